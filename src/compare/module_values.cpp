#include "compare/module_values.hpp"

#include "common/cancel.hpp"
#include "common/error.hpp"
#include "numerics/compensated_sum.hpp"
#include "numerics/formats.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>

namespace mx2nv {
namespace {

// 32-groups per chunk: 1 MiB of packed bytes per side (at most 8 MiB of an
// F32 unquantized weight) per worker.
constexpr std::uint64_t kChunkGroups = 1 << 16;

struct Names {
  std::string weight, scale, global, input;
};

Names names_of(const OtherModule& om, OtherFormat f) {
  const bool ct = f == OtherFormat::CompressedTensors;
  const std::string p(om.name);
  if (!om.quantized) return {p + ".weight", {}, {}, {}};
  return {p + (ct ? ".weight_packed" : ".weight"), p + ".weight_scale", p + (ct ? ".weight_global_scale" : ".weight_scale_2"),
          p + (ct ? ".input_global_scale" : ".input_scale")};
}

std::string shape_text(const std::vector<std::uint64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

void expect(const OtherTensor* t, const std::string& name, std::initializer_list<Dtype> dtypes,
            std::initializer_list<std::vector<std::uint64_t>> shapes) {
  if (!t) fail_input("{}: missing", name);
  if (std::find(dtypes.begin(), dtypes.end(), t->dtype) == dtypes.end()) {
    std::vector<std::string_view> want;
    for (const Dtype d : dtypes) want.push_back(dtype_name(d));
    fail_input("{}: dtype {}, expected {}", name, dtype_name(t->dtype), fmt::join(want, " or "));
  }
  if (std::none_of(shapes.begin(), shapes.end(), [&](const auto& s) { return t->has_shape(s); })) {
    std::vector<std::string> want;
    for (const auto& s : shapes) want.push_back(shape_text(s));
    fail_input("{}: shape {}, expected {}", name, t->shape_text(), fmt::join(want, " or "));
  }
}

// Sums of one 32-group in plain double (32 terms: a relative error of a few
// ulps), then added to the module's compensated sums: a compensated addition
// per group instead of four per value.
struct GroupSums {
  double d2 = 0, s2 = 0, o2 = 0, os = 0, max_abs = 0;
  std::uint64_t exact = 0;
  void add(double s, double o) {
    const double d = o - s;
    exact += o == s ? 1u : 0u;
    max_abs = std::max(max_abs, std::fabs(d));
    d2 += d * d;
    s2 += s * s;
    o2 += o * o;
    os += o * s;
  }
};

struct Accumulator {
  CompensatedSum d2, s2, o2, os;
  std::uint64_t values = 0, exact = 0;
  double max_abs = 0;
  void add(const GroupSums& g, std::uint64_t n) {
    values += n;
    exact += g.exact;
    max_abs = std::max(max_abs, g.max_abs);
    d2.add(g.d2);
    s2.add(g.s2);
    o2.add(g.o2);
    os.add(g.os);
  }
};

// OTHER's 16 values for one block-scale byte, computed as the definition
// says (e2m1 x scale, then / global or x global: the same roundings as the
// oracle's), filled the first time a byte is met in the module; and, per
// byte, the one SRC scale byte (if any) whose values the row equals code for
// code, so a block with that scale and SRC's packed bytes is exact.
class OtherValues {
 public:
  static constexpr int kNone = -1;
  OtherValues(bool ct, double global) : ct_(ct), global_(global) {}
  const double* row(std::uint8_t scale) {
    double* r = &rows_[static_cast<std::size_t>(scale) * 16];
    if (!filled_[scale]) {
      const double factor = e4m3_value(scale);
      for (std::uint8_t c = 0; c < 16; ++c) {
        const double prod = e2m1_value(c) * factor;
        r[c] = ct_ ? prod / global_ : prod * global_;
      }
      same_as_src_[scale] = static_cast<std::int16_t>(src_scale_of(r));
      filled_[scale] = true;
    }
    return r;
  }
  // After row(scale): the E8M0 byte whose block values the row equals, or kNone.
  int same_as_src(std::uint8_t scale) const { return same_as_src_[scale]; }

 private:
  // Code 2 is 1.0, so r[2] is the row's factor: a power of two 2^k with k
  // in E8M0's range, and every code's value e2m1 x 2^k, or no SRC scale.
  static int src_scale_of(const double* r) {
    int e = 0;
    if (!(r[2] > 0) || std::frexp(r[2], &e) != 0.5 || e - 1 < -127 || e - 1 > 127) return kNone;
    for (std::uint8_t c = 0; c < 16; ++c) {
      if (r[c] != e2m1_value(c) * r[2]) return kNone;
    }
    return e - 1 + 127;
  }
  bool ct_;
  double global_;
  std::array<bool, 256> filled_{};
  std::array<std::int16_t, 256> same_as_src_;  // valid where filled_
  std::array<double, 256 * 16> rows_;          // valid where filled_
};

// The sum of the squares of a packed byte's two E2M1 values (exact).
constexpr std::array<double, 256> kSquaresOfByte = [] {
  std::array<double, 256> t{};
  for (unsigned b = 0; b < 256; ++b) {
    const double lo = detail::kE2M1Values[b & 0xF], hi = detail::kE2M1Values[b >> 4];
    t[b] = lo * lo + hi * hi;
  }
  return t;
}();

std::uint8_t u8(std::byte b) { return std::to_integer<std::uint8_t>(b); }

std::array<double, 16> e2m1_table() {
  std::array<double, 16> t{};
  for (std::uint8_t c = 0; c < 16; ++c) t[c] = e2m1_value(c);
  return t;
}

float read_f32(const Checkpoint& c, const OtherTensor& t) {
  std::array<std::byte, 4> raw{};
  c.files->open(t.shard)->read_at(t.offset, raw);
  return std::bit_cast<float>(raw);
}

double half_value(std::uint16_t h) {
  const int exp = (h >> 10) & 0x1F;
  const int man = h & 0x3FF;
  double v = exp == 0 ? std::ldexp(man, -24) : exp == 31 ? (man ? NAN : INFINITY) : std::ldexp(1024 + man, exp - 25);
  return (h & 0x8000) ? -v : v;
}

double float_value(Dtype d, const std::byte* p) {
  if (d == Dtype::F32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  if (d == Dtype::BF16) return std::bit_cast<float>(std::uint32_t{h} << 16);
  return half_value(h);
}

// Packed bytes of one chunk: identical bytes, zero-sign flips.
void tally_packed(std::span<const std::byte> a, std::span<const std::byte> b, CompareSums& s) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    // Eight identical bytes at once (the common case for an exact OTHER).
    if (i % 8 == 0 && i + 8 <= a.size() && std::memcmp(&a[i], &b[i], 8) == 0) {
      s.packed_bytes_identical += 8;
      i += 7;
      continue;
    }
    const std::uint8_t x = u8(a[i]), y = u8(b[i]);
    if (x == y) {
      ++s.packed_bytes_identical;
      continue;
    }
    bool only_flips = true;
    for (const int shift : {0, 4}) {
      const int p = (x >> shift) & 0xF, q = (y >> shift) & 0xF;
      if (p == q) continue;
      if ((p & 7) == 0 && (q & 7) == 0) {
        ++s.zero_sign_rewrites;
      } else {
        only_flips = false;
      }
    }
    if (only_flips) ++s.zero_sign_rewrite_bytes;
  }
}

}  // namespace

void check_other_module(const QuantModule& src, const OtherModule& om, OtherFormat format) {
  const std::uint64_t n = src.rows, k = src.groups * kMxGroup;
  const Names names = names_of(om, format);
  if (!om.quantized) {
    expect(om.weight, names.weight, {Dtype::BF16, Dtype::F16, Dtype::F32}, {{n, k}});
    return;
  }
  expect(om.weight, names.weight, {Dtype::U8}, {{n, k / 2}});
  expect(om.scale, names.scale, {Dtype::F8_E4M3}, {{n, k / kNvGroup}});
  expect(om.global, names.global, {Dtype::F32}, {{1}, {}});
  if (om.input_scale) expect(om.input_scale, names.input, {Dtype::F32}, {{1}, {}});
}

void compare_module_values(const Checkpoint& src, const QuantModule& m, const OtherTree& other,
                           const OtherModule& om, ModuleComparison& out) {
  static const std::array<double, 16> kE2M1 = e2m1_table();
  const Names names = names_of(om, other.format);
  const bool ct = other.format == OtherFormat::CompressedTensors;
  double global = 1;
  if (om.quantized) {
    const float g = read_f32(other.checkpoint, *om.global);
    out.global_bits = std::bit_cast<std::uint32_t>(g);
    if (!std::isfinite(g) || !(g > 0)) fail_input("{}: global is {}, must be finite and > 0", names.global, g);
    global = g;
    if (om.input_scale) {
      out.has_input_scale = true;
      const float in = read_f32(other.checkpoint, *om.input_scale);
      if (std::isfinite(in)) out.input_scale = in;
    }
  }
  const auto sp = src.files->open(m.packed_shard);
  const auto ss = src.files->open(m.scale_shard);
  const auto op = other.checkpoint.files->open(om.weight->shard);
  const auto os = om.quantized ? other.checkpoint.files->open(om.scale->shard) : nullptr;
  const std::uint64_t src_packed = src.shards[m.packed_shard].data_start + m.packed.begin;
  const std::uint64_t src_scale = src.shards[m.scale_shard].data_start + m.scale.begin;
  const unsigned item = om.quantized ? 1 : dtype_bits(om.weight->dtype) / 8;
  const std::uint64_t other_group_bytes = om.quantized ? kGroupBytes : kMxGroup * item;

  const std::uint64_t total = m.group_count();
  const std::uint64_t chunk = std::min(total, kChunkGroups);
  std::vector<std::byte> a_packed(chunk * kGroupBytes), a_scale(chunk);
  std::vector<std::byte> b_weight(chunk * other_group_bytes), b_scale(om.quantized ? chunk * kNvScalesPerMxScale : 0);
  Accumulator acc;
  CompareSums& sums = out.sums;
  // 33 KiB, only for a quantized OTHER: the heap, not the worker's stack.
  const auto other_values = om.quantized ? std::make_unique<OtherValues>(ct, global) : nullptr;
  // Chunk `start`'s ranges asked for ahead of their reads (File::prefetch).
  const auto prefetch = [&](std::uint64_t start) {
    if (start >= total) return;
    const std::uint64_t n = std::min(chunk, total - start);
    sp->prefetch(src_packed + start * kGroupBytes, n * kGroupBytes);
    ss->prefetch(src_scale + start, n);
    op->prefetch(om.weight->offset + start * other_group_bytes, n * other_group_bytes);
    if (om.quantized) os->prefetch(om.scale->offset + start * kNvScalesPerMxScale, n * kNvScalesPerMxScale);
  };
  prefetch(0);
  for (std::uint64_t start = 0; start < total; start += chunk) {
    const std::uint64_t n = std::min(chunk, total - start);
    prefetch(start + chunk);
    sp->read_at(src_packed + start * kGroupBytes, std::span(a_packed).first(n * kGroupBytes));
    ss->read_at(src_scale + start, std::span(a_scale).first(n));
    op->read_at(om.weight->offset + start * other_group_bytes, std::span(b_weight).first(n * other_group_bytes));
    if (om.quantized) {
      os->read_at(om.scale->offset + start * kNvScalesPerMxScale, std::span(b_scale).first(n * kNvScalesPerMxScale));
      tally_packed(std::span(a_packed).first(n * kGroupBytes), std::span(b_weight).first(n * kGroupBytes), sums);
    }
    for (std::uint64_t g = 0; g < n; ++g) {
      const std::uint8_t sb = u8(a_scale[g]);
      if (sb == kE8M0NaN) fail_input("{}.weight_scale: E8M0 NaN (0xFF) in SRC", m.name);
      const double src_factor = e8m0_value(sb);
      const std::byte* a = &a_packed[g * kGroupBytes];
      GroupSums group;
      for (unsigned half = 0; half < 2; ++half) {
        if (om.quantized) {
          const std::uint8_t b = u8(b_scale[g * 2 + half]);
          if ((b & 0x7F) == 0x7F) fail_input("{}: E4M3 NaN block scale", names.scale);
          const std::byte* w = &b_weight[g * kGroupBytes + half * 8];
          bool active = false;
          for (unsigned j = 0; j < 8; ++j) active |= (u8(w[j]) & 0x77) != 0;
          if (active && ((b >> 3) & 0xF) == 0 && (b & 7) != 0) ++sums.active_block_scales_below_min_normal;
          const double* o = other_values->row(b);
          if (other_values->same_as_src(b) == sb && std::memcmp(w, a + half * 8, 8) == 0) {
            // Every value equals SRC's: the sums from SRC's codes alone
            // (squares of values e2m1 x 2^k, each and their sum exact).
            double squares = 0;
            for (unsigned j = 0; j < 8; ++j) squares += kSquaresOfByte[u8(w[j])];
            const double s2 = squares * src_factor * src_factor;
            group.exact += 16;
            group.s2 += s2;
            group.o2 += s2;
            group.os += s2;
            continue;
          }
          for (unsigned j = 0; j < 8; ++j) {
            const std::uint8_t x = u8(a[half * 8 + j]), y = u8(w[j]);
            group.add(kE2M1[x & 0xF] * src_factor, o[y & 0xF]);
            group.add(kE2M1[x >> 4] * src_factor, o[y >> 4]);
          }
        } else {
          for (unsigned j = 0; j < 16; ++j) {
            const std::uint8_t x = u8(a[half * 8 + j / 2]);
            const double o = float_value(om.weight->dtype, &b_weight[(g * kMxGroup + half * 16 + j) * item]);
            if (!std::isfinite(o)) fail_input("{}: non-finite value in an unquantized weight", names.weight);
            group.add(kE2M1[(x >> ((j % 2) * 4)) & 0xF] * src_factor, o);
          }
        }
      }
      acc.add(group, kMxGroup);
    }
    throw_if_stopped();
  }
  sums.values = acc.values;
  sums.exact_values = acc.exact;
  sums.max_abs_error = acc.exact == acc.values ? 0.0 : acc.max_abs;
  sums.sum_d2 = acc.d2.value();
  sums.sum_s2 = acc.s2.value();
  sums.sum_o2 = acc.o2.value();
  sums.sum_os = acc.os.value();
  if (om.quantized) sums.packed_bytes = m.packed.nbytes();
}

}  // namespace mx2nv

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

constexpr std::uint64_t kMagnitudeBits = 0x7777777777777777ULL;  // of 16 packed E2M1 codes

// Four times the sum of the squares of a packed byte's two E2M1 values: an
// integer (the squares are multiples of 1/4), at most 2 x 144.
constexpr std::array<std::uint16_t, 256> kQuarterSquaresOfByte = [] {
  std::array<std::uint16_t, 256> t{};
  for (unsigned b = 0; b < 256; ++b) t[b] = static_cast<std::uint16_t>(4 * kSquaresOfByte[b]);
  return t;
}();

// Groups whose 32 values all equal SRC's: their only figure is the sum of
// SRC's squares (which is also OTHER's, and their product's), kept per SRC
// scale byte as an integer count of quarters and added to the module's sums
// every kGroups groups of the module (fixed points, so the sums do not depend
// on how the module was read), each scale's term exact (a count of at most
// 2^16 groups x 4608 quarters, far below 2^53, scaled by a power of two). A
// table lookup per byte instead of four sums per value.
class ExactGroups {
 public:
  void add(std::uint8_t scale, const std::byte* group16) {
    std::uint32_t q = 0;
    for (unsigned j = 0; j < kGroupBytes; ++j) q += kQuarterSquaresOfByte[u8(group16[j])];
    quarters_[scale] += q;
    ++groups_;
  }
  static constexpr std::uint64_t kGroups = 1 << 16;
  // Called before the module's group g when g is a multiple of kGroups, and
  // after its last.
  void flush(Accumulator& acc) {
    if (groups_ == 0) return;
    acc.values += groups_ * kMxGroup;
    acc.exact += groups_ * kMxGroup;
    for (unsigned k = 0; k < 255; ++k) {
      if (quarters_[k] == 0) continue;
      const double s2 = std::ldexp(static_cast<double>(quarters_[k]), 2 * (static_cast<int>(k) - 127) - 2);
      acc.s2.add(s2);
      acc.o2.add(s2);
      acc.os.add(s2);
      quarters_[k] = 0;
    }
    groups_ = 0;
  }

 private:
  std::array<std::uint64_t, 256> quarters_{};
  std::uint64_t groups_ = 0;
};

// e8m0_value by table (one ldexp per byte, at start-up); 0xFF is NaN.
const std::array<double, 256> kE8M0 = [] {
  std::array<double, 256> t{};
  for (unsigned v = 0; v < 256; ++v) t[v] = e8m0_value(static_cast<std::uint8_t>(v));
  return t;
}();

constexpr const std::array<double, 16>& kE2M1 = detail::kE2M1Values;

// One 32-group of a quantized OTHER (w: 16 packed bytes, scales: its two
// E4M3 block scales) against SRC's (a, scale byte sb): a NaN block scale is
// invalid input, an active block with a subnormal scale is counted; true when
// all 32 values equal SRC's (left to ExactGroups), else the terms in `group`.
bool quantized_group(const std::byte* a, const std::byte* w, const std::byte* scales, std::uint8_t sb,
                     OtherValues& other, const std::string& scale_name, CompareSums& sums, GroupSums& group) {
  const std::uint8_t b[2] = {u8(scales[0]), u8(scales[1])};
  std::uint64_t a_half[2], w_half[2];
  std::memcpy(a_half, a, 16);
  std::memcpy(w_half, w, 16);
  for (unsigned half = 0; half < 2; ++half) {
    if ((b[half] & 0x7F) == 0x7F) fail_input("{}: E4M3 NaN block scale", scale_name);
    const bool active = (w_half[half] & kMagnitudeBits) != 0;
    if (active && ((b[half] >> 3) & 0xF) == 0 && (b[half] & 7) != 0) ++sums.active_block_scales_below_min_normal;
    other.row(b[half]);
  }
  const bool same[2] = {other.same_as_src(b[0]) == sb && a_half[0] == w_half[0],
                        other.same_as_src(b[1]) == sb && a_half[1] == w_half[1]};
  if (same[0] && same[1]) return true;
  const double src_factor = kE8M0[sb];
  for (unsigned half = 0; half < 2; ++half) {
    if (same[half]) {
      // Every value equals SRC's: the sums from SRC's codes alone
      // (squares of values e2m1 x 2^k, each and their sum exact).
      double squares = 0;
      for (unsigned j = 0; j < 8; ++j) squares += kSquaresOfByte[u8(a[half * 8 + j])];
      const double s2 = squares * src_factor * src_factor;
      group.exact += 16;
      group.s2 += s2;
      group.o2 += s2;
      group.os += s2;
      continue;
    }
    const double* o = other.row(b[half]);
    for (unsigned j = 0; j < 8; ++j) {
      const std::uint8_t x = u8(a[half * 8 + j]), y = u8(w[half * 8 + j]);
      group.add(kE2M1[x & 0xF] * src_factor, o[y & 0xF]);
      group.add(kE2M1[x >> 4] * src_factor, o[y >> 4]);
    }
  }
  return false;
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

// One 32-group of an unquantized OTHER (w: its 32 values of `dtype`) against
// SRC's; a non-finite value is invalid input.
void unquantized_group(const std::byte* a, const std::byte* w, Dtype dtype, double src_factor,
                       const std::string& weight_name, GroupSums& group) {
  const unsigned item = dtype_bits(dtype) / 8;
  for (unsigned j = 0; j < kMxGroup; ++j) {
    const std::uint8_t x = u8(a[j / 2]);
    const double o = float_value(dtype, w + j * item);
    if (!std::isfinite(o)) fail_input("{}: non-finite value in an unquantized weight", weight_name);
    group.add(kE2M1[(x >> ((j % 2) * 4)) & 0xF] * src_factor, o);
  }
}

// Packed bytes that differ somewhere: identical bytes, zero-sign flips, byte by byte.
void tally_bytes(std::span<const std::byte> a, std::span<const std::byte> b, CompareSums& s) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    // Eight identical bytes at once.
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

// Packed bytes of one chunk: identical bytes, zero-sign flips.
void tally_packed(std::span<const std::byte> a, std::span<const std::byte> b, CompareSums& s) {
  // Blocks of identical bytes (all of an exact OTHER's) at one memcmp each.
  constexpr std::size_t kBlock = 4096;
  for (std::size_t begin = 0; begin < a.size(); begin += kBlock) {
    const std::size_t n = std::min(kBlock, a.size() - begin);
    if (std::memcmp(&a[begin], &b[begin], n) == 0) {
      s.packed_bytes_identical += n;
      continue;
    }
    tally_bytes(a.subspan(begin, n), b.subspan(begin, n), s);
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
                           const OtherModule& om, unsigned workers, CompareBuffers& buffers, ReadOrder::Turn& turn,
                           ModuleComparison& out) {
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
  // A chunk's groups: SRC's packed bytes or OTHER's weight (up to 8 times as
  // large, an F32 unquantized one), whichever is larger, fill one chunk.
  const std::uint64_t chunk = std::min(total, stream_chunk_bytes(workers) / std::max(kGroupBytes, other_group_bytes));
  Accumulator acc;
  CompareSums& sums = out.sums;
  // 33 KiB, only for a quantized OTHER: the heap, not the worker's stack.
  const auto other_values = om.quantized ? std::make_unique<OtherValues>(ct, global) : nullptr;
  ExactGroups exact_squares;
  for (std::uint64_t start = 0; start < total; start += chunk) {
    const std::uint64_t n = std::min(chunk, total - start);
    const auto a_packed = turn.read(*sp, src_packed + start * kGroupBytes, n * kGroupBytes, buffers.a_packed);
    const auto a_scale = turn.read(*ss, src_scale + start, n, buffers.a_scale);
    const auto b_weight = turn.read(*op, om.weight->offset + start * other_group_bytes, n * other_group_bytes,
                                    buffers.b_weight);
    const auto b_scale = om.quantized ? turn.read(*os, om.scale->offset + start * kNvScalesPerMxScale,
                                                  n * kNvScalesPerMxScale, buffers.b_scale)
                                      : std::span<const std::byte>();
    turn.pass();  // a module of several chunks reads the rest out of turn
    if (om.quantized) tally_packed(a_packed, b_weight, sums);
    for (std::uint64_t g = 0; g < n; ++g) {
      if ((start + g) % ExactGroups::kGroups == 0) exact_squares.flush(acc);
      const std::uint8_t sb = u8(a_scale[g]);
      if (sb == kE8M0NaN) fail_input("{}.weight_scale: E8M0 NaN (0xFF) in SRC", m.name);
      const double src_factor = kE8M0[sb];
      const std::byte* a = &a_packed[g * kGroupBytes];
      GroupSums group;
      if (!om.quantized) {
        unquantized_group(a, &b_weight[g * kMxGroup * item], om.weight->dtype, src_factor, names.weight, group);
      } else if (quantized_group(a, &b_weight[g * kGroupBytes], &b_scale[g * 2], sb, *other_values, names.scale, sums,
                                 group)) {
        exact_squares.add(sb, a);  // the common case for an exact OTHER
        continue;
      }
      acc.add(group, kMxGroup);
    }
    throw_if_stopped();
  }
  exact_squares.flush(acc);
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

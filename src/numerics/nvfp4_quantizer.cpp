#include "numerics/nvfp4_quantizer.hpp"

#include "numerics/formats.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

namespace mx2nv {
namespace {

// compressed-tensors' constants: FP8_E4M3_DATA.max, FP4_E2M1_DATA.max, and
// _get_dtype_eps(float8_e4m3fn).
constexpr float kE4M3Max = 448.0f;
constexpr float kE2M1Max = 6.0f;
constexpr float kE4M3Eps = 0.125f;

std::uint8_t nibble(std::span<const std::byte, 16> packed, std::size_t i) {
  const auto b = std::to_integer<std::uint8_t>(packed[i / 2]);
  return static_cast<std::uint8_t>((i % 2 == 0) ? (b & 0xF) : (b >> 4));
}

// E2M1 magnitude code of |s| <= 6, nearest with ties to even (the even codes
// 0, 2, 4, 6 are 0, 1, 2, 4): the same thresholds as compressed-tensors'
// cast_to_fp4 (<= 0.25 -> 0, < 0.75 -> 0.5, <= 1.25 -> 1, < 1.75 -> 1.5,
// <= 2.5 -> 2, < 3.5 -> 3, <= 5 -> 4, else 6).
std::uint8_t e2m1_magnitude_code(float a) {
  if (a <= 0.25f) return 0;
  if (a < 0.75f) return 1;
  if (a <= 1.25f) return 2;
  if (a < 1.75f) return 3;
  if (a <= 2.5f) return 4;
  if (a < 3.5f) return 5;
  if (a <= 5.0f) return 6;
  return 7;
}

}  // namespace

std::optional<float> mxfp4_value_f32(std::uint8_t code, int k) {
  const auto v = std::ldexp(static_cast<float>(e2m1_value(code)), k);
  if (!std::isfinite(v)) return std::nullopt;
  return v;
}

bool mxfp4_group_values_f32(std::span<const std::byte, 16> packed, std::uint8_t e8m0, std::span<float, 32> out) {
  const int k = e8m0_exponent(e8m0);
  if (k >= std::numeric_limits<float>::min_exponent - 1 && k < std::numeric_limits<float>::max_exponent) {
    // 2^k is a normal float, so e2m1 x 2^k is ldexp's result, correctly
    // rounded (infinite where ldexp's is): one multiplication a value.
    const float factor = std::ldexp(1.0f, k);
    for (std::size_t i = 0; i < 32; ++i) {
      out[i] = static_cast<float>(e2m1_value(nibble(packed, i))) * factor;
      if (!std::isfinite(out[i])) return false;
    }
    return true;
  }
  for (std::size_t i = 0; i < 32; ++i) {
    const auto v = mxfp4_value_f32(nibble(packed, i), k);
    if (!v) return false;
    out[i] = *v;
  }
  return true;
}

std::optional<float> mxfp4_group_amax(std::span<const std::byte, 16> packed, std::uint8_t e8m0) {
  std::uint8_t top = 0;  // largest magnitude code: E2M1 magnitudes grow with the code
  for (std::size_t i = 0; i < 32; ++i) top = std::max(top, static_cast<std::uint8_t>(nibble(packed, i) & 0x7));
  return mxfp4_value_f32(top, e8m0_exponent(e8m0));
}

float nvfp4_global_scale(float amax) {
  const float g = (kE4M3Max * kE2M1Max) / std::max(std::fabs(amax), std::numeric_limits<float>::min());
  return std::isfinite(g) ? g : 1.0f;
}

bool SecondLevel::same_as(const SecondLevel& o) const {
  return recipe == o.recipe && std::bit_cast<std::uint32_t>(stored) == std::bit_cast<std::uint32_t>(o.stored);
}

SecondLevel second_level_for(Recipe recipe, float amax) {
  if (recipe == Recipe::ModelOpt) return {recipe, modelopt_weight_scale_2(amax)};
  return {recipe, nvfp4_global_scale(amax)};
}

float modelopt_weight_scale_2(float amax) {
  const float a = std::fabs(amax);
  return (a == 0 ? kE2M1Max : a) / (kE2M1Max * kE4M3Max);
}

std::uint8_t e4m3_round(float x) {
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(static_cast<double>(x));
  if (a < std::ldexp(1.0, kE4M3MinNormalPow2)) {
    // Subnormal: multiples of 2^-9; a mantissa rounding up to 8 is 2^-6, byte 0x08.
    const auto m = static_cast<std::uint8_t>(std::nearbyint(std::ldexp(a, 9)));
    return static_cast<std::uint8_t>(sign | m);
  }
  int e = 0;
  const double f = std::frexp(a, &e);  // a = f x 2^e, f in [0.5, 1)
  int exponent = e - 1;                // a = (2f) x 2^exponent, 2f in [1, 2)
  auto mantissa = static_cast<int>(std::nearbyint((2 * f - 1) * 8));
  if (mantissa == 8) {
    mantissa = 0;
    ++exponent;
  }
  return static_cast<std::uint8_t>(sign | ((exponent + 7) << 3) | mantissa);
}

BlockScale nvfp4_block_scale(float block_amax, float global) {
  float s = global * (std::fabs(block_amax) / kE2M1Max);
  s = std::clamp(s, -kE4M3Max, kE4M3Max);
  const std::uint8_t byte = e4m3_round(s);
  if ((byte & 0x7F) == 0) return {e4m3_round(kE4M3Eps), kE4M3Eps};
  return {byte, static_cast<float>(e4m3_value(byte))};
}

std::uint8_t nvfp4_code(float x, float scale_value, float global) {
  const float effective = scale_value / global;
  const float s = std::clamp(x / effective, -kE2M1Max, kE2M1Max);
  const std::uint8_t sign = s < 0 ? 0x8 : 0x0;  // cast_to_fp4 multiplies by sign(x): sign(-0.0) is +0
  return static_cast<std::uint8_t>(sign | e2m1_magnitude_code(std::fabs(s)));
}

BlockScale modelopt_block_scale(float block_amax, float weight_scale_2) {
  // Each step one float32 operation, in ModelOpt's order.
  const float six_w = kE2M1Max * weight_scale_2;
  float s = std::fabs(block_amax) / six_w;
  if (s == 0) s = 1.0f;
  s = std::clamp(s, 0x1p-9f, kE4M3Max);
  const std::uint8_t byte = e4m3_round(s);
  return {byte, static_cast<float>(e4m3_value(byte))};
}

std::uint8_t modelopt_code(float x, float scale_value, float weight_scale_2) {
  const float effective = scale_value * weight_scale_2;
  const float t = x / effective;
  const std::uint8_t sign = t < 0 ? 0x8 : 0x0;  // _cast_fp4: weight < 0, so -0.0 is +0
  return static_cast<std::uint8_t>(sign | e2m1_magnitude_code(std::fabs(t)));
}

void ErrorStats::add(double reference, double quantized) {
  const double d = quantized - reference;
  sum_err2 += d * d;
  sum_ref2 += reference * reference;
  sum_q2 += quantized * quantized;
  sum_dot += quantized * reference;
  max_abs = std::max(max_abs, std::fabs(d));
  ++values;
}

void ErrorStats::merge(const ErrorStats& o) {
  sum_err2 += o.sum_err2;
  sum_ref2 += o.sum_ref2;
  sum_q2 += o.sum_q2;
  sum_dot += o.sum_dot;
  max_abs = std::max(max_abs, o.max_abs);
  values += o.values;
  marlin_zeroed_blocks += o.marlin_zeroed_blocks;
}

double ErrorStats::relative_rmse() const {
  if (sum_err2 == 0) return 0;
  if (sum_ref2 == 0) return std::numeric_limits<double>::infinity();
  return std::sqrt(sum_err2 / sum_ref2);
}

double ErrorStats::cosine() const {
  if (sum_ref2 == 0 && sum_q2 == 0) return 1;
  if (sum_ref2 == 0 || sum_q2 == 0) return 0;
  return sum_dot / std::sqrt(sum_ref2 * sum_q2);
}

namespace {

using Block = GroupRequantizer::Block;

const std::uint8_t* bytes_of(std::span<const std::byte> s) { return reinterpret_cast<const std::uint8_t*>(s.data()); }

// By packed byte: the set of its two codes, bit c for code c.
constexpr std::array<std::uint16_t, 256> kCodesOfByte = [] {
  std::array<std::uint16_t, 256> t{};
  for (unsigned b = 0; b < 256; ++b) t[b] = static_cast<std::uint16_t>((1u << (b & 0xF)) | (1u << (b >> 4)));
  return t;
}();

// The set of codes of a block (bit c for code c): its 8 packed bytes.
std::uint16_t block_codes(const std::uint8_t* bytes) {
  std::uint16_t present = 0;
  for (std::size_t j = 0; j < kNvBlock / 2; ++j) present = static_cast<std::uint16_t>(present | kCodesOfByte[bytes[j]]);
  return present;
}

// The largest magnitude code among the 16 codes of 8 packed bytes, bit by
// bit from the highest: keep the codes that have the bit when any has it.
inline __attribute__((always_inline)) std::uint8_t block_top(const std::uint8_t* bytes) {
  std::uint64_t m;
  std::memcpy(&m, bytes, sizeof m);
  m &= 0x7777777777777777u;  // each code's magnitude, a nibble each
  const std::uint64_t has4 = m & 0x4444444444444444u;
  m = has4 != 0 ? m & ((has4 >> 2) * 0xF) : m;  // the nibbles that have the bit, whole
  const std::uint64_t has2 = m & 0x2222222222222222u;
  m = has2 != 0 ? m & ((has2 >> 1) * 0xF) : m;
  const bool has1 = (m & 0x1111111111111111u) != 0;
  return static_cast<std::uint8_t>((has4 != 0 ? 4 : 0) | (has2 != 0 ? 2 : 0) | (has1 ? 1 : 0));
}

// The block of an E8M0 byte and largest magnitude code under `level`: every
// figure computed as its recipe's steps compute it (file comment), from the
// block's float32 values (mxfp4_value_f32), and each value's error terms as
// ErrorStats::add computes them.
Block make_block(std::uint8_t e8m0, std::uint8_t top, SecondLevel level) {
  Block b;
  const int k = e8m0_exponent(e8m0);
  const auto amax = mxfp4_value_f32(top, k);  // the largest |value|: magnitudes grow with the code
  if (!amax) return b;
  b.finite = true;
  const bool modelopt = level.recipe == Recipe::ModelOpt;
  const float second = level.stored;
  const BlockScale scale = modelopt ? modelopt_block_scale(*amax, second) : nvfp4_block_scale(*amax, second);
  b.scale = scale.byte;
  // An E4M3 subnormal block scale (below 2^-6): vLLM's Marlin path flushes it to zero.
  b.marlin_zeroed = (scale.byte & 0x78) == 0 && (scale.byte & 0x07) != 0;
  std::uint8_t code[16]{};
  for (std::uint8_t c = 0; c < 16; ++c) {
    if ((c & 0x7) > top) continue;  // not in this block
    const float x = *mxfp4_value_f32(c, k);
    code[c] = modelopt ? modelopt_code(x, scale.value, second) : nvfp4_code(x, scale.value, second);
    const double reference = static_cast<double>(x);
    const double scaled = e2m1_value(code[c]) * static_cast<double>(scale.value);  // exact: 3 x 4 bits
    const double quantized = modelopt ? scaled * static_cast<double>(second) : scaled / static_cast<double>(second);
    const double d = quantized - reference;
    const double terms[4] = {d * d, reference * reference, quantized * quantized, quantized * reference};
    for (std::size_t j = 0; j < 4; ++j) {
      b.term[c][j] = terms[j];
      b.term_max[j] = std::max(b.term_max[j], terms[j]);
    }
    b.abs_error[c] = std::fabs(d);
  }
  for (std::size_t q = 0; q < 4; ++q) {
    for (unsigned set = 0; set < 16; ++set) {
      for (std::size_t i = 0; i < 4; ++i) {
        if ((set >> i) & 1u) b.max_by_nibble[q][set] = std::max(b.max_by_nibble[q][set], b.abs_error[4 * q + i]);
      }
    }
  }
  for (unsigned v = 0; v < 256; ++v) b.byte[v] = static_cast<std::uint8_t>(code[v & 0xF] | (code[v >> 4] << 4));
  return b;
}

// Two doubles added lane by lane, each lane an ordinary IEEE double
// addition (GCC's and clang's vector extension).
using Pair = double __attribute__((vector_size(16)));
Pair load_pair(const double* p) {
  Pair v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The largest |q - x| over the codes in `present` (bit c for code c): the
// largest of the block's four lookups by a nibble of the set.
double block_max(const Block& b, std::uint16_t present) {
  return std::max(std::max(b.max_by_nibble[0][present & 0xF], b.max_by_nibble[1][(present >> 4) & 0xF]),
                  std::max(b.max_by_nibble[2][(present >> 8) & 0xF], b.max_by_nibble[3][present >> 12]));
}

// Block b's units for sum j in the binade of ulp u = 2^p (|p| < 1023):
// each code's term / u rounded to an integer, and whether that rounding is a
// fixed function of the term (no tie, no negative or oversized term), as
// SumRun's proof needs.
void block_units(Block& b, std::size_t j, int p) {
  const double inv_u = std::bit_cast<double>(static_cast<std::uint64_t>(1023 - p) << 52);  // 1/u, exact
  bool ok = true;
  b.units_bound[j] = 0;
  for (std::size_t c = 0; c < 16; ++c) {
    const double t = b.term[c][j];
    // Exact, a power-of-two scaling, unless it falls below 2^-1022: then
    // t/u < 2^-1021 and both round to 0, neither a tie.
    const double v = t * inv_u;
    double n = 0;
    if (t >= 0 && v < 0x1p48) {
      n = (v + 0x1p52) - 0x1p52;       // v rounded to the nearest integer (0 <= v < 2^52)
      if (std::fabs(v - n) == 0.5) ok = false;  // a tie: S's last bit would decide (v - n is exact)
    } else {
      ok = false;
    }
    b.units[c][j] = n;
    b.units_bound[j] = std::max(b.units_bound[j], static_cast<double>(kNvBlock) * n);
  }
  b.units_ok[j] = ok;
  b.units_ulp[j] = p;
  b.units_key = 0;  // set again once every sum's units are known good (add_by_sum, requantize_whole)
}

// The sums of units of blocks' values (block_units), the four sums side by
// side in two pairs of independent chains; integers, so exact in any order.
struct Units {
  Pair lo0{}, hi0{}, lo1{}, hi1{};
  void add(const Block& b, const std::uint8_t* bytes) {
    for (std::size_t j = 0; j < 8; j += 2) {
      const double* u0 = b.units[bytes[j] & 0xF];
      const double* u1 = b.units[bytes[j] >> 4];
      const double* u2 = b.units[bytes[j + 1] & 0xF];
      const double* u3 = b.units[bytes[j + 1] >> 4];
      lo0 += load_pair(u0) + load_pair(u1);
      hi0 += load_pair(u0 + 2) + load_pair(u1 + 2);
      lo1 += load_pair(u2) + load_pair(u3);
      hi1 += load_pair(u2 + 2) + load_pair(u3 + 2);
    }
  }
  Pair sum01() const { return lo0 + lo1; }  // sums 0 and 1
  Pair sum23() const { return hi0 + hi1; }  // sums 2 and 3
};

// ErrorStats's four sums over a run of blocks, bit for bit what adding each
// value's terms in value order gives (ErrorStats::add: S := fl(S + t) for
// each term t of each value), plus its maximum, value and block counts.
//
// A block's 16 terms of one sum (or a group's 32) are added at once when
// that provably gives the same double. Let S be a double in the binade
// [2^(p+52), 2^(p+53)), so S = a u with u = 2^p and a an integer in
// [2^52, 2^53); the doubles of that binade are exactly its multiples of u.
// Let every term t be >= 0 and t/u not a half-integer, n(t) = round(t/u),
// and let a plus the terms' n sum below 2^53. Then, step by step, the exact
// S + t lies within u/2 of exactly one multiple of u, S + n(t) u, which lies
// below 2^(p+53) (the n are >= 0 and their total keeps below it), so it is
// the double nearest S + t: fl(S + t) = S + n(t) u, and the terms end at
// S = (a + sum of n) u. Each n is an integer below 2^48, 32 of them sum
// below 2^53: their sum is exact in doubles in any order, and so is a + sum
// when it is below 2^53 (and >= 2^53 when the exact one is). Otherwise (a
// tie, a negative or large term, a sum leaving the binade, S below 2^-960
// where 1/u would overflow) the block is added term by term in value order.
// The maximum is order-free.
class SumRun {
  static constexpr double kBlockValues = 16;  // kNvBlock

 public:
  explicit SumRun(ErrorStats& stats)
      : stats_(stats),
        s_{stats.sum_err2, stats.sum_ref2, stats.sum_q2, stats.sum_dot},
        max_(stats.max_abs),
        marlin_zeroed_(stats.marlin_zeroed_blocks),
        values_(stats.values) {}

  // Adds block b, whose packed bytes are `bytes` (8).
  void add(Block& b, const std::uint8_t* bytes) {
    if (b.units_key == key_) {
      // Every sum in the binade form, and the block's units computed for
      // each sum's u, with no tie and no negative or large term: only the
      // sums' totals are left to check.
      Units r;
      r.add(b, bytes);
      if (take(r, 1)) {
        count(b, bytes);
        return;
      }
    }
    count(b, bytes);
    add_by_sum(b, bytes);
  }

  // A group's two blocks, b0 then b1 (bytes: the group's 16 packed bytes).
  void add_group(Block& b0, Block& b1, const std::uint8_t* bytes) {
    if (b0.units_key == key_ && b1.units_key == key_) {
      // As in add, over the group's 32 values: 32 units below 2^48 sum below
      // 2^53, still exact in any order.
      Units r;
      r.add(b0, bytes);
      r.add(b1, bytes + 8);
      if (take(r, 2)) {
        count(b0, bytes);
        count(b1, bytes + 8);
        return;
      }
    }
    add(b0, bytes);
    add(b1, bytes + 8);
  }

  // A whole run can start when every sum is in the binade form; its room
  // keeps every sum below 2^53 units (class comment).
  std::optional<GroupRequantizer::WholeRun> start_run() const {
    if (key_ == kNoKey) return std::nullopt;
    GroupRequantizer::WholeRun run;
    run.key = key_;
    for (std::size_t j = 0; j < 4; ++j) {
      run.room[j] = 0x1p53 - a_[j];  // exact: a_ is an integer in [2^52, 2^53)
      run.p[j] = p_[j];
    }
    run.max_abs = max_;
    return run;
  }

  // Adds a whole run's totals. Each of its blocks' units held for the sums'
  // u and the run's total stayed below the room, so each sum, block by block
  // in value order, would have stayed in the binade: adding the total at
  // once gives the same integer a (add's proof), and max and counts are
  // order-free.
  void end_run(const GroupRequantizer::WholeRun& run) {
    for (std::size_t j = 0; j < 4; ++j) a_[j] += static_cast<double>(run.units[j]);  // exact: below 2^53
    summed_whole_ += 4 * run.blocks;
    values_ += kNvBlock * run.blocks;
    marlin_zeroed_ += run.marlin_zeroed;
    max_ = run.max_abs;
  }

  // Writes the sums back into the stats; returns how many block sums were
  // added whole.
  std::uint64_t finish() {
    for (std::size_t j = 0; j < 4; ++j) leave(j);
    stats_.sum_err2 = s_[0];
    stats_.sum_ref2 = s_[1];
    stats_.sum_q2 = s_[2];
    stats_.sum_dot = s_[3];
    stats_.max_abs = max_;
    stats_.marlin_zeroed_blocks = marlin_zeroed_;
    stats_.values = values_;
    return summed_whole_;
  }

 private:
  // Adds the units' totals to the sums in the binade form when every sum
  // stays below 2^53 units (the class comment's condition); else nothing.
  bool take(const Units& units, std::uint64_t blocks) {
    const Pair r01 = units.sum01(), r23 = units.sum23();
    const double r[4] = {r01[0], r01[1], r23[0], r23[1]};
    if (!(a_[0] + r[0] < 0x1p53 && a_[1] + r[1] < 0x1p53 && a_[2] + r[2] < 0x1p53 && a_[3] + r[3] < 0x1p53)) {
      return false;
    }
    for (std::size_t j = 0; j < 4; ++j) a_[j] += r[j];
    summed_whole_ += 4 * blocks;
    return true;
  }

  // The maximum and the counts of a block added.
  void count(const Block& b, const std::uint8_t* bytes) {
    // A block whose largest |q - x| over all its codes is no larger cannot
    // raise the maximum: the codes it holds are looked at only otherwise.
    if (b.max_by_nibble[0][0xF] > max_ || b.max_by_nibble[1][0xF] > max_ || b.max_by_nibble[2][0xF] > max_ ||
        b.max_by_nibble[3][0xF] > max_) {
      max_ = std::max(max_, block_max(b, block_codes(bytes)));
    }
    values_ += kNvBlock;
    if (b.marlin_zeroed) ++marlin_zeroed_;
  }

  // add's sums, each on its own: whole where it can (try_whole), else value
  // by value.
  void add_by_sum(Block& b, const std::uint8_t* bytes) {
    std::uint8_t c[16];
    for (std::size_t j = 0; j < 8; ++j) {
      c[2 * j] = bytes[j] & 0xF;
      c[2 * j + 1] = static_cast<std::uint8_t>(bytes[j] >> 4);
    }
    bool whole[4];
    bool any_whole = false;
    for (std::size_t j = 0; j < 4; ++j) {
      whole[j] = try_whole(b, j);
      any_whole = any_whole || whole[j];
    }
    if (any_whole) {
      // Four partial sums side by side (independent chains); integers, so
      // exact in any order (class comment).
      Pair lo0{}, hi0{}, lo1{}, hi1{}, lo2{}, hi2{}, lo3{}, hi3{};
      for (std::size_t i = 0; i < kNvBlock; i += 4) {
        const double* u0 = b.units[c[i]];
        const double* u1 = b.units[c[i + 1]];
        const double* u2 = b.units[c[i + 2]];
        const double* u3 = b.units[c[i + 3]];
        lo0 += load_pair(u0);
        hi0 += load_pair(u0 + 2);
        lo1 += load_pair(u1);
        hi1 += load_pair(u1 + 2);
        lo2 += load_pair(u2);
        hi2 += load_pair(u2 + 2);
        lo3 += load_pair(u3);
        hi3 += load_pair(u3 + 2);
      }
      const Pair r01 = (lo0 + lo1) + (lo2 + lo3), r23 = (hi0 + hi1) + (hi2 + hi3);
      const double r[4] = {r01[0], r01[1], r23[0], r23[1]};
      for (std::size_t j = 0; j < 4; ++j) {
        if (!whole[j]) continue;
        if (a_[j] + r[j] < 0x1p53) {
          a_[j] += r[j];
          ++summed_whole_;
        } else {
          leave(j);
          whole[j] = false;
        }
      }
    }
    if (!whole[0] && !whole[1] && !whole[2] && !whole[3]) {
      // The four sums side by side, each lane in value order.
      Pair s01 = {s_[0], s_[1]}, s23 = {s_[2], s_[3]};
      for (const std::uint8_t code : c) {
        s01 += load_pair(b.term[code]);
        s23 += load_pair(b.term[code] + 2);
      }
      s_[0] = s01[0];
      s_[1] = s01[1];
      s_[2] = s23[0];
      s_[3] = s23[1];
      return;
    }
    for (std::size_t j = 0; j < 4; ++j) {
      if (whole[j]) continue;
      double s = s_[j];
      for (const std::uint8_t code : c) s += b.term[code][j];
      s_[j] = s;
    }
    // Every sum took the block whole: its units hold for every sum's u.
    if (whole[0] && whole[1] && whole[2] && whole[3]) b.units_key = key_;
  }

  // Whether sum j adds block b whole (its units ready), entering or leaving
  // the binade form as S allows. A heuristic bound decides when to try; the
  // exactness conditions are checked in compute_units and add.
  bool try_whole(Block& b, std::size_t j) {
    if (!fast_[j]) {
      // Enter when S is normal, far enough from the exponent range's ends,
      // and large against the block's terms (else the next blocks would
      // leave the binade at once).
      const double s = s_[j];
      if (!(s >= 0x1p-960 && s < 0x1p1023 && s >= 512 * kBlockValues * b.term_max[j])) return false;
      const auto bits = std::bit_cast<std::uint64_t>(s);
      const int p = static_cast<int>(bits >> 52) - 1023 - 52;  // S's binade is [2^(p+52), 2^(p+53))
      p_[j] = p;
      u_[j] = std::bit_cast<double>(static_cast<std::uint64_t>(p + 1023) << 52);
      inv_u_[j] = std::bit_cast<double>(static_cast<std::uint64_t>(1023 - p) << 52);
      a_[j] = s * inv_u_[j];  // exact: a power-of-two scaling of a normal double into [2^52, 2^53)
      fast_[j] = true;
      update_key();
    }
    if (!(a_[j] + kBlockValues * b.term_max[j] * inv_u_[j] < 0x1p53)) {
      leave(j);
      return false;
    }
    if (b.units_ulp[j] != p_[j]) compute_units(b, j);
    if (!b.units_ok[j]) {
      leave(j);
      return false;
    }
    return true;
  }

  void compute_units(Block& b, std::size_t j) const { block_units(b, j, p_[j]); }

  // key_: the four sums' u when all are in the binade form (each p + 2048
  // in 16 bits: never 0), else kNoKey (no block's units_key).
  void update_key() {
    key_ = kNoKey;
    if (!(fast_[0] && fast_[1] && fast_[2] && fast_[3])) return;
    key_ = 0;
    for (std::size_t j = 0; j < 4; ++j) key_ = (key_ << 16) | static_cast<std::uint64_t>(p_[j] + 2048);
  }

  void leave(std::size_t j) {
    if (!fast_[j]) return;
    s_[j] = a_[j] * u_[j];  // exact: a power-of-two scaling back into the binade
    fast_[j] = false;
    key_ = kNoKey;
  }

  ErrorStats& stats_;
  double s_[4];  // each sum, when not in the binade form
  double a_[4]{};  // S / u, an integer in [2^52, 2^53), when in the binade form
  double u_[4]{}, inv_u_[4]{};
  int p_[4]{};
  bool fast_[4]{};
  double max_;
  std::uint64_t marlin_zeroed_, values_;
  static constexpr std::uint64_t kNoKey = ~std::uint64_t{0};
  std::uint64_t key_ = kNoKey;
  std::uint64_t summed_whole_ = 0;
};

// Writes one group from its two blocks (both finite) and adds its values.
void apply_group(Block& b0, Block& b1, const std::uint8_t* in, std::uint8_t* out_packed, std::uint8_t* out_scales, SumRun* sums) {
  if (out_scales != nullptr) {
    out_scales[0] = b0.scale;
    out_scales[1] = b1.scale;
  }
  if (out_packed != nullptr) {
    for (std::size_t j = 0; j < 8; ++j) out_packed[j] = b0.byte[in[j]];
    for (std::size_t j = 8; j < 16; ++j) out_packed[j] = b1.byte[in[j]];
  }
  if (sums != nullptr) {
    sums->add_group(b0, b1, in);
  }
}

}  // namespace

std::size_t mxfp4_groups_amax(std::span<const std::byte> packed, std::span<const std::byte> e8m0s, float& amax) {
  // By E8M0 byte and largest magnitude code: mxfp4_value_f32, +inf where it
  // has none (and for the NaN byte).
  static const std::array<float, 256 * 8> kValues = [] {
    std::array<float, 256 * 8> t{};
    for (unsigned e = 0; e < 256; ++e) {
      for (unsigned top = 0; top < 8; ++top) {
        const auto v = mxfp4_value_f32(static_cast<std::uint8_t>(top), e8m0_exponent(static_cast<std::uint8_t>(e)));
        t[e * 8 + top] = (v && e != kE8M0NaN) ? *v : std::numeric_limits<float>::infinity();
      }
    }
    return t;
  }();
  // By E8M0 byte below 253: the largest value a group of it can hold (code 7).
  static const std::array<float, 253> kBound = [] {
    std::array<float, 253> t{};
    for (unsigned e = 0; e < t.size(); ++e) t[e] = kValues[e * 8 + 7];
    return t;
  }();
  const std::uint8_t* in = bytes_of(packed);
  const std::size_t n = e8m0s.size();
  float m = amax;
  std::uint8_t highest = 0;
  for (const std::byte e : e8m0s) highest = std::max(highest, std::to_integer<std::uint8_t>(e));
  if (highest < kBound.size()) {
    // No group can fail (every value is below 2^128), and a group that can
    // hold no value above the maximum so far cannot raise it: only the others
    // are decoded.
    for (std::size_t g = 0; g < n; ++g) {
      const auto e8m0 = std::to_integer<std::uint8_t>(e8m0s[g]);
      if (!(kBound[e8m0] > m)) continue;
      const std::uint8_t* p = in + g * 16;
      m = std::max(m, kValues[static_cast<std::size_t>(e8m0) * 8 + std::max(block_top(p), block_top(p + 8))]);
    }
    amax = m;
    return n;
  }
  for (std::size_t g = 0; g < n; ++g) {
    const std::uint8_t* p = in + g * 16;
    const std::uint8_t top = std::max(block_top(p), block_top(p + 8));
    const float v = kValues[std::to_integer<std::size_t>(e8m0s[g]) * 8 + top];
    if (v == std::numeric_limits<float>::infinity()) {
      amax = m;
      return g;
    }
    m = std::max(m, v);
  }
  amax = m;
  return n;
}

bool requantize_group(std::span<const std::byte, 16> packed, std::uint8_t e8m0, SecondLevel level,
                      std::span<std::byte, 16> out_packed, std::span<std::uint8_t, 2> out_scales, ErrorStats& stats) {
  const std::uint8_t* in = bytes_of(packed);
  Block b0 = make_block(e8m0, block_top(in), level), b1 = make_block(e8m0, block_top(in + 8), level);
  if (!b0.finite || !b1.finite) return false;
  SumRun sums(stats);
  apply_group(b0, b1, in, reinterpret_cast<std::uint8_t*>(out_packed.data()), out_scales.data(),
              &sums);
  sums.finish();
  return true;
}

std::size_t GroupRequantizer::add_block(std::uint8_t e8m0, std::uint8_t top) {
  blocks_.push_back(make_block(e8m0, top, level_));
  const std::size_t key = static_cast<std::size_t>(e8m0) * 8 + top;
  index_[key] = static_cast<std::uint16_t>(blocks_.size());
  const Block& b = blocks_.back();
  scale_of_[key] = static_cast<std::uint16_t>(kComputed | (b.finite ? b.scale : kBeyondFloat32));
  return blocks_.size() - 1;
}

std::size_t GroupRequantizer::requantize(std::span<const std::byte> packed, std::span<const std::byte> e8m0s,
                                         std::span<std::byte> out_packed, std::span<std::uint8_t> out_scales,
                                         ErrorStats* stats) {
  const std::size_t n = e8m0s.size();
  const std::uint8_t* in = bytes_of(packed);
  auto* out = out_packed.empty() ? nullptr : reinterpret_cast<std::uint8_t*>(out_packed.data());
  std::uint8_t* scales_out = out_scales.empty() ? nullptr : out_scales.data();
  std::size_t g = 0;
  if (out == nullptr && stats == nullptr) {
    // Only the scale bytes: from the small table of each block's scale,
    // without touching the blocks themselves.
    for (; g < n; ++g) {
      const auto e8m0 = std::to_integer<std::uint8_t>(e8m0s[g]);
      if (e8m0 == kE8M0NaN) break;
      const std::uint8_t* p = in + g * 16;
      const std::size_t key = static_cast<std::size_t>(e8m0) * 8;
      const std::uint8_t top0 = block_top(p), top1 = block_top(p + 8);
      const std::size_t k0 = key + top0, k1 = key + top1;
      if (scale_of_[k0] == 0) block_index(e8m0, top0);
      if (scale_of_[k1] == 0) block_index(e8m0, top1);
      const unsigned s0 = scale_of_[k0], s1 = scale_of_[k1];
      if (((s0 | s1) & kBeyondFloat32) != 0) break;
      if (scales_out != nullptr) {
        scales_out[2 * g] = static_cast<std::uint8_t>(s0);
        scales_out[2 * g + 1] = static_cast<std::uint8_t>(s1);
      }
    }
    return g;
  }
  std::optional<SumRun> sums;
  if (stats != nullptr) sums.emplace(*stats);
  // Whole runs pay off over many groups: not for the last few, and not
  // again for a while after a short one (while the sums are small their
  // binades change every few groups, and each change ends a run).
  constexpr std::size_t kShortRun = 256;
  std::size_t no_run_before = 0;
  for (; g < n; ++g) {
    if (sums && g >= no_run_before && n - g >= kShortRun) {
      if (auto run = sums->start_run()) {
        const std::size_t done = requantize_whole(in + g * 16, e8m0s.subspan(g), out == nullptr ? nullptr : out + g * 16,
                                                  scales_out == nullptr ? nullptr : scales_out + g * 2, *run);
        sums->end_run(*run);
        g += done;
        if (g == n) break;
        if (done < kShortRun) no_run_before = g + kShortRun;
      }
    }
    // The group a run stopped at, value by value.
    const auto e8m0 = std::to_integer<std::uint8_t>(e8m0s[g]);
    if (e8m0 == kE8M0NaN) break;
    const std::uint8_t* p = in + g * 16;
    // Both indexes first: computing the second block may move the first.
    const std::size_t i0 = block_index(e8m0, block_top(p)), i1 = block_index(e8m0, block_top(p + 8));
    Block& b0 = blocks_[i0];
    Block& b1 = blocks_[i1];
    if (!b0.finite || !b1.finite) break;
    apply_group(b0, b1, p, out == nullptr ? nullptr : out + g * 16, scales_out == nullptr ? nullptr : scales_out + g * 2,
                sums ? &*sums : nullptr);
  }
  if (sums) blocks_summed_whole_ += sums->finish();
  return g;
}

namespace {

// requantize_whole's counts, one set per thread: by place in a requantizer's
// blocks (at most 256 x 8), how often each source byte occurs in the run so
// far. Every run leaves them zero.
struct RunCounts {
  std::vector<std::array<std::uint32_t, 256>> bytes = std::vector<std::array<std::uint32_t, 256>>(256 * 8);
  std::vector<std::uint8_t> met = std::vector<std::uint8_t>(256 * 8);  // by place: counted in this run
  std::vector<std::uint16_t> blocks = [] {  // the places met, in order met
    std::vector<std::uint16_t> v;
    v.reserve(256 * 8);  // every place: count() never allocates, so a run cannot stop half-counted
    return v;
  }();
  // Counts the 8 packed bytes p of a block at place `at`.
  void count(unsigned at, const std::uint8_t* p) {
    if (met[at] == 0) {
      met[at] = 1;
      blocks.push_back(static_cast<std::uint16_t>(at));
    }
    auto& c = bytes[at];
    for (std::size_t j = 0; j < 8; ++j) ++c[p[j]];
  }
};

// By code, how many of the counted bytes hold it. Byte v = 16 h + l holds
// codes l and h: the low codes' counts are the sums of the 16 rows, the high
// codes' the rows' totals (all at most 2^28: kMaxRunGroups).
void code_counts(const std::array<std::uint32_t, 256>& bytes, std::uint64_t (&codes)[16]) {
  std::uint32_t low[16]{}, high[16]{};
  for (unsigned h = 0; h < 16; ++h) {
    for (unsigned l = 0; l < 16; ++l) {
      low[l] += bytes[16 * h + l];
      high[h] += bytes[16 * h + l];
    }
  }
  for (unsigned c = 0; c < 16; ++c) codes[c] = std::uint64_t{low[c]} + high[c];
}

// The units the counted values of block b add to each sum, raised into
// `units` (each product and partial sum at most the run's total, below 2^53:
// exact).
void add_units(const Block& b, const std::uint64_t (&codes)[16], std::uint64_t (&units)[4]) {
  for (unsigned c = 0; c < 16; ++c) {
    for (std::size_t j = 0; j < 4; ++j) units[j] += codes[c] * static_cast<std::uint64_t>(b.units[c][j]);
  }
}

// The units the counted values add to each sum so far (lanes 0, 1 and 2, 3).
void counted_units(const RunCounts& counts, const std::vector<Block>& blocks, Pair& units01, Pair& units23) {
  std::uint64_t units[4]{};
  for (const std::uint16_t at : counts.blocks) {
    std::uint64_t codes[16];
    code_counts(counts.bytes[at], codes);
    add_units(blocks[at], codes, units);
  }
  units01 = Pair{static_cast<double>(units[0]), static_cast<double>(units[1])};  // exact: below 2^53
  units23 = Pair{static_cast<double>(units[2]), static_cast<double>(units[3])};
}

// A run's totals from its counts into `run`, the counts emptied for the next.
void end_counts(RunCounts& counts, const std::vector<Block>& blocks, GroupRequantizer::WholeRun& run) {
  for (const std::uint16_t at : counts.blocks) {
    const Block& b = blocks[at];
    std::uint64_t codes[16], values = 0;
    code_counts(counts.bytes[at], codes);
    counts.bytes[at].fill(0);
    counts.met[at] = 0;
    add_units(b, codes, run.units);
    std::uint16_t present = 0;
    for (unsigned c = 0; c < 16; ++c) {
      values += codes[c];
      present = static_cast<std::uint16_t>(present | (codes[c] != 0 ? 1u << c : 0u));
    }
    const std::uint64_t block_count = values / kNvBlock;
    run.blocks += block_count;
    if (b.marlin_zeroed) run.marlin_zeroed += block_count;
    run.max_abs = std::max(run.max_abs, block_max(b, present));
  }
  counts.blocks.clear();
}

// A run's groups per call: a place counts at most 16 bytes a group (both
// blocks of a group may share it), so every count and sum of counts stays at
// most 16 x 2^24 = 2^28 (no uint32 overflow).
constexpr std::size_t kMaxRunGroups = std::size_t{1} << 24;

// Whether block b's units hold for every sum of the run (computing them for
// the run's u where they were computed for another): a finite block, no
// tie, no negative or oversized term (block_units).
inline bool units_ready(Block& b, const GroupRequantizer::WholeRun& run) {
  if (b.units_key == run.key) return true;
  if (!b.finite) return false;
  for (std::size_t j = 0; j < 4; ++j) {
    if (b.units_ulp[j] != run.p[j]) block_units(b, j, run.p[j]);
    if (!b.units_ok[j]) return false;
  }
  b.units_key = run.key;
  return true;
}

}  // namespace

std::size_t GroupRequantizer::requantize_whole(const std::uint8_t* in, std::span<const std::byte> e8m0s,
                                               std::uint8_t* out, std::uint8_t* scales_out, WholeRun& run) {
  thread_local RunCounts counts;
  const std::size_t n = std::min(e8m0s.size(), kMaxRunGroups);
  // What the run adds to each sum (lanes 0, 1 and 2, 3) is at most bound +
  // exact, integers below the room (so below 2^53: exact). bound grows by
  // the blocks' largest units while the room allows; when it would not, it
  // is made exact from the counts (a few times a run) and grows again; when
  // even that leaves no room, exact adds each later group's units value by
  // value until the next group would reach the room.
  Pair bound01{}, bound23{}, exact01{}, exact23{};
  const Pair room01 = {run.room[0], run.room[1]}, room23 = {run.room[2], run.room[3]};
  const auto below = [&](Pair a01, Pair a23) { return a01[0] < room01[0] && a01[1] < room01[1] && a23[0] < room23[0] && a23[1] < room23[1]; };
  bool by_bound = true;
  int tightenings_left = 4;
  std::size_t g = 0;
  for (; g < n; ++g) {
    const auto e8m0 = std::to_integer<std::uint8_t>(e8m0s[g]);
    if (e8m0 == kE8M0NaN) break;
    const std::uint8_t* p = in + g * 16;
    const std::size_t key = static_cast<std::size_t>(e8m0) * 8;
    const unsigned at0 = index_[key + block_top(p)], at1 = index_[key + block_top(p + 8)];
    if (at0 == 0 || at1 == 0) break;  // a block not computed yet
    Block& b0 = blocks_[at0 - 1];
    Block& b1 = blocks_[at1 - 1];
    if (!units_ready(b0, run) || !units_ready(b1, run)) break;
    if (by_bound) {
      const auto grown = [&](Pair& n01, Pair& n23) {
        n01 = bound01 + load_pair(b0.units_bound) + load_pair(b1.units_bound);
        n23 = bound23 + load_pair(b0.units_bound + 2) + load_pair(b1.units_bound + 2);
        return below(n01, n23);
      };
      Pair n01, n23;
      by_bound = grown(n01, n23);
      if (!by_bound && tightenings_left-- > 0) {
        counted_units(counts, blocks_, bound01, bound23);
        by_bound = grown(n01, n23);
      }
      if (by_bound) {
        bound01 = n01;
        bound23 = n23;
      }
    }
    if (!by_bound) {
      Units r;  // 32 integers below 2^48 a lane: exact
      r.add(b0, p);
      r.add(b1, p + 8);
      const Pair r01 = r.sum01(), r23 = r.sum23();
      if (!below(bound01 + exact01 + r01, bound23 + exact23 + r23)) break;
      exact01 += r01;
      exact23 += r23;
    }
    counts.count(at0 - 1, p);
    counts.count(at1 - 1, p + 8);
    apply_group(b0, b1, p, out == nullptr ? nullptr : out + g * 16, scales_out == nullptr ? nullptr : scales_out + g * 2,
                nullptr);
  }
  end_counts(counts, blocks_, run);
  groups_in_whole_runs_ += g;
  return g;
}

bool GroupRequantizer::requantize(std::span<const std::byte, 16> packed, std::uint8_t e8m0,
                                  std::span<std::byte, 16> out_packed, std::span<std::uint8_t, 2> out_scales,
                                  ErrorStats& stats) {
  const std::byte scale[1] = {static_cast<std::byte>(e8m0)};
  return requantize(packed, scale, out_packed, out_scales, &stats) == 1;
}

bool GroupRequantizer::scales(std::span<const std::byte, 16> packed, std::uint8_t e8m0,
                              std::span<std::uint8_t, 2> out_scales) {
  const std::byte scale[1] = {static_cast<std::byte>(e8m0)};
  return requantize(packed, scale, {}, out_scales, nullptr) == 1;
}

}  // namespace mx2nv

#include "numerics/nvfp4_quantizer.hpp"

#include "numerics/formats.hpp"

#include <algorithm>
#include <cmath>
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

// The block of an E8M0 byte and largest magnitude code under `global`: every
// figure computed as the quantizer's steps compute it (file comment), from
// the block's float32 values (mxfp4_value_f32).
GroupRequantizer::Block make_block(std::uint8_t e8m0, std::uint8_t top, float global) {
  GroupRequantizer::Block b;
  const int k = e8m0_exponent(e8m0);
  const auto amax = mxfp4_value_f32(top, k);  // the largest |value|: magnitudes grow with the code
  if (!amax) return b;
  b.finite = true;
  const BlockScale scale = nvfp4_block_scale(*amax, global);
  b.scale = scale.byte;
  // An E4M3 subnormal block scale (below 2^-6): vLLM's Marlin path flushes it to zero.
  b.marlin_zeroed = (scale.byte & 0x78) == 0 && (scale.byte & 0x07) != 0;
  for (std::uint8_t c = 0; c < 16; ++c) {
    if ((c & 0x7) > top) continue;  // not in this block
    const float x = *mxfp4_value_f32(c, k);
    b.code[c] = nvfp4_code(x, scale.value, global);
    b.value[c] = static_cast<double>(x);
    b.dequantized[c] = e2m1_value(b.code[c]) * static_cast<double>(scale.value) / static_cast<double>(global);
  }
  return b;
}

using GroupCodes = GroupRequantizer::GroupCodes;

GroupCodes group_codes(std::span<const std::byte, 16> packed) {
  GroupCodes g{};
  for (std::size_t j = 0; j < 16; ++j) {
    const auto b = std::to_integer<std::uint8_t>(packed[j]);
    g.code[2 * j] = b & 0xF;
    g.code[2 * j + 1] = static_cast<std::uint8_t>(b >> 4);
  }
  for (std::size_t block = 0; block < 2; ++block) {
    for (std::size_t i = block * kNvBlock; i < (block + 1) * kNvBlock; ++i) {
      g.top[block] = std::max(g.top[block], static_cast<std::uint8_t>(g.code[i] & 0x7));
    }
  }
  return g;
}

// Writes a group from its two blocks (both finite), adding every value to
// `stats` in order.
void apply_blocks(const GroupCodes& g, const GroupRequantizer::Block* const (&blocks)[2],
                  std::span<std::byte, 16> out_packed, std::span<std::uint8_t, 2> out_scales, ErrorStats& stats) {
  std::uint8_t codes[32];
  for (std::size_t block = 0; block < 2; ++block) {
    const GroupRequantizer::Block& b = *blocks[block];
    out_scales[block] = b.scale;
    if (b.marlin_zeroed) ++stats.marlin_zeroed_blocks;
    for (std::size_t i = block * kNvBlock; i < (block + 1) * kNvBlock; ++i) {
      const std::uint8_t c = g.code[i];
      codes[i] = b.code[c];
      stats.add(b.value[c], b.dequantized[c]);
    }
  }
  for (std::size_t j = 0; j < 16; ++j) {
    out_packed[j] = static_cast<std::byte>(codes[2 * j] | (codes[2 * j + 1] << 4));
  }
}

}  // namespace

bool requantize_group(std::span<const std::byte, 16> packed, std::uint8_t e8m0, float global,
                      std::span<std::byte, 16> out_packed, std::span<std::uint8_t, 2> out_scales, ErrorStats& stats) {
  const GroupCodes g = group_codes(packed);
  const GroupRequantizer::Block b0 = make_block(e8m0, g.top[0], global), b1 = make_block(e8m0, g.top[1], global);
  if (!b0.finite || !b1.finite) return false;
  const GroupRequantizer::Block* const blocks[2] = {&b0, &b1};
  apply_blocks(g, blocks, out_packed, out_scales, stats);
  return true;
}

std::size_t GroupRequantizer::block_index(std::uint8_t e8m0, std::uint8_t top) {
  std::uint16_t& at = index_[static_cast<std::size_t>(e8m0) * 8 + top];
  if (at == 0) {
    blocks_.push_back(make_block(e8m0, top, global_));
    at = static_cast<std::uint16_t>(blocks_.size());
  }
  return at - 1u;
}

bool GroupRequantizer::blocks_of(std::span<const std::byte, 16> packed, std::uint8_t e8m0, GroupCodes& g,
                                 const Block* (&blocks)[2]) {
  g = group_codes(packed);
  // Both indexes first: computing the second block may move the first.
  const std::size_t i0 = block_index(e8m0, g.top[0]), i1 = block_index(e8m0, g.top[1]);
  blocks[0] = &blocks_[i0];
  blocks[1] = &blocks_[i1];
  return blocks[0]->finite && blocks[1]->finite;
}

bool GroupRequantizer::requantize(std::span<const std::byte, 16> packed, std::uint8_t e8m0,
                                  std::span<std::byte, 16> out_packed, std::span<std::uint8_t, 2> out_scales,
                                  ErrorStats& stats) {
  GroupCodes g;
  const Block* blocks[2];
  if (!blocks_of(packed, e8m0, g, blocks)) return false;
  apply_blocks(g, blocks, out_packed, out_scales, stats);
  return true;
}

bool GroupRequantizer::scales(std::span<const std::byte, 16> packed, std::uint8_t e8m0,
                              std::span<std::uint8_t, 2> out_scales) {
  GroupCodes g;
  const Block* blocks[2];
  if (!blocks_of(packed, e8m0, g, blocks)) return false;
  out_scales[0] = blocks[0]->scale;
  out_scales[1] = blocks[1]->scale;
  return true;
}

}  // namespace mx2nv

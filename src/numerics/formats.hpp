// The three small number formats involved, decoded from their bit fields
// (OCP MX v1.0 / ml_dtypes definitions), plus the one encoder the transcoder
// needs: an exact power of two into E4M3FN.
//
// Decoders return double: every value of every format here, and every product
// code x scale x 1/global the checkpoints can hold, is exact in double
// (2^-137 .. 6*2^127 is far inside double's range), so comparisons are exact.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "numerics/window.hpp"  // the windows (runtime profiles) built on these formats

namespace mx2nv {

// --- E8M0 (float8_e8m0fnu): unsigned biased exponent, no zero, 0xFF is NaN.
inline constexpr std::uint8_t kE8M0NaN = 0xFF;
inline constexpr int kE8M0Bias = 127;
inline constexpr int e8m0_exponent(std::uint8_t b) { return static_cast<int>(b) - kE8M0Bias; }
double e8m0_value(std::uint8_t b);  // 2^(b-127); NaN for 0xFF

// --- E2M1 (float4_e2m1fn): sign bit 3, two exponent bits (bias 1), one mantissa bit.
// Magnitude codes 0..7 = {0, .5, 1, 1.5, 2, 3, 4, 6}; 0x8 is -0.
namespace detail {
// By the fields: sign, 2 exponent bits (bias 1), 1 mantissa bit; subnormal
// when the exponent field is 0 (0.m x 2^0 = m x 0.5).
constexpr double e2m1_from_fields(std::uint8_t code) {
  const int exponent = (code >> 1) & 0x3;
  const int mantissa = code & 1;
  const double magnitude = exponent == 0 ? mantissa * 0.5 : (1.0 + mantissa * 0.5) * (1 << (exponent - 1));
  return (code >> 3) & 1 ? -magnitude : magnitude;
}
// Every code's value, so decoding a value is a load (code 8 is -0).
inline constexpr std::array<double, 16> kE2M1Values = [] {
  std::array<double, 16> t{};
  for (std::uint8_t c = 0; c < 16; ++c) t[c] = e2m1_from_fields(c);
  return t;
}();
static_assert(kE2M1Values[7] == 6.0 && kE2M1Values[9] == -0.5 && kE2M1Values[1] == 0.5);
}  // namespace detail
inline double e2m1_value(std::uint8_t code) { return detail::kE2M1Values[code & 0xF]; }  // low 4 bits
inline constexpr bool e2m1_is_zero(std::uint8_t code) { return (code & 0x7) == 0; }

// --- E4M3FN (float8_e4m3fn): bias 7, no infinities, 0x7F/0xFF are NaN, max 448.
double e4m3_value(std::uint8_t byte);
// Powers of two E4M3FN holds exactly: 2^-9 (smallest subnormal) .. 2^8.
inline constexpr int kE4M3MinPow2 = -9;
inline constexpr int kE4M3MinNormalPow2 = -6;
inline constexpr int kE4M3MaxPow2 = 8;
// The exact E4M3FN byte of 2^e, or nullopt when 2^e is not representable.
std::optional<std::uint8_t> e4m3_encode_pow2(int e);

// --- The FP32 global scale. compressed-tensors stores it as a divisor:
// value = e2m1 x weight_scale / weight_global_scale. For a global exponent m
// the stored divisor is 2^-m; it must be a normal float (2^-126 .. 2^127).
std::optional<float> global_divisor_for(int m);

}  // namespace mx2nv

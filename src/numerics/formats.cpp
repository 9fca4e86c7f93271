#include "numerics/formats.hpp"

#include <array>

#include <cmath>
#include <limits>

namespace mx2nv {

double e8m0_value(std::uint8_t b) {
  if (b == kE8M0NaN) return std::numeric_limits<double>::quiet_NaN();
  return std::ldexp(1.0, e8m0_exponent(b));
}

double e4m3_value(std::uint8_t byte) {
  const int sign = (byte >> 7) & 1;
  const int exponent = (byte >> 3) & 0xF;
  const int mantissa = byte & 0x7;
  if (exponent == 0xF && mantissa == 0x7) return std::numeric_limits<double>::quiet_NaN();
  const double magnitude = exponent == 0 ? std::ldexp(mantissa / 8.0, 1 - 7)
                                         : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return sign ? -magnitude : magnitude;
}

std::optional<std::uint8_t> e4m3_encode_pow2(int e) {
  if (e > kE4M3MaxPow2 || e < kE4M3MinPow2) return std::nullopt;
  if (e >= kE4M3MinNormalPow2) return static_cast<std::uint8_t>((e + 7) << 3);  // normal, mantissa 0
  // Subnormal: value = mantissa/8 x 2^-6, so 2^e needs mantissa = 2^(e+9).
  return static_cast<std::uint8_t>(1u << (e + 9));
}

std::optional<float> global_divisor_for(int m) {
  const int e = -m;
  if (e < std::numeric_limits<float>::min_exponent - 1 || e > std::numeric_limits<float>::max_exponent - 1) {
    return std::nullopt;
  }
  return std::ldexp(1.0f, e);
}

}  // namespace mx2nv

#include "numerics/bf16.hpp"

#include <bit>
#include <cmath>
#include <limits>

namespace mx2nv {

std::optional<std::uint16_t> bf16_exact(double value) {
  if (!std::isfinite(value) || std::fabs(value) > static_cast<double>(std::numeric_limits<float>::max())) {
    return std::nullopt;
  }
  const auto f = static_cast<float>(value);
  if (static_cast<double>(f) != value) return std::nullopt;  // not even float32 holds it
  const auto bits = std::bit_cast<std::uint32_t>(f);
  if ((bits & 0xFFFFu) != 0) return std::nullopt;  // needs mantissa bits BF16 drops
  return static_cast<std::uint16_t>(bits >> 16);
}

double bf16_value(std::uint16_t bits) {
  return static_cast<double>(std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16));
}

}  // namespace mx2nv

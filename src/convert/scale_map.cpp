#include "convert/scale_map.hpp"

#include "numerics/formats.hpp"

namespace mx2nv {

ScaleLut make_scale_lut(int m, bool zero_scales) {
  ScaleLut lut{};
  if (zero_scales) return lut;
  for (int b = 0; b < 256; ++b) {
    lut[static_cast<std::size_t>(b)] = e4m3_encode_pow2(e8m0_exponent(static_cast<std::uint8_t>(b)) - m).value_or(0);
  }
  lut[kE8M0NaN] = 0;  // never reached: NaN scales are refused while planning
  return lut;
}

void map_scales(const ScaleLut& lut, std::span<const std::byte> in, std::span<std::byte> out) {
  for (std::size_t i = 0; i < in.size(); ++i) {
    const auto v = static_cast<std::byte>(lut[std::to_integer<std::uint8_t>(in[i])]);
    out[2 * i] = v;
    out[2 * i + 1] = v;
  }
}

}  // namespace mx2nv

// The transcode of one scale byte: E8M0 2^k (one per 32 values) becomes the
// E4M3 byte of 2^(k-m), written twice (one per 16-value half). A lookup
// table per module makes the hot loop a byte gather.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace mx2nv {

using ScaleLut = std::array<std::uint8_t, 256>;

// Byte b maps to E4M3(2^(b-127-m)) when representable, else 0x00. The plan has
// already refused any active group whose byte maps outside the window, so a
// 0x00 here only ever lands on a zero group. `zero_scales` (no active group in
// the scale group) maps every byte to 0x00.
ScaleLut make_scale_lut(int m, bool zero_scales);

// out.size() must be 2 * in.size().
void map_scales(const ScaleLut& lut, std::span<const std::byte> in, std::span<std::byte> out);

}  // namespace mx2nv

// A palette PNG as a data: URI, for the HTML page's dense maps: one byte per
// pixel, stored (uncompressed) deflate blocks, so no compression library is
// needed and the bytes are a pure function of the pixels (PNG: RFC 2083 /
// ISO/IEC 15948; zlib stream: RFC 1950; stored deflate blocks: RFC 1951 3.2.4).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace mx2nv {

struct PaletteImage {
  std::uint32_t width = 0, height = 0;
  std::vector<std::array<std::uint8_t, 3>> palette;  // at most 256 colours (RGB)
  std::vector<std::uint8_t> pixels;                  // width x height palette indices, row by row
};

// "data:image/png;base64,..." of `image`. Throws std::logic_error (a bug) for
// an image whose sizes disagree or whose palette is empty or over 256 colours.
std::string png_data_uri(const PaletteImage& image);

}  // namespace mx2nv

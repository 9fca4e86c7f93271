// The dense map's PNG: decoded here by the format's rules (chunks with their
// CRCs, the zlib stream's stored blocks and Adler-32), the pixels and palette
// must come back exactly.
#include "html/png_image.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace mx2nv {
namespace {

std::vector<std::uint8_t> unbase64(const std::string& text) {
  const std::string digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::vector<std::uint8_t> out;
  std::uint32_t acc = 0;
  int bits = 0;
  for (const char c : text) {
    if (c == '=') break;
    const auto d = digits.find(c);
    EXPECT_NE(d, std::string::npos);
    acc = (acc << 6) | static_cast<std::uint32_t>(d);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<std::uint8_t>(acc >> bits));
    }
  }
  return out;
}

std::uint32_t be32(const std::vector<std::uint8_t>& b, std::size_t at) {
  return (std::uint32_t{b[at]} << 24) | (std::uint32_t{b[at + 1]} << 16) | (std::uint32_t{b[at + 2]} << 8) | b[at + 3];
}

std::uint32_t crc32_bitwise(const std::uint8_t* p, std::size_t n) {  // no table: a second way to the same CRC
  std::uint32_t crc = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

struct Decoded {
  std::uint32_t width = 0, height = 0;
  std::vector<std::uint8_t> palette, pixels;
};

Decoded decode(const std::string& uri) {
  const std::string prefix = "data:image/png;base64,";
  EXPECT_EQ(uri.substr(0, prefix.size()), prefix);
  const auto png = unbase64(uri.substr(prefix.size()));
  const std::vector<std::uint8_t> signature = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  EXPECT_EQ(std::vector<std::uint8_t>(png.begin(), png.begin() + 8), signature);
  Decoded d;
  std::vector<std::uint8_t> z;
  std::size_t at = 8;
  std::string last;
  while (at < png.size()) {
    const std::uint32_t n = be32(png, at);
    const std::string type(png.begin() + static_cast<std::ptrdiff_t>(at + 4), png.begin() + static_cast<std::ptrdiff_t>(at + 8));
    EXPECT_EQ(be32(png, at + 8 + n), crc32_bitwise(&png[at + 4], n + 4)) << type;
    const auto data = png.begin() + static_cast<std::ptrdiff_t>(at + 8);
    if (type == "IHDR") {
      d.width = be32(png, at + 8);
      d.height = be32(png, at + 12);
      EXPECT_EQ(std::vector<std::uint8_t>(data + 8, data + 13), (std::vector<std::uint8_t>{8, 3, 0, 0, 0}));
    } else if (type == "PLTE") {
      d.palette.assign(data, data + n);
    } else if (type == "IDAT") {
      z.insert(z.end(), data, data + n);
    }
    last = type;
    at += 12 + n;
  }
  EXPECT_EQ(last, "IEND");
  // zlib: header, stored blocks, Adler-32 of the raw bytes.
  EXPECT_EQ((z[0] * 256 + z[1]) % 31, 0);
  std::vector<std::uint8_t> raw;
  std::size_t p = 2;
  for (bool final = false; !final;) {
    final = z[p] & 1;
    EXPECT_EQ(z[p] >> 1, 0) << "stored block";
    const std::size_t len = z[p + 1] | (std::size_t{z[p + 2]} << 8);
    const std::size_t nlen = z[p + 3] | (std::size_t{z[p + 4]} << 8);
    EXPECT_EQ(len ^ 0xFFFF, nlen);
    raw.insert(raw.end(), z.begin() + static_cast<std::ptrdiff_t>(p + 5), z.begin() + static_cast<std::ptrdiff_t>(p + 5 + len));
    p += 5 + len;
  }
  std::uint32_t a = 1, b = 0;
  for (const auto v : raw) {
    a = (a + v) % 65521;
    b = (b + a) % 65521;
  }
  EXPECT_EQ(be32(z, p), (b << 16) | a);
  EXPECT_EQ(p + 4, z.size());
  EXPECT_EQ(raw.size(), std::size_t{d.height} * (d.width + 1));
  for (std::uint32_t y = 0; y < d.height; ++y) {
    const auto row = raw.begin() + static_cast<std::ptrdiff_t>(std::size_t{y} * (d.width + 1));
    EXPECT_EQ(*row, 0) << "filter type";
    d.pixels.insert(d.pixels.end(), row + 1, row + 1 + d.width);
  }
  return d;
}

TEST(PngImage, PixelsAndPaletteComeBackExactly) {
  PaletteImage image;
  image.width = 3;
  image.height = 2;
  image.palette = {{1, 2, 3}, {250, 128, 7}, {0, 0, 0}};
  image.pixels = {0, 1, 2, 2, 1, 0};
  const Decoded d = decode(png_data_uri(image));
  EXPECT_EQ(d.width, 3u);
  EXPECT_EQ(d.height, 2u);
  EXPECT_EQ(d.palette, (std::vector<std::uint8_t>{1, 2, 3, 250, 128, 7, 0, 0, 0}));
  EXPECT_EQ(d.pixels, image.pixels);
}

TEST(PngImage, ImagesLargerThanOneStoredBlock) {
  PaletteImage image;  // K3's map: 92 layers x 896 experts, more than 65,535 bytes of rows
  image.width = 896;
  image.height = 92;
  for (int i = 0; i < 256; ++i) image.palette.push_back({static_cast<std::uint8_t>(i), 0, static_cast<std::uint8_t>(255 - i)});
  for (std::size_t i = 0; i < 896u * 92u; ++i) image.pixels.push_back(static_cast<std::uint8_t>((i * 7919) % 256));
  const Decoded d = decode(png_data_uri(image));
  EXPECT_EQ(d.width, 896u);
  EXPECT_EQ(d.height, 92u);
  EXPECT_EQ(d.pixels, image.pixels);
  EXPECT_EQ(d.palette.size(), 256u * 3);
}

TEST(PngImage, InconsistentImagesAreBugs) {
  PaletteImage image;
  image.width = 2;
  image.height = 2;
  image.palette = {{0, 0, 0}};
  image.pixels = {0, 0, 0};  // one short
  EXPECT_THROW(png_data_uri(image), std::logic_error);
  image.pixels.push_back(0);
  image.palette.clear();
  EXPECT_THROW(png_data_uri(image), std::logic_error);
}

}  // namespace
}  // namespace mx2nv

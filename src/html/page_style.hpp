// What every mx2nv HTML page shares (the command reports, compare's page):
// the head with its inline style and content security policy, and the
// escaping of untrusted text.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace mx2nv {

// Names come from a hostile checkpoint: control bytes escaped (printable),
// then HTML's special characters.
std::string html_escape(std::string_view raw);

// <!DOCTYPE html> through <body>: meta tags, the escaped title, the style.
std::string page_preamble(std::string_view title);

// "#rrggbb" as its three bytes (a palette entry of a map's image).
std::array<std::uint8_t, 3> rgb(std::string_view hex);

// Where a layers x experts map's cells go: cells sized to fit about 960 x
// 480 pixels (2-18 wide, 3-18 high), after room for the axis labels.
struct MapGrid {
  static constexpr int left = 48, top = 18;
  std::uint64_t layers = 0, experts = 0;
  int cw = 0, ch = 0;
  MapGrid(std::uint64_t layer_count, std::uint64_t expert_count);
  std::int64_t x(std::uint64_t expert) const { return left + cw * static_cast<std::int64_t>(expert); }
  std::int64_t y(std::uint64_t layer) const { return top + ch * static_cast<std::int64_t>(layer); }
  std::int64_t cells_width() const { return x(experts) - left; }
  std::int64_t cells_height() const { return y(layers) - top; }
  std::int64_t width() const { return x(experts) + 4; }
  std::int64_t height() const { return y(layers) + 4; }
};

}  // namespace mx2nv

#include "html/page_style.hpp"

#include "common/printable.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <string>

namespace mx2nv {
namespace {

constexpr std::string_view kStyle = R"(<style>
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1100px;padding:0 16px;color:#111827;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #e5e7eb;padding-bottom:4px}
h3{font-size:14px;margin:16px 0 6px;font-family:ui-monospace,monospace;font-weight:600}
.badge{display:inline-block;padding:2px 10px;border-radius:12px;font-weight:600;color:#fff;vertical-align:middle}
.ok{background:#15803d}.refused,.mismatch,.error{background:#b91c1c}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}.card{border:1px solid #e5e7eb;border-radius:8px;padding:8px 12px;min-width:130px}
.card b{display:block;font-size:18px}.card span{color:#6b7280;font-size:12px}
table{border-collapse:collapse;width:100%;font-size:13px}td,th{border-bottom:1px solid #f3f4f6;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f9fafb}td.num{text-align:right;font-variant-numeric:tabular-nums}
code,.mono{font-family:ui-monospace,monospace;font-size:12px;word-break:break-all}
.heatmap{max-width:100%;height:auto;display:block}.heatmap .axis{font:9px sans-serif;fill:#6b7280}.heatmap .empty{fill:#f9fafb}
.heatmap .refused{stroke:#7f1d1d;stroke-width:.6}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px;color:#374151;margin:6px 0 10px}.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px;border-radius:2px}
.note{background:#fffbeb;border:1px solid #fde68a;border-radius:6px;padding:8px 12px}
.err{background:#fef2f2;border:1px solid #fecaca;border-radius:6px;padding:8px 12px;white-space:pre-wrap}
</style></head><body>
)";

}  // namespace

std::string html_escape(std::string_view raw) {
  const std::string text = printable(raw);
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string page_preamble(std::string_view title) {
  std::string html = R"(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; img-src data:">
)";
  html += fmt::format("<title>{}</title>\n", html_escape(title));
  html += kStyle;
  return html;
}

std::array<std::uint8_t, 3> rgb(std::string_view hex) {
  const auto byte = [&](std::size_t at) {
    return static_cast<std::uint8_t>(std::stoi(std::string(hex.substr(at, 2)), nullptr, 16));
  };
  return {byte(1), byte(3), byte(5)};
}

MapGrid::MapGrid(std::uint64_t layer_count, std::uint64_t expert_count)
    : layers(layer_count),
      experts(expert_count),
      cw(static_cast<int>(std::clamp<std::uint64_t>(960 / std::max<std::uint64_t>(expert_count, 1), 2, 18))),
      ch(static_cast<int>(std::clamp<std::uint64_t>(480 / std::max<std::uint64_t>(layer_count, 1), 3, 18))) {}

}  // namespace mx2nv

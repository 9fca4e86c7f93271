#include "html/compare_page.hpp"

#include "compare/compare_json.hpp"
#include "html/page_style.hpp"
#include "html/png_image.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <tuple>

namespace mx2nv {
namespace {

constexpr std::size_t kMaxListedModules = 500;
// Above this many cells a map is drawn as an image (dense_heatmap): a shape
// per module would grow the page with the module count (K3: 92 layers x 896
// experts per projection).
constexpr std::size_t kMaxCellShapes = 4'096;
// Shades of the relative RMSE scale in the image's palette.
constexpr int kImageShades = 64;
constexpr const char* kExactColor = "#15803d";
constexpr const char* kUndefinedColor = "#7c3aed";  // SRC all zero, OTHER not
// Relative RMSE is drawn on a log scale from 10^kLowDecade (light) to 10^0 (dark red).
constexpr double kLowDecade = -6;

std::optional<double> rmse_of(const ModuleComparison& m) { return relative_rmse(m.sums.sum_d2, m.sums.sum_s2); }

std::string rmse_text(const std::optional<double>& r) { return r ? fmt::format("{:.3g}", *r) : "undefined"; }

// Where a relative RMSE sits on the drawn scale: 0 at 10^kLowDecade or
// below, 1 at 1 or above.
double rmse_position(double r) {
  return std::clamp((std::log10(std::max(r, 1e-300)) - kLowDecade) / -kLowDecade, 0.0, 1.0);
}

std::array<std::uint8_t, 3> rmse_rgb(double t) {
  const auto mix = [t](int a, int b) { return static_cast<std::uint8_t>(std::lround(a + (b - a) * t)); };
  return {mix(254, 127), mix(240, 29), mix(138, 29)};
}

std::string hex(const std::array<std::uint8_t, 3>& c) { return fmt::format("#{:02x}{:02x}{:02x}", c[0], c[1], c[2]); }

std::string rmse_color(const ModuleComparison& m) {
  if (m.sums.exact()) return kExactColor;
  const auto r = rmse_of(m);
  if (!r) return kUndefinedColor;
  return hex(rmse_rgb(rmse_position(*r)));
}

std::string card(const std::string& value, const std::string& label) {
  return fmt::format("<div class=\"card\"><b>{}</b><span>{}</span></div>", value, label);
}

// The map's grid, sized by the largest layer and expert present.
MapGrid grid_of(const std::vector<const ModuleComparison*>& cells) {
  std::uint64_t layers = 0, experts = 0;
  for (const auto* m : cells) {
    layers = std::max(layers, *m->layer + 1);
    experts = std::max(experts, *m->expert + 1);
  }
  return MapGrid(layers, experts);
}

std::string svg_open(std::string_view projection, const MapGrid& g, std::string_view drawn) {
  return fmt::format(
      "<h3>{}</h3><svg class=\"heatmap\" role=\"img\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "viewBox=\"0 0 {} {}\" data-projection=\"{}\" data-layers=\"{}\" data-experts=\"{}\" data-drawn=\"{}\"><title>{}: "
      "relative RMSE per layer (rows) and expert (columns)</title>",
      html_escape(projection), g.width(), g.height(), g.width(), g.height(), html_escape(projection), g.layers, g.experts,
      drawn, html_escape(projection));
}

std::string cell_title(const ModuleComparison& m) {
  return fmt::format("layer {}, expert {}: rel RMSE {}, {} of {} values exact{}\n{}", *m.layer, *m.expert,
                     rmse_text(rmse_of(m)), m.sums.exact_values, m.sums.values,
                     m.quantized ? "" : " (unquantized in OTHER)", html_escape(m.name));
}

std::string cell_shape(const MapGrid& g, const ModuleComparison& m) {
  return fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" class=\"cell\"><title>{}</title></rect>",
                     g.x(*m.expert), g.y(*m.layer), g.cw, g.ch, rmse_color(m), cell_title(m));
}

// A shape per module: small maps.
std::string heatmap(std::string_view projection, const std::vector<const ModuleComparison*>& cells) {
  const MapGrid g = grid_of(cells);
  std::string svg = svg_open(projection, g, "shapes");
  svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"empty\"/>", g.left, g.top,
                     g.cells_width(), g.cells_height());
  for (const auto* m : cells) svg += cell_shape(g, *m);
  return svg + "</svg>\n";
}

// A cell's class in a dense map: runs of one class in a layer are one shape.
enum class CellClass { Exact, Differs, Undefined };
CellClass class_of(const ModuleComparison& m) {
  return m.sums.exact() ? CellClass::Exact : rmse_of(m) ? CellClass::Differs : CellClass::Undefined;
}

// A map too dense for a shape per module: the cells as an image, one pixel
// per module in its colour; over it, per layer, one transparent shape per run
// of modules of one class (its title: layer, experts and rel RMSE range), and
// the `outlined` modules (the worst) as shapes of their own, named in their
// titles. `cells` are sorted by layer, then expert.
std::string dense_heatmap(std::string_view projection, const std::vector<const ModuleComparison*>& cells,
                          const std::vector<const ModuleComparison*>& outlined) {
  const MapGrid g = grid_of(cells);
  std::string svg = svg_open(projection, g, "image");
  // Palette: 0 no module, 1 exact, 2 undefined, 3 + i the RMSE scale's shade i.
  PaletteImage image;
  image.width = static_cast<std::uint32_t>(g.experts);
  image.height = static_cast<std::uint32_t>(g.layers);
  image.palette = {{0xf9, 0xfa, 0xfb}, rgb(kExactColor), rgb(kUndefinedColor)};
  for (int i = 0; i < kImageShades; ++i) image.palette.push_back(rmse_rgb(i / double(kImageShades - 1)));
  image.pixels.assign(static_cast<std::size_t>(g.experts * g.layers), 0);
  for (const auto* m : cells) {
    const CellClass c = class_of(*m);
    const std::uint8_t index =
        c == CellClass::Exact       ? 1
        : c == CellClass::Undefined ? 2
                                    : static_cast<std::uint8_t>(3 + std::lround(rmse_position(*rmse_of(*m)) * (kImageShades - 1)));
    image.pixels[static_cast<std::size_t>(*m->layer * g.experts + *m->expert)] = index;
  }
  svg += fmt::format("<image x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" preserveAspectRatio=\"none\" "
                     "style=\"image-rendering:pixelated\" href=\"{}\"/>",
                     g.left, g.top, g.cells_width(), g.cells_height(), png_data_uri(image));
  for (std::size_t i = 0; i < cells.size();) {
    const ModuleComparison& first = *cells[i];
    const CellClass c = class_of(first);
    double lo = rmse_of(first).value_or(0), hi = lo;
    std::size_t j = i + 1;
    for (; j < cells.size() && *cells[j]->layer == *first.layer && *cells[j]->expert == *cells[j - 1]->expert + 1 &&
           class_of(*cells[j]) == c;
         ++j) {
      lo = std::min(lo, rmse_of(*cells[j]).value_or(0));
      hi = std::max(hi, rmse_of(*cells[j]).value_or(0));
    }
    const std::uint64_t e0 = *first.expert, e1 = *cells[j - 1]->expert;
    const std::string experts = e0 == e1 ? fmt::format("expert {}", e0) : fmt::format("experts {}-{}", e0, e1);
    const std::string what = c == CellClass::Exact       ? std::string("exact")
                             : c == CellClass::Undefined ? std::string("rel RMSE undefined (SRC all zero)")
                             : lo == hi                  ? fmt::format("rel RMSE {}", rmse_text(lo))
                                                         : fmt::format("rel RMSE {}-{}", rmse_text(lo), rmse_text(hi));
    svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"transparent\" class=\"run\"><title>layer {}, {}: "
                       "{}{}</title></rect>",
                       g.x(e0), g.y(*first.layer), g.cw * static_cast<std::int64_t>(e1 - e0 + 1), g.ch, *first.layer,
                       experts, what, e0 == e1 ? "\n" + html_escape(first.name) : "");
    i = j;
  }
  for (const auto* m : outlined) svg += cell_shape(g, *m);
  return svg + "</svg>\n";
}

// Under a dense map, as text a reader can search: per layer, its modules,
// how many are exact, the layer's relative RMSE and its worst module's.
std::string layer_summaries(const std::vector<const ModuleComparison*>& cells) {
  std::string html = "<details class=\"layers\"><summary>Per layer: modules, exact modules, relative RMSE</summary><table>"
                     "<tr><th>layer</th><th>modules</th><th>exact</th><th>rel RMSE</th><th>worst module</th>"
                     "<th>its rel RMSE</th></tr>";
  for (std::size_t i = 0; i < cells.size();) {
    const std::uint64_t layer = *cells[i]->layer;
    CompareSums sums;
    std::uint64_t modules = 0, exact = 0;
    const ModuleComparison* worst = nullptr;
    for (; i < cells.size() && *cells[i]->layer == layer; ++i) {
      const ModuleComparison& m = *cells[i];
      ++modules;
      exact += m.sums.exact() ? 1u : 0u;
      sums.sum_d2 += m.sums.sum_d2;
      sums.sum_s2 += m.sums.sum_s2;
      const double r = rmse_of(m).value_or(std::numeric_limits<double>::infinity());
      if (!m.sums.exact() && (!worst || r > rmse_of(*worst).value_or(std::numeric_limits<double>::infinity()))) worst = &m;
    }
    html += fmt::format("<tr><td>layer {}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>"
                        "<td><code>{}</code></td><td class=\"num\">{}</td></tr>",
                        layer, modules, exact, rmse_text(relative_rmse(sums.sum_d2, sums.sum_s2)),
                        worst ? html_escape(worst->name) : std::string("-"), worst ? rmse_text(rmse_of(*worst)) : "-");
  }
  return html + "</table></details>\n";
}

std::string legend() {
  std::string out = fmt::format("<div class=\"legend\"><span><i style=\"background:{}\"></i>exact</span>", kExactColor);
  for (int d = static_cast<int>(kLowDecade); d <= 0; ++d) {
    ModuleComparison probe;
    probe.sums.values = 1;
    probe.sums.sum_d2 = std::pow(10.0, 2 * d);
    probe.sums.sum_s2 = 1;
    out += fmt::format("<span><i style=\"background:{}\"></i>1e{}</span>", rmse_color(probe), d);
  }
  return out + fmt::format("<span>relative RMSE</span><span><i style=\"background:{}\"></i>undefined (SRC all zero)"
                           "</span></div>\n", kUndefinedColor);
}

std::string figures_row(std::string_view label, const CompareSums& s) {
  return fmt::format(
      "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>"
      "<td class=\"num\">{:.9f}</td><td class=\"num\">{:.3g}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
      html_escape(label), s.values, s.exact_values, rmse_text(relative_rmse(s.sum_d2, s.sum_s2)),
      cosine_similarity(s.exact(), s.sum_os, s.sum_o2, s.sum_s2), s.max_abs_error, s.zero_sign_rewrites,
      s.active_block_scales_below_min_normal);
}

constexpr std::string_view kFiguresHead =
    "<table><tr><th></th><th>values</th><th>exact</th><th>rel RMSE</th><th>cosine</th><th>max abs error</th>"
    "<th>zero-sign rewrites</th><th>active scales &lt; 2<sup>-6</sup></th></tr>";

std::string name_list(std::string_view title, const std::vector<std::string>& names) {
  if (names.empty()) return {};
  std::string out = fmt::format("<h2>{} ({})</h2><ul>", html_escape(title), names.size());
  for (std::size_t i = 0; i < names.size() && i < kMaxListedModules; ++i) {
    out += "<li><code>" + html_escape(names[i]) + "</code></li>";
  }
  return out + "</ul>\n";
}

}  // namespace

std::string render_compare_html(const CompareResult& r) {
  const bool exact = r.exit_code() == 0;
  std::string html = page_preamble(fmt::format("mx2nv compare report: {}", exact ? "exact" : "different"));
  html += fmt::format("<h1>mx2nv compare <span class=\"badge {}\">{}</span></h1>\n", exact ? "ok" : "mismatch",
                      exact ? "exact" : "different");
  html += fmt::format("<div class=\"mono\">{} &rarr; {}</div>\n", html_escape(r.source.string()),
                      html_escape(r.other.string()));
  const CompareSums t = compare_totals(r);
  html += "<div class=\"cards\">";
  html += card(r.format == OtherFormat::CompressedTensors ? "compressed-tensors" : "ModelOpt", "format of OTHER");
  html += card(compare_activations(r), "activations");
  html += card(fmt::format("{}", r.modules.size()), "modules compared");
  html += card(rmse_text(relative_rmse(t.sum_d2, t.sum_s2)), "relative RMSE");
  html += card(fmt::format("{:.4f}%", t.values ? 100.0 * static_cast<double>(t.exact_values) /
                                                     static_cast<double>(t.values) : 100.0), "values exact");
  html += card(fmt::format("{:.2f} s", r.seconds), "wall time");
  html += "</div>\n<h2>Totals</h2>" + std::string(kFiguresHead) + figures_row("total", t);
  for (const std::string_view p : {"gate", "up", "down", "other"}) {
    const CompareSums s = compare_totals(r, p);
    if (s.values) html += figures_row(p, s);
  }
  html += "</table>\n<h2>Relative RMSE by layer and expert</h2>" + legend();
  std::vector<const ModuleComparison*> worst;
  for (const auto& m : r.modules) {
    if (!m.sums.exact()) worst.push_back(&m);
  }
  const auto key = [](const ModuleComparison* m) { return rmse_of(*m).value_or(std::numeric_limits<double>::infinity()); };
  std::stable_sort(worst.begin(), worst.end(), [&](auto* a, auto* b) { return key(a) > key(b); });
  const std::set<const ModuleComparison*> listed(worst.begin(), worst.begin() + static_cast<std::ptrdiff_t>(std::min(worst.size(), kMaxListedModules)));
  for (const std::string_view p : {"gate", "up", "down"}) {
    std::vector<const ModuleComparison*> cells;
    for (const auto& m : r.modules) {
      if (m.layer && m.projection == p) cells.push_back(&m);
    }
    if (cells.empty()) continue;
    if (cells.size() <= kMaxCellShapes) {
      html += heatmap(p, cells);
      continue;
    }
    std::sort(cells.begin(), cells.end(), [](auto* a, auto* b) { return std::tie(*a->layer, *a->expert) < std::tie(*b->layer, *b->expert); });
    std::vector<const ModuleComparison*> outlined;
    for (const auto* m : cells) {
      if (listed.count(m)) outlined.push_back(m);
    }
    html += dense_heatmap(p, cells, outlined) + layer_summaries(cells);
  }
  if (!worst.empty()) {
    html += fmt::format("<h2>Modules that differ ({}, worst first)</h2>", worst.size()) + std::string(kFiguresHead);
    for (std::size_t i = 0; i < worst.size() && i < kMaxListedModules; ++i) html += figures_row(worst[i]->name, worst[i]->sums);
    html += "</table>\n";
  }
  html += name_list("Missing in OTHER", r.missing_in_other);
  html += name_list("Extra in OTHER", r.extra_in_other);
  std::vector<std::string> unquantized;
  for (const auto& m : r.modules) {
    if (!m.quantized) unquantized.emplace_back(m.name);
  }
  html += name_list("Unquantized in OTHER", unquantized);
  return html + "</body></html>\n";
}

}  // namespace mx2nv

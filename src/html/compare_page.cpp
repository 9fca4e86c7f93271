#include "html/compare_page.hpp"

#include "compare/compare_json.hpp"
#include "html/page_style.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

namespace mx2nv {
namespace {

constexpr std::size_t kMaxListedModules = 500;
constexpr const char* kExactColor = "#15803d";
constexpr const char* kUndefinedColor = "#7c3aed";  // SRC all zero, OTHER not
// Relative RMSE is drawn on a log scale from 10^kLowDecade (light) to 10^0 (dark red).
constexpr double kLowDecade = -6;

std::optional<double> rmse_of(const ModuleComparison& m) { return relative_rmse(m.sums.sum_d2, m.sums.sum_s2); }

std::string rmse_text(const std::optional<double>& r) { return r ? fmt::format("{:.3g}", *r) : "undefined"; }

std::string rmse_color(const ModuleComparison& m) {
  if (m.sums.exact()) return kExactColor;
  const auto r = rmse_of(m);
  if (!r) return kUndefinedColor;
  const double t = std::clamp((std::log10(std::max(*r, 1e-300)) - kLowDecade) / -kLowDecade, 0.0, 1.0);
  const auto mix = [t](int a, int b) { return static_cast<int>(std::lround(a + (b - a) * t)); };
  return fmt::format("#{:02x}{:02x}{:02x}", mix(254, 127), mix(240, 29), mix(138, 29));
}

std::string card(const std::string& value, const std::string& label) {
  return fmt::format("<div class=\"card\"><b>{}</b><span>{}</span></div>", value, label);
}

std::string heatmap(std::string_view projection, const std::vector<const ModuleComparison*>& cells) {
  std::uint64_t layers = 0, experts = 0;
  for (const auto* m : cells) {
    layers = std::max(layers, *m->layer + 1);
    experts = std::max(experts, *m->expert + 1);
  }
  const int cw = static_cast<int>(std::clamp<std::uint64_t>(960 / std::max<std::uint64_t>(experts, 1), 2, 18));
  const int ch = static_cast<int>(std::clamp<std::uint64_t>(480 / std::max<std::uint64_t>(layers, 1), 3, 18));
  const int left = 48, top = 18;
  const auto width = left + cw * static_cast<std::int64_t>(experts) + 4;
  const auto height = top + ch * static_cast<std::int64_t>(layers) + 4;
  std::string svg = fmt::format(
      "<h3>{}</h3><svg class=\"heatmap\" role=\"img\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "viewBox=\"0 0 {} {}\" data-projection=\"{}\" data-layers=\"{}\" data-experts=\"{}\"><title>{}: relative RMSE "
      "per layer (rows) and expert (columns)</title>",
      html_escape(projection), width, height, width, height, html_escape(projection), layers, experts,
      html_escape(projection));
  svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"empty\"/>", left, top,
                     cw * static_cast<std::int64_t>(experts), ch * static_cast<std::int64_t>(layers));
  for (const auto* m : cells) {
    svg += fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" class=\"cell\"><title>layer {}, expert {}: "
        "rel RMSE {}, {} of {} values exact{}\n{}</title></rect>",
        left + cw * static_cast<std::int64_t>(*m->expert), top + ch * static_cast<std::int64_t>(*m->layer), cw, ch,
        rmse_color(*m), *m->layer, *m->expert, rmse_text(rmse_of(*m)), m->sums.exact_values, m->sums.values,
        m->quantized ? "" : " (unquantized in OTHER)", html_escape(m->name));
  }
  return svg + "</svg>\n";
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
  std::map<std::string, std::vector<const ModuleComparison*>> grids;
  for (const auto& m : r.modules) {
    if (m.layer) grids[std::string(m.projection)].push_back(&m);
  }
  for (const std::string_view p : {"gate", "up", "down"}) {
    if (const auto it = grids.find(std::string(p)); it != grids.end()) html += heatmap(p, it->second);
  }
  std::vector<const ModuleComparison*> worst;
  for (const auto& m : r.modules) {
    if (!m.sums.exact()) worst.push_back(&m);
  }
  const auto key = [](const ModuleComparison* m) { return rmse_of(*m).value_or(std::numeric_limits<double>::infinity()); };
  std::stable_sort(worst.begin(), worst.end(), [&](auto* a, auto* b) { return key(a) > key(b); });
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

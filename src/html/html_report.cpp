#include "html/html_report.hpp"

#include "html/page_style.hpp"
#include "common/error.hpp"
#include "common/printable.hpp"
#include "html/png_image.hpp"
#include "model/module_names.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <set>
#include <string>

namespace mx2nv {
namespace {

constexpr std::size_t kMaxListedModules = 500;  // a table longer than this helps nobody; the count is shown
// Above this many runs of equal cells a map is drawn as an image with shapes
// for runs of one class and for the refused and constrained modules
// (dense_heatmap_svg): a shape per run grows the page with the module count.
constexpr std::size_t kMaxRunShapes = 4'096;
constexpr const char* kAllZeroColor = "#d1d5db";
constexpr const char* kConstrainedColor = "#f59e0b";
constexpr const char* kRefusedColor = "#dc2626";

std::string esc(std::string_view raw) { return html_escape(raw); }

// Fits: light blue at span 0 to dark blue at the marlin limit.
std::string fits_color(int span) {
  const double t = std::clamp(static_cast<double>(span) / window_limits(Window::Marlin).max_span(), 0.0, 1.0);
  const auto mix = [t](int a, int b) { return static_cast<int>(std::lround(a + (b - a) * t)); };
  return fmt::format("#{:02x}{:02x}{:02x}", mix(219, 30), mix(234, 64), mix(254, 175));
}

std::string cell_color(SpanClass c, int span) {
  switch (c) {
    case SpanClass::AllZero: return kAllZeroColor;
    case SpanClass::Constrained: return kConstrainedColor;
    case SpanClass::Refused: return kRefusedColor;
    case SpanClass::Fits: break;
  }
  return fits_color(span);
}

const char* class_name(SpanClass c) {
  switch (c) {
    case SpanClass::AllZero: return "all-zero";
    case SpanClass::Fits: return "fits";
    case SpanClass::Constrained: return "constrained";
    case SpanClass::Refused: return "refused";
  }
  return "";
}

struct Cell {
  const ModuleSummary* module;
  SpanClass cls;
};

struct Heatmap {
  std::uint64_t layers = 0, experts = 0;
  std::map<std::pair<std::uint64_t, std::uint64_t>, Cell> cells;  // (layer, expert)
};

// A pattern's <svg> element and title; `attributes` (with a leading space)
// say how its cells are drawn.
std::string svg_open(const std::string& pattern, const MapGrid& g, std::string_view attributes) {
  return fmt::format(
      "<svg class=\"heatmap\" role=\"img\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "viewBox=\"0 0 {} {}\" data-pattern=\"{}\" data-layers=\"{}\" data-experts=\"{}\"{}>"
      "<title>{}: exponent span per layer (rows) and expert (columns)</title>",
      g.width(), g.height(), g.width(), g.height(), esc(pattern), g.layers, g.experts, attributes, esc(pattern));
}

// One SVG per module pattern; horizontal runs of identical cells share one
// rect (and one tooltip), which keeps a map of hundreds of experts per
// layer small.
std::string heatmap_svg(const std::string& pattern, const Heatmap& h) {
  const MapGrid g(h.layers, h.experts);
  const int cw = g.cw, ch = g.ch, left = g.left, top = g.top;
  std::string svg = svg_open(pattern, g, "");
  svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"empty\"/>", left, top,
                     cw * static_cast<int>(h.experts), ch * static_cast<int>(h.layers));
  const std::uint64_t label_every_layer = std::max<std::uint64_t>(1, (h.layers + 15) / 16);
  const std::uint64_t label_every_expert = std::max<std::uint64_t>(1, (h.experts * 8 + 479) / 480 * 4);
  for (std::uint64_t e = 0; e < h.experts; e += label_every_expert) {
    svg += fmt::format("<text x=\"{}\" y=\"12\" class=\"axis\">{}</text>", left + static_cast<int>(e) * cw, e);
  }
  for (std::uint64_t l = 0; l < h.layers; ++l) {
    const int y = top + static_cast<int>(l) * ch;
    if (l % label_every_layer == 0) {
      svg += fmt::format("<text x=\"{}\" y=\"{}\" class=\"axis\" text-anchor=\"end\">{}</text>", left - 4,
                         y + std::min(ch, 10), l);
    }
    std::uint64_t e = 0;
    while (e < h.experts) {
      const auto it = h.cells.find({l, e});
      if (it == h.cells.end()) {
        ++e;
        continue;
      }
      const Cell& c = it->second;
      std::uint64_t end = e + 1;
      for (;; ++end) {
        const auto next = h.cells.find({l, end});
        if (end >= h.experts || next == h.cells.end() || next->second.cls != c.cls ||
            next->second.module->span != c.module->span) {
          break;
        }
      }
      const std::string experts = end - e == 1 ? fmt::format("expert {}", e) : fmt::format("experts {}-{}", e, end - 1);
      const std::string what = c.cls == SpanClass::AllZero ? "all groups zero"
                                                           : fmt::format("span {} ({})", c.module->span, class_name(c.cls));
      svg += fmt::format(
          "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" class=\"cell {}\"><title>layer {}, {}: {}{}</title></rect>",
          left + static_cast<int>(e) * cw, y, cw * static_cast<int>(end - e), ch, cell_color(c.cls, c.module->span),
          class_name(c.cls), l, experts, what, end - e == 1 ? "\n" + esc(c.module->name) : "");
      e = end;
    }
  }
  svg += "</svg>";
  return svg;
}

// Runs of equal cells (class and span) along each layer: the shapes
// heatmap_svg draws.
std::size_t span_runs(const Heatmap& h) {
  std::size_t runs = 0;
  const Cell* last = nullptr;
  std::pair<std::uint64_t, std::uint64_t> at{};
  for (const auto& [pos, c] : h.cells) {
    const bool joins = last && pos.first == at.first && pos.second == at.second + 1 && c.cls == last->cls &&
                       c.module->span == last->module->span;
    if (!joins) ++runs;
    last = &c;
    at = pos;
  }
  return runs;
}

// The axes' labels: every few experts along the top, every few layers down
// the left (as heatmap_svg places them).
std::string axis_labels(const Heatmap& h, int cw, int ch, int left, int top) {
  std::string svg;
  const std::uint64_t label_every_layer = std::max<std::uint64_t>(1, (h.layers + 15) / 16);
  const std::uint64_t label_every_expert = std::max<std::uint64_t>(1, (h.experts * 8 + 479) / 480 * 4);
  for (std::uint64_t e = 0; e < h.experts; e += label_every_expert) {
    svg += fmt::format("<text x=\"{}\" y=\"12\" class=\"axis\">{}</text>", left + static_cast<int>(e) * cw, e);
  }
  for (std::uint64_t l = 0; l < h.layers; l += label_every_layer) {
    svg += fmt::format("<text x=\"{}\" y=\"{}\" class=\"axis\" text-anchor=\"end\">{}</text>", left - 4,
                       top + static_cast<int>(l) * ch + std::min(ch, 10), l);
  }
  return svg;
}

// A map too dense for a shape per run of equal cells (K3: 92 layers x 896
// experts per pattern): the cells as an image, one pixel per module in its
// colour, and over it, per layer, one transparent shape per run of modules of
// one class (its title: layer, experts, class and span range), and every
// refused or constrained module as a shape of its own, named in its title.
std::string dense_heatmap_svg(const std::string& pattern, const Heatmap& h) {
  const MapGrid g(h.layers, h.experts);
  const int cw = g.cw, ch = g.ch, left = g.left, top = g.top;
  std::string svg = svg_open(pattern, g, " data-drawn=\"image\"");
  // Palette: 0 no module, 1 all-zero, 2 constrained, 3 refused, 4 + s fits with span s.
  PaletteImage image;
  image.width = static_cast<std::uint32_t>(h.experts);
  image.height = static_cast<std::uint32_t>(h.layers);
  image.palette = {{0xf9, 0xfa, 0xfb}, rgb(kAllZeroColor), rgb(kConstrainedColor), rgb(kRefusedColor)};
  const int max_fits = window_limits(Window::Marlin).max_span();
  for (int span = 0; span <= max_fits; ++span) image.palette.push_back(rgb(fits_color(span)));
  image.pixels.assign(static_cast<std::size_t>(h.experts * h.layers), 0);
  for (const auto& [pos, c] : h.cells) {
    const std::uint8_t index = c.cls == SpanClass::AllZero       ? 1
                               : c.cls == SpanClass::Constrained ? 2
                               : c.cls == SpanClass::Refused     ? 3
                                                                 : static_cast<std::uint8_t>(4 + std::clamp(c.module->span, 0, max_fits));
    image.pixels[static_cast<std::size_t>(pos.first * h.experts + pos.second)] = index;
  }
  svg += fmt::format("<image x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" preserveAspectRatio=\"none\" "
                     "style=\"image-rendering:pixelated\" href=\"{}\"/>",
                     left, top, cw * static_cast<int>(h.experts), ch * static_cast<int>(h.layers), png_data_uri(image));
  svg += axis_labels(h, cw, ch, left, top);
  const auto shape = [&](std::uint64_t l, std::uint64_t e, std::uint64_t end, const char* cls, const std::string& fill,
                         const std::string& title) {
    svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" class=\"cell {}\"><title>{}</title></rect>",
                       left + static_cast<int>(e) * cw, top + static_cast<int>(l) * ch, cw * static_cast<int>(end - e), ch,
                       fill, cls, title);
  };
  auto it = h.cells.begin();
  while (it != h.cells.end()) {
    const auto [l, e] = it->first;
    const Cell& c = it->second;
    if (c.cls == SpanClass::Refused || c.cls == SpanClass::Constrained) {
      shape(l, e, e + 1, class_name(c.cls), cell_color(c.cls, c.module->span),
            fmt::format("layer {}, expert {}: span {} ({})\n{}", l, e, c.module->span, class_name(c.cls), esc(c.module->name)));
      ++it;
      continue;
    }
    int lo = c.module->span, hi = lo;
    std::uint64_t end = e + 1;
    for (++it; it != h.cells.end() && it->first.first == l && it->first.second == end && it->second.cls == c.cls; ++it, ++end) {
      lo = std::min(lo, it->second.module->span);
      hi = std::max(hi, it->second.module->span);
    }
    const std::string experts = end - e == 1 ? fmt::format("expert {}", e) : fmt::format("experts {}-{}", e, end - 1);
    const std::string what = c.cls == SpanClass::AllZero ? std::string("all groups zero")
                             : lo == hi ? fmt::format("span {} ({})", lo, class_name(c.cls))
                                        : fmt::format("spans {}-{} ({})", lo, hi, class_name(c.cls));
    shape(l, e, end, "run", "transparent",
          fmt::format("layer {}, {}: {}{}", l, experts, what, end - e == 1 ? "\n" + esc(c.module->name) : ""));
  }
  return svg + "</svg>";
}

// Under a dense map, as text a reader can search: per layer, its modules by
// class and their span range.
std::string layer_summaries(const Heatmap& h) {
  struct Summary {
    std::array<std::uint64_t, 4> classes{};  // SpanClass order
    int lo = 0, hi = 0;
    bool any_span = false;
  };
  std::map<std::uint64_t, Summary> layers;
  for (const auto& [pos, c] : h.cells) {
    Summary& s = layers[pos.first];
    ++s.classes[static_cast<std::size_t>(c.cls)];
    if (c.cls == SpanClass::AllZero) continue;
    s.lo = s.any_span ? std::min(s.lo, c.module->span) : c.module->span;
    s.hi = s.any_span ? std::max(s.hi, c.module->span) : c.module->span;
    s.any_span = true;
  }
  std::string html = "<details class=\"layers\"><summary>Per layer: modules by class and span range</summary><table>"
                     "<tr><th>layer</th><th>modules</th><th>spans</th><th>fits</th><th>constrained</th><th>refused</th>"
                     "<th>all-zero</th></tr>";
  for (const auto& [l, s] : layers) {
    const std::uint64_t n = s.classes[0] + s.classes[1] + s.classes[2] + s.classes[3];
    html += fmt::format("<tr><td>layer {}</td><td class=\"num\">{}</td><td>{}</td><td class=\"num\">{}</td>"
                        "<td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
                        l, n, s.any_span ? fmt::format("{}-{}", s.lo, s.hi) : std::string("-"),
                        s.classes[static_cast<std::size_t>(SpanClass::Fits)],
                        s.classes[static_cast<std::size_t>(SpanClass::Constrained)],
                        s.classes[static_cast<std::size_t>(SpanClass::Refused)],
                        s.classes[static_cast<std::size_t>(SpanClass::AllZero)]);
  }
  return html + "</table></details>";
}

std::string legend(Window window) {
  std::string out = "<div class=\"legend\">";
  for (int s = 0; s <= window_limits(Window::Marlin).max_span(); s += 2) {
    out += fmt::format("<span><i style=\"background:{}\"></i>{}</span>", fits_color(s), s);
  }
  out += fmt::format("<span>span (fits)</span><span><i style=\"background:{}\"></i>constrained (span {}-{}: exact on disk, "
                     "Marlin zeroes its smallest scales)</span>",
                     kConstrainedColor, window_limits(Window::Marlin).max_span() + 1,
                     window_limits(Window::E4M3).max_span());
  out += fmt::format("<span><i style=\"background:{}\"></i>refused under window {} (span &gt; {})</span>", kRefusedColor,
                     window_name(window), window_limits(window).max_span());
  out += fmt::format("<span><i style=\"background:{}\"></i>all-zero module</span></div>", kAllZeroColor);
  return out;
}

std::string row(std::initializer_list<std::string> cells) {
  std::string out = "<tr>";
  for (const auto& c : cells) out += "<td>" + c + "</td>";
  return out + "</tr>";
}

// Modules listed by class: (module, class).
using Flagged = std::vector<std::pair<const ModuleSummary*, SpanClass>>;


std::string page_head(const Report& r) {
  std::string html = page_preamble(fmt::format("mx2nv {} report: {}", command_name(r.command), outcome_name(r.result)));
  html += fmt::format("<h1>mx2nv {} <span class=\"badge {}\">{}</span></h1>\n", esc(command_name(r.command)), esc(outcome_name(r.result)), esc(outcome_name(r.result)));
  html += fmt::format("<div class=\"mono\">{}{}</div>\n", esc(r.provenance.source),
                      r.provenance.target.empty() ? "" : " &rarr; " + esc(r.provenance.target));
  if (!r.error.empty()) html += fmt::format("<p class=\"err\">{}</p>\n", esc(r.error));
  return html;
}

std::string card(const std::string& value, const std::string& label) {
  return fmt::format("<div class=\"card\"><b>{}</b><span>{}</span></div>", value, label);
}

std::string summary_cards(const Report& r, const Inspection* in) {
  std::string html = "<div class=\"cards\">";
  html += card(esc(window_name(r.window)), fmt::format("window (span &le; {})", window_limits(r.window).max_span()));
  html += card(fmt::format("{}", r.modules), "quantized modules");
  html += card(fmt::format("{}", r.scale_groups), "global scales");
  html += card(fmt::format("{}", r.shards), "shards");
  if (in) html += card(fmt::format("{}", in->max_span), "widest span");
  if (r.command == Command::Verify) {
    html += card(fmt::format("{}", r.values_compared), "values compared");
    html += card(fmt::format("{}", r.mismatches), "value mismatches");
  }
  html += card(fmt::format("{:.2f} s", r.seconds), "wall time");
  html += "</div>\n";
  return html;
}

// One heatmap per module pattern (expert_position); fills `flagged` (refused
// or constrained) and `other` (off the grid) for the sections below.
std::string span_heatmaps(const HtmlReportInput& input, Flagged& flagged, Flagged& other) {
  const Report& r = *input.report;
  std::string html = "<h2>Exponent span per module</h2>\n";
  if (!input.inspection) {
    html += fmt::format("<p class=\"note\">Module spans are not available: {}</p>\n",
                        esc(input.spans_unavailable.empty() ? "SRC was not inspected" : input.spans_unavailable));
    return html;
  }
  html += fmt::format(
      "<p>Each cell is one module: the span k<sub>max</sub> &minus; k<sub>min</sub> of its active groups' exponents "
      "(k<sub>max</sub> of the global it shares), against the window limit {}. Hover a cell for the module.</p>\n",
      window_limits(r.window).max_span());
  html += legend(r.window);
  std::map<std::string, Heatmap> maps;
  for (const auto& m : input.inspection->modules) {
    const SpanClass cls = classify_span(m, r.window);
    if (cls == SpanClass::Refused || cls == SpanClass::Constrained) flagged.emplace_back(&m, cls);
    const auto pos = expert_position(m.name);
    if (!pos) {
      other.emplace_back(&m, cls);
      continue;
    }
    Heatmap& h = maps[pos->pattern];
    h.layers = std::max(h.layers, pos->layer + 1);
    h.experts = std::max(h.experts, pos->expert + 1);
    h.cells.emplace(std::pair{pos->layer, pos->expert}, Cell{&m, cls});
  }
  if (maps.empty()) html += "<p class=\"note\">No module is named like <code>layers.L.….experts.E.…</code>.</p>\n";
  for (const auto& [pattern, h] : maps) {
    html += fmt::format("<h3>{}</h3>\n{}\n", esc(pattern),
                        span_runs(h) > kMaxRunShapes ? dense_heatmap_svg(pattern, h) + "\n" + layer_summaries(h)
                                                     : heatmap_svg(pattern, h));
  }
  return html;
}

std::string refusals(const Report& r, const Flagged& flagged) {
  std::string html = "<h2>Refused and constrained modules</h2>\n";
  if (r.refused_spans.empty() && r.unrepresentable_globals.empty() && flagged.empty()) {
    return html + "<p>None: every module fits the marlin window.</p>\n";
  }
  html += "<table><tr><th>module</th><th>span</th><th>limit</th><th>status</th><th>active groups outside</th></tr>";
  std::set<std::string> listed;
  std::size_t rows = 0;
  for (const auto& o : r.refused_spans) {
    if (rows++ >= kMaxListedModules) break;
    listed.insert(o.module);
    html += row({"<code>" + esc(o.module) + "</code>", fmt::format("{}", o.span), fmt::format("{}", o.limit),
                 "<b style=\"color:#b91c1c\">refused</b>", fmt::format("{}", o.groups_outside)});
  }
  for (const auto& [m, cls] : flagged) {
    if (listed.count(std::string(m->name))) continue;
    if (rows++ >= kMaxListedModules) break;
    html += row({"<code>" + esc(m->name) + "</code>", fmt::format("{}", m->span),
                 fmt::format("{}", window_limits(r.window).max_span()),
                 cls == SpanClass::Refused ? "<b style=\"color:#b91c1c\">refused</b>"
                                           : "<b style=\"color:#b45309\">constrained</b>",
                 ""});
  }
  html += "</table>\n";
  const std::size_t total = std::max(r.refused_spans.size(), flagged.size());
  if (total > kMaxListedModules) html += fmt::format("<p>… {} more not listed.</p>\n", total - kMaxListedModules);
  for (const auto& g : r.unrepresentable_globals) {
    html += fmt::format("<p>Global scale of <code>{}</code> would not be a normal FP32 number (refused).</p>\n", esc(g));
  }
  return html;
}

std::string window_outcomes(const Report& r, const Inspection& in) {
  std::string html = "<h3>Outcome under each window</h3><table><tr><th>window</th><th>span limit</th><th>result</th>"
                     "<th>over-span modules</th><th>zero-group scales &rarr; 0x00</th><th>active groups Marlin zeroes</th></tr>";
  for (const auto& o : in.outcomes) {
    html += row({esc(window_name(o.window)) + (o.window == r.window ? " (selected)" : ""),
                 fmt::format("{}", window_limits(o.window).max_span()), o.refused ? "refused" : "ok",
                 fmt::format("{}", o.over_span.size()), fmt::format("{}", o.canonicalised_zero_groups),
                 fmt::format("{}", o.marlin_zeroed_groups)});
  }
  return html + "</table>\n";
}

std::string outside_grid(const Flagged& other) {
  std::string html = "<h3>Modules outside the layers &times; experts grid</h3><table><tr><th>module</th><th>span</th><th>status</th></tr>";
  for (std::size_t i = 0; i < other.size() && i < kMaxListedModules; ++i) {
    html += row({"<code>" + esc(other[i].first->name) + "</code>", fmt::format("{}", other[i].first->span),
                 class_name(other[i].second)});
  }
  html += "</table>\n";
  if (other.size() > kMaxListedModules) html += fmt::format("<p>… {} more.</p>\n", other.size() - kMaxListedModules);
  return html;
}

std::string size_section(const Report& r) {
  std::string html = "<h2>Size</h2>\n";
  const auto bytes = [](const Measured<std::uint64_t>& n) { return n ? human_bytes(*n) : std::string("not written"); };
  const auto count = [](const Measured<std::uint64_t>& n) { return n ? fmt::format("{}", *n) : std::string("not written"); };
  const auto change = r.size_change_percent();
  if (r.source_tensor_bytes.value_or(0) > 0) {
    const double a = static_cast<double>(*r.source_tensor_bytes);
    const double b = static_cast<double>(r.target_tensor_bytes.value_or(0));
    const double scale = 600.0 / std::max(a, b);
    html += fmt::format(
        "<svg class=\"size\" xmlns=\"http://www.w3.org/2000/svg\" width=\"760\" height=\"50\" viewBox=\"0 0 760 50\">"
        "<rect x=\"60\" y=\"4\" width=\"{:.1f}\" height=\"18\" fill=\"#9ca3af\"/><text x=\"0\" y=\"17\" font-size=\"12\">MXFP4</text>"
        "<text x=\"{:.1f}\" y=\"17\" font-size=\"12\">{}</text>"
        "<rect x=\"60\" y=\"28\" width=\"{:.1f}\" height=\"18\" fill=\"#2563eb\"/><text x=\"0\" y=\"41\" font-size=\"12\">NVFP4</text>"
        "<text x=\"{:.1f}\" y=\"41\" font-size=\"12\">{}</text></svg>\n",
        a * scale, 66 + a * scale, human_bytes(*r.source_tensor_bytes), b * scale, 66 + b * scale,
        bytes(r.target_tensor_bytes));
    html += fmt::format("<p>Tensor data {} &rarr; {}{}: FP8 block scales per 16 values instead of E8M0 per 32, "
                        "plus one FP32 global per module; packed FP4 bytes are unchanged.</p>\n",
                        human_bytes(*r.source_tensor_bytes), bytes(r.target_tensor_bytes),
                        change ? fmt::format(" ({:+.2f}%)", *change) : "");
  }
  // A convert that wrote nothing (refused) copied nothing: its counts of
  // what SRC holds are not what DST received.
  const bool wrote = r.command != Command::Convert || r.target_tensor_bytes.has_value();
  html += "<table>";
  html += row({"pass-through tensors copied", wrote ? count(r.passthrough_tensors) : "not written"});
  html += row({"companion files copied", wrote ? count(r.companion_files) : "not written"});
  if (r.active_groups && r.zero_groups && *r.active_groups + *r.zero_groups) {
    html += row({"active / all-zero 32-groups", fmt::format("{} / {}", *r.active_groups, *r.zero_groups)});
  }
  if (r.canonicalised_zero_groups) {
    html += row({"zero-group scales canonicalised to 0x00", count(r.canonicalised_zero_groups)});
  }
  if (r.marlin_zeroed_groups) html += row({"active groups Marlin would zero", count(r.marlin_zeroed_groups)});
  if (r.resumed_shards.value_or(0)) html += row({"shards reused by --resume", count(r.resumed_shards)});
  return html + "</table>\n";
}

// Only real verdicts, from mx2nv gate.
std::string runtime_verdicts(const HtmlReportInput& input) {
  std::string html = "<h2>Runtime verdicts</h2>\n";
  const GateResult* g = input.gate;
  if (!g) {
    return html + fmt::format("<p class=\"note\">Not available: {} Nothing here is a runtime verdict.</p>\n",
                              esc(input.gate_unavailable.empty() ? "no runtime was asked about this checkpoint."
                                                                 : input.gate_unavailable));
  }
  html += fmt::format("<p>From <code>mx2nv gate</code> on <code>{}</code> (TP 1; hidden {}, intermediate {}, {} experts "
                      "&times; {} MoE layers): will the pinned runtimes run it exactly?</p>\n",
                      esc(g->checkpoint), g->dims.hidden, g->dims.intermediate, g->dims.experts, g->dims.layers);
  html += "<table class=\"gate\"><tr><th>runtime</th><th>backend</th><th>GPUs</th><th>activations</th>"
          "<th>verdict</th><th>why</th></tr>";
  for (const Verdict& v : g->verdicts) {
    const char* color = v.kind == Verdict::Run ? "#15803d" : v.kind == Verdict::Blocked ? "#b91c1c" : "#b45309";
    std::string why;
    for (const auto& reason : v.reasons) why += (why.empty() ? "" : "<br>") + esc(reason);
    html += row({esc(fmt::format("{} {}", choice_name(v.backend->runtime), v.backend->version)), esc(choice_name(v.backend->backend)),
                 esc(v.backend->gpus), esc(choice_name(v.dtype)),
                 fmt::format("<b class=\"verdict\" style=\"color:{}\">{}</b>", color, esc(verdict_name(v.kind))), why});
  }
  return html + "</table>\n";
}

std::string provenance(const Report& r) {
  std::string html = "<h2>Provenance</h2><table>";
  html += row({"tool", "mx2nv " + esc(r.provenance.tool_version)});
  html += row({"command", esc(command_name(r.command))});
  html += row({"window", esc(window_name(r.window))});
  html += row({"source", "<code>" + esc(r.provenance.source) + "</code>"});
  if (!r.provenance.target.empty()) html += row({"target", "<code>" + esc(r.provenance.target) + "</code>"});
  html += row({"revision", r.provenance.revision ? "<code>" + esc(*r.provenance.revision) + "</code>" : "none (not a Hugging Face cache snapshot)"});
  return html + "</table>\n</body></html>\n";
}

}  // namespace

SpanClass classify_span(const ModuleSummary& m, Window window) {
  if (!m.k_max) return SpanClass::AllZero;
  if (m.span > window_limits(window).max_span()) return SpanClass::Refused;
  if (m.span > window_limits(Window::Marlin).max_span()) return SpanClass::Constrained;
  return SpanClass::Fits;
}

std::string render_html_report(const HtmlReportInput& input) {
  const Report& r = *input.report;
  const Inspection* in = input.inspection;
  std::string html = page_head(r);
  html += summary_cards(r, in);
  Flagged flagged, other;
  html += span_heatmaps(input, flagged, other);
  html += refusals(r, flagged);
  if (in) html += window_outcomes(r, *in);
  if (!other.empty()) html += outside_grid(other);
  html += size_section(r);
  if (!r.differences.empty()) {
    html += "<h2>Differences</h2><ul>";
    for (const auto& d : r.differences) html += "<li><code>" + esc(d) + "</code></li>";
    html += "</ul>\n";
  }
  html += runtime_verdicts(input);
  html += provenance(r);
  return html;
}

}  // namespace mx2nv

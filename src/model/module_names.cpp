#include "model/module_names.hpp"

#include <array>

namespace mx2nv {
namespace {

struct Spelling {
  std::string_view suffix;
  Projection projection;
  std::string_view partner;  // the gate/up partner's suffix, "" for down
};
constexpr std::array<Spelling, 6> kSpellings{{
    {"w1", Projection::Gate, "w3"},
    {"w3", Projection::Up, "w1"},
    {"w2", Projection::Down, ""},
    {"gate_proj", Projection::Gate, "up_proj"},
    {"up_proj", Projection::Up, "gate_proj"},
    {"down_proj", Projection::Down, ""},
}};

const Spelling* spelling_of(std::string_view suffix) {
  for (const Spelling& s : kSpellings) {
    if (s.suffix == suffix) return &s;
  }
  return nullptr;
}

// 1 to 9 decimal digits (leading zeros allowed): an index that always fits.
std::optional<std::uint64_t> parse_index(std::string_view s) {
  if (s.empty() || s.size() > 9) return std::nullopt;
  std::uint64_t v = 0;
  for (const char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  return v;
}

// The component before the last '.' and what precedes it: "X.E" -> (X, E).
std::pair<std::string_view, std::string_view> split_last(std::string_view s) {
  const auto dot = s.rfind('.');
  if (dot == std::string_view::npos) return {{}, s};
  return {s.substr(0, dot), s.substr(dot + 1)};
}

}  // namespace

std::optional<ProjectionName> parse_projection(std::string_view module) {
  const auto dot = module.rfind('.');
  if (dot == std::string_view::npos || dot == 0) return std::nullopt;
  const Spelling* s = spelling_of(module.substr(dot + 1));
  if (s == nullptr) return std::nullopt;
  return ProjectionName{module.substr(0, dot), s->suffix, s->projection};
}

std::optional<ExpertName> parse_expert_module(std::string_view module) {
  const auto projection = parse_projection(module);
  if (!projection) return std::nullopt;
  const auto [layer, index] = split_last(projection->parent);
  const auto expert = parse_index(index);
  if (layer.empty() || !expert) return std::nullopt;
  return ExpertName{layer, *expert, *projection};
}

std::string_view moe_layer_of(std::string_view module) {
  const auto e = parse_expert_module(module);
  return e ? e->layer : module;
}

std::string gate_up_partner(std::string_view module) {
  const auto p = parse_projection(module);
  if (!p) return {};
  const std::string_view partner = spelling_of(p->suffix)->partner;
  if (partner.empty()) return {};
  std::string name(p->parent);
  name += '.';
  name += partner;
  return name;
}

std::optional<ExpertPosition> expert_position(std::string_view module) {
  const auto e = parse_expert_module(module);
  if (!e) return std::nullopt;
  // X's components, the first index after layers|h|blocks replaced by '*'.
  std::string pattern;
  std::optional<std::uint64_t> layer;
  bool after_keyword = false;
  std::string_view rest = e->layer;
  for (;;) {
    const auto dot = rest.find('.');
    const std::string_view part = rest.substr(0, dot);
    const bool is_layer = !layer && after_keyword && (layer = parse_index(part)).has_value();
    pattern += is_layer ? std::string_view("*") : part;
    after_keyword = part == "layers" || part == "h" || part == "blocks";
    if (dot == std::string_view::npos) break;
    pattern += '.';
    rest.remove_prefix(dot + 1);
  }
  if (!layer) return std::nullopt;
  pattern += ".*.";
  pattern += e->projection.suffix;
  return ExpertPosition{std::move(pattern), *layer, e->expert};
}

}  // namespace mx2nv

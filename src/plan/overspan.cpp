#include "plan/overspan.hpp"

#include "common/checked.hpp"
#include "common/error.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

namespace mx2nv {

namespace {
constexpr Choice<OverSpanChoice> kOverSpanChoices[] = {
    {OverSpanChoice::Fail, "fail", "refuse, write nothing"},
    {OverSpanChoice::Bf16, "bf16",
     "every expert of an affected MoE layer written as an exact BF16 weight and listed in the config's ignore; "
     "larger"},
    {OverSpanChoice::Requantize, "requantize",
     "LOSSY: only those modules, a gate/up pair together, requantized from decoded values as the layout's own "
     "quantizer would (compressed-tensors', or ModelOpt's with --format modelopt); per-module error in the report"},
};
}  // namespace

template <>
std::span<const Choice<OverSpanChoice>> choices<OverSpanChoice>() {
  return kOverSpanChoices;
}

std::vector<std::size_t> refused_scale_groups(const ModuleSet& set, const Plan& plan) {
  std::vector<bool> refused(set.scale_groups.size(), false);
  for (const BadGlobal& b : plan.bad_globals) refused[b.scale_group] = true;
  // Over-span rows name their module (the report prints them as they are).
  std::set<std::string_view> over;
  for (const OverSpan& o : plan.refused_spans) over.insert(o.module);
  std::vector<std::size_t> groups;
  for (std::size_t sg = 0; sg < set.scale_groups.size(); ++sg) {
    for (const std::size_t i : set.scale_groups[sg]) refused[sg] = refused[sg] || over.contains(set.modules[i].name);
    if (refused[sg]) groups.push_back(sg);
  }
  return groups;
}

void resolve_over_span(const ModuleSet& set, Plan& plan, OverSpanChoice choice,
                       const std::function<float(std::size_t scale_group)>& requantized_global) {
  plan.over_span_choice = choice;
  if (choice == OverSpanChoice::Fail || !plan.refused()) return;
  const std::vector<std::size_t> groups = refused_scale_groups(set, plan);
  std::vector<BadGlobal> still_bad;
  const auto rewrite = [&](std::size_t i, Treatment t, float divisor) {
    ModulePlan p;
    p.treatment = t;
    p.divisor = divisor;
    p.span = plan.modules[i].span;
    plan.modules[i] = p;
  };
  if (choice == OverSpanChoice::Requantize) {
    for (const std::size_t sg : groups) {
      const float global = requantized_global(sg);
      if (!std::isnormal(global) || !global_multiplier_fits(plan.window, multiplier_of_stored(plan.format, global))) {
        still_bad.push_back({sg, global});
        continue;
      }
      for (const std::size_t i : set.scale_groups[sg]) rewrite(i, Treatment::Requantized, global);
    }
  } else {
    std::set<std::string_view> layers;  // views into the modules' names
    for (const std::size_t sg : groups) {
      for (const std::size_t i : set.scale_groups[sg]) layers.insert(moe_layer_of(set.modules[i].name));
    }
    for (std::size_t i = 0; i < set.modules.size(); ++i) {
      if (layers.contains(moe_layer_of(set.modules[i].name))) rewrite(i, Treatment::Bf16, 1.0f);
    }
  }
  plan.resolved_spans = std::move(plan.refused_spans);
  plan.refused_spans.clear();
  plan.resolved_globals.clear();
  for (const BadGlobal& b : plan.bad_globals) plan.resolved_globals.push_back(b.scale_group);
  plan.bad_globals = std::move(still_bad);
  // Conflicts of groups now rewritten are resolved too; only those still bad stay.
  if (plan.bad_globals.empty()) plan.global_conflicts.clear();
}

namespace {
const std::string_view kRequantizeMode = choice_name(PlanKind::Requantize);
constexpr char kFormatMark = '@';

std::optional<ConversionMode> parse_unformatted_mode(std::string_view text) {
  if (text == kRequantizeMode) return ConversionMode{PlanKind::Requantize, Window::Marlin, OverSpanChoice::Fail};
  const std::size_t plus = text.find('+');
  const auto window = parse_window(text.substr(0, plus));
  if (!window) return std::nullopt;
  ConversionMode mode{PlanKind::Convert, *window, OverSpanChoice::Fail};
  if (plus == std::string_view::npos) return mode;
  const auto choice = parse_choice<OverSpanChoice>(text.substr(plus + 1));
  if (!choice || *choice == OverSpanChoice::Fail) return std::nullopt;
  mode.rewritten = *choice;
  return mode;
}
}  // namespace

std::string mode_name(const ConversionMode& mode) {
  std::string name;
  if (mode.kind == PlanKind::Requantize) {
    name = kRequantizeMode;
  } else {
    name = window_name(mode.window);
    if (mode.rewritten != OverSpanChoice::Fail) name.append("+").append(choice_name(mode.rewritten));
  }
  if (mode.format != TargetFormat::CompressedTensors) name.append(1, kFormatMark).append(choice_name(mode.format));
  return name;
}

std::optional<ConversionMode> parse_mode(std::string_view text) {
  const std::size_t mark = text.find(kFormatMark);
  auto mode = parse_unformatted_mode(text.substr(0, mark));
  if (!mode || mark == std::string_view::npos) return mode;
  const auto format = parse_choice<TargetFormat>(text.substr(mark + 1));
  if (!format || *format == TargetFormat::CompressedTensors) return std::nullopt;  // the default is never spelled
  mode->format = *format;
  return mode;
}

ConversionMode plan_mode(const Plan& plan) {
  if (plan.kind == PlanKind::Requantize) return {PlanKind::Requantize, plan.window, OverSpanChoice::Fail, plan.format};
  ConversionMode mode{PlanKind::Convert, plan.window, OverSpanChoice::Fail, plan.format};
  // One choice resolves a plan, so its rewrites are all of one treatment.
  for (const auto& m : plan.modules) {
    if (m.treatment == Treatment::Requantized) mode.rewritten = OverSpanChoice::Requantize;
    if (m.treatment == Treatment::Bf16) mode.rewritten = OverSpanChoice::Bf16;
  }
  return mode;
}

bool mode_matches(const ConversionMode& recorded, Window window, OverSpanChoice choice, TargetFormat format) {
  if (recorded.kind != PlanKind::Convert || recorded.window != window || recorded.format != format) return false;
  // Nothing needed the choice, or the choice given is the one that rewrote.
  return recorded.rewritten == OverSpanChoice::Fail || recorded.rewritten == choice;
}

std::uint64_t bf16_weight_bytes(const QuantModule& m) {
  // group_count() x 16 is the packed tensor's size, which fits its file.
  const auto bytes = checked_mul(m.group_count(), 32 * 2);
  if (!bytes) fail_input("{}: a BF16 weight of this size cannot be addressed", m.name);
  return *bytes;
}

std::uint64_t nvfp4_module_bytes(const QuantModule& m) {
  const std::uint64_t groups = m.group_count();
  return groups * kGroupBytes + groups * kNvScalesPerMxScale + 4;
}

std::vector<Bf16Layer> bf16_layers(const ModuleSet& set, const Plan& plan) {
  // Why a layer is BF16: the members of the scale groups its choice resolved.
  std::vector<bool> refused(set.modules.size(), false);
  for (const OverSpan& o : plan.resolved_spans) {
    if (const auto i = set.find(o.module)) refused[*i] = true;
  }
  for (const std::size_t sg : plan.resolved_globals) {
    for (const std::size_t i : set.scale_groups[sg]) refused[i] = true;
  }
  std::map<std::string_view, Bf16Layer> layers;  // by layer name, as the report lists them
  for (std::size_t i = 0; i < set.modules.size(); ++i) {
    if (plan.modules[i].treatment != Treatment::Bf16) continue;
    const QuantModule& m = set.modules[i];
    Bf16Layer& l = layers[moe_layer_of(m.name)];
    l.modules.emplace_back(m.name);
    if (refused[i]) l.refused.emplace_back(m.name);
    l.bf16_bytes += bf16_weight_bytes(m);
    l.nvfp4_bytes += nvfp4_module_bytes(m);
  }
  std::vector<Bf16Layer> out;
  for (auto& [name, l] : layers) {
    l.layer = std::string(name);
    out.push_back(std::move(l));
  }
  return out;
}

}  // namespace mx2nv

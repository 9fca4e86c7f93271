#include "inspect/inspect.hpp"

#include "checkpoint/argument_check.hpp"
#include "checkpoint/reader.hpp"
#include "checkpoint/source_fields.hpp"
#include "common/error.hpp"
#include "common/printable.hpp"
#include "common/stopwatch.hpp"
#include "gate/rules.hpp"
#include "plan/target_layout.hpp"
#include "safetensors/file_names.hpp"
#include "scan/overspan_values.hpp"
#include "scan/planner.hpp"

#include <algorithm>
#include <chrono>

namespace mx2nv {

Inspection inspect_checkpoint(const fs::path& path, Window window, unsigned threads) {
  const auto started = std::chrono::steady_clock::now();
  Inspection in;
  in.report = start_report(Command::Inspect, window, path);
  Report& r = in.report;
  check_source_argument({Command::Inspect, path, std::nullopt});

  // The index was checked on opening and is not used again.
  SourceCheckpoint source = open_source_checkpoint(path, threads, IndexNames::Drop);
  const Checkpoint& ck = source.checkpoint;
  const ScanResult scan = scan_modules(source, threads);
  in.probes = scan.probes;
  in.fully_scanned_modules = scan.fully_classified;

  add_source_counts(r, source);
  const TargetTotals totals = target_totals(*r.source_tensor_bytes, ck.tensor_count(), source.modules);
  r.target_tensor_bytes = totals.tensor_bytes;
  r.passthrough_tensors = totals.passthrough_tensors;

  for (const WindowInfo& spec : windows()) {
    const Window w = spec.window;
    const Plan plan = plan_conversion(source, scan, w);
    WindowOutcome o{w, plan.refused(), plan.refused_spans, bad_global_names(source.modules, plan),
                    named_global_conflicts(source.modules, plan), plan.raised_globals, 0, 0};
    for (const auto& mp : plan.modules) {
      o.canonicalised_zero_groups += mp.canonical_zero_groups;
      o.marlin_zeroed_groups += mp.marlin_zeroed_groups;
    }
    if (w == window) {
      r.result = plan.refused() ? Outcome::Refused : Outcome::Ok;
      r.refused_spans = plan.refused_spans;
      r.unrepresentable_globals = o.unrepresentable_globals;
      r.global_conflicts = o.global_conflicts;
      r.raised_globals = plan.raised_globals;
      r.canonicalised_zero_groups = o.canonicalised_zero_groups;
      r.marlin_zeroed_groups = o.marlin_zeroed_groups;
      if (plan.refused()) {
        Inspection::OverSpanCost cost;
        try {
          Plan bf16 = plan;
          apply_overspan(source, bf16, OverSpanChoice::Bf16, threads);
          cost.bf16_layers = bf16_layers(source.modules, bf16);
          for (const auto& l : cost.bf16_layers) {
            cost.bf16_size_change += static_cast<std::int64_t>(l.bf16_bytes) - static_cast<std::int64_t>(l.nvfp4_bytes);
          }
        } catch (const Error& e) {
          if (e.kind() != ErrorKind::InvalidInput) throw;
          cost.bf16_refused = e.what();
        }
        try {
          Plan lossy = plan;
          apply_overspan(source, lossy, OverSpanChoice::Requantize, threads);
          if (lossy.refused()) cost.requantize_refused = "a requantized global is outside the window's global range";
          cost.requantized = measure_requantized(source, lossy, threads);
        } catch (const Error& e) {
          if (e.kind() != ErrorKind::InvalidInput) throw;
          cost.requantize_refused = e.what();
        }
        in.overspan = std::move(cost);
      }
      in.modules.reserve(source.modules.modules.size());
      for (std::size_t i = 0; i < source.modules.modules.size(); ++i) {
        const QuantModule& m = source.modules.modules[i];
        ModuleSummary s{m.name, m.rows, m.groups, scan.facts[i].k_max, scan.facts[i].k_min, plan.modules[i].span,
                        source.modules.scale_groups[m.scale_group].size() > 1};
        in.max_span = std::max(in.max_span, s.span);
        in.modules.push_back(std::move(s));
      }
    }
    in.outcomes.push_back(std::move(o));
  }
  in.names = std::move(source.modules.names);  // the summaries' names stay where they are
  std::vector<ModuleShape> shapes;
  for (const auto& m : in.modules) shapes.push_back({m.name, m.rows, m.groups * 32});
  in.moe_dims = moe_dims_of(shapes);
  r.seconds = seconds_since(started);
  return in;
}

Json inspection_to_json(const Inspection& in) {
  // Names as in every report: through json_text() (common/printable.hpp).
  const auto texts = [](const std::vector<std::string>& strings) {
    Json out = Json::array();
    for (const auto& s : strings) out.push_back(json_text(s));
    return out;
  };
  Json j = report_to_json(in.report);
  j["max_span"] = in.max_span;
  j["packed_groups_probed"] = in.probes;
  j["modules_fully_scanned"] = in.fully_scanned_modules;
  j["outcomes"] = Json::object();
  for (const auto& o : in.outcomes) {
    j["outcomes"][std::string(window_name(o.window))] = {
        {"result", o.refused ? "refused" : "ok"},
        {"over_span", over_span_to_json(o.over_span)},
        {"unrepresentable_globals", texts(o.unrepresentable_globals)},
        {"global_conflicts", global_conflicts_to_json(o.global_conflicts)},
        {"raised_globals", o.raised_globals},
        {"canonicalised_zero_groups", o.canonicalised_zero_groups},
        {"marlin_zeroed_groups", o.marlin_zeroed_groups}};
  }
  if (in.overspan) {
    Json layers = Json::array(), rows = Json::array();
    for (const auto& l : in.overspan->bf16_layers) {
      layers.push_back({{"layer", json_text(l.layer)}, {"modules", l.modules.size()}, {"why", texts(l.refused)},
                        {"size_cost_bytes", static_cast<std::int64_t>(l.bf16_bytes) - static_cast<std::int64_t>(l.nvfp4_bytes)}});
    }
    for (const auto& m : in.overspan->requantized) {
      rows.push_back({{"module", json_text(m.module)}, {"global_scale", m.global_scale}, {"values", m.values},
                      {"relative_rmse", m.relative_rmse}, {"cosine", m.cosine}, {"max_abs_error", m.max_abs_error},
                      {"marlin_zeroed_blocks", m.marlin_zeroed_blocks}});
    }
    const auto result = [](const std::string& why) { return why.empty() ? Json("ok") : Json("refused: " + json_text(why)); };
    j["overspan"] = {{"fail", {{"result", "refused"}}},
                     {"bf16", {{"result", result(in.overspan->bf16_refused)}, {"lossless", true}, {"layers", layers},
                               {"size_change_bytes", in.overspan->bf16_size_change}}},
                     {"requantize", {{"result", result(in.overspan->requantize_refused)}, {"lossless", false},
                                     {"lossy_modules", rows}, {"size_change_bytes", 0}}}};
  }
  // The layouts --format chooses between: the same tensor bytes, other names.
  j["formats"] = Json::object();
  for (const Choice<TargetFormat>& f : choices<TargetFormat>()) {
    const FormatNames& names = format_names(f.value);
    Json files = Json::array({std::string(kConfigFileName)});
    if (f.value == TargetFormat::ModelOpt) files.push_back(std::string(kModelOptConfigFileName));
    j["formats"][std::string(f.name)] = {
        {"packed", std::string(names.packed)},
        {"block_scales", std::string(names.scale)},
        {"global", std::string(names.global)},
        {"global_shape", names.global_shape},
        {"global_is", names.global_is_divisor ? "divisor" : "multiplier"},
        {"target_tensor_bytes", in.report.target_tensor_bytes ? Json(*in.report.target_tensor_bytes) : Json(nullptr)},
        {"config_files", files}};
    if (in.moe_dims) j["formats"][std::string(f.name)]["tp_table"] = tp_table_json(*in.moe_dims, f.value);
  }
  if (const auto& dims = in.moe_dims) {
    j["moe_dims"] = {{"hidden", dims->hidden}, {"intermediate", dims->intermediate}, {"experts", dims->experts},
                     {"moe_layers", dims->layers}};
    j["tp_table"] = tp_table_json(*dims);  // after conversion, per runtime backend (README "mx2nv gate")
  }
  j["modules"] = Json::array();
  for (const auto& m : in.modules) {
    j["modules"].push_back({{"name", json_text(m.name)},
                            {"rows", m.rows},
                            {"groups_per_row", m.groups},
                            {"k_max", m.k_max ? Json(*m.k_max) : Json(nullptr)},
                            {"k_min", m.k_min ? Json(*m.k_min) : Json(nullptr)},
                            {"span", m.span},
                            {"shares_global", m.pair}});
  }
  return j;
}

}  // namespace mx2nv

#include "core/report.hpp"

#include "core/printable.hpp"

#include <cmath>

namespace mx2nv {

std::optional<std::string> hf_snapshot_revision(const std::string& path) {
  const std::string marker = "/snapshots/";
  const auto at = path.rfind(marker);
  if (at == std::string::npos) return std::nullopt;
  const auto start = at + marker.size();
  const auto end = path.find('/', start);
  std::string rev = path.substr(start, end == std::string::npos ? std::string::npos : end - start);
  if (rev.empty()) return std::nullopt;
  return rev;
}

double Report::size_change_percent() const {
  if (source_tensor_bytes == 0) return 0;
  return 100.0 * (static_cast<double>(target_tensor_bytes) - static_cast<double>(source_tensor_bytes)) /
         static_cast<double>(source_tensor_bytes);
}

void Report::set_error(const Error& e) {
  result = Outcome::Error;
  error_kind = e.kind();
  error = e.what();
}

Json global_conflicts_to_json(const std::vector<GlobalConflict>& conflicts) {
  Json out = Json::array();
  for (const auto& c : conflicts) {
    out.push_back({{"scale_group", json_text(c.scale_group)},
                   {"k_max", c.k_max},
                   {"k_min", c.k_min},
                   {"needed", {c.needed_min, c.needed_max}},
                   {"allowed", {c.allowed_min, c.allowed_max}}});
  }
  return out;
}

Json report_to_json(const Report& r) {
  Json j;
  j["command"] = r.command;
  j["result"] = outcome_name(r.result);
  j["window"] = window_name(r.window);
  j["provenance"] = {{"tool", "mx2nv"}, {"tool_version", r.provenance.tool_version}, {"source", json_text(r.provenance.source)}};
  j["provenance"]["revision"] = r.provenance.revision ? Json(json_text(*r.provenance.revision)) : Json(nullptr);
  if (!r.provenance.target.empty()) j["provenance"]["target"] = json_text(r.provenance.target);
  j["counts"] = {{"shards", r.shards},
                 {"resumed_shards", r.resumed_shards},
                 {"modules", r.modules},
                 {"scale_groups", r.scale_groups},
                 {"active_groups", r.active_groups},
                 {"zero_groups", r.zero_groups},
                 {"canonicalised_zero_groups", r.canonicalised_zero_groups},
                 {"marlin_zeroed_groups", r.marlin_zeroed_groups},
                 {"raised_globals", r.raised_globals},
                 {"global_conflicts", r.global_conflicts.size()},
                 {"passthrough_tensors", r.passthrough_tensors},
                 {"companion_files", r.companion_files}};
  if (r.command == "convert") j["already_complete"] = r.already_complete;
  if (!r.shard_subset.empty()) {
    j["shard_subset"] = r.shard_subset;
    j["resolved"] = {{"source", json_text(r.resolved_source)}, {"target", json_text(r.resolved_target)}};
  }
  if (!r.groups_counted) j["counts"]["active_groups"] = j["counts"]["zero_groups"] = nullptr;
  if (!r.copy_mode.empty()) {
    j["copy"] = {{"mode", r.copy_mode},
                 {"shared_bytes", r.shared_bytes},
                 {"copied_bytes", r.copied_bytes},
                 {"written_bytes", r.written_bytes}};
  }
  j["source_tensor_bytes"] = r.source_tensor_bytes;
  j["target_tensor_bytes"] = r.target_tensor_bytes;
  j["size_change_percent"] = std::round(r.size_change_percent() * 1e4) / 1e4;
  j["values_compared"] = r.values_compared;
  j["mismatches"] = r.mismatches;
  j["max_abs_error"] = std::isfinite(r.max_abs_error) ? Json(r.max_abs_error) : Json("inf");
  j["over_span"] = Json::array();
  for (const auto& o : r.over_span) {
    j["over_span"].push_back(
        {{"module", json_text(o.module)}, {"span", o.span}, {"limit", o.limit}, {"groups_outside", o.groups_outside}});
  }
  if (r.command == "requantize" || !r.requantized.empty()) {
    const auto number = [](double v) { return std::isfinite(v) ? Json(v) : Json("inf"); };
    j["requantized"] = Json::array();
    for (const auto& m : r.requantized) {
      j["requantized"].push_back({{"module", json_text(m.module)},
                                  {"global_scale", m.global_scale},
                                  {"values", m.values},
                                  {"relative_rmse", number(m.relative_rmse)},
                                  {"cosine", number(m.cosine)},
                                  {"max_abs_error", number(m.max_abs_error)},
                                  {"marlin_zeroed_blocks", m.marlin_zeroed_blocks}});
    }
  }
  if (r.overspan != "fail") {
    Json layers = Json::array();
    for (const auto& l : r.bf16_layers) {
      Json modules = Json::array(), refused = Json::array();
      for (const auto& m : l.modules) modules.push_back(json_text(m));
      for (const auto& m : l.refused) refused.push_back(json_text(m));
      layers.push_back({{"layer", json_text(l.layer)},
                        {"modules", modules},
                        {"why", refused},
                        {"bf16_bytes", l.bf16_bytes},
                        {"nvfp4_bytes", l.nvfp4_bytes},
                        {"size_cost_bytes", static_cast<std::int64_t>(l.bf16_bytes) - static_cast<std::int64_t>(l.nvfp4_bytes)}});
    }
    Json resolved = Json::array();
    for (const auto& o : r.resolved_over_span) {
      resolved.push_back(
          {{"module", json_text(o.module)}, {"span", o.span}, {"limit", o.limit}, {"groups_outside", o.groups_outside}});
    }
    j["overspan"] = {{"choice", r.overspan},
                     {"lossy", !r.requantized.empty()},
                     {"resolved_over_span", resolved},
                     {"bf16_layers", layers},
                     {"requantized_marlin_zeroed_blocks", r.requantized_marlin_zeroed_blocks}};
  }
  j["unrepresentable_globals"] = Json::array();
  for (const auto& g : r.unrepresentable_globals) j["unrepresentable_globals"].push_back(json_text(g));
  j["global_conflicts"] = global_conflicts_to_json(r.global_conflicts);
  j["differences"] = Json::array();
  for (const auto& d : r.differences) j["differences"].push_back(json_text(d));
  if (r.result == Outcome::Error) {
    j["error"] = json_text(r.error);
    j["error_kind"] = kind_name(r.error_kind);
  }
  j["exit_code"] = r.exit_code();
  j["seconds"] = std::round(r.seconds * 1000) / 1000;
  return j;
}

}  // namespace mx2nv

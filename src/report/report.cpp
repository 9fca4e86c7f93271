#include "report/report.hpp"

#include "common/printable.hpp"
#include "output/report_file.hpp"

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

Report start_report(Command command, Window window, const fs::path& source, const fs::path& target) {
  Report r;
  r.command = command;
  r.window = window;
  // An empty path is one the command does not know (a planned step whose
  // plan is gone and which was given no SRC): left empty in the report.
  if (!source.empty()) {
    r.provenance.source = fs::absolute(source).lexically_normal().string();
    r.provenance.revision = hf_snapshot_revision(r.provenance.source);
  }
  if (!target.empty()) r.provenance.target = fs::absolute(target).lexically_normal().string();
  return r;
}

Report failed_report(Command command, Window window, const fs::path& source, const fs::path& target,
                     const Error& error, UnresolvedPaths unresolved) {
  Report r;
  try {
    r = start_report(command, window, source, target);
  } catch (...) {
    if (unresolved == UnresolvedPaths::Throw) throw;
    Provenance as_given;
    as_given.source = source.string();
    as_given.target = target.string();
    return failed_report(command, window, std::move(as_given), error);
  }
  r.set_error(error);
  return r;
}

Report failed_report(Command command, Window window, Provenance provenance, const Error& error) {
  Report r;
  r.command = command;
  r.window = window;
  r.provenance = std::move(provenance);
  r.set_error(error);
  return r;
}

std::optional<double> Report::size_change_percent() const {
  if (!source_tensor_bytes || !target_tensor_bytes || *source_tensor_bytes == 0) return std::nullopt;
  return 100.0 * (static_cast<double>(*target_tensor_bytes) - static_cast<double>(*source_tensor_bytes)) /
         static_cast<double>(*source_tensor_bytes);
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

namespace {

template <typename T>
Json figure(const Measured<T>& m) {
  return m ? Json(*m) : Json(nullptr);
}

Json over_span_row(const OverSpan& o) {
  return {{"module", json_text(o.module)}, {"span", o.span}, {"limit", o.limit}, {"groups_outside", o.groups_outside}};
}

Json requantized_row(const ModuleError& m) {
  const auto number = [](double v) { return std::isfinite(v) ? Json(v) : Json("inf"); };
  return {{"module", json_text(m.module)},
          {"global_scale", m.global_scale},
          {"values", m.values},
          {"relative_rmse", number(m.relative_rmse)},
          {"cosine", number(m.cosine)},
          {"max_abs_error", number(m.max_abs_error)},
          {"marlin_zeroed_blocks", m.marlin_zeroed_blocks}};
}

template <typename Row, typename Format>
Json rows_to_json(const std::vector<Row>& rows, Format&& format) {
  Json out = Json::array();
  for (const auto& row : rows) out.push_back(format(row));
  return out;
}

Json requantized_to_json(const std::vector<ModuleError>& requantized) {
  return rows_to_json(requantized, requantized_row);
}

}  // namespace

Json over_span_to_json(const std::vector<OverSpan>& over_span) { return rows_to_json(over_span, over_span_row); }

namespace {

Json bf16_layers_to_json(const std::vector<Bf16Layer>& bf16_layers) {
  Json out = Json::array();
  for (const auto& l : bf16_layers) {
    Json modules = Json::array(), refused = Json::array();
    for (const auto& m : l.modules) modules.push_back(json_text(m));
    for (const auto& m : l.refused) refused.push_back(json_text(m));
    out.push_back({{"layer", json_text(l.layer)},
                   {"modules", modules},
                   {"why", refused},
                   {"bf16_bytes", l.bf16_bytes},
                   {"nvfp4_bytes", l.nvfp4_bytes},
                   {"size_cost_bytes",
                    static_cast<std::int64_t>(l.bf16_bytes) - static_cast<std::int64_t>(l.nvfp4_bytes)}});
  }
  return out;
}

// convert --overspan bf16|requantize: the choice, the refusals it resolved, what it wrote.
Json overspan_to_json(const Report& r) {
  return {{"choice", choice_name(r.overspan)},
          {"lossy", !r.requantized.empty()},
          {"resolved_over_span", over_span_to_json(r.resolved_over_span)},
          {"bf16_layers", bf16_layers_to_json(r.bf16_layers)},
          {"requantized_marlin_zeroed_blocks", figure(r.requantized_marlin_zeroed_blocks)}};
}

// The document; with `rows` false, the top-level per-module arrays
// (over_span, requantized) are left empty for write_report_json to stream.
Json report_document(const Report& r, bool rows) {
  Json j;
  j["command"] = command_name(r.command);
  j["result"] = outcome_name(r.result);
  j["window"] = window_name(r.window);
  j["provenance"] = {
      {"tool", "mx2nv"}, {"tool_version", r.provenance.tool_version}, {"source", json_text(r.provenance.source)}};
  j["provenance"]["revision"] = r.provenance.revision ? Json(json_text(*r.provenance.revision)) : Json(nullptr);
  if (!r.provenance.target.empty()) j["provenance"]["target"] = json_text(r.provenance.target);
  j["counts"] = {{"shards", figure(r.shards)},
                 {"resumed_shards", figure(r.resumed_shards)},
                 {"modules", figure(r.modules)},
                 {"scale_groups", figure(r.scale_groups)},
                 {"active_groups", figure(r.active_groups)},
                 {"zero_groups", figure(r.zero_groups)},
                 {"canonicalised_zero_groups", figure(r.canonicalised_zero_groups)},
                 {"marlin_zeroed_groups", figure(r.marlin_zeroed_groups)},
                 {"raised_globals", figure(r.raised_globals)},
                 {"global_conflicts", r.global_conflicts.size()},
                 {"passthrough_tensors", figure(r.passthrough_tensors)},
                 {"companion_files", figure(r.companion_files)}};
  if (r.command == Command::Convert) j["already_complete"] = r.already_complete;
  if (!r.shard_subset.empty()) {
    j["shard_subset"] = r.shard_subset;
    j["resolved"] = {{"source", json_text(r.resolved_source)}, {"target", json_text(r.resolved_target)}};
  }
  if (r.copy_mode) {
    j["copy"] = {{"mode", choice_name(*r.copy_mode)},
                 {"shared_bytes", figure(r.shared_bytes)},
                 {"copied_bytes", figure(r.copied_bytes)},
                 {"written_bytes", figure(r.written_bytes)}};
  }
  j["source_tensor_bytes"] = figure(r.source_tensor_bytes);
  j["target_tensor_bytes"] = figure(r.target_tensor_bytes);
  const auto change = r.size_change_percent();
  j["size_change_percent"] = change ? Json(std::round(*change * 1e4) / 1e4) : Json(nullptr);
  j["values_compared"] = figure(r.values_compared);
  j["mismatches"] = figure(r.mismatches);
  j["max_abs_error"] = !r.max_abs_error                 ? Json(nullptr)
                       : std::isfinite(*r.max_abs_error) ? Json(*r.max_abs_error)
                                                         : Json("inf");
  j["over_span"] = rows ? over_span_to_json(r.over_span) : Json::array();
  if (r.command == Command::Requantize || !r.requantized.empty()) {
    j["requantized"] = rows ? requantized_to_json(r.requantized) : Json::array();
  }
  if (r.overspan != OverSpanChoice::Fail) j["overspan"] = overspan_to_json(r);
  j["unrepresentable_globals"] = Json::array();
  for (const auto& g : r.unrepresentable_globals) j["unrepresentable_globals"].push_back(json_text(g));
  j["global_conflicts"] = global_conflicts_to_json(r.global_conflicts);
  if (r.fingerprint) {
    j["fingerprint"] = {{"scheme", "mx2nv-fingerprint/1"},
                        {"source", r.fingerprint->source},
                        {"target", r.fingerprint->target},
                        {"source_files", r.fingerprint->source_files},
                        {"target_files", r.fingerprint->target_files}};
  }
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

// `rows` as dump_json would write them as the value of a top-level key: each
// row's lines indented by two levels, rows separated by ",\n".
template <typename Row, typename Format>
void stream_rows(const std::vector<Row>& rows, Format&& format, const std::function<void(std::string_view)>& sink) {
  if (rows.empty()) return sink("[]");
  sink("[\n");
  std::string piece;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::string row = dump_json(format(rows[i]));
    piece.assign(i ? ",\n    " : "    ");
    for (const char c : row) {
      piece += c;
      if (c == '\n') piece += "    ";
    }
    sink(piece);
  }
  sink("\n  ]");
}

}  // namespace

Json report_to_json(const Report& r) { return report_document(r, true); }

void write_report_json(const Report& r, const std::function<void(std::string_view)>& sink) {
  const std::string text = dump_json(report_document(r, false));
  // Each streamed array's key, as dump_json writes an empty array at the top
  // level: a raw newline occurs in the text only between tokens, so this
  // line cannot be inside a string or a nested object.
  struct Streamed {
    std::string_view marker;
    std::function<void()> write;
  };
  const Streamed streamed[] = {
      {"\n  \"over_span\": []", [&] { stream_rows(r.over_span, over_span_row, sink); }},
      {"\n  \"requantized\": []", [&] { stream_rows(r.requantized, requantized_row, sink); }},
  };
  std::size_t at = 0;
  for (const auto& s : streamed) {
    const std::size_t found = text.find(s.marker, at);
    if (found == std::string::npos) continue;  // a report without this key
    const std::size_t value = found + s.marker.size() - 2;  // the "[]"
    sink(std::string_view(text).substr(at, value - at));
    s.write();
    at = value + 2;
  }
  sink(std::string_view(text).substr(at));
}

std::string report_json_text(const Report& r) {
  std::string out;
  write_report_json(r, [&](std::string_view piece) { out += piece; });
  return out;
}

void record_resolved_paths(Report& report, const fs::path& source, const fs::path& target) {
  const auto resolved = [](const fs::path& p) {
    std::error_code ec;
    return resolved_path(p).value_or(fs::absolute(p, ec).lexically_normal()).string();
  };
  report.resolved_source = resolved(source);
  report.resolved_target = resolved(target);
}

}  // namespace mx2nv

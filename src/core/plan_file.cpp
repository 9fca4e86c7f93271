#include "core/plan_file.hpp"

#include "core/error.hpp"
#include "core/overspan.hpp"
#include "core/printable.hpp"
#include "core/strict_json.hpp"

#include <xxhash.h>

#include <bit>
#include <cmath>

namespace mx2nv {
namespace {

Json content_json(const PlanFile& p) {
  Json shards = Json::array();
  for (const auto& s : p.shards) {
    shards.push_back({{"file", s.file},
                      {"source_size", s.source_size},
                      {"source_mtime_ns", s.source_mtime_ns},
                      {"source_header_hash", s.source_header_hash},
                      {"plan_hash", s.plan_hash},
                      {"output_data_bytes", s.output_data_bytes},
                      {"output_tensors", s.output_tensors}});
  }
  // Modules as rows of numbers: K3 has ~250k of them.
  Json modules = Json::array();
  for (std::size_t i = 0; i < p.modules.size(); ++i) {
    const ModulePlan& m = p.modules[i];
    modules.push_back(Json::array({p.module_names[i], m.m, std::bit_cast<std::uint32_t>(m.divisor),
                                   m.zero_scales ? 1 : 0, m.span, m.groups_outside, m.canonical_zero_groups,
                                   m.marlin_zeroed_groups, static_cast<int>(m.treatment)}));
  }
  return {{"format", kPlanFormat},
          {"tool_version", p.tool_version},
          {"window", window_name(p.window)},
          {"overspan", overspan_name(p.overspan)},
          {"source", json_text(p.source)},
          {"target", json_text(p.target)},
          {"shards", shards},
          {"module_columns", {"name", "m", "divisor_bits", "zero_scales", "span", "groups_outside",
                              "canonical_zero_groups", "marlin_zeroed_groups", "treatment"}},
          {"modules", modules}};
}

std::uint64_t checksum(const Json& content) {
  const std::string text = dump_json(content, -1);
  return XXH3_64bits(text.data(), text.size());
}

}  // namespace

std::string plan_file_to_text(PlanFile& p) {
  Json j = content_json(p);
  p.fingerprint = checksum(j);
  j["fingerprint"] = fmt::format("{:016x}", p.fingerprint);
  return dump_json(j, 1) + "\n";
}

PlanFile plan_file_from_text(std::string_view text, std::string_view what) {
  const Json j = parse_strict_json(text, what).value;
  PlanFile p;
  try {
    if (!j.is_object() || j.value("format", Json()) != kPlanFormat) {
      fail_input("{}: not an mx2nv plan ({} expected)", what, kPlanFormat);
    }
    p.tool_version = j.at("tool_version").get<std::string>();
    const auto window = parse_window(j.at("window").get<std::string>());
    if (!window) fail_input("{}: unknown window {}", what, j.at("window").dump());
    p.window = *window;
    const auto overspan = parse_overspan(j.at("overspan").get<std::string>());
    if (!overspan) fail_input("{}: unknown overspan choice {}", what, j.at("overspan").dump());
    p.overspan = *overspan;
    p.source = j.at("source").get<std::string>();
    p.target = j.at("target").get<std::string>();
    for (const Json& s : j.at("shards")) {
      PlannedShard ps;
      ps.file = s.at("file").get<std::string>();
      ps.source_size = s.at("source_size").get<std::uint64_t>();
      ps.source_mtime_ns = s.at("source_mtime_ns").get<std::int64_t>();
      ps.source_header_hash = s.at("source_header_hash").get<std::uint64_t>();
      ps.plan_hash = s.at("plan_hash").get<std::uint64_t>();
      ps.output_data_bytes = s.at("output_data_bytes").get<std::uint64_t>();
      ps.output_tensors = s.at("output_tensors").get<std::uint64_t>();
      p.shards.push_back(std::move(ps));
    }
    for (const Json& row : j.at("modules")) {
      if (!row.is_array() || row.size() != 9) fail_input("{}: a module row is not 9 columns", what);
      p.module_names.push_back(row[0].get<std::string>());
      ModulePlan m;
      m.m = row[1].get<int>();
      m.divisor = std::bit_cast<float>(row[2].get<std::uint32_t>());
      m.zero_scales = row[3].get<int>() != 0;
      m.span = row[4].get<int>();
      m.groups_outside = row[5].get<std::uint64_t>();
      m.canonical_zero_groups = row[6].get<std::uint64_t>();
      m.marlin_zeroed_groups = row[7].get<std::uint64_t>();
      const int treatment = row[8].get<int>();
      if (treatment < 0 || treatment > static_cast<int>(Treatment::Bf16) ||
          (treatment != 0 && p.overspan == OverSpanChoice::Fail)) {
        fail_input("{}: module {} has an unknown treatment {}", what, row[0].dump(), treatment);
      }
      m.treatment = static_cast<Treatment>(treatment);
      if (!std::isfinite(m.divisor) || m.divisor <= 0) fail_input("{}: module {} has a bad global", what, row[0].dump());
      p.modules.push_back(m);
    }
    const std::string stored = j.at("fingerprint").get<std::string>();
    p.fingerprint = checksum(content_json(p));
    if (stored != fmt::format("{:016x}", p.fingerprint)) {
      fail_input("{}: checksum mismatch (the plan was edited or damaged); run mx2nv plan again", what);
    }
  } catch (const Json::exception& e) {
    fail_input("{}: malformed plan: {}", what, e.what());
  }
  return p;
}

Plan plan_for_modules(const PlanFile& file, const std::vector<std::string>& module_names) {
  if (module_names != file.module_names) {
    fail(ErrorKind::Usage, "the plan was made for other quantized modules than SRC holds now ({} planned, {} found); "
                           "SRC changed since: run mx2nv plan again",
         file.module_names.size(), module_names.size());
  }
  Plan plan;
  plan.window = file.window;
  plan.overspan = file.overspan;
  plan.modules = file.modules;
  return plan;
}

}  // namespace mx2nv

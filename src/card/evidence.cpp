#include "card/evidence.hpp"

#include "plan/overspan.hpp"

#include "common/error.hpp"
#include "common/printable.hpp"
#include "destination/destination.hpp"

#include <sys/stat.h>

#include <cmath>

namespace mx2nv {
namespace {

constexpr std::uint64_t kMaxReportBytes = 64ull << 20;

std::string_view kind_command(EvidenceKind k) { return k == EvidenceKind::Verify ? "verify" : "requantize"; }


// SRC or DST as reports write them (report/report.cpp start_report).
std::string as_reported(const fs::path& p) { return json_text(fs::absolute(p).lexically_normal().string()); }

void check_outcome(const Evidence& e) {
  const Json& r = e.report;
  const auto refuse = [](const std::string& why) {
    fail(ErrorKind::Usage, "card: the report does not prove this card: {}", why);
  };
  if (member_or_null(r, "result") != "ok") refuse(fmt::format("its result is {}, not ok", printable(member_or_null(r, "result").dump())));
  if (member_or_null(r, "exit_code") != 0) refuse("its exit_code is not 0");
  if (r.contains("error")) refuse("it records an error");
  if (e.kind == EvidenceKind::Verify) {
    if (member_or_null(r, "mismatches") != 0) refuse("it counts mismatches");
    if (member_or_null(r, "differences") != Json::array()) refuse("it lists differences");
    if (r.contains("shard_subset")) {
      refuse("it covers only shards " + printable(member_or_null(r, "shard_subset").dump()) +
             " (verify --merge the parts, or verify all shards)");
    }
  } else if (!member_or_null(r, "requantized").is_array() || member_or_null(r, "requantized").empty()) {
    refuse("it lists no requantized module");
  }
  const Json& prov = member_or_null(r, "provenance");
  if (member_or_null(prov, "tool") != "mx2nv") refuse("it was not written by mx2nv");
  if (member_or_null(prov, "tool_version") != MX2NV_VERSION) {
    fail(ErrorKind::Usage, "card: the report is of mx2nv {}, this is mx2nv {}: {} again with this version",
         printable(member_or_null(prov, "tool_version").dump()), MX2NV_VERSION, kind_command(e.kind));
  }
}

// --- The declared type of every field a card reads -------------------------

enum class Type { Count, Finite, Error, Text, Object, Array };

std::string_view type_name(Type t) {
  switch (t) {
    case Type::Count: return "a non-negative integer";
    case Type::Finite: return "a finite number";
    case Type::Error: return "a finite non-negative number or \"inf\"";
    case Type::Text: return "a string";
    case Type::Object: return "an object";
    case Type::Array: return "an array";
  }
  return "";
}

bool has_type(const Json& v, Type t, bool inf_allowed) {
  switch (t) {
    case Type::Count: return v.is_number_unsigned();
    case Type::Finite: return v.is_number() && std::isfinite(v.get<double>());
    case Type::Error:
      return (inf_allowed && v.is_string() && v == "inf") ||
             (v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() >= 0);
    case Type::Text: return v.is_string();
    case Type::Object: return v.is_object();
    case Type::Array: return v.is_array();
  }
  return false;
}

// Checks `parent[key]` (shown as `path`): absent or null is "not computed"
// when `nullable` (the card omits what shows it), else refused; any other
// value must have the type. Returns the value when it is there.
const Json* field(const Json& parent, const std::string& key, const std::string& path, Type t, bool nullable,
                  bool inf_allowed = false) {
  const Json* v = parent.is_object() && parent.contains(key) ? &parent.at(key) : nullptr;
  if (v == nullptr || v->is_null()) {
    if (nullable) return nullptr;
    fail(ErrorKind::Usage, "card: the report does not prove this card: its {} is {}, not {}", path,
         v == nullptr ? "absent" : "null", type_name(t));
  }
  if (!has_type(*v, t, inf_allowed)) {
    const std::string shown = v->dump();
    fail(ErrorKind::Usage, "card: the report does not prove this card: its {} is {}, not {}", path,
         printable(shown.size() > 80 ? shown.substr(0, 80) + "..." : shown), type_name(t));
  }
  return v;
}

// An element of an array the card lists: never null.
void element(const Json& v, const std::string& path, Type t) {
  const Json holder = Json::object({{"v", v}});
  field(holder, "v", path, t, false);
}

// Every field the card reads (card_render.cpp, card_sections.cpp), with the
// type mx2nv writes it with. A wrong type is refused like any report that
// does not prove the card; a null or absent count is a figure the command
// did not compute, and the card leaves out the row that would show it.
void check_field_types(const Evidence& e) {
  const Json& r = e.report;
  const bool rq = e.kind == EvidenceKind::Requantize;
  field(r, "window", "window", Type::Text, rq);
  const Json* prov = field(r, "provenance", "provenance", Type::Object, false);
  field(*prov, "tool_version", "provenance.tool_version", Type::Text, false);
  field(*prov, "source", "provenance.source", Type::Text, false);
  if (const Json* counts = field(r, "counts", "counts", Type::Object, true)) {
    for (const char* k : {"modules", "scale_groups", "passthrough_tensors", "companion_files", "shards", "active_groups",
                          "zero_groups", "canonicalised_zero_groups", "marlin_zeroed_groups", "raised_globals"}) {
      field(*counts, k, std::string("counts.") + k, Type::Count, true);
    }
  }
  field(r, "mismatches", "mismatches", Type::Count, rq);
  for (const char* k : {"values_compared", "source_tensor_bytes", "target_tensor_bytes"}) {
    field(r, k, k, Type::Count, true);
  }
  field(r, "size_change_percent", "size_change_percent", Type::Finite, true);
  field(r, "max_abs_error", "max_abs_error", Type::Error, true, rq);
  if (const Json* os = field(r, "overspan", "overspan", Type::Object, true)) {
    field(*os, "choice", "overspan.choice", Type::Text, false);
    if (const Json* layers = field(*os, "bf16_layers", "overspan.bf16_layers", Type::Array, true)) {
      for (std::size_t i = 0; i < layers->size(); ++i) {
        const std::string at = fmt::format("overspan.bf16_layers[{}]", i);
        const Json& l = (*layers)[i];
        element(l, at, Type::Object);
        field(l, "layer", at + ".layer", Type::Text, false);
        field(l, "modules", at + ".modules", Type::Array, false);
        field(l, "size_cost_bytes", at + ".size_cost_bytes", Type::Count, false);
        const Json* why = field(l, "why", at + ".why", Type::Array, false);
        for (std::size_t k = 0; k < why->size(); ++k) {
          element((*why)[k], fmt::format("{}.why[{}]", at, k), Type::Text);
        }
      }
    }
    if (const Json* over = field(*os, "resolved_over_span", "overspan.resolved_over_span", Type::Array, true)) {
      for (std::size_t i = 0; i < over->size(); ++i) {
        const std::string at = fmt::format("overspan.resolved_over_span[{}]", i);
        const Json& o = (*over)[i];
        element(o, at, Type::Object);
        field(o, "module", at + ".module", Type::Text, false);
        for (const char* k : {"span", "limit", "groups_outside"}) field(o, k, at + "." + k, Type::Count, false);
      }
    }
  }
  if (const Json* mods = field(r, "requantized", "requantized", Type::Array, true)) {
    for (std::size_t i = 0; i < mods->size(); ++i) {
      const std::string at = fmt::format("requantized[{}]", i);
      const Json& m = (*mods)[i];
      element(m, at, Type::Object);
      field(m, "module", at + ".module", Type::Text, false);
      field(m, "relative_rmse", at + ".relative_rmse", Type::Error, false, true);
      field(m, "cosine", at + ".cosine", Type::Finite, false);
      field(m, "marlin_zeroed_blocks", at + ".marlin_zeroed_blocks", Type::Count, false);
    }
  }
}

}  // namespace

Evidence read_evidence(EvidenceKind kind, const fs::path& report, const std::string* text, const fs::path& source,
                       const fs::path& target) {
  Evidence e;
  e.kind = kind;
  if (text) {
    e.bytes = *text;
  } else {
    struct stat st {};
    if (::stat(report.c_str(), &st) != 0) fail(ErrorKind::Usage, "card: report {}: no such file", printable(report.string()));
    if (!S_ISREG(st.st_mode)) fail(ErrorKind::Usage, "card: report {}: not a regular file", printable(report.string()));
    if (static_cast<std::uint64_t>(st.st_size) > kMaxReportBytes) {
      fail(ErrorKind::Usage, "card: report {}: larger than 64 MiB", printable(report.string()));
    }
    e.bytes = read_text_file(report, kMaxReportBytes);
  }
  try {
    e.report = parse_strict_json(e.bytes, "the report").value;
  } catch (const Error& err) {
    fail(ErrorKind::Usage, "card: the report is not strict JSON: {}", err.what());
  }
  if (!e.report.is_object()) fail(ErrorKind::Usage, "card: the report is not a JSON object");
  if (member_or_null(e.report, "command") != kind_command(kind)) {
    fail(ErrorKind::Usage, "card: --{}-report needs a report of mx2nv {}, this one's command is {}", kind_command(kind),
         kind_command(kind), printable(member_or_null(e.report, "command").dump()));
  }
  check_field_types(e);
  check_outcome(e);
  const Json& prov = member_or_null(e.report, "provenance");
  if (member_or_null(prov, "source") != as_reported(source)) {
    fail(ErrorKind::Usage, "card: the report is of another SRC ({}), not {}", printable(member_or_null(prov, "source").dump()),
         printable(as_reported(source)));
  }
  if (member_or_null(prov, "target") != as_reported(target)) {
    fail(ErrorKind::Usage, "card: the report is of another DST ({}), not {}", printable(member_or_null(prov, "target").dump()),
         printable(as_reported(target)));
  }
  return e;
}

TargetFormat check_finished_mode(const Evidence& e, const fs::path& target) {
  const auto finished = Destination::finished_record(target);
  if (!finished) fail(ErrorKind::Usage, "card: DST {} holds no finished conversion", printable(target.string()));
  const std::string& mode = finished->window;
  const std::optional<ConversionMode> recorded = parse_mode(mode);
  const bool requantized = recorded && recorded->kind == PlanKind::Requantize;
  if (e.kind == EvidenceKind::Requantize) {
    if (!requantized) {
      fail(ErrorKind::Usage, "card: DST was written by convert (mode {}), not requantize", printable(mode));
    }
    return recorded->format;
  }
  if (requantized) fail(ErrorKind::Usage, "card: DST was written by requantize; use --requantize-report");
  const std::string window = recorded ? std::string(window_name(recorded->window)) : mode;
  if (member_or_null(e.report, "window") != window) {
    fail(ErrorKind::Usage, "card: DST was converted with window {}, the report verified window {}", printable(window),
         printable(member_or_null(e.report, "window").dump()));
  }
  if (!recorded) fail(ErrorKind::Usage, "card: DST's finished record has mode {}, which this mx2nv does not know", printable(mode));
  return recorded->format;
}

}  // namespace mx2nv

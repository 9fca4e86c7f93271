#include "card/evidence.hpp"

#include "plan/overspan.hpp"

#include "common/error.hpp"
#include "common/printable.hpp"
#include "destination/destination.hpp"
#include "json/strict_json.hpp"

#include <sys/stat.h>

#include <cmath>

namespace mx2nv {
namespace {

constexpr std::uint64_t kMaxReportBytes = 64ull << 20;

std::string_view kind_command(EvidenceKind k) { return k == EvidenceKind::Verify ? "verify" : "requantize"; }

// SRC or DST as reports write them (report/report.cpp start_report).
std::string as_reported(const fs::path& p) { return json_text(fs::absolute(p).lexically_normal().string()); }

[[noreturn]] void refuse(const std::string& why) {
  fail(ErrorKind::Usage, "card: the report does not prove this card: {}", why);
}

// The two keys that say which schema the rest is in, looked at before the
// report is read by it: its command (the kind of report) and the version of
// mx2nv that wrote it (another version's report may have other fields). A
// value of the wrong type is left to report_from_json, which names it.
void check_schema(EvidenceKind kind, const Json& document) {
  const Json& command = member_or_null(document, "command");
  if (command != kind_command(kind)) {
    fail(ErrorKind::Usage, "card: --{}-report needs a report of mx2nv {}, this one's command is {}", kind_command(kind),
         kind_command(kind), printable(command.dump()));
  }
  const Json& version = member_or_null(member_or_null(document, "provenance"), "tool_version");
  if (version.is_string() && version != MX2NV_VERSION) {
    fail(ErrorKind::Usage, "card: the report is of mx2nv {}, this is mx2nv {}: {} again with this version",
         printable(version.dump()), MX2NV_VERSION, kind_command(kind));
  }
}

// What the report proves (docs/reference/model-card.md §6, rules 3-5): an ok
// outcome of the whole checkpoint, with the figures the card cites. A null
// figure is one the command did not compute: the card leaves its row out,
// except the mismatch count a verify card rests on.
void check_outcome(const Evidence& e) {
  const Report& r = e.report;
  if (r.result != Outcome::Ok) refuse(fmt::format("its result is \"{}\", not ok", outcome_name(r.result)));
  if (e.kind == EvidenceKind::Verify) {
    if (!r.mismatches) refuse("its mismatches is null, not a count verify made");
    if (*r.mismatches != 0) refuse("it counts mismatches");
    if (!r.differences.empty()) refuse("it lists differences");
    if (!r.shard_subset.empty()) {
      refuse(fmt::format("it covers only shards {} (verify --merge the parts, or verify all shards)",
                         printable(json_text(r.shard_subset))));
    }
    // verify compares exact values: an infinite error is no exact transcode.
    if (r.max_abs_error && !std::isfinite(*r.max_abs_error)) refuse("its max_abs_error is inf, not a finite number");
  } else if (r.requantized.empty()) {
    refuse("it lists no requantized module");
  }
  for (std::size_t i = 0; i < r.requantized.size(); ++i) {
    if (!std::isfinite(r.requantized[i].cosine)) {
      refuse(fmt::format("its requantized[{}].cosine is inf, not a finite number", i));
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
  Json document;
  try {
    document = parse_strict_json(e.bytes, "the report").value;
  } catch (const Error& err) {
    fail(ErrorKind::Usage, "card: the report is not strict JSON: {}", err.what());
  }
  if (!document.is_object()) fail(ErrorKind::Usage, "card: the report is not a JSON object");
  check_schema(kind, document);
  try {
    e.report = report_from_json(document, "report");
  } catch (const Error& err) {
    if (err.kind() != ErrorKind::InvalidInput) throw;
    refuse(err.what());
  }
  check_outcome(e);
  const Provenance& prov = e.report.provenance;
  // A report read back holds its paths as written (json_text of each).
  if (prov.source != as_reported(source)) {
    fail(ErrorKind::Usage, "card: the report is of another SRC ({}), not {}", printable(dump_json(Json(prov.source), -1)),
         printable(as_reported(source)));
  }
  if (prov.target != as_reported(target)) {
    fail(ErrorKind::Usage, "card: the report is of another DST ({}), not {}", printable(dump_json(Json(prov.target), -1)),
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
  if (window_name(e.report.window) != window) {
    fail(ErrorKind::Usage, "card: DST was converted with window {}, the report verified window {}", printable(window),
         window_name(e.report.window));
  }
  if (!recorded) fail(ErrorKind::Usage, "card: DST's finished record has mode {}, which this mx2nv does not know", printable(mode));
  return recorded->format;
}

}  // namespace mx2nv

#include "card/evidence.hpp"

#include "common/error.hpp"
#include "common/printable.hpp"
#include "destination/destination.hpp"

#include <sys/stat.h>

namespace mx2nv {
namespace {

constexpr std::uint64_t kMaxReportBytes = 64ull << 20;

std::string_view kind_command(EvidenceKind k) { return k == EvidenceKind::Verify ? "verify" : "requantize"; }

const Json& member(const Json& j, const char* key) {
  static const Json kNull;
  return j.is_object() && j.contains(key) ? j.at(key) : kNull;
}

// SRC or DST as reports write them (report/report.cpp start_report).
std::string as_reported(const fs::path& p) { return json_text(fs::absolute(p).lexically_normal().string()); }

void check_outcome(const Evidence& e) {
  const Json& r = e.report;
  const auto refuse = [](const std::string& why) {
    fail(ErrorKind::Usage, "card: the report does not prove this card: {}", why);
  };
  if (member(r, "result") != "ok") refuse(fmt::format("its result is {}, not ok", printable(member(r, "result").dump())));
  if (member(r, "exit_code") != 0) refuse("its exit_code is not 0");
  if (r.contains("error")) refuse("it records an error");
  if (e.kind == EvidenceKind::Verify) {
    if (member(r, "mismatches") != 0) refuse("it counts mismatches");
    if (member(r, "differences") != Json::array()) refuse("it lists differences");
    if (r.contains("shard_subset")) {
      refuse("it covers only shards " + printable(member(r, "shard_subset").dump()) +
             " (verify --merge the parts, or verify all shards)");
    }
  } else if (!member(r, "requantized").is_array() || member(r, "requantized").empty()) {
    refuse("it lists no requantized module");
  }
  const Json& prov = member(r, "provenance");
  if (member(prov, "tool") != "mx2nv") refuse("it was not written by mx2nv");
  if (member(prov, "tool_version") != MX2NV_VERSION) {
    fail(ErrorKind::Usage, "card: the report is of mx2nv {}, this is mx2nv {}: {} again with this version",
         printable(member(prov, "tool_version").dump()), MX2NV_VERSION, kind_command(e.kind));
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
  if (member(e.report, "command") != kind_command(kind)) {
    fail(ErrorKind::Usage, "card: --{}-report needs a report of mx2nv {}, this one's command is {}", kind_command(kind),
         kind_command(kind), printable(member(e.report, "command").dump()));
  }
  check_outcome(e);
  const Json& prov = member(e.report, "provenance");
  if (member(prov, "source") != as_reported(source)) {
    fail(ErrorKind::Usage, "card: the report is of another SRC ({}), not {}", printable(member(prov, "source").dump()),
         printable(as_reported(source)));
  }
  if (member(prov, "target") != as_reported(target)) {
    fail(ErrorKind::Usage, "card: the report is of another DST ({}), not {}", printable(member(prov, "target").dump()),
         printable(as_reported(target)));
  }
  return e;
}

void check_finished_mode(const Evidence& e, const fs::path& target) {
  const auto finished = Destination::finished_record(target);
  if (!finished) fail(ErrorKind::Usage, "card: DST {} holds no finished conversion", printable(target.string()));
  const std::string& mode = finished->window;
  if (e.kind == EvidenceKind::Requantize) {
    if (mode != "requantize") {
      fail(ErrorKind::Usage, "card: DST was written by convert (mode {}), not requantize", printable(mode));
    }
    return;
  }
  if (mode == "requantize") fail(ErrorKind::Usage, "card: DST was written by requantize; use --requantize-report");
  const std::string window = mode.substr(0, mode.find('+'));
  if (member(e.report, "window") != window) {
    fail(ErrorKind::Usage, "card: DST was converted with window {}, the report verified window {}", printable(window),
         printable(member(e.report, "window").dump()));
  }
}

}  // namespace mx2nv

// mx2nv verify --merge PART...: the partial reports of verify --shards I/N
// joined into one (verify/merge.hpp). The parts are input. The report may go
// anywhere but into the SRC and DST the parts name (as recorded, as they
// resolve now, and as they resolved when each part was verified: a symlink
// re-pointed since protects nothing) and never over a part. The path is
// resolved (a FIFO opened) before the parts are read, and checked once they
// are, before anything is printed or written. A failed merge writes its error
// report only where every part's SRC and DST are known, so the same check can
// be made.
#include "cli/standard_output.hpp"
#include "cli/subcommand.hpp"
#include "cli/summary.hpp"
#include "common/error.hpp"
#include "common/printable.hpp"
#include "verify/verify.hpp"

#include <fmt/core.h>

namespace mx2nv::cli {
namespace {

// The merged report's file, checked against the trees the parts name and
// against the parts themselves.
void check_merged_report_file(ReportFile& file, const VerifyReportMerger& merger,
                              const std::vector<fs::path>& parts) {
  std::vector<fs::path> trees;
  for (const auto& t : merger.named_trees()) trees.emplace_back(t);
  std::vector<std::pair<fs::path, std::string>> inputs;
  for (const auto& part : parts) inputs.emplace_back(part, fmt::format("{}, a part this merge reads", part.string()));
  file.check(protect_paths(trees, inputs));
}

Report read_parts(VerifyReportMerger& merger, const std::vector<fs::path>& parts) {
  check_distinct_inputs(parts, "--merge");
  for (const auto& part : parts) {
    std::string text;
    try {
      text = read_text_file(part, kMaxMergePartBytes);
    } catch (const Error& e) {
      rethrow_with_context(e, "--merge");
    }
    merger.add(part.string(), text);
  }
  return merger.finish();
}

// The merge failed with `e`: its error report, where the parts it read
// name their SRC and DST.
void write_merge_error(const Error& e, const VerifyReportMerger& merger, ReportFile& file,
                       const std::vector<fs::path>& parts) {
  try {
    if (!merger.all_parts_named() || !merger.window()) {
      fail(ErrorKind::Usage, "the parts do not all name their SRC and DST, which the report must stay out of");
    }
    check_merged_report_file(file, merger, parts);
    Provenance named;
    named.source = merger.source();
    named.target = merger.target();
    const Report r = failed_report(Command::Verify, *merger.window(), std::move(named), e);
    flush_out();
    file.write_pieces([&](const ReportFile::PieceSink& sink) {
      write_report_json(r, sink);
      sink("\n");
    });
  } catch (...) {
    const Error again = current_exception_as_error();
    err("mx2nv: no report written: {}\n", printable(again.what()));
  }
}

// Figures a part did not compute print as "not computed" (Measured's formatter).
void print_merged(const Report& merged, std::size_t parts) {
  const bool lossy = !merged.requantized.empty();
  out("mx2nv verify: merged {} parts: {}, {} values compared, {} mismatches, {} differences\n", parts,
      merged.result == Outcome::Ok         ? (lossy ? "ok, LOSSY modules equal the documented requantization bit for bit, "
                                                      "every other value identical"
                                                    : "ok, every value identical")
      : merged.result == Outcome::Mismatch ? "MISMATCH"
                                           : "ERROR",
      merged.values_compared, merged.mismatches, merged.differences.size());
  if (merged.result == Outcome::Error) {
    err("mx2nv verify: a part failed: {}: {}\n", printable(kind_name(merged.error_kind)), printable(merged.error));
  }
  for (const auto& d : merged.differences) err("mx2nv verify: {}\n", printable(d));
}

}  // namespace

int run_merge(const std::vector<std::string>& parts, const std::string& report_path) {
  const std::vector<fs::path> paths(parts.begin(), parts.end());
  std::optional<ReportFile> file;
  if (!report_path.empty()) {
    file.emplace(report_path, "--report");  // a directory, a missing folder: exit 2 now
    file->require_directory();
  }
  VerifyReportMerger merger(parts.size());
  Report merged;
  try {
    merged = read_parts(merger, paths);
  } catch (...) {
    const Error e = current_exception_as_error();
    print_error(e);
    if (file) write_merge_error(e, merger, *file, paths);
    return exit_code(e.kind());
  }
  if (file) check_merged_report_file(*file, merger, paths);
  print_merged(merged, parts.size());
  if (file) {
    flush_out();
    file->write_pieces([&](const ReportFile::PieceSink& sink) {
      write_report_json(merged, sink);
      sink("\n");
    });
  }
  return merged.exit_code();
}

}  // namespace mx2nv::cli

// `mx2nv verify --merge`: joins the partial reports of `verify --shards I/N`
// (run on many machines) into the report of one whole verify. Pure logic on
// the reports' text; the parts are input, not trusted state: a part may be
// damaged, truncated, from another conversion or another mx2nv, or written
// by hand.
//
// Each part is read by report_from_json (report/report.hpp: every key of
// its type, no unknown key, derived keys agreeing with the rest), then
// checked as a verify report of a run; the merged report is a Report.
//
// Exit codes (the errors this throws; the CLI maps them):
// - 3 (InvalidInput), naming the part and the key: a part that is not, on
//   its own, a verify report of this version's schema: not JSON (or larger
//   than kMaxMergePartBytes / kMaxMergePartValues), a missing or unknown key,
//   a value of the wrong type or out of range, a shard_subset that is not
//   I/N with N <= kMaxMergeParts, or a part that contradicts itself (result
//   vs exit_code vs error vs mismatches vs differences vs max_abs_error,
//   mismatches > values_compared, requantized rows vs the overspan summary).
//   Also a set whose counts add up past 2^64 - 1, and a requantized module
//   listed by two parts (a module belongs to the one part that holds its
//   packed tensor's shard): no set of real parts does that.
// - 2 (Usage): parts each valid that do not make one whole: another SRC,
//   DST, window, tool version (or not this mx2nv's version), N, over-span
//   choice or whole-checkpoint result (counts, sizes, global conflicts,
//   over-span layers: the checks every part runs on the whole checkpoint);
//   a part index given twice; parts missing (the first kMaxListedMissingParts
//   listed, "and K more"). Also no parts, or more than kMaxMergeParts.
// The merged result is ok only when every part is ok and the set is
// complete and consistent; any part in error makes it an error (that part's
// error, exit code and kind; the lowest part index wins), else any mismatch
// makes it a mismatch.
//
// Memory is bounded by what the parts hold, never by what they claim: a
// part is at most kMaxMergePartBytes of text and kMaxMergePartValues JSON
// values, parsed one at a time and dropped; what is kept across parts is one
// part's whole-checkpoint fields, the part indices (one per part), the
// requantized rows (each module once) and at most kMaxReportedDifferences
// differences.
#pragma once

#include "numerics/window.hpp"
#include "report/report.hpp"
#include "safetensors/index.hpp"

#include <array>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mx2nv {

// Room for a real part, whose size grows with the modules it lists (the
// over-span layers list every module of an affected layer, and each
// requantized module has a row), far above a real checkpoint's.
inline constexpr std::uint64_t kMaxMergePartBytes = 32 << 20;
inline constexpr std::size_t kMaxMergePartValues = 1 << 20;
// No checkpoint has more shards (safetensors/index.hpp), so no split needs more parts.
inline constexpr std::size_t kMaxMergeParts = kMaxShards;
inline constexpr std::size_t kMaxListedMissingParts = 10;

struct PartData;  // what one part says, checked (merge.cpp)

// The counts each part makes over its own shards, added up (merge.cpp kPerPartCounts).
inline constexpr std::size_t kMergedCounts = 6;

class VerifyReportMerger {
 public:
  // `parts`: how many parts will be added. Throws Error(Usage) for none or
  // more than kMaxMergeParts.
  explicit VerifyReportMerger(std::size_t parts);

  // One part's text; `name` (its file) names it in messages. Throws as
  // described above; a part that throws leaves the merger unusable.
  void add(std::string_view name, std::string_view text);

  // The merged report (its merged_parts set). Throws Error(Usage) when
  // parts are missing.
  Report finish() const;

  // Every SRC and DST named by the parts added so far (provenance source and
  // target as given to verify, and as they resolved then, each also with its
  // \xNN escapes turned back into bytes): a report must stay out of all of
  // them (and of where they resolve at merge time: the caller's part).
  std::vector<std::string> named_trees() const;
  // Whether every part was added and named its SRC and DST (so named_trees()
  // is complete: an error report may be written where it allows).
  bool all_parts_named() const { return named_parts_ == expected_parts_; }
  // The first part's window and provenance, once one was read.
  std::optional<Window> window() const { return window_; }
  const std::string& source() const { return provenance_.source; }
  const std::string& target() const { return provenance_.target; }

 private:
  void check_identity(std::string_view name, const PartData& d);
  void keep_whole(std::string_view name, PartData& d);
  void add_results(std::string_view name, PartData& d);
  void add_difference(std::uint64_t part, std::uint64_t position, const std::string& text);

  std::size_t expected_parts_;
  std::size_t named_parts_ = 0;
  std::set<std::string> trees_;

  // Identity: what every part shares (from the first part).
  std::string first_name_;
  std::optional<Window> window_;
  Provenance provenance_;
  std::uint64_t count_ = 0;  // N

  // The whole-checkpoint fields, from the first part not in error (or the
  // first part, until one arrives): as written (compared with each part's)
  // and the part's report they come from (without its rows).
  Json whole_;
  Report whole_report_;
  std::string whole_name_;
  bool whole_from_error_part_ = true;

  std::map<std::uint64_t, std::string> seen_;  // part index I -> its name
  // The parts' own counts, added up (kPerPartCounts' order); nullopt once a
  // part did not compute one.
  std::array<std::optional<std::uint64_t>, kMergedCounts> counts_;
  std::optional<std::uint64_t> values_compared_ = 0, mismatches_ = 0;
  std::uint64_t marlin_zeroed_blocks_ = 0;
  double max_abs_error_ = 0;  // infinity once a part's is "inf"
  bool max_abs_error_computed_ = true;
  bool any_mismatch_ = false;
  bool size_change_withheld_ = false;  // by a part not in error (report.hpp)
  struct PartError {
    std::uint64_t index;
    std::string error;
    ErrorKind kind;
  };
  std::optional<PartError> error_;  // the lowest part index in error
  double seconds_ = 0;
  std::map<std::string, std::pair<ModuleError, std::string>> requantized_;  // module -> row, the part that listed it

  // The first kMaxReportedDifferences distinct differences in (part index,
  // position) order; `omitted_` counts those that did not fit.
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::string> differences_;
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> difference_keys_;
  std::uint64_t omitted_differences_ = 0;
  // The parts' fingerprints (verify writes one): carried into the merged
  // report only when every part has the same one; parts that differ mean SRC
  // or DST changed between them, a difference.
  std::optional<Fingerprint> fingerprint_;
  bool fingerprint_missing_ = false, fingerprints_differ_ = false, any_part_added_ = false;
};

// All parts at once (tests, the fuzz target): (name, text) pairs.
Report merge_verify_reports(const std::vector<std::pair<std::string, std::string>>& parts);

}  // namespace mx2nv

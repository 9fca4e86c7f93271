// The machine-readable account of a run (`--report FILE`, `inspect --json`).
// Field names are a contract: scripts read them.
#pragma once

#include "common/command.hpp"
#include "common/error.hpp"
#include "json/strict_json.hpp"
#include "numerics/formats.hpp"
#include "plan/overspan.hpp"
#include "plan/plan.hpp"
#include "sys/copy_engine.hpp"

#include <compare>
#include <cstdint>
#include <functional>
#include <ostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mx2nv {

struct Provenance {
  std::string tool_version = MX2NV_VERSION;
  std::string source;
  std::optional<std::string> revision;  // HF cache snapshot revision, when SRC is one
  std::string target;
};

// "…/snapshots/<rev>/…" -> rev (the Hugging Face cache layout).
std::optional<std::string> hf_snapshot_revision(const std::string& path);

// One requantized module's error against its MXFP4 values (requantize,
// convert --overspan requantize): the report's per-module error table.
struct ModuleError {
  std::string module;
  // The second-level F32 written (shared by a gate/up pair): the divisor
  // weight_global_scale, or in ModelOpt's layout the multiplier weight_scale_2.
  float global_scale = 1.0f;
  std::uint64_t values = 0;
  double relative_rmse = 0;
  double cosine = 1;
  double max_abs_error = 0;
  // Block scales below 2^-6 (E4M3 subnormals): exact on disk, flushed to zero
  // by vLLM's Marlin path (README "Windows"); the error above is on disk.
  std::uint64_t marlin_zeroed_blocks = 0;
};

// Which files a report's claims are about (verify, requantize): a digest of
// SRC's and DST's files as checkpoint/fingerprint.hpp computes it, so that
// `mx2nv card` can tell a report of these bytes from one of others.
struct Fingerprint {
  std::string source, target;  // "xxh3-128:<32 hex>"
  std::uint64_t source_files = 0, target_files = 0;
  bool operator==(const Fingerprint&) const = default;
};

// A figure of a report: absent until the command computes it, and then
// written; absent figures are JSON null ("not computed", never 0). `+=` and
// `=` mark it computed, so the code that counts is the code that says so.
template <typename T>
class Measured {
 public:
  Measured() = default;
  Measured& operator=(T v) {
    value_ = v;
    return *this;
  }
  Measured& operator+=(T v) {
    value_ = value_.value_or(T{}) + v;
    return *this;
  }
  void reset() { value_.reset(); }
  bool has_value() const { return value_.has_value(); }
  explicit operator bool() const { return value_.has_value(); }
  T operator*() const { return *value_; }
  T value_or(T fallback) const { return value_.value_or(fallback); }
  const std::optional<T>& get() const { return value_; }
  bool operator==(const Measured&) const = default;
  // An absent figure equals no number and is unordered against every one.
  friend bool operator==(const Measured& m, T v) { return m.value_ && *m.value_ == v; }
  friend std::partial_ordering operator<=>(const Measured& m, T v) {
    if (!m.value_) return std::partial_ordering::unordered;
    return *m.value_ <=> v;
  }
  friend std::ostream& operator<<(std::ostream& os, const Measured& m) {
    if (!m.value_) return os << "null";
    return os << *m.value_;
  }

 private:
  std::optional<T> value_;
};

}  // namespace mx2nv

// Text output prints an absent figure as "not computed", never as 0.
template <typename T>
struct fmt::formatter<mx2nv::Measured<T>> : fmt::formatter<T> {
  template <typename Context>
  auto format(const mx2nv::Measured<T>& m, Context& ctx) const {
    if (!m) return fmt::format_to(ctx.out(), "not computed");
    return fmt::formatter<T>::format(*m, ctx);
  }
};

namespace mx2nv {

// verify lists the first this many differences, then "... and K more"
// (`verify --merge` reads partial reports by the same rule).
inline constexpr std::size_t kMaxReportedDifferences = 200;

struct Report {
  Command command = Command::Convert;  // one of the commands that write reports (common/command.hpp)
  Outcome result = Outcome::Ok;
  ErrorKind error_kind = ErrorKind::Io;  // when result == Outcome::Error
  Window window = Window::Marlin;
  Provenance provenance;

  Measured<std::uint64_t> modules;
  Measured<std::uint64_t> scale_groups;  // distinct global scales (gate/up pairs count once)
  Measured<std::uint64_t> active_groups;
  Measured<std::uint64_t> zero_groups;
  Measured<std::uint64_t> canonicalised_zero_groups;
  Measured<std::uint64_t> marlin_zeroed_groups;
  Measured<std::uint64_t> passthrough_tensors;
  Measured<std::uint64_t> companion_files;
  Measured<std::uint64_t> shards;
  Measured<std::uint64_t> resumed_shards;  // convert --resume: finished shards reused
  std::string shard_subset;          // verify --shards I/N: the part this report covers ("" = all)
  // verify --shards I/N: SRC and DST as they resolved when the part was
  // verified (every symlink followed), so that verify --merge keeps its
  // report out of them even if a symlink given as SRC or DST is re-pointed
  // before the merge. Written with the part ("resolved"), absent otherwise.
  std::string resolved_source, resolved_target;
  bool already_complete = false;     // convert --resume: DST already held this conversion; nothing was written

  // active_groups and zero_groups are counted only where mx2nv reads the
  // packed bytes itself (verify; convert --copy copy): shared or
  // kernel-copied bytes are not seen, and the figures stay null.

  // convert: how the output bytes came to be (README "Zero-copy output").
  std::optional<CopyMode> copy_mode;  // how unchanged bytes reach DST (--copy); none: no "copy" in the JSON
  Measured<std::uint64_t> shared_bytes;     // unchanged bytes shared with SRC (reflink): no new data blocks
  Measured<std::uint64_t> copied_bytes;     // unchanged bytes copied (copy_file_range or read/write)
  Measured<std::uint64_t> written_bytes;    // new bytes: shard headers, scales, globals, config, index

  Measured<std::uint64_t> source_tensor_bytes;
  Measured<std::uint64_t> target_tensor_bytes;

  Measured<std::uint64_t> values_compared;
  Measured<std::uint64_t> mismatches;
  Measured<double> max_abs_error;

  std::vector<OverSpan> refused_spans;
  std::vector<std::string> unrepresentable_globals;  // scale groups no global exponent serves
  std::vector<GlobalConflict> global_conflicts;      // the same, with the ranges that do not meet
  Measured<std::uint64_t> raised_globals;  // scale groups whose global is above k_max - 8 (the window's global range)
  std::vector<ModuleError> requantized;  // lossy modules, sorted by name
  // convert --overspan (absent from the JSON for fail): the choice, the
  // refusals it resolved (why), the BF16 layers with their size cost.
  OverSpanChoice over_span_choice = OverSpanChoice::Fail;
  std::vector<OverSpan> resolved_spans;
  std::vector<Bf16Layer> bf16_layers;
  Measured<std::uint64_t> requantized_marlin_zeroed_blocks;
  std::optional<Fingerprint> fingerprint;  // verify, requantize: absent when DST could not be read
  std::vector<std::string> differences;  // verify: every structural or value difference found (capped)
  std::string error;                     // the error message when result == "error"
  std::optional<std::uint64_t> merged_parts;  // verify --merge: how many parts were joined
  double seconds = 0;

  // A report read back whose size_change_percent was null although both sizes
  // are there (a report that withholds the figure): it stays null, and the
  // card leaves its row out. Commands never withhold it.
  bool size_change_withheld = false;

  // null unless both tensor sizes were computed (and SRC's is not 0), and
  // not withheld.
  std::optional<double> size_change_percent() const;
  // The same as the report writes it (to 4 decimals), which the card cites.
  std::optional<double> written_size_change_percent() const;
  int exit_code() const { return mx2nv::exit_code(result, error_kind); }
  // Records `error` as this run's outcome (the error path's report is the
  // success path's report with result "error").
  void set_error(const Error& error);
};

// A report of `command` with its provenance filled in: absolute paths and,
// when SRC is a Hugging Face cache snapshot, its revision. An empty path (one
// the command does not know, or has not: inspect's DST) stays empty.
Report start_report(Command command, Window window, const fs::path& source, const fs::path& target = {});

// The report of a command that failed, which the CLI and the Python package
// write alike: the report its success path starts, with result "error" and
// the error's kind and message. `source` and `target` are the SRC and DST
// the command uses (with a plan, the plan's), empty where unknown.
// `unresolved` says what happens when they cannot be made absolute (the
// working directory is gone): Throw (the CLI then writes no report), or
// AsGiven (the paths as given, no revision: the Python package returns a
// report whatever happens).
enum class UnresolvedPaths { Throw, AsGiven };
Report failed_report(Command command, Window window, const fs::path& source, const fs::path& target,
                     const Error& error, UnresolvedPaths unresolved);
// The same for a command that knows its SRC and DST only as recorded
// (verify --merge: as its parts name them), kept as they are.
Report failed_report(Command command, Window window, Provenance provenance, const Error& error);

// The report as JSON (report_json.cpp: one property list, written and read
// by the same names). write_report_json hands the text to `sink` in pieces:
// the per-module arrays (over_span, requantized: a row per module, a quarter
// of a million at K3's structure) are written a row at a time, so no
// document of them is built. The text is nlohmann's indented dump of the
// document (keys sorted), as reports have always been.
void write_report_json(const Report& report, const std::function<void(std::string_view)>& sink);
std::string report_json_text(const Report& report);
Json report_to_json(const Report& report);  // the same document, parsed
// [{module, span, limit, groups_outside}]: refusals (over_span, resolved_over_span, inspect's outcomes).
Json over_span_to_json(const std::vector<OverSpan>& over_span);
// [{scale_group, k_max, k_min, needed: [lo, hi], allowed: [lo, hi]}]: global exponents m.
Json global_conflicts_to_json(const std::vector<GlobalConflict>& conflicts);

// A part of verify --shards I/N records SRC and DST as they resolve now
// (Report::resolved_source/target): every symlink followed, or, for one
// that does not exist, the absolute path as given.
void record_resolved_paths(Report& report, const fs::path& source, const fs::path& target);

// The inverse of write_report_json: a report document read back into a
// Report, by the writer's own property list, so that writing the result
// gives the same text. The document is input: every member is checked for
// its type and range, arrays against caps before anything is allocated for
// them, unknown members refused, and derived members (exit_code,
// size_change_percent, counts.global_conflicts, overspan.lossy, ...) and
// conditional ones (error only with result "error", ...) checked against
// the rest. Throws Error(InvalidInput) "<what>: <path of the key>: ...".
Report report_from_json(const Json& document, std::string_view what);
// The same from text, within `max_bytes` and `max_values` (parse_strict_json).
Report report_from_text(std::string_view text, std::string_view what, std::uint64_t max_bytes,
                        std::size_t max_values);

}  // namespace mx2nv

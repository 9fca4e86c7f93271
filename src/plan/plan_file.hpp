// The plan as a file (`mx2nv plan`), so that the per-shard execute step can
// run in other processes and on other machines: a pure function of (source
// shard, plan). It holds the source's identity (per shard: size, mtime, header
// hash), every module's global exponent and scale mode, each output shard's
// size and plan fingerprint, the window and tool version, and a checksum over
// all of it. Reading validates everything (the file may have been edited or
// damaged on shared storage): anything off is invalid input (exit 3). SRC and
// DST are recorded byte for byte (paths are bytes, not text); a plan in the
// earlier format mx2nv-plan/2 (paths as text) is read when its paths are
// unambiguous and refused (exit 2) otherwise.
//
// Memory is bounded by the caps below, never by what a plan claims: the text
// `mx2nv plan` writes is read a line at a time through a fixed window, and
// written again to prove it is that text; any other is read as a stream of
// JSON events (no DOM, no copy of the text), the checksum computed over the
// canonical text as it streams by. Both give one verdict and one message
// for every file (the line reader accepts only what the stream would, and
// declines everything else to it). Kimi K3's
// plan (96 shards, ~250k module rows) is ~24 MB on disk (~34 MB as earlier
// mx2nv wrote it, a line per number) and ~40 MB as read.
#pragma once

#include "common/byte_source.hpp"
#include "plan/plan.hpp"
#include "safetensors/index.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mx2nv {

inline constexpr std::string_view kPlanFormat = "mx2nv-plan/3";
inline constexpr std::string_view kPlanFileName = "plan.json";  // inside DST/.mx2nv/ by default

// What a plan may hold (exit 3 beyond, before anything is allocated for it):
// - the file: 128 MiB, ~5x K3's (a larger model's plan is refused, with this
//   cap named, rather than read into unbounded memory);
// - shards: as many as an index may name (safetensors/index.hpp);
// - module rows: every module is at least three entries of the converted
//   index (packed weight, block scales, global), so no index within its
//   caps holds more; their names, the index's name bytes;
// - a path (SRC, DST, a shard's file): PATH_MAX bytes, as the kernel takes.
inline constexpr std::uint64_t kMaxPlanBytes = 128ull << 20;
inline constexpr std::size_t kMaxPlanShards = kMaxShards;
inline constexpr std::size_t kMaxPlanModules = kMaxIndexTensors / 3;
inline constexpr std::uint64_t kMaxPlanNameBytes = kMaxIndexNameBytes;
inline constexpr std::size_t kMaxPlanPathBytes = 4096;

struct PlannedShard {
  std::string file;
  std::uint64_t source_size = 0;
  std::int64_t source_mtime_ns = 0;
  std::uint64_t source_header_hash = 0;
  std::uint64_t plan_hash = 0;          // the shard record's plan fingerprint
  std::uint64_t output_data_bytes = 0;  // tensor data of the output shard
  std::uint64_t output_tensors = 0;
};

struct PlanFile {
  // A requantize plan (`mx2nv plan --requantize`) records "kind":
  // "requantize"; a conversion's plan has no such member (its text is the
  // one earlier mx2nv wrote).
  PlanKind kind = PlanKind::Convert;
  std::string tool_version;
  Window window = Window::Marlin;
  OverSpanChoice over_span_choice = OverSpanChoice::Fail;  // convert --overspan (each module's treatment is in its row)
  // The layout the steps write (convert --format); "output_format" only
  // where it is not compressed-tensors', so such plans' text is unchanged.
  TargetFormat format = TargetFormat::CompressedTensors;
  // The absolute paths `mx2nv plan` was given, exactly (any bytes but NUL):
  // what a step opens unless told otherwise (another machine may mount the
  // storage elsewhere).
  std::string source;
  std::string target;
  std::vector<PlannedShard> shards;         // in the source's shard order
  std::vector<std::string> module_names;    // ModuleSet order
  std::vector<ModulePlan> modules;          // parallel to module_names
  std::uint64_t fingerprint = 0;            // XXH3-64 of the canonical text of everything above
  // (Semantic checks on reading: each row's global agrees with its m, the
  // window and the treatment with the --overspan choice; shard names are
  // plain relative paths, each once. Whether the rows are SRC's is checked
  // by the steps, convert/planned.cpp.)
};

std::string plan_file_to_text(PlanFile& plan);  // fills plan.fingerprint
// Throws Error(InvalidInput) naming `what` and the field.
PlanFile plan_file_from_text(std::string_view text, std::string_view what);
// The same, streamed from bytes [0, size) of `source` (a plan file): the
// size is checked against kMaxPlanBytes first.
PlanFile plan_file_from_source(const ByteSource& source, std::uint64_t size, std::string_view what);
// The two readers plan_file_from_source uses, alone (tests compare them):
// the streaming reader, which reads any JSON text and gives every verdict;
// and the line reader, which reads the text plan_file_to_text writes,
// accepting only a plan the streaming reader accepts the same (nullopt
// where it declines, whatever the reason).
PlanFile plan_file_streamed(const ByteSource& source, std::uint64_t size, std::string_view what);
std::optional<PlanFile> plan_file_as_written(const ByteSource& source, std::uint64_t size, std::string_view what);

// The plan for `modules` (ModuleSet order) from the file; throws
// Error(Usage) when the file plans other modules (SRC changed since).
Plan plan_for_modules(const PlanFile& file, const std::vector<std::string_view>& module_names);

}  // namespace mx2nv

// A conversion split across processes and machines, for schedulers (Slurm job
// arrays, Kubernetes Indexed Jobs, Ray tasks):
//   mx2nv plan SRC DST                      plan once; refusals happen here
//   mx2nv convert --plan P --shards I/N     any number of times, anywhere, in any order
//   mx2nv convert --plan P --finalize       companions, config, index last
// Every step is idempotent: a shard whose record matches is skipped, two
// workers on the same shard serialise on its lock (the second finds the work
// done), and a finished DST answers "already complete". The bytes are those of
// a single-process `mx2nv convert` (same steps, same code).
#pragma once

#include "core/numerics.hpp"
#include "core/plan.hpp"
#include "core/report.hpp"
#include "io/copy_engine.hpp"
#include "io/file.hpp"
#include "io/progress.hpp"

#include <optional>
#include <string_view>
#include <vector>

namespace mx2nv {

// --shard I (exactly shard I) or --shards I/N (shards I, I+N, I+2N, ...).
struct ShardSelection {
  std::size_t index = 0;
  std::size_t stride = 0;  // 0: the one shard `index`
};
// "I/N" -> selection; throws Error(Usage).
ShardSelection parse_shard_selection(std::string_view text);
// "I" -> the one shard I; throws Error(Usage).
ShardSelection parse_shard_index(std::string_view text);
// The shard indices selected out of `total`; throws Error(Usage) when an
// explicit --shard is out of range.
std::vector<std::size_t> selected_shards(const ShardSelection& selection, std::size_t total);

struct PlanOptions {
  fs::path source;
  fs::path target;
  Window window = Window::Marlin;
  unsigned threads = 1;
  std::optional<fs::path> plan_out;  // default: DST/.mx2nv/plan.json
  OverSpanChoice overspan = OverSpanChoice::Fail;  // as convert --overspan; recorded in the plan
};
// Plans and writes the plan file. report.result is Refused (nothing written)
// when the window refuses a module.
Report plan_checkpoint(const PlanOptions& options, fs::path& plan_written);

struct PlannedOptions {
  fs::path plan;
  std::optional<fs::path> source;  // default: the plan's
  std::optional<fs::path> target;  // default: the plan's
  unsigned threads = 1;
  CopyMode copy = CopyMode::Auto;  // --copy, as for convert
  ProgressCallback progress = {};  // optional; as convert's (unit: shards, bytes: the selected shards' source bytes)
};
Report convert_planned_shards(const PlannedOptions& options, const ShardSelection& selection);
// Exits 2 naming the shards not finished yet.
Report finalize_planned(const PlannedOptions& options);

}  // namespace mx2nv

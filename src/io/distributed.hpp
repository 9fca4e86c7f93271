// A conversion split across processes and machines, for schedulers (Slurm job
// arrays, Kubernetes Indexed Jobs, Ray tasks):
//   mx2nv plan SRC DST                      plan once; refusals happen here
//   mx2nv convert --plan P --shards I/N     any number of times, anywhere, in any order
//   mx2nv convert --plan P --finalize       companions, config, index last
// Every step is idempotent: a shard whose record matches is skipped, two
// workers on the same shard serialise on its lock (the second finds the work
// done), and a finished DST answers "already complete". The bytes are those of
// a single-process `mx2nv convert` (same steps, same code).
//
// A plan is input, not trusted state (it lives on shared storage, and its
// checksum detects damage, not forgery). A step uses it to know which SRC and
// DST (recorded byte for byte), which options and which shards; everything a
// step writes is checked against SRC and the options first: SRC's shard
// identities and module list, the tool version, each shard's output size and
// fingerprint, and the rows (global, treatment, counts) of every module the
// step writes, derived again from SRC (io/planner.hpp). DST must be receiving
// this conversion and no other (io/shard_record.hpp, ConversionIdentity).
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
// explicit --shard is out of range. Any I and N (up to 2^64 - 1) select
// exactly I, I+N, ... below `total`: the stride never wraps.
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
  // --window / --overspan given to a step: what the caller expects the plan
  // to be (exit 2 when it is another); the plan decides either way.
  std::optional<Window> window;
  std::optional<OverSpanChoice> overspan;
};
Report convert_planned_shards(const PlannedOptions& options, const ShardSelection& selection);
// Exits 2 naming the shards not finished yet.
Report finalize_planned(const PlannedOptions& options);

// The SRC and DST a planned step uses (the plan's, or the options'), for
// front ends to check their output paths (--report, --html) against before
// any work. Reads and checks the plan as the step does (exit 3 for a damaged
// one). For a plan finalize has removed with the rest of DST's state: the
// DST it was kept in, and SRC if given, else the directory among the
// ancestors of `outputs` that holds SRC's first shard as DST's finished
// record describes it (name, size, mtime, header), if any: a report meant
// for SRC is recognised even when nobody said where SRC is.
struct PlannedPaths {
  fs::path plan;
  std::optional<fs::path> source;
  std::optional<fs::path> target;
};
PlannedPaths planned_paths(const PlannedOptions& options, const std::vector<fs::path>& outputs = {});

}  // namespace mx2nv

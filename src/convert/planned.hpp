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
// step writes, derived again from SRC (scan/planner.hpp). DST must be receiving
// this conversion and no other (destination/records.hpp, ConversionIdentity).
#pragma once

#include "common/progress.hpp"
#include "numerics/formats.hpp"
#include "plan/plan.hpp"
#include "plan/shard_selection.hpp"
#include "report/report.hpp"
#include "sys/copy_engine.hpp"
#include "sys/file.hpp"

#include <memory>
#include <optional>
#include <string_view>
#include <vector>

namespace mx2nv {

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
  std::optional<OverSpanChoice> over_span_choice;
  std::optional<TargetFormat> format;  // --format given to a step, likewise
};
struct PlannedPaths;
// `paths`: what planned_paths gave for these options, whose plan the step
// then runs instead of reading the file again.
Report convert_planned_shards(const PlannedOptions& options, const ShardSelection& selection,
                              const PlannedPaths* paths = nullptr);
// Exits 2 naming the shards not finished yet.
Report finalize_planned(const PlannedOptions& options, const PlannedPaths* paths = nullptr);

// The SRC and DST a planned step uses (the plan's, or the options'), for
// front ends to check their output paths (--report, --html) against before
// any work. Reads and checks the plan as the step does (exit 3 for a damaged
// one). For a plan finalize has removed with the rest of DST's state: the
// DST it was kept in, and SRC if given, else the directory among the
// ancestors of `outputs` that holds SRC's first shard as DST's finished
// record describes it (name, size, mtime, header), if any: a report meant
// for SRC is recognised even when nobody said where SRC is.
struct LoadedPlan;
struct PlannedPaths {
  fs::path plan;
  std::optional<fs::path> source;
  std::optional<fs::path> target;
  std::shared_ptr<const LoadedPlan> loaded = nullptr;  // the plan as read and checked; null where it is gone
};
PlannedPaths planned_paths(const PlannedOptions& options, const std::vector<fs::path>& outputs = {});

}  // namespace mx2nv

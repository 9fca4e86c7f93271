// The steps of a conversion, shared by `mx2nv convert` (plan, every shard and
// finalize in one process), `mx2nv requantize` (the same on a requantize
// plan, PlanKind::Requantize) and the planned, per-shard commands that
// schedulers run on many machines (`mx2nv plan`, `convert --plan P --shards
// I/N`, `convert --plan P --finalize`). Each output shard is a pure function
// of (source shard, plan), so every way of running them writes the same bytes.
#pragma once

#include "checkpoint/reader.hpp"
#include "common/progress.hpp"
#include "destination/destination.hpp"
#include "destination/index_writer.hpp"
#include "destination/records.hpp"
#include "numerics/nvfp4_quantizer.hpp"
#include "plan/plan.hpp"
#include "plan/plan_file.hpp"
#include "report/report.hpp"
#include "sys/copy_engine.hpp"

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace mx2nv {

// Every file a conversion of `ck` into `format` writes, relative to DST.
std::set<std::string> files_written(const Checkpoint& ck, TargetFormat format = TargetFormat::CompressedTensors);

// Counts a report gets from the plan (canonicalised and Marlin-zeroed groups).
void add_plan_counts(Report& report, const Plan& plan);
// Counts a report gets from finished shards.
void add_shard_counts(Report& report, const std::vector<ShardRecord>& records);

// Execute: the given shards, independently and in parallel; a shard whose
// record still matches (and whose output is intact) is reused when `reuse`.
// Returns their records, in the order of `shards`. Unchanged bytes go through
// `engine` (nullptr: one with --copy auto). `errors` (parallel to the
// modules): the error of every requantized module written here (write_shard);
// a module of a reused shard keeps its slot as it was.
std::vector<ShardRecord> execute_shards(const SourceCheckpoint& source, const Plan& plan, Destination& out,
                                        const std::vector<std::size_t>& shards, bool reuse, unsigned threads,
                                        std::uint64_t& reused, CopyEngine* engine = nullptr,
                                        ProgressTracker* progress = nullptr, std::vector<ErrorStats>* errors = nullptr);

// The whole-DST commands (convert, requantize): every shard of `plan`
// (reused where `resume` allows), then `counted(records)` fills what the
// report takes from the shards, then finalize. DST's index is written while
// the shards are when its size is known early (destination/index_writer.hpp).
// Returns how many shards were reused.
std::uint64_t execute_and_finalize(const SourceCheckpoint& source, const Plan& plan, Report& report, Destination& out,
                                   bool resume, unsigned threads, CopyEngine& engine, ProgressTracker* progress,
                                   std::vector<ErrorStats>* errors,
                                   const std::function<void(const std::vector<ShardRecord>&)>& counted);

// A DST holding a plan is a planned conversion's: its steps continue it
// (convert --plan P --shards/--finalize). A whole-DST run (`command`) would
// finish it under its own options and remove the plan, and the plan's later
// steps would then answer for a conversion they did not plan: Error(Usage).
void refuse_planned_destination(const Destination& out, Command command);

// The record of an earlier run's shard, if it still describes this shard of
// this plan and the output file on disk (shard_record.hpp says why the
// output's identity and the bytes mx2nv wrote itself are enough to check).
// `layout` is the shard's target layout (make_target_layout).
std::optional<ShardRecord> reusable_record(const Destination& dst, const ShardRecord& expected,
                                           const TargetLayout& layout);

// Finalize: companions, config, then the finished record and the commit point
// (the index; for a single-file model config.json). Adds the bytes it writes
// and copies to the report. `early`: the index written while the shards were
// (destination/index_writer.hpp); used if its total size is the shards', else
// dropped and written again.
void finalize_conversion(const SourceCheckpoint& source, const Plan& plan, Report& report,
                         std::vector<ShardRecord> records, Destination& out, CopyEngine* engine = nullptr,
                         std::optional<WrittenIndex> early = std::nullopt);

// A retried command (Slurm --requeue, a Kubernetes Job retry) on a DST that
// already holds a finished conversion: true, with `report` filled as "already
// complete", when it is this conversion of SRC under `window`; Error(Usage)
// naming what differs when it is another; false when DST is not finished.
// `choice` (convert --overspan) also accepts a DST whose refused modules were
// rewritten that way (finished.json mode "<window>+<choice>").
// `plan_hashes` (a planned step: its plan's per-shard fingerprints) also
// requires every finished shard to have been written under exactly that plan.
// `kind` Requantize: DST must hold `mx2nv requantize`'s checkpoint instead
// (window and choice unused), and a conversion's is another. A DST in another
// layout (`format`, --format) is always another.
bool answer_finished(Report& report, const Destination& dst, const Checkpoint& source, Window window,
                     OverSpanChoice choice = OverSpanChoice::Fail,
                     const std::vector<std::uint64_t>* plan_hashes = nullptr, PlanKind kind = PlanKind::Convert,
                     TargetFormat format = TargetFormat::CompressedTensors);

// SRC's shard identities (source_identity), in order.
std::vector<ShardRecord> source_identities(const Checkpoint& ck);
// Which conversion `plan` of the SRC with these shard identities is.
ConversionIdentity conversion_identity(const std::vector<ShardRecord>& identities, const Plan& plan);
// The same for a plan file, from the shard identities it records (equal to
// SRC's once a step has checked them).
ConversionIdentity conversion_identity(const PlanFile& file, const Plan& plan);

// The plan step of convert and `mx2nv plan`: nullopt when there is nothing to
// execute, either because DST already holds this conversion (answer_finished)
// or because the window refuses a module (report_refusal).
// With `choice` other than fail, refused scale groups are resolved that way
// (scan/overspan_values.hpp) and the report gets the over-span section.
// `scan_cache`: how the scan uses the page cache (scan_modules).
std::optional<Plan> plan_step(Report& report, const Destination& dst, const SourceCheckpoint& source, Window window,
                              unsigned threads, OverSpanChoice choice = OverSpanChoice::Fail,
                              TargetFormat format = TargetFormat::CompressedTensors,
                              CacheUse scan_cache = CacheUse::Passing);

// True, with the refusal in `report`, when the plan refuses a module.
bool report_refusal(Report& report, const ModuleSet& set, const Plan& plan);

}  // namespace mx2nv

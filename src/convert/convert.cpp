#include "convert/convert.hpp"

#include "checkpoint/reader.hpp"
#include "checkpoint/argument_check.hpp"
#include "common/cancel.hpp"
#include "common/error.hpp"
#include "common/stopwatch.hpp"
#include "checkpoint/source_fields.hpp"
#include "convert/steps.hpp"
#include "destination/destination.hpp"
#include "destination/index_writer.hpp"
#include "scan/planner.hpp"

#include <chrono>
#include <numeric>
#include <vector>

namespace mx2nv {
namespace {

// A DST holding a plan is a planned conversion's: its steps continue it
// (convert --plan P --shards/--finalize). A whole-DST run would finish it
// under its own options and remove the plan, and the plan's later steps
// would then answer for a conversion they did not plan.
void refuse_planned_destination(const Destination& out) {
  if (out.holds_plan()) {
    fail(ErrorKind::Usage,
         "DST {} holds a plan made by mx2nv plan ({}/plan.json); continue it with mx2nv convert --plan ... --shards "
         "I/N and --finalize, or convert into another DST",
         out.root().string(), (out.root() / kStateDirName).string());
  }
}

}  // namespace

Report convert_checkpoint(const ConvertOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  check_source_argument({Command::Convert, options.source, options.target});
  check_new_destination({Command::Convert, options.source, options.target});
  Destination out(options.source, options.target, options.resume);
  Report report = start_report(Command::Convert, options.window, options.source, options.target);
  report.copy_mode = options.copy;
  ProgressTracker progress(Command::Convert, "shards", options.progress);
  progress.phase(ProgressPhase::Plan);

  // --- plan: nothing is written until every module has been decided.
  // The index's names go into DST's index at the end: kept for an index of
  // a real checkpoint's size (IndexNames::KeepIfSmall), read again then
  // (render_target_index) for a larger one rather than held while modules are
  // scanned and shards written.
  // A planned conversion's DST is refused before the plan step's scan.
  // (A finished DST's plan is a leftover of a finalize killed after its
  // commit point: answered for as finished, and tidied away.)
  if (out.state() != DestinationState::Finished) refuse_planned_destination(out);
  const SourceCheckpoint source = open_source_checkpoint(options.source, options.threads, IndexNames::KeepIfSmall);
  const Checkpoint& ck = source.checkpoint;
  add_source_counts(report, source);
  const std::optional<Plan> planned = plan_step(report, out, source, options.window, options.threads, options.over_span_choice);
  if (!planned) {
    if (report.already_complete) out.tidy_finished();
    report.seconds = seconds_since(started);
    return report;
  }
  const Plan& plan = *planned;
  // Which conversion this is; DST must be receiving no other (checked here
  // to refuse before any write, and again under the lock).
  const ConversionIdentity identity = conversion_identity(source_identities(ck), plan);
  out.check_identity(identity);
  // --copy reflink is refused before anything is written.
  if (options.copy == CopyMode::Reflink && !ck.shards.empty()) out.require_sharing(*ck.files->open(0));
  throw_if_stopped();
  progress.phase(ProgressPhase::Shards, report.source_tensor_bytes.value_or(0), ck.shards.size());

  // --- execute every shard, then finalize.
  if (!out.open_for_writing(files_written(ck))) {
    // Finished by another process since DST was opened: answered, not redone.
    if (answer_finished(report, out, ck, options.window, options.over_span_choice)) out.tidy_finished();
    report.seconds = seconds_since(started);
    return report;
  }
  refuse_planned_destination(out);
  out.claim_identity(identity);
  CopyEngine engine(options.copy);
  // DST's index does not depend on the shards: written meanwhile (destination/index_writer.hpp).
  std::optional<BackgroundIndex> index;
  if (const auto total = early_index_total(source, plan)) index.emplace(source, plan, *total, out);
  std::vector<std::size_t> all(ck.shards.size());
  std::iota(all.begin(), all.end(), std::size_t{0});
  std::uint64_t resumed = 0;
  std::vector<ShardRecord> records =
      execute_shards(source, plan, out, all, options.resume, options.threads, resumed, &engine, &progress);
  report.resumed_shards = resumed;
  add_shard_counts(report, records);
  progress.phase(ProgressPhase::Finalize);
  finalize_conversion(source, plan, report, std::move(records), out, &engine,
                      index ? std::optional<WrittenIndex>(index->take()) : std::nullopt);
  report.seconds = seconds_since(started);
  progress.done();
  return report;
}

}  // namespace mx2nv

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
#include <vector>

namespace mx2nv {

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
  if (out.state() != DestinationState::Finished) refuse_planned_destination(out, Command::Convert);
  const SourceCheckpoint source = open_source_checkpoint(options.source, options.threads, IndexNames::KeepIfSmall);
  const Checkpoint& ck = source.checkpoint;
  add_source_counts(report, source);
  // Where the unchanged bytes will likely be shared, the writer reads the
  // scales again and nothing else: the scan leaves them cached. Elsewhere it
  // leaves nothing behind for the stream over every shard to stumble on.
  // (A guess that writes nothing: it only changes how the cache is used.)
  const bool shares = options.copy != CopyMode::Copy && !ck.shards.empty() && out.may_share(*ck.files->open(0));
  const std::optional<Plan> planned = plan_step(report, out, source, options.window, options.threads,
                                                options.over_span_choice, options.format,
                                                shares ? CacheUse::Random : CacheUse::Passing);
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
  if (!out.open_for_writing(files_written(ck, options.format))) {
    // Finished by another process since DST was opened: answered, not redone.
    if (answer_finished(report, out, ck, options.window, options.over_span_choice, nullptr, PlanKind::Convert,
                        options.format)) {
      out.tidy_finished();
    }
    report.seconds = seconds_since(started);
    return report;
  }
  refuse_planned_destination(out, Command::Convert);
  out.claim_identity(identity);
  CopyEngine engine(options.copy);
  report.resumed_shards = execute_and_finalize(source, plan, report, out, options.resume, options.threads, engine,
                                               &progress, nullptr,
                                               [&](const auto& records) { add_shard_counts(report, records); });
  report.seconds = seconds_since(started);
  progress.done();
  return report;
}

}  // namespace mx2nv

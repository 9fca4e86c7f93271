#include "requantize/requantize.hpp"

#include "checkpoint/argument_check.hpp"
#include "checkpoint/fingerprint.hpp"
#include "checkpoint/reader.hpp"
#include "checkpoint/source_fields.hpp"
#include "common/cancel.hpp"
#include "common/error.hpp"
#include "common/parallel.hpp"
#include "common/stopwatch.hpp"
#include "convert/steps.hpp"
#include "destination/destination.hpp"
#include "destination/index_writer.hpp"
#include "scan/overspan_values.hpp"
#include "scan/requantizer.hpp"
#include "sys/heap.hpp"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <vector>

namespace mx2nv {
namespace {

// What a requantize report says of DST's shards: their tensor bytes and
// pass-through tensors. Not the group counts nor the byte tallies
// (shared/copied/written) convert's reports carry: a requantize report has
// never had them, and card and verify read it as it is.
void add_requantize_counts(Report& report, const std::vector<ShardRecord>& records) {
  report.target_tensor_bytes = 0;
  report.passthrough_tensors = 0;
  for (const auto& r : records) {
    report.target_tensor_bytes += r.target_bytes;
    report.passthrough_tensors += r.passthrough_tensors;
  }
  report.zero_groups.reset();
  report.active_groups.reset();
  report.shared_bytes.reset();
  report.copied_bytes.reset();
  report.written_bytes.reset();
}

// DST already holds this requantization of SRC: the report says so, and
// nothing is written.
bool answer_requantized(Report& report, Destination& out, const Checkpoint& ck, TargetFormat format) {
  if (!answer_finished(report, out, ck, Window::Marlin, OverSpanChoice::Fail, nullptr, PlanKind::Requantize, format)) {
    return false;
  }
  add_requantize_counts(report, out.finished()->shards);
  report.canonicalised_zero_groups.reset();
  report.marlin_zeroed_groups.reset();
  out.tidy_finished();
  return true;
}

// The report's error table, every module in module order: from what the
// shard writer measured as it wrote (`errors`), and for the modules of
// shards reused by --resume (no values measured) a pass of their own.
std::vector<ModuleError> error_table(const SourceCheckpoint& source, const Plan& plan, std::vector<ErrorStats>& errors,
                                     unsigned threads) {
  const ModuleSet& set = source.modules;
  std::vector<std::size_t> unmeasured;
  for (std::size_t i = 0; i < set.modules.size(); ++i) {
    if (errors[i].values == 0) unmeasured.push_back(i);
  }
  const TensorEmit discard = [](std::uint64_t, std::span<const std::byte>) { throw_if_stopped(); };
  parallel_for(unmeasured.size(), threads, [&](std::size_t u) {
    const std::size_t i = unmeasured[u];
    stream_requantized_packed(source, i, requantized_level(plan.format, plan.modules[i]), discard, errors[i]);
  });
  throw_if_stopped();
  std::vector<ModuleError> rows;
  rows.reserve(set.modules.size());
  for (std::size_t i = 0; i < set.modules.size(); ++i) {
    const ErrorStats& e = errors[i];
    rows.push_back({std::string(set.modules[i].name), plan.modules[i].divisor, e.values, e.relative_rmse(), e.cosine(),
                    e.max_abs, e.marlin_zeroed_blocks});
  }
  return rows;
}

// What `mx2nv card --requantize-report` checks the files against. Before
// the report's rows are built, and the index's names dropped at once: only
// the files are hashed; the heap they held is handed back after.
void add_fingerprint(Report& report, const Checkpoint& ck, const fs::path& target) {
  {
    Checkpoint written = open_checkpoint(target, CheckpointRole::Target);
    if (written.index) written.index->forget_tensors();
    const FileSetDigest s = checkpoint_fingerprint(ck, CheckpointRole::Source);
    const FileSetDigest t = checkpoint_fingerprint(written, CheckpointRole::Target);
    report.fingerprint = Fingerprint{s.digest, t.digest, s.files, t.files};
  }
  release_free_heap();
}

}  // namespace

Report requantize_checkpoint(const RequantizeOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  check_source_argument({Command::Requantize, options.source, options.target});
  check_new_destination({Command::Requantize, options.source, options.target});
  Destination out(options.source, options.target, options.resume);
  Report report = start_report(Command::Requantize, Window::Marlin, options.source, options.target);
  if (out.state() != DestinationState::Finished) refuse_planned_destination(out, Command::Requantize);
  const SourceCheckpoint source = open_source_checkpoint(options.source, options.threads, IndexNames::KeepIfSmall);
  const Checkpoint& ck = source.checkpoint;
  add_source_counts(report, source);
  const auto done = [&] {
    report.seconds = seconds_since(started);
    return report;
  };
  if (answer_requantized(report, out, ck, options.format)) return done();

  // Plan: one second-level scale per scale group, from the group's absolute max.
  const Plan plan = requantize_plan(source, options.threads, options.format);
  const ConversionIdentity identity = conversion_identity(source_identities(ck), plan);
  out.check_identity(identity);
  if (options.copy == CopyMode::Reflink && !ck.shards.empty()) out.require_sharing(*ck.files->open(0));
  throw_if_stopped();

  // Execute every shard, then finalize, as convert does.
  if (!out.open_for_writing(files_written(ck, options.format))) {
    if (answer_requantized(report, out, ck, options.format)) return done();
    fail(ErrorKind::Usage, "DST {} changed meanwhile", options.target.string());
  }
  refuse_planned_destination(out, Command::Requantize);
  out.claim_identity(identity);
  CopyEngine engine(options.copy);
  std::vector<ErrorStats> errors(source.modules.modules.size());
  const std::uint64_t resumed =
      execute_and_finalize(source, plan, report, out, options.resume, options.threads, engine, nullptr, &errors,
                           [&](const auto& records) { add_requantize_counts(report, records); });
  if (options.resume) report.resumed_shards = resumed;
  // finalize's byte tallies are convert's report's, not this one's.
  report.shared_bytes.reset();
  report.copied_bytes.reset();
  report.written_bytes.reset();
  report.canonicalised_zero_groups.reset();
  report.marlin_zeroed_groups.reset();

  add_fingerprint(report, ck, options.target);
  report.requantized = error_table(source, plan, errors, options.threads);
  report.values_compared = 0;
  report.max_abs_error = 0;
  for (const ModuleError& m : report.requantized) {
    report.values_compared += m.values;
    report.max_abs_error = std::max(*report.max_abs_error, m.max_abs_error);
  }
  return done();
}

}  // namespace mx2nv

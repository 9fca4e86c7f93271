#include "verify/verify.hpp"

#include "checkpoint/fingerprint.hpp"
#include "checkpoint/source_fields.hpp"
#include "checkpoint/argument_check.hpp"
#include "common/cancel.hpp"
#include "common/error.hpp"
#include "common/stopwatch.hpp"
#include "output/report_file.hpp"
#include "safetensors/file_names.hpp"
#include "verify/checks.hpp"
#include "verify/config_check.hpp"
#include "verify/modelopt_config_check.hpp"
#include "model/module_names.hpp"

#include <algorithm>
#include <chrono>
#include <exception>

namespace mx2nv {
namespace {

Fingerprint fingerprints(const Checkpoint& target, const Checkpoint& source) {
  const FileSetDigest s = checkpoint_fingerprint(source, CheckpointRole::Source);
  const FileSetDigest t = checkpoint_fingerprint(target, CheckpointRole::Target);
  return {s.digest, t.digest, s.files, t.files};
}

TargetFormat target_format(const Checkpoint& target) {
  return target_format_of(target.config_text, std::binary_search(target.companions.begin(), target.companions.end(),
                                                                 std::string(kModelOptConfigFileName)));
}

void check_config(const VerifyContext& ctx) {
  const SourceCheckpoint& source = ctx.source;
  std::vector<std::string> found;
  if (ctx.format == TargetFormat::CompressedTensors) {
    found = check_target_config(source.quant, ctx.target.config_text, ctx.bf16_modules, ctx.requantized_modules);
  } else {
    std::vector<std::string> layers;
    for (std::size_t i = 0; i < source.modules.modules.size(); ++i) {
      if (ctx.treatment(i) != Treatment::Bf16) layers.emplace_back(moe_layer_of(source.modules.modules[i].name));
    }
    found = check_modelopt_config(source.quant, ctx.target.config_text, hf_quant_config_of(ctx.target),
                                  ctx.unquantized_weights, ctx.bf16_modules, layers, ctx.requantized_modules);
  }
  for (const auto& d : found) ctx.diff.add("{}", d);
}

}  // namespace

Report verify_checkpoint(const VerifyOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  Report report = start_report(Command::Verify, options.window, options.source, options.target);
  check_source_argument({Command::Verify, options.source, options.target});
  check_converted_argument({Command::Verify, options.source, options.target});
  ProgressTracker progress(Command::Verify, "modules", options.progress);
  progress.phase(ProgressPhase::Plan);
  Differences diff;

  // Memory: each index is checked against its shards when it is opened and
  // its names are dropped right after; DST is opened first, so its names
  // never coexist with SRC's module table (the largest thing verify keeps).
  // Where a tensor DST lacks went is looked up
  // again in DST's index (check_shards). SRC's errors still come first: an
  // error opening DST waits until SRC has opened.
  std::optional<Checkpoint> opened;
  std::exception_ptr target_error;
  try {
    opened = open_checkpoint(options.target, CheckpointRole::Target, options.threads);
    if (opened->index) opened->index->forget_tensors();
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::InvalidInput) {
      diff.add("DST is not a valid checkpoint: {}", e.what());
    } else {
      target_error = std::current_exception();
    }
  }
  const SourceCheckpoint source = open_source_checkpoint(options.source, options.threads, IndexNames::Drop);
  if (target_error) std::rethrow_exception(target_error);
  const Checkpoint& src = source.checkpoint;
  add_source_counts(report, source);
  std::vector<bool> selected(src.shards.size(), true);
  if (options.shards) {
    std::fill(selected.begin(), selected.end(), false);
    for (const std::size_t s : selected_shards(*options.shards, src.shards.size())) selected[s] = true;
    report.shard_subset = options.shards->stride == 0
                              ? fmt::format("{}", options.shards->index)
                              : fmt::format("{}/{}", options.shards->index, options.shards->stride);
    record_resolved_paths(report, options.source, options.target);
  }

  // Both fingerprints before and after the comparison: a file that changed
  // while verify ran makes the report describe neither version.
  std::optional<Fingerprint> before;
  if (opened) before = fingerprints(*opened, src);

  if (opened) {
    VerifyContext ctx{source, *opened, options, diff, target_format(*opened), selected, {}, {}, {}, {}, {}, {}, {},
                      &progress, {}, {}};
    const VerifyWork work = verify_work(source, selected);
    throw_if_stopped();
    progress.phase(ProgressPhase::Shards, work.bytes, work.modules);
    report.target_tensor_bytes = opened->tensor_bytes();
    check_files(ctx);
    check_shards(ctx);
    check_overspan(ctx, report);
    check_config(ctx);
    report.passthrough_tensors = ctx.passthrough_tensors;
    check_globals(ctx);
    check_values(ctx, report);
    check_rewritten_values(ctx, report);
    progress.phase(ProgressPhase::Finalize);
  }

  if (before) {
    const Fingerprint after = fingerprints(*opened, src);
    if (after.source != before->source) diff.add("SRC changed while verify ran");
    if (after.target != before->target) diff.add("DST changed while verify ran");
    report.fingerprint = before;
  }
  report.differences = diff.take();
  if (diff.count() > 0 || report.mismatches.value_or(0) > 0) report.result = Outcome::Mismatch;
  report.seconds = seconds_since(started);
  progress.done();
  return report;
}

}  // namespace mx2nv

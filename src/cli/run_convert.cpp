// mx2nv convert: SRC into an empty DST, or with --plan one step of a plan
// (cli/run_planned.cpp).
#include "cli/shell_words.hpp"
#include "cli/standard_output.hpp"
#include "cli/progress_line.hpp"
#include "cli/shared_options.hpp"
#include "cli/subcommand.hpp"
#include "cli/summary.hpp"
#include "common/error.hpp"
#include "common/printable.hpp"

#include <CLI/CLI.hpp>
#include <fmt/core.h>

namespace mx2nv::cli {

int run_convert(const ConvertOptions& o, const std::optional<ReportFile>& report_path,
                const std::optional<ReportFile>& html) {
  const Report r = convert_checkpoint(o);
  if (r.already_complete) {
    out("mx2nv convert: already complete: {} holds this conversion of {} (checked from its records; nothing "
        "was written)\n",
        printable(o.target.string()), printable(o.source.string()));
    print_counts(r);
    return finish(r, report_path, html, o.threads);
  }
  if (r.result == Outcome::Refused) {
    out("mx2nv convert: refused under window {} (span limit {}); nothing was written to {}\n",
        window_name(o.window), window_limits(o.window).max_span(), printable(o.target.string()));
    print_over_span(r.refused_spans);
    print_global_conflicts(r.global_conflicts, r.unrepresentable_globals);
    const std::string inspect = "mx2nv inspect --window " + std::string(window_name(o.window)) + " " +
                                shell_path(o.source.string());
    if (o.window == Window::Marlin) {
      out("  --window e4m3 allows spans up to 17 (exact on disk, but vLLM's Marlin path zeroes block scales "
          "below 2^-6); `mx2nv inspect --window e4m3 {}` shows that outcome.\n",
          shell_path(o.source.string()));
    }
    out("  --overspan bf16 writes the affected MoE layers as BF16 (exact, larger); --overspan requantize "
        "requantizes only these modules (lossy, measured); `{}` shows both costs.\n",
        inspect);
    return finish(r, report_path, html, o.threads);
  }
  out("mx2nv convert: ok, window {}, {:.2f} s\n", window_name(o.window), r.seconds);
  print_counts(r);
  print_overspan(r);
  if (o.resume) out("  resumed  {} of {} shards reused from the interrupted run\n", r.resumed_shards, r.shards);
  if (r.marlin_zeroed_groups.value_or(0) > 0) {
    out("  warning  {} active groups have block scales below 2^-6: exact on disk, zeroed by vLLM's Marlin path\n",
        r.marlin_zeroed_groups);
  }
  // Runnable as printed: quoted, and under the window this conversion used
  // (verify takes the --overspan choice from DST's records).
  out("  next     mx2nv verify --window {} {} {}\n", window_name(o.window), shell_path(o.source.string()),
      shell_path(o.target.string()));
  return finish(r, report_path, html, o.threads);
}

namespace {

class ConvertCommand final : public Subcommand {
 public:
  explicit ConvertCommand(CLI::App& mx2nv)
      : Subcommand(mx2nv, Command::Convert, "transcode SRC (MXFP4) into an empty DST (NVFP4A16)") {
    add_source("source checkpoint directory (with --plan: default the plan's)", false);
    add_target("DST", "target directory (created; must be empty) (with --plan: default the plan's)", false);
    add_plan_options();
    add_window_option();
    add_threads_option();
    add_report_option();
    add_copy(app_, copy_);
    overspan_opt_ = add_overspan(app_, overspan_);
    format_opt_ = add_format(app_, format_);
    add_resume(app_, resume_, "conversion");
    add_html_option();
    add_progress_option();
  }

  int run(CommandRun& state) override {
    ProgressLine progress(progress_, stderr);
    if (plan_opt_->count() > 0) {
      note_run(state);  // the plan's outputs are checked against the plan's SRC and DST
      return run_planned_step(planned_step(progress), state);
    }
    begin(state);
    require_paths();
    return run_convert({source_, target_, window_, threads_, resume_, copy_, overspan_, format_, progress.callback()},
                       state.outputs.report, state.outputs.html);
  }

 private:
  void add_plan_options() {
    plan_opt_ = app_->add_option("--plan", plan_path_,
                                 "run steps of a plan made by `mx2nv plan` (see --shard, --shards, --finalize)");
    auto* shard = app_->add_option("--shard", shard_, "with --plan: convert shard I only")->needs(plan_opt_);
    auto* shards = app_->add_option("--shards", shards_, "with --plan: convert shards I, I+N, I+2N, ... (I/N)")
                       ->needs(plan_opt_)
                       ->excludes(shard);
    app_->add_flag("--finalize", finalize_,
                   "with --plan: check every shard is finished, then write companions, config and the index last")
        ->needs(plan_opt_)
        ->excludes(shard)
        ->excludes(shards);
  }

  // Options a planned step does not use are refused, never ignored:
  // --resume (implied), --html on a shard step (a finalize writes the
  // conversion's page); --window and --overspan are checked against the
  // plan (convert/planned.hpp).
  PlannedStep planned_step(ProgressLine& progress) const {
    if (resume_) fail(ErrorKind::Usage, "--resume is implied with --plan");
    if (shard_.empty() && shards_.empty() && !finalize_) {
      fail(ErrorKind::Usage, "--plan needs --shard I, --shards I/N or --finalize");
    }
    if (!finalize_ && html_opt_->count() > 0) {
      fail(ErrorKind::Usage, "--html is for a whole conversion: give it to --finalize, not to a shard step");
    }
    PlannedStep step;
    if (!shards_.empty()) step.selection = parse_shard_selection(shards_);
    if (!shard_.empty()) step.selection = parse_shard_index(shard_);
    step.options = {plan_path_, std::nullopt, std::nullopt, threads_, copy_,
                    progress.callback(), std::nullopt, std::nullopt, std::nullopt};
    if (!source_.empty()) step.options.source = source_;
    if (!target_.empty()) step.options.target = target_;
    if (window_opt_->count() > 0) step.options.window = window_;
    if (overspan_opt_->count() > 0) step.options.over_span_choice = overspan_;
    if (format_opt_->count() > 0) step.options.format = format_;
    step.report_path = report_path_;
    step.html_path = html_path_;
    return step;
  }

  std::string plan_path_, shard_, shards_;
  CopyMode copy_ = CopyMode::Auto;
  OverSpanChoice overspan_ = OverSpanChoice::Fail;
  TargetFormat format_ = TargetFormat::CompressedTensors;
  bool resume_ = false, finalize_ = false;
  CLI::Option *plan_opt_ = nullptr, *overspan_opt_ = nullptr, *format_opt_ = nullptr;
};

}  // namespace

std::unique_ptr<Subcommand> add_convert(CLI::App& mx2nv) { return std::make_unique<ConvertCommand>(mx2nv); }

}  // namespace mx2nv::cli

// mx2nv plan: plan a conversion once for many processes or machines; the
// refusals happen here, the steps run with convert --plan.
#include "cli/shell_words.hpp"
#include "cli/standard_output.hpp"
#include "cli/shared_options.hpp"
#include "cli/subcommand.hpp"
#include "cli/summary.hpp"
#include "common/error.hpp"
#include "common/printable.hpp"
#include "convert/convert.hpp"

#include <CLI/CLI.hpp>
#include <fmt/core.h>

namespace mx2nv::cli {
namespace {

int run_plan(const PlanOptions& o, const std::optional<ReportFile>& report_path) {
  fs::path written;
  const Report r = plan_checkpoint(o, written);
  if (r.result == Outcome::Refused) {
    out("mx2nv plan: refused under window {}; no plan written\n", window_name(o.window));
    print_over_span(r.refused_spans);
    return finish(r, report_path);
  }
  if (r.already_complete) {
    out("mx2nv plan: already complete: {} holds this conversion of {}\n", printable(o.target.string()),
        printable(o.source.string()));
    return finish(r, report_path);
  }
  if (o.requantize) {
    out("mx2nv plan: ok, LOSSY requantize plan (every module requantized from decoded values), {} shards, plan in "
        "{}\n",
        r.shards, printable(written.string()));
  } else {
    out("mx2nv plan: ok, window {}, {} shards, plan in {}\n", window_name(o.window), r.shards,
        printable(written.string()));
  }
  print_overspan(r);
  out("  next     mx2nv convert --plan {} --shards I/N    (for I in 0..N-1, anywhere, in any order)\n",
      shell_path(written.string()));
  out("  then     mx2nv convert --plan {} --finalize\n", shell_path(written.string()));
  return finish(r, report_path);
}

class PlanCommand final : public Subcommand {
 public:
  explicit PlanCommand(CLI::App& mx2nv)
      : Subcommand(mx2nv, Command::Plan,
                   "plan a conversion once for many processes or machines: refusals happen here") {
    add_source("source checkpoint directory", true);
    add_target("DST", "target directory", true);
    app_->add_option("--plan-out", plan_out_, "write the plan here instead of DST/.mx2nv/plan.json");
    overspan_opt_ = add_overspan(app_, overspan_);
    add_window_option();
    add_format(app_, format_);
    app_->add_flag("--requantize", requantize_,
                   "plan mx2nv requantize instead of a conversion (LOSSY: every expert requantized from its decoded "
                   "values; the steps are the same)");
    add_threads_option();
    add_report_option();
  }

  int run(CommandRun& state) override {
    std::vector<std::pair<fs::path, std::string>> inputs;  // files the report must not replace
    if (!plan_out_.empty()) inputs.emplace_back(plan_out_, "where --plan-out writes the plan");
    begin(state, inputs);
    PlanOptions o;
    if (!plan_out_.empty()) o.plan_out = plan_out_;
    o.source = source_;
    o.target = target_;
    o.window = window_;
    o.threads = threads_;
    o.over_span_choice = overspan_;
    o.requantize = requantize_;
    o.format = format_;
    if (requantize_ && (window_opt_->count() > 0 || overspan_opt_->count() > 0)) {
      fail(ErrorKind::Usage, "--requantize takes no --window or --overspan (requantize has no window to fit)");
    }
    return run_plan(o, state.outputs.report);
  }

 private:
  std::string plan_out_;
  OverSpanChoice overspan_ = OverSpanChoice::Fail;
  TargetFormat format_ = TargetFormat::CompressedTensors;
  bool requantize_ = false;
  CLI::Option* overspan_opt_ = nullptr;
};

}  // namespace

std::unique_ptr<Subcommand> add_plan(CLI::App& mx2nv) { return std::make_unique<PlanCommand>(mx2nv); }

}  // namespace mx2nv::cli

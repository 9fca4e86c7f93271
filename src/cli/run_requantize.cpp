// mx2nv requantize: the LOSSY companion, every expert of SRC requantized from
// its decoded values as the layout's own NVFP4 quantizer would.
#include "cli/standard_output.hpp"
#include "cli/shared_options.hpp"
#include "cli/subcommand.hpp"
#include "cli/summary.hpp"
#include "common/printable.hpp"
#include "requantize/requantize.hpp"

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>

namespace mx2nv::cli {
namespace {

int run_requantize(const RequantizeOptions& o, const std::optional<ReportFile>& report_path) {
  const Report r = requantize_checkpoint(o);
  if (r.already_complete) {
    out("mx2nv requantize: already complete: {} holds this requantization of {} (checked from its records; "
        "nothing was written)\n",
        printable(o.target.string()), printable(o.source.string()));
    print_counts(r);
    return finish(r, report_path);
  }
  out("mx2nv requantize: ok, LOSSY: {} modules requantized from decoded values ({} values), {:.2f} s\n",
      r.requantized.size(), r.values_compared, r.seconds);
  print_counts(r);
  double worst_rmse = 0, worst_cosine = 1;
  for (const auto& m : r.requantized) {
    worst_rmse = std::max(worst_rmse, m.relative_rmse);
    worst_cosine = std::min(worst_cosine, m.cosine);
  }
  out("  error    worst relative RMSE {:.6g}, worst cosine {:.9f}, max abs error {:.6g} (per module: --report)\n",
      worst_rmse, worst_cosine, r.max_abs_error);
  if (o.resume) out("  resumed  {} of {} shards reused from the interrupted run\n", r.resumed_shards, r.shards);
  return finish(r, report_path);
}

class RequantizeCommand final : public Subcommand {
 public:
  explicit RequantizeCommand(CLI::App& mx2nv)
      : Subcommand(mx2nv, Command::Requantize,
                   "LOSSY companion: requantize every expert of SRC from its decoded values into an empty DST, "
                   "as the layout's own NVFP4 quantizer would (compressed-tensors', or ModelOpt's with --format "
                   "modelopt); per-module error table in the report") {
    add_source("source checkpoint directory", true);
    add_target("DST", "target directory (created; must be empty)", true);
    add_threads_option();
    add_report_option();
    add_copy(app_, copy_);
    add_resume(app_, resume_, "requantization");
    add_format(app_, format_);
  }

  int run(CommandRun& state) override {
    begin(state);
    return run_requantize({source_, target_, threads_, resume_, copy_, format_}, state.outputs.report);
  }

 private:
  CopyMode copy_ = CopyMode::Auto;
  bool resume_ = false;
  TargetFormat format_ = TargetFormat::CompressedTensors;
};

}  // namespace

std::unique_ptr<Subcommand> add_requantize(CLI::App& mx2nv) { return std::make_unique<RequantizeCommand>(mx2nv); }

}  // namespace mx2nv::cli

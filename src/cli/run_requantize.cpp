// mx2nv requantize: the LOSSY companion, every expert of SRC requantized from
// its decoded values as compressed-tensors' NVFP4 quantization would.
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
                   "as compressed-tensors' NVFP4 quantization would; per-module error table in the report") {
    app_->add_option("SRC", src_, "source checkpoint directory")->required();
    app_->add_option("DST", dst_, "target directory (created; must be empty)")->required();
    add_threads(app_, threads_);
    report_opt_ = add_report(app_, report_path_);
    add_copy(app_, copy_);
    add_resume(app_, resume_, "requantization");
  }

  int run(CommandRun& state) override {
    refuse_empty_paths({{report_opt_, &report_path_}});
    state.threads = threads_;
    state.source = src_;
    state.target = dst_;
    // Where the report goes is checked before any work.
    state.outputs = check_command_outputs(path_if_given(report_path_), std::nullopt, {src_, dst_});
    return run_requantize({src_, dst_, threads_, resume_, copy_},
                          state.outputs.report);
  }

 private:
  std::string src_, dst_, report_path_;
  CopyMode copy_ = CopyMode::Auto;
  unsigned threads_ = all_cores();
  bool resume_ = false;
  CLI::Option* report_opt_ = nullptr;
};

}  // namespace

std::unique_ptr<Subcommand> add_requantize(CLI::App& mx2nv) { return std::make_unique<RequantizeCommand>(mx2nv); }

}  // namespace mx2nv::cli

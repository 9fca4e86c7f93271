// mx2nv requantize: the LOSSY companion, every expert of SRC requantized from
// its decoded values as compressed-tensors' NVFP4 quantization would.
#include "cli/standard_output.hpp"
#include "cli/shared_options.hpp"
#include "cli/subcommand.hpp"
#include "cli/summary.hpp"
#include "convert/requantize_command.hpp"

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <string_view>

namespace mx2nv::cli {
namespace {

int run_requantize(const RequantizeOptions& o, const std::optional<ReportFile>& report_path) {
  const Report r = requantize_checkpoint(o);
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
  }

  int run(CommandRun& state) override {
    refuse_empty_paths({{report_opt_, &report_path_}});
    state.threads = threads_;
    state.source = src_;
    state.target = dst_;
    // Where the report goes is checked before any work.
    state.outputs = check_command_outputs(path_if_given(report_path_), std::nullopt, {src_, dst_});
    try {
      return run_requantize({src_, dst_, threads_}, state.outputs.report);
    } catch (const Error& e) {
      // DST's check (destination/destination.cpp) offers convert's --resume
      // for a DST holding an mx2nv run; requantize has none.
      constexpr std::string_view kConvertHint = " (it holds an mx2nv conversion: add --resume to continue or confirm it)";
      std::string message = e.what();
      const auto at = message.find(kConvertHint);
      if (at == std::string::npos) throw;
      message.replace(at, kConvertHint.size(),
                      " (it holds an earlier mx2nv run; requantize does not resume: remove it or give an empty DST)");
      throw Error(e.kind(), message);
    }
  }

 private:
  std::string src_, dst_, report_path_;
  unsigned threads_ = all_cores();
  CLI::Option* report_opt_ = nullptr;
};

}  // namespace

std::unique_ptr<Subcommand> add_requantize(CLI::App& mx2nv) { return std::make_unique<RequantizeCommand>(mx2nv); }

}  // namespace mx2nv::cli

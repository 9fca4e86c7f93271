// mx2nv compare SRC OTHER: how far an NVFP4 checkpoint made from an MXFP4
// SRC is from SRC's values (compare/compare.hpp, docs/compare.md).
#include "cli/standard_output.hpp"
#include "cli/progress_line.hpp"
#include "cli/shared_options.hpp"
#include "cli/subcommand.hpp"
#include "common/error.hpp"
#include "common/printable.hpp"
#include "compare/compare.hpp"
#include "html/html.hpp"

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <limits>

namespace mx2nv::cli {
namespace {

constexpr std::size_t kWorstModulesShown = 5;

std::string rel_rmse_text(const CompareSums& s) {
  const auto r = relative_rmse(s.sum_d2, s.sum_s2);
  return r ? fmt::format("{:.6g}", *r) : std::string("undefined (SRC all zero)");
}

void print_figures_line(std::string_view label, const CompareSums& s) {
  out("  {:<6} {} values, {} exact ({:.4f}%), rel RMSE {}, cosine {:.9f}, max abs error {:.6g}\n", label,
      s.values, s.exact_values, s.values ? 100.0 * static_cast<double>(s.exact_values) / static_cast<double>(s.values) : 100.0,
      rel_rmse_text(s), cosine_similarity(s.exact(), s.sum_os, s.sum_o2, s.sum_s2), s.max_abs_error);
}

void print_compare_summary(const CompareResult& r) {
  const CompareSums t = compare_totals(r);
  const char* format = r.format == OtherFormat::CompressedTensors ? "compressed-tensors" : "modelopt";
  out("mx2nv compare: {} ({}, {}), {} modules compared, {:.2f} s\n",
      r.exit_code() == 0 ? "EXACT, every value identical" : "DIFFERENT", format, compare_activations(r),
      r.modules.size(), r.seconds);
  print_figures_line("total", t);
  for (const std::string_view p : {"gate", "up", "down", "other"}) {
    const CompareSums s = compare_totals(r, p);
    if (s.values) print_figures_line(p, s);
  }
  out("  packed bytes {} identical of {}, zero-sign rewrites {} nibbles, active block scales below 2^-6 {}\n",
      t.packed_bytes_identical, t.packed_bytes, t.zero_sign_rewrites, t.active_block_scales_below_min_normal);
  std::vector<const ModuleComparison*> worst;
  for (const auto& m : r.modules) {
    if (!m.sums.exact()) worst.push_back(&m);
  }
  const auto rmse = [](const ModuleComparison* m) {
    return relative_rmse(m->sums.sum_d2, m->sums.sum_s2).value_or(std::numeric_limits<double>::infinity());
  };
  std::stable_sort(worst.begin(), worst.end(), [&](auto* a, auto* b) { return rmse(a) > rmse(b); });
  if (worst.size() > kWorstModulesShown) worst.resize(kWorstModulesShown);
  for (const auto* m : worst) {
    out("  worst: {} rel RMSE {}, {} of {} values differ\n", printable(m->name), rel_rmse_text(m->sums),
        m->sums.values - m->sums.exact_values, m->sums.values);
  }
  for (const auto& n : r.missing_in_other) out("  missing in OTHER: {}\n", printable(n));
  for (const auto& n : r.extra_in_other) out("  extra in OTHER: {}\n", printable(n));
  for (const auto& m : r.modules) {
    if (!m.quantized) out("  unquantized in OTHER: {}\n", printable(m.name));
  }
}

class CompareCommand final : public Subcommand {
 public:
  explicit CompareCommand(CLI::App& mx2nv)
      : Subcommand(mx2nv, Command::Compare,
                   "measure how far an NVFP4 checkpoint OTHER (compressed-tensors or ModelOpt) is from its MXFP4 SRC") {
    add_source("MXFP4 source checkpoint directory", false);
    add_target("OTHER", "NVFP4 checkpoint directory made from SRC", false);
    app_->add_flag("--json", json_, "print the JSON document (docs/compare.md) instead of the summary");
    app_->add_option("--modules", modules_, "compare the SRC modules whose name this regular expression matches");
    add_threads_option();
    add_report_option();
    add_html_option("write a self-contained HTML page (relative RMSE heatmap per layer and expert, worst modules) to "
                    "this file (the same rules as --report)");
    add_progress_option();
  }

  int run(CommandRun& state) override {
    ProgressLine progress(progress_, stderr);
    begin(state);
    require_paths();
    const CompareResult r = compare_checkpoints({source_, target_, threads_, modules_, progress.callback()});
    if (json_) {
      write_compare_json(r, [](std::string_view piece) { out("{}", piece); });
    } else {
      print_compare_summary(r);
    }
    flush_out();  // what is printed comes first where a report goes to /dev/stdout too
    if (state.outputs.report) {
      state.outputs.report->write_pieces([&](const ReportFile::PieceSink& sink) { write_compare_json(r, sink); });
    }
    if (state.outputs.html) state.outputs.html->write(render_compare_html(r));
    return r.exit_code();
  }

 private:
  std::string modules_;
  bool json_ = false;
};

}  // namespace

std::unique_ptr<Subcommand> add_compare(CLI::App& mx2nv) { return std::make_unique<CompareCommand>(mx2nv); }

}  // namespace mx2nv::cli

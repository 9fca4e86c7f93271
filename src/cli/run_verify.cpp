// mx2nv verify: prove every value of DST equals the value in SRC, whole or
// in parts (--shards I/N) that --merge joins (cli/run_merge.cpp).
#include "cli/standard_output.hpp"
#include "cli/progress_line.hpp"
#include "plan/plan.hpp"
#include "cli/shared_options.hpp"
#include "cli/subcommand.hpp"
#include "cli/summary.hpp"
#include "common/error.hpp"
#include "common/printable.hpp"
#include "destination/destination.hpp"

#include <CLI/CLI.hpp>
#include <fmt/core.h>

namespace mx2nv::cli {

int run_verify(const VerifyOptions& o, const std::optional<ReportFile>& report_path,
               const std::optional<ReportFile>& html) {
  const Report r = verify_checkpoint(o);
  if (r.result == Outcome::Ok) {
    if (r.requantized.empty()) {
      out("mx2nv verify: ok, every value identical ({} values, max abs error 0), window {}, {:.2f} s\n",
          r.values_compared, window_name(o.window), r.seconds);
    } else {
      out("mx2nv verify: ok, LOSSY modules equal the documented requantization bit for bit, every other value "
          "identical ({} values), window {}, {:.2f} s\n",
          r.values_compared, window_name(o.window), r.seconds);
    }
    print_counts(r);
    print_overspan(r);
  } else {
    out("mx2nv verify: MISMATCH: {} value mismatches, {} differences\n", r.mismatches, r.differences.size());
    for (const auto& d : r.differences) err("mx2nv verify: {}\n", printable(d));
  }
  return finish(r, report_path, html, o.threads);
}

namespace {

class VerifyCommand final : public Subcommand {
 public:
  explicit VerifyCommand(CLI::App& mx2nv)
      : Subcommand(mx2nv, Command::Verify, "prove every value of DST equals the value in SRC") {
    add_source("source checkpoint directory", false);
    add_target("DST", "converted checkpoint directory", false);
    auto* shards = app_->add_option("--shards", shards_,
                                    "verify shards I, I+N, ... only (I/N) and write a partial report");
    app_->add_option("--merge", merge_parts_, "join the partial reports of verify --shards I/N into one")
        ->excludes(shards)
        ->expected(1, -1);
    window_opt_ = add_window(app_, window_)->default_str("the one DST records, else marlin");
    add_threads_option();
    add_report_option();
    add_html_option();
    add_progress_option();
  }

  int run(CommandRun& state) override {
    if (!merge_parts_.empty()) return merge();
    if (!target_.empty()) choose_window();
    ProgressLine progress(progress_, stderr);
    begin(state);
    require_paths();
    std::optional<ShardSelection> selection;
    if (!shards_.empty()) {
      selection = parse_shard_selection(shards_);
      state.shard_subset = fmt::format("{}/{}", selection->index, selection->stride);
    }
    return run_verify({source_, target_, window_, threads_, selection, progress.callback()}, state.outputs.report,
                      state.outputs.html);
  }

 private:
  // SRC, DST, window and how they were verified come from the parts; an
  // option that could only be ignored is refused.
  int merge() const {
    if (!source_.empty() || !target_.empty()) {
      fail(ErrorKind::Usage, "verify --merge takes SRC and DST from the parts: give SRC DST or --merge, not both");
    }
    for (const char* option : {"--window", "--threads", "--html", "--progress"}) {
      if (app_->get_option(option)->count() > 0) {
        fail(ErrorKind::Usage, "verify --merge: {} does not apply (the parts were verified with their own)", option);
      }
    }
    return run_merge(merge_parts_, report_path_);
  }

  // The window DST records (.mx2nv/finished.json, written by convert) unless
  // --window was given; a --window that differs from it, or a DST that
  // records none, is said on stderr, so a MISMATCH is never a silent choice
  // of window.
  void choose_window() {
    std::optional<std::string> recorded;
    try {
      if (const auto finished = Destination::finished_record(target_)) recorded = finished->window;
    } catch (...) {  // unreadable: verify itself says what is wrong with DST
    }
    const std::string mode = recorded.value_or("");
    const std::optional<Window> dst_window = Destination::window_of_mode(mode);
    if (window_opt_->count() == 0) {
      if (dst_window) {
        window_ = *dst_window;
      } else if (const auto m = parse_mode(mode); !m || m->kind != PlanKind::Requantize) {
        err("mx2nv verify: DST records no window; verifying under window {} (the default; --window chooses)\n",
            window_name(window_));
      }
    } else if (dst_window && *dst_window != window_) {
      err("mx2nv verify: note: DST was converted under window {}; verifying under --window {} as asked\n",
          window_name(*dst_window), window_name(window_));
    }
  }

  std::string shards_;
  std::vector<std::string> merge_parts_;
};

}  // namespace

std::unique_ptr<Subcommand> add_verify(CLI::App& mx2nv) { return std::make_unique<VerifyCommand>(mx2nv); }

}  // namespace mx2nv::cli

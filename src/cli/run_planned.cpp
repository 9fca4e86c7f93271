// mx2nv convert --plan P (--shard I | --shards I/N | --finalize): one step of
// a plan made by `mx2nv plan`, anywhere, in any order.
#include "cli/shell_words.hpp"
#include "cli/standard_output.hpp"
#include "cli/shared_options.hpp"
#include "cli/subcommand.hpp"
#include "cli/summary.hpp"
#include "common/printable.hpp"

#include <fmt/core.h>

namespace mx2nv::cli {
namespace {

int run_planned(const PlannedOptions& o, const PlannedPaths& paths, const std::optional<ShardSelection>& selection,
                const std::optional<ReportFile>& report_path, const std::optional<ReportFile>& html) {
  const Report r = selection ? convert_planned_shards(o, *selection, &paths) : finalize_planned(o, &paths);
  if (r.already_complete) {
    out("mx2nv convert: already complete: {} holds the finished conversion\n", printable(r.provenance.target));
  } else if (selection) {
    out("mx2nv convert: ok, {} shards ({} already done), {:.2f} s\n", r.shards, r.resumed_shards, r.seconds);
  } else {
    out("mx2nv convert: finalized, {:.2f} s\n", r.seconds);
    print_counts(r);
    out("  next     mx2nv verify --window {} {} {}\n", window_name(r.window), shell_path(r.provenance.source),
        shell_path(r.provenance.target));
  }
  return finish(r, report_path, html, o.threads);
}

}  // namespace

int run_planned_step(const PlannedStep& step, CommandRun& state) {
  // The plan's SRC and DST (read and checked as the step will, which then
  // runs that plan), before any output path is checked against them.
  std::vector<fs::path> outputs;
  if (!step.report_path.empty()) outputs.emplace_back(step.report_path);
  if (!step.html_path.empty()) outputs.emplace_back(step.html_path);
  const PlannedPaths paths = planned_paths(step.options, outputs);
  state.source = paths.source.value_or(fs::path());
  state.target = paths.target.value_or(fs::path());
  state.outputs =
      check_command_outputs(path_if_given(step.report_path), path_if_given(step.html_path),
                            {state.source, state.target}, {{step.options.plan, "the plan this step reads"}});
  return run_planned(step.options, paths, step.selection, state.outputs.report, state.outputs.html);
}

}  // namespace mx2nv::cli

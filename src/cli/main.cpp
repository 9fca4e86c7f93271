// The mx2nv command line: argument parsing, human summaries on stdout, errors
// on stderr, JSON reports, exit codes. Each subcommand is a file of its own
// (cli/run_<name>.cpp, cli/subcommand.hpp); all work happens in the libraries.
#include "cli/subcommand.hpp"
#include "cli/summary.hpp"
#include "common/cancel.hpp"
#include "common/error.hpp"
#include "common/printable.hpp"

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <csignal>
#include <memory>
#include <sstream>
#include <vector>

namespace mx2nv::cli {
namespace {

// SIGINT/SIGTERM unwind through the library's cleanup (temporary files
// removed, finished shards kept for --resume) instead of dying mid-write.
void stop_on_signals() {
  struct sigaction stop {};
  stop.sa_handler = [](int signal_number) { request_stop(signal_number); };
  sigemptyset(&stop.sa_mask);
  sigaction(SIGINT, &stop, nullptr);
  sigaction(SIGTERM, &stop, nullptr);
}

// CLI11's messages quote the arguments (a file name from a glob, say):
// escaped like every other message.
void escape_failure_messages(CLI::App& app) {
  app.failure_message([](const CLI::App* a, const CLI::Error& e) {
    std::string out, line;
    std::istringstream lines(CLI::FailureMessage::simple(a, e));
    while (std::getline(lines, line)) out += printable(line) + "\n";
    return out;
  });
}

// A failed command: the error on stderr and, where the command had checked
// its outputs, its error report there (the success path's report with
// result "error", report/report.hpp failed_report). Called inside a catch.
int report_failure(Command command, const CommandRun& state) {
  const Error e = current_exception_as_error();
  print_error(e);
  if (state.outputs.report || state.outputs.html) {
    try {
      Report r = failed_report(command, state.window, state.source, state.target, e, UnresolvedPaths::Throw);
      r.shard_subset = state.shard_subset;  // a failed part of verify --shards I/N is still part I/N for --merge
      if (!state.shard_subset.empty()) record_resolved_paths(r, state.source, state.target);
      write_report(state.outputs.report, r);
      write_html(state.outputs.html, r, nullptr, state.threads);
    } catch (...) {
      const Error again = current_exception_as_error();
      fmt::print(stderr, "mx2nv: also failed to write the report: {}\n", printable(again.what()));
    }
  }
  return exit_code(e.kind());
}

}  // namespace
}  // namespace mx2nv::cli

int main(int argc, char** argv) {
  using namespace mx2nv;
  using namespace mx2nv::cli;
  stop_on_signals();
  CLI::App app{"mx2nv: lossless MXFP4 -> NVFP4A16 transcoder for compressed-tensors MoE checkpoints"};
  app.set_version_flag("--version", std::string("mx2nv ") + MX2NV_VERSION);
  app.require_subcommand(1);
  std::vector<std::unique_ptr<Subcommand>> subcommands;
  for (const auto add : {add_convert, add_verify, add_compare, add_plan, add_requantize, add_inspect, add_gate,
                         add_generate, add_demo, add_card}) {
    subcommands.push_back(add(app));
  }
  escape_failure_messages(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }
  for (const auto& subcommand : subcommands) {
    if (!subcommand->chosen()) continue;
    CommandRun state;
    try {
      return subcommand->run(state);
    } catch (...) {
      return report_failure(subcommand->command(), state);
    }
  }
  return kExitUsage;
}

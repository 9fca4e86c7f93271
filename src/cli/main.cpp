// The mx2nv command line: argument parsing, human summaries on stdout, errors
// on stderr, JSON reports, exit codes. Each subcommand is a file of its own
// (cli/run_<name>.cpp, cli/subcommand.hpp); all work happens in the libraries.
//
// Conventions (docs/commands.md#conventions): `mx2nv` alone prints the help
// on stderr and exits 2 (no command is a usage error); `mx2nv help [CMD]`,
// `mx2nv CMD --help` and `mx2nv --version` print on stdout and exit 0; an
// unknown command or option is exit 2 with the nearest names. Whatever is
// printed on stdout goes through cli/standard_output.hpp: a failure to write
// it is exit 4. A run stopped by SIGINT or SIGTERM, wherever it was (working,
// or waiting to write stdout or a report), exits 4 with one message that
// says how to go on with this command.
#include "cli/shared_options.hpp"
#include "cli/shell_words.hpp"
#include "cli/standard_output.hpp"
#include "cli/subcommand.hpp"
#include "cli/summary.hpp"
#include "common/cancel.hpp"
#include "common/error.hpp"
#include "common/printable.hpp"

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <csignal>
#include <memory>
#include <optional>
#include <string_view>
#include <sstream>
#include <vector>

namespace mx2nv::cli {
namespace {

// SIGINT/SIGTERM unwind through the library's cleanup (temporary files
// removed, finished shards kept for --resume) instead of dying mid-write.
// Without SA_RESTART, so that a write waiting on a reader returns.
void stop_on_signals() {
  struct sigaction stop {};
  stop.sa_handler = [](int signal_number) { request_stop(signal_number); };
  sigemptyset(&stop.sa_mask);
  sigaction(SIGINT, &stop, nullptr);
  sigaction(SIGTERM, &stop, nullptr);
}

// How to go on after an interruption, in words only this command accepts.
std::string how_to_go_on(Command command, const std::vector<std::string>& args) {
  switch (command) {
    case Command::Convert:
    case Command::Requantize: {  // the same steps: both continue with --resume
      const bool planned = std::any_of(args.begin(), args.end(), [](const std::string& a) {
        return a == "--plan" || a.rfind("--plan=", 0) == 0;
      });
      if (planned) {
        return "temporary files removed, finished shards kept; to continue, run the same step again: " +
               shell_line(args);
      }
      std::vector<std::string> resumed = args;
      if (std::find(resumed.begin(), resumed.end(), "--resume") == resumed.end()) {
        // Right after the command's name: before any `--` that ends the options.
        const auto at = std::find(resumed.begin(), resumed.end(), std::string(command_name(command)));
        resumed.insert(at == resumed.end() ? resumed.end() : at + 1, "--resume");
      }
      return "temporary files removed, finished shards kept; to continue: " + shell_line(resumed);
    }
    case Command::Generate: return "run it again into an empty DIR";
    case Command::Demo: return "run it again (it reuses its DIR)";
    default: return "it did not finish; run it again";
  }
}

// `cause`: the error the stop ended the command with, where it says more
// than the interruption itself (which output was being waited for).
int interrupted(Command command, const std::vector<std::string>& args, const std::optional<Error>& cause) {
  discard_out();
  std::string detail;
  if (cause && std::string_view(cause->what()).find(fmt::format("interrupted by {}", stop_signal_name())) ==
                   std::string_view::npos) {
    detail = fmt::format(" ({})", printable(cause->what()));
  }
  err("mx2nv {}: interrupted by {}{}; {}\n", command_name(command), stop_signal_name(), detail,
      printable(how_to_go_on(command, args)));
  return kExitIo;
}

// A failed command: the error on stderr and, where the command had checked
// its outputs, its error report there (the success path's report with
// result "error", report/report.hpp failed_report). Called inside a catch.
// An interruption is told by the caller instead of the error it caused.
int report_failure(Command command, const CommandRun& state) {
  const Error e = current_exception_as_error();
  try {
    flush_out();  // what the command printed before it failed
  } catch (...) {
    if (!stop_requested()) print_error(current_exception_as_error());
  }
  if (!stop_requested()) print_error(e);
  if (state.outputs.report || state.outputs.html) {
    try {
      Report r = failed_report(command, state.window, state.source, state.target, e, UnresolvedPaths::Throw);
      r.shard_subset = state.shard_subset;  // a failed part of verify --shards I/N is still part I/N for --merge
      if (!state.shard_subset.empty()) record_resolved_paths(r, state.source, state.target);
      write_report(state.outputs.report, r);
      write_html(state.outputs.html, r, nullptr, state.threads);
    } catch (...) {
      const Error again = current_exception_as_error();
      if (!stop_requested()) err("mx2nv: also failed to write the report: {}\n", printable(again.what()));
    }
  }
  return exit_code(e.kind());
}

std::vector<std::string> command_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) names.push_back(sub->get_name());
  return names;
}

std::vector<std::string> option_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* o : app.get_options()) {
    for (const auto& l : o->get_lnames()) names.push_back("--" + l);
    for (const auto& s : o->get_snames()) names.push_back("-" + s);
  }
  return names;
}

// Prints `text` on stdout; 0, or 4 when stdout cannot be written.
int print_help(const std::string& text) {
  try {
    out_text(text);
    flush_out();
    return kExitOk;
  } catch (...) {
    if (stop_requested()) {
      err("mx2nv: interrupted by {}; it did not finish; run it again\n", stop_signal_name());
    } else {
      print_error(current_exception_as_error());
    }
    return kExitIo;
  }
}

// A parse error, in one message: what was wrong, the nearest names for an
// unknown option, and where the help is.
int usage_error(CLI::App& app, const CLI::ParseError& e) {
  const auto chosen = app.get_subcommands();
  const CLI::App* sub = chosen.empty() ? nullptr : chosen.front();
  const std::string who = sub ? "mx2nv " + sub->get_name() : std::string("mx2nv");
  const std::string help = sub ? "mx2nv help " + sub->get_name() : std::string("mx2nv help");
  // Unknown options first, whatever CLI11 noticed first (a required SRC
  // that is missing because an unknown option came instead, say).
  {
    std::vector<std::string> extras = app.remaining();
    if (sub) {
      const auto more = sub->remaining();
      extras.insert(extras.end(), more.begin(), more.end());
    }
    const std::vector<std::string> known = sub ? option_names(*sub) : option_names(app);
    std::string message;
    bool after_unknown_option = false, unknown_option = false;
    for (const auto& x : extras) {
      const bool option = x.size() > 1 && x.front() == '-';
      // The value of an unknown option is not a second error.
      if (!option && after_unknown_option) {
        after_unknown_option = false;
        continue;
      }
      if (!message.empty()) message += "; ";
      if (option) {
        message += "unknown option " + x + did_you_mean(x.substr(0, x.find('=')), known);
        after_unknown_option = x.find('=') == std::string::npos;
        unknown_option = true;
      } else {
        message += "unexpected argument " + shell_word(x);
      }
    }
    if (unknown_option || (!message.empty() && dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr)) {
      err("{}: usage: {}; see `{}`\n", who, printable(message), help);
      return kExitUsage;
    }
  }
  err("{}: usage: {}; see `{}`\n", who, printable(e.what()), help);
  return kExitUsage;
}

// `mx2nv help [COMMAND]`.
int run_help(const CLI::App& app, const std::string& topic) {
  if (topic.empty()) return print_help(app.help());
  if (topic == "help") return print_help(app.get_subcommand("help")->help("mx2nv"));
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (sub->get_name() == topic) return print_help(sub->help("mx2nv"));
  }
  err("mx2nv help: unknown command {}{}; see `mx2nv help`\n", shell_word(topic),
      did_you_mean(topic, command_names(app)));
  return kExitUsage;
}

// What CLI11 would take for a subcommand name or a top-level option, checked
// before it parses: an unknown command is named, with the nearest ones.
std::optional<int> refuse_unknown_first_word(const CLI::App& app, const std::vector<std::string>& args) {
  const std::string& first = args.front();
  if (first == "--help" || first == "-h" || first == "--version") return std::nullopt;
  const auto names = command_names(app);
  if (first.size() > 1 && first.front() == '-') {
    err("mx2nv: usage: unknown option {}{}; a command comes first; see `mx2nv help`\n", printable(first),
        did_you_mean(first.substr(0, first.find('=')), {"--help", "--version"}));
    return kExitUsage;
  }
  if (std::find(names.begin(), names.end(), first) != names.end()) return std::nullopt;
  err("mx2nv: usage: unknown command {}{}; see `mx2nv help`\n", shell_word(first), did_you_mean(first, names));
  return kExitUsage;
}

}  // namespace
}  // namespace mx2nv::cli

int main(int argc, char** argv) {
  using namespace mx2nv;
  using namespace mx2nv::cli;
  prepare_standard_streams();
  stop_on_signals();
  const std::vector<std::string> args(argv + 1, argv + argc);
  CLI::App app{"mx2nv: lossless MXFP4 -> NVFP4A16 transcoder for compressed-tensors MoE checkpoints", "mx2nv"};
  app.set_version_flag("--version", std::string("mx2nv ") + MX2NV_VERSION, "print the version and exit");
  app.set_help_flag("-h,--help", "print this help and exit");
  app.require_subcommand(1);
  app.footer("Example:\n  mx2nv convert ./kimi-k3 ./kimi-k3-nvfp4 && mx2nv verify ./kimi-k3 ./kimi-k3-nvfp4\n"
             "`mx2nv help COMMAND` or `mx2nv COMMAND --help` shows one command.");
  std::vector<std::unique_ptr<Subcommand>> subcommands;
  for (const auto add : {add_convert, add_verify, add_compare, add_plan, add_requantize, add_inspect, add_gate,
                         add_generate, add_demo, add_card}) {
    subcommands.push_back(add(app));
  }
  std::string help_topic;
  CLI::App* help = app.add_subcommand("help", "print the help of mx2nv or of one command");
  help->add_option("COMMAND", help_topic, "the command to describe");
  help->footer("Example:\n  mx2nv help convert");

  if (args.empty()) {  // no command: a usage error, with the help that says what to give
    err_text(app.help());
    return kExitUsage;
  }
  if (const auto refused = refuse_unknown_first_word(app, args)) return *refused;
  // `help` is answered here: CLI11 would take its COMMAND for that command.
  if (args.front() == "help") {
    if (args.size() > 2) {
      err("mx2nv help: usage: one COMMAND at most; see `mx2nv help help`\n");
      return kExitUsage;
    }
    if (args.size() == 2 && (args[1] == "--help" || args[1] == "-h")) return print_help(help->help("mx2nv"));
    return run_help(app, args.size() == 2 ? args[1] : std::string());
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    return print_help(app.help());
  } catch (const CLI::CallForAllHelp&) {
    return print_help(app.help("", CLI::AppFormatMode::All));
  } catch (const CLI::CallForVersion& e) {
    return print_help(std::string(e.what()) + "\n");
  } catch (const CLI::ParseError& e) {
    return usage_error(app, e);
  }
  for (const auto& subcommand : subcommands) {
    if (!subcommand->chosen()) continue;
    CommandRun state;
    int rc = kExitUsage;
    std::optional<Error> failure;
    try {
      subcommand->refuse_empty_values();
      rc = subcommand->run(state);
      flush_out();
    } catch (...) {
      failure = current_exception_as_error();
      rc = report_failure(subcommand->command(), state);
    }
    // Stopped at any point, even after the work was done: never told as a
    // finished run (0 or 1).
    if (stop_requested()) return interrupted(subcommand->command(), args, failure);
    return rc;
  }
  return kExitUsage;
}

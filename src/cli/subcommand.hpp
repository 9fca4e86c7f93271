// The subcommands of `mx2nv`, one file each (cli/run_<name>.cpp). Each
// registers its options on the command line when constructed and runs once
// the command line names it; main knows the command once, as its Command.
#pragma once

#include "cli/progress_line.hpp"
#include "cli/shared_options.hpp"
#include "common/command.hpp"
#include "convert/convert.hpp"
#include "output/output.hpp"
#include "verify/verify.hpp"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI

namespace mx2nv::cli {

// What main needs of the command being run once it fails: where its reports
// go (set once checked, before any work: also where the success path writes
// them) and what its error report names. The command fills it in as it
// learns it; the error report is written only where outputs were checked.
struct CommandRun {
  CommandOutputs outputs;
  Window window = windows().front().window;
  // The SRC and DST the command uses (with --plan, the plan's); empty where
  // unknown or absent (inspect has no DST).
  fs::path source, target;
  std::string shard_subset;  // verify --shards I/N: a failed part is still part I/N for --merge
  unsigned threads = 1;      // for the error report's HTML page
};

class Subcommand {
 public:
  virtual ~Subcommand() = default;
  Subcommand(const Subcommand&) = delete;
  Subcommand& operator=(const Subcommand&) = delete;

  Command command() const { return command_; }
  // Whether the command line named this subcommand.
  bool chosen() const;
  // Runs the chosen subcommand: its exit code; throws on failure, with
  // `state` holding what its error report needs.
  virtual int run(CommandRun& state) = 0;
  // An option or argument given an empty value is a usage error, never "not
  // given": an unset shell variable must not silently change what runs.
  void refuse_empty_values() const;

 protected:
  // Registers the subcommand (named by command_name) on `mx2nv`.
  Subcommand(CLI::App& mx2nv, Command command, const std::string& description);

  // The arguments several commands take, each registered by the add_*
  // below with the same name, help and checks wherever it appears
  // (cli/shared_options.hpp); a command registers those it takes.
  void add_source(const std::string& help, bool required);
  void add_target(const std::string& name, const std::string& help, bool required);
  void add_window_option() { window_opt_ = add_window(app_, window_); }
  void add_threads_option() { add_threads(app_, threads_); }
  void add_report_option() { report_opt_ = add_report(app_, report_path_); }
  void add_html_option() { html_opt_ = add_html(app_, html_path_); }
  void add_html_option(const std::string& help);
  void add_progress_option() { add_progress(app_, progress_); }

  // The prologue of run(): `state` learns what this run was given (its error
  // report names them: note_run), then where --report and --html go is
  // checked against SRC and DST, and `inputs` (other files a report must not
  // replace), before any work.
  void begin(CommandRun& state, const std::vector<std::pair<fs::path, std::string>>& inputs = {});
  void note_run(CommandRun& state) const;
  // SRC and DST both given; a usage error naming them otherwise.
  void require_paths() const;

  const Command command_;
  CLI::App* const app_;
  std::string source_, target_, report_path_, html_path_;
  std::string target_name_ = "DST";
  Window window_ = windows().front().window;
  unsigned threads_ = all_cores();
  ProgressMode progress_ = ProgressMode::Auto;
  CLI::Option *window_opt_ = nullptr, *report_opt_ = nullptr, *html_opt_ = nullptr;
};

// Each registers its subcommand; --help lists them in the order registered.
std::unique_ptr<Subcommand> add_convert(CLI::App& mx2nv);
std::unique_ptr<Subcommand> add_verify(CLI::App& mx2nv);
std::unique_ptr<Subcommand> add_plan(CLI::App& mx2nv);
std::unique_ptr<Subcommand> add_requantize(CLI::App& mx2nv);
std::unique_ptr<Subcommand> add_inspect(CLI::App& mx2nv);
std::unique_ptr<Subcommand> add_gate(CLI::App& mx2nv);
std::unique_ptr<Subcommand> add_generate(CLI::App& mx2nv);
std::unique_ptr<Subcommand> add_demo(CLI::App& mx2nv);
std::unique_ptr<Subcommand> add_card(CLI::App& mx2nv);
std::unique_ptr<Subcommand> add_compare(CLI::App& mx2nv);

// convert SRC DST and verify SRC DST with their summaries, as the demo runs
// them too (cli/run_convert.cpp, cli/run_verify.cpp).
int run_convert(const ConvertOptions& o, const std::optional<ReportFile>& report_path,
                const std::optional<ReportFile>& html = std::nullopt);
int run_verify(const VerifyOptions& o, const std::optional<ReportFile>& report_path,
               const std::optional<ReportFile>& html = std::nullopt);
// verify --merge PART... (cli/run_merge.cpp).
int run_merge(const std::vector<std::string>& parts, const std::string& report_path);

// convert --plan P: one step of a plan, its options checked against the
// command line already (cli/run_planned.cpp). Sets state's outputs, SRC and
// DST: the plan's.
struct PlannedStep {
  PlannedOptions options;
  std::optional<ShardSelection> selection;  // --shard I or --shards I/N; none: --finalize
  std::string report_path, html_path;       // "": not given
};
int run_planned_step(const PlannedStep& step, CommandRun& state);

}  // namespace mx2nv::cli

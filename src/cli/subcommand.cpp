#include "cli/subcommand.hpp"

#include "common/error.hpp"

#include <CLI/CLI.hpp>

namespace mx2nv::cli {
namespace {

// The example each command's --help ends with.
std::string example(Command command) {
  switch (command) {
    case Command::Convert: return "mx2nv convert ./kimi-k3 ./kimi-k3-nvfp4 --window e4m3 --report convert.json";
    case Command::Verify: return "mx2nv verify ./kimi-k3 ./kimi-k3-nvfp4 --report verify.json";
    case Command::Plan: return "mx2nv plan ./kimi-k3 /shared/kimi-k3-nvfp4 && mx2nv convert --plan /shared/kimi-k3-nvfp4/.mx2nv/plan.json --shards 0/8";
    case Command::Requantize: return "mx2nv requantize ./kimi-k3 ./kimi-k3-nvfp4-requantized --report requantize.json";
    case Command::Inspect: return "mx2nv inspect ./kimi-k3 --window e4m3";
    case Command::Gate: return "mx2nv gate ./kimi-k3-nvfp4 --runtime vllm --tp 8";
    case Command::Generate: return "mx2nv generate ./tiny-mxfp4 --layers 2 --experts 8 --shards 4";
    case Command::Demo: return "mx2nv demo ./mx2nv-demo";
    case Command::Card: return "mx2nv card ./kimi-k3 ./kimi-k3-nvfp4 --verify-report verify.json";
    case Command::Compare: return "mx2nv compare ./kimi-k3 ./kimi-k3-nvfp4 --json > compare.json";
  }
  return "mx2nv --help";
}

}  // namespace

Subcommand::Subcommand(CLI::App& mx2nv, Command command, const std::string& description)
    : command_(command), app_(mx2nv.add_subcommand(std::string(command_name(command)), description)) {
  // Every option's default is shown in --help (an option without one shows none).
  app_->option_defaults()->always_capture_default();
  app_->set_help_flag("-h,--help", "print this help and exit");
  app_->footer("Example:\n  " + example(command));
}

bool Subcommand::chosen() const { return app_->parsed(); }

void Subcommand::add_source(const std::string& help, bool required) {
  CLI::Option* o = app_->add_option("SRC", source_, help);
  if (required) o->required();
}

void Subcommand::add_target(const std::string& name, const std::string& help, bool required) {
  target_name_ = name;
  CLI::Option* o = app_->add_option(name, target_, help);
  if (required) o->required();
}

void Subcommand::add_html_option(const std::string& help) { html_opt_ = app_->add_option("--html", html_path_, help); }

void Subcommand::note_run(CommandRun& state) const {
  state.window = window_;
  state.threads = threads_;
  state.source = source_;
  state.target = target_;
}

void Subcommand::begin(CommandRun& state, const std::vector<std::pair<fs::path, std::string>>& inputs) {
  note_run(state);
  state.outputs = check_command_outputs(report_opt_ ? path_if_given(report_path_) : std::nullopt,
                                        html_opt_ ? path_if_given(html_path_) : std::nullopt, {source_, target_},
                                        inputs);
}

void Subcommand::require_paths() const {
  if (source_.empty() || target_.empty()) fail(ErrorKind::Usage, "SRC and {} are required", target_name_);
}

void Subcommand::refuse_empty_values() const {
  for (const CLI::Option* option : app_->get_options()) {
    if (option->count() == 0 || option->get_type_size() == 0) continue;  // not given, or a flag
    for (const std::string& value : option->results()) {
      if (value.empty()) {
        fail(ErrorKind::Usage, "{}: given an empty value (an unset shell variable?); give a value or leave it out",
             option->get_name());
      }
    }
  }
}

}  // namespace mx2nv::cli

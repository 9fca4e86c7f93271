// mx2nv generate: write a deterministic MXFP4 checkpoint (fixture/fixture.hpp)
// for tests and benchmarks.
#include "cli/shared_options.hpp"
#include "cli/standard_output.hpp"
#include "cli/subcommand.hpp"
#include "common/error.hpp"
#include "common/printable.hpp"
#include "fixture/fixture.hpp"

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <charconv>

namespace mx2nv::cli {
namespace {

// MODULE=VALUE with an integer VALUE (generate --set-span, --set-k-max).
std::pair<std::string, int> module_value(const std::string& kv, const char* option) {
  const auto eq = kv.rfind('=');
  if (eq == std::string::npos || eq == 0) {
    fail(ErrorKind::Usage, "{}: expected MODULE=VALUE, got {}", option, printable(kv));
  }
  const std::string_view text = std::string_view(kv).substr(eq + 1);
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
    fail(ErrorKind::Usage, "{}: {} is not an integer (in {})", option, printable(text), printable(kv));
  }
  return {kv.substr(0, eq), value};
}

// DIR may be absent or an empty directory, never anything else.
void check_generate_dir(const std::string& given) {
  const fs::path dir(given);
  if (!fs::exists(fs::symlink_status(dir))) return;
  if (!fs::is_directory(fs::symlink_status(dir))) {
    fail(ErrorKind::Usage, "{} exists and is not a directory", printable(given));
  }
  if (!fs::is_empty(dir)) fail(ErrorKind::Usage, "{} is not empty", printable(given));
}

class GenerateCommand final : public Subcommand {
 public:
  explicit GenerateCommand(CLI::App& mx2nv)
      : Subcommand(mx2nv, Command::Generate, "write a deterministic MXFP4 checkpoint (tests, benchmarks)") {
    app_->add_option("DIR", dir_, "directory to create (absent or empty)")->required();
    add_choice(app_, "--layout", spec_.layout, "checkpoint layout");
    app_->add_option("--layers", spec_.layers, "decoder layers, 1-4096")->type_name("N")->check(CLI::Range(1u, 4096u).description(""));
    app_->add_option("--experts", spec_.experts, "routed experts per layer, 1-4096")->type_name("N")->check(CLI::Range(1u, 4096u).description(""));
    app_->add_option("--hidden", spec_.hidden, "hidden size (K of gate/up), multiple of 32");
    app_->add_option("--intermediate", spec_.intermediate, "expert intermediate size (K of down), multiple of 32");
    app_->add_option("--shards", spec_.shards, "shard files (1 writes model.safetensors), 1-100000")
        ->type_name("N")->check(CLI::Range(1u, 100000u).description(""));
    app_->add_option("--k-max", spec_.k_max, "exponent of each module's top active group");
    app_->add_option("--span", spec_.span, "k_max - k_min of each module, 0-200")->type_name("N")->check(CLI::Range(0, 200).description(""));
    app_->add_option("--zero-percent", spec_.zero_group_percent, "share of all-zero groups, 0-100")
        ->type_name("N")->check(CLI::Range(0u, 100u).description(""));
    app_->add_option("--seed", spec_.seed, "generator seed");
    add_named_choice(app_, "--extreme-zero-scales", {"on", "off"}, "on",
                     "on: a quarter of the all-zero groups carry scales far outside the window (byte 0 or k_max+20)",
                     [this](const std::string& given) { spec_.out_of_window_zero_groups = given == "on"; });
    app_->add_option("--set-span", set_span_, "MODULE=SPAN for one module");
    app_->add_option("--set-k-max", set_kmax_, "MODULE=K for one module");
    app_->add_option("--all-zero", all_zero_, "MODULE whose codes are all +-0");
    app_->add_option("--nan-scale", nan_scale_, "MODULE with one 0xFF scale");
  }

  int run(CommandRun&) override {
    for (const auto& kv : set_span_) {
      const auto [module, value] = module_value(kv, "--set-span");
      if (value < 0 || value > 200) fail(ErrorKind::Usage, "--set-span: {} is outside [0, 200]", value);
      spec_.overrides[module].span = value;
    }
    for (const auto& kv : set_kmax_) {
      const auto [module, value] = module_value(kv, "--set-k-max");
      spec_.overrides[module].k_max = value;
    }
    for (const auto& m : all_zero_) spec_.overrides[m].all_zero = true;
    for (const auto& m : nan_scale_) spec_.overrides[m].nan_scale = true;
    check_generate_dir(dir_);
    write_fixture(dir_, spec_);
    out("mx2nv generate: wrote {}\n", printable(dir_));
    return kExitOk;
  }

 private:
  FixtureSpec spec_;
  std::string dir_;
  std::vector<std::string> set_span_, set_kmax_, all_zero_, nan_scale_;
};

}  // namespace

std::unique_ptr<Subcommand> add_generate(CLI::App& mx2nv) { return std::make_unique<GenerateCommand>(mx2nv); }

}  // namespace mx2nv::cli

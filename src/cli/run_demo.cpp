// mx2nv demo: a small K3-shaped MXFP4 checkpoint written, converted and
// verified in one directory, with the reports a real run writes.
#include "cli/standard_output.hpp"
#include "cli/shared_options.hpp"
#include "cli/subcommand.hpp"
#include "common/error.hpp"
#include "common/printable.hpp"
#include "fixture/fixture.hpp"

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <fstream>

namespace mx2nv::cli {
namespace {

// DIR is absent, empty or an earlier demo's (marked), whose checkpoints are
// removed; anything else is refused.
void prepare_demo_dir(const fs::path& dir) {
  const fs::path marker = dir / ".mx2nv-demo";
  std::error_code ec;
  if (fs::exists(fs::symlink_status(dir)) && !fs::is_directory(dir)) {
    fail(ErrorKind::Usage, "{} exists and is not a directory", printable(dir.string()));
  }
  if (fs::exists(dir) && !fs::is_empty(dir)) {
    if (!fs::exists(marker)) {
      fail(ErrorKind::Usage, "{} exists, is not empty and is not an mx2nv demo directory", printable(dir.string()));
    }
    fs::remove_all(dir / "mxfp4", ec);
    fs::remove_all(dir / "nvfp4", ec);
  }
  fs::create_directories(dir);
  std::ofstream(marker) << "created by mx2nv demo; safe to delete\n";
}

int run_demo(const fs::path& dir, unsigned threads) {
  prepare_demo_dir(dir);
  FixtureSpec spec;
  spec.layout = FixtureLayout::K3;
  spec.layers = 2;
  spec.experts = 8;
  spec.hidden = 512;
  spec.intermediate = 256;
  spec.shards = 4;
  write_fixture(dir / "mxfp4", spec);
  out("mx2nv demo: wrote a K3-shaped MXFP4 checkpoint to {}\n\n", printable((dir / "mxfp4").string()));

  const ConvertOptions c{dir / "mxfp4", dir / "nvfp4", Window::Marlin, threads, false};
  const int rc = run_convert(c, ReportFile(dir / "convert-report.json", {c.source, c.target}),
                             ReportFile(dir / "convert-report.html", {c.source, c.target}, "--html"));
  if (rc != kExitOk) return rc;
  out("\n");
  const int vrc =
      run_verify({c.source, c.target, Window::Marlin, threads, std::nullopt},
                 ReportFile(dir / "verify-report.json", {c.source, c.target}));
  if (vrc == kExitOk) {
    out("\nmx2nv demo: done. Reports: {}, {}, {}\n", printable((dir / "convert-report.json").string()),
        printable((dir / "convert-report.html").string()), printable((dir / "verify-report.json").string()));
  }
  return vrc;
}

class DemoCommand final : public Subcommand {
 public:
  explicit DemoCommand(CLI::App& mx2nv)
      : Subcommand(mx2nv, Command::Demo, "write a small K3-shaped MXFP4 checkpoint, convert it, verify it") {
    app_->add_option("DIR", dir_, "working directory (default: ./mx2nv-demo)");
    add_threads_option();
  }

  int run(CommandRun&) override { return run_demo(dir_, threads_); }

 private:
  std::string dir_ = "mx2nv-demo";
};

}  // namespace

std::unique_ptr<Subcommand> add_demo(CLI::App& mx2nv) { return std::make_unique<DemoCommand>(mx2nv); }

}  // namespace mx2nv::cli

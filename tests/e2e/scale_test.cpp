// Resources that must not grow with the checkpoint: open files. (Memory at
// Kimi K3's structure is measured by bench/benchmark.py; a test would need a
// timed or RSS assertion on a shared machine.)
#include "e2e_support.hpp"
#include "fixture/fixture.hpp"
#include "io/planner.hpp"

namespace mx2nv::e2e {
namespace {

// Runs the CLI under a soft limit of `max_files` open descriptors.
int run_with_file_limit(int max_files, const std::string& args) {
  ScratchDir io;
  const std::string cmd = "ulimit -n " + std::to_string(max_files) + " && " + std::string(MX2NV_EXE) + " " + args +
                          " >" + (io / "out").string() + " 2>" + (io / "err").string() + " </dev/null";
  const int status = std::system(cmd.c_str());
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ADD_FAILURE() << args << "\n" << read_file(io / "err");
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// 200 shards under `ulimit -n 64`: every command holds a bounded number of
// files (a pool for positional reads, one per worker for a pass), whatever
// the shard count.
TEST(Scale, TwoHundredShardsUnderSixtyFourOpenFiles) {
  ScratchDir dir;
  FixtureSpec spec = tiny_spec();
  spec.layers = 2;
  spec.experts = 40;
  spec.intermediate = 32;
  spec.shards = 200;
  write_fixture(dir / "src", spec);
  std::size_t shard_files = 0;
  for (const auto& e : fs::directory_iterator(dir / "src")) shard_files += e.path().extension() == ".safetensors";
  ASSERT_EQ(shard_files, 200u);
  const std::string src = (dir / "src").string(), dst = (dir / "dst").string();
  for (const char* threads : {"1", "4"}) {
    fs::remove_all(dir / "dst");
    EXPECT_EQ(run_with_file_limit(64, "convert --threads " + std::string(threads) + " " + src + " " + dst), 0);
    EXPECT_EQ(run_with_file_limit(64, "verify --threads " + std::string(threads) + " " + src + " " + dst), 0);
    EXPECT_EQ(run_with_file_limit(64, "inspect --threads " + std::string(threads) + " " + src), 0);
  }
}

}  // namespace
// Memory: scale histograms past the scan's budget are not kept and the plan
// reads those modules' scales again; every window's plan is the same as with
// all of them kept (here: none kept, with an over-span module and zero groups
// whose scales lie far outside the window).
TEST(Scale, PlansAreTheSameWhenNoHistogramIsKept) {
  ScratchDir d;
  write_fixture(d / "src", spec_with_over_span());
  const SourceCheckpoint source = open_source_checkpoint(d / "src", 2);
  const ScanResult kept = scan_modules(source, 2);
  const ScanResult none = scan_modules(source, 2, 0);
  for (const auto& f : kept.facts) EXPECT_TRUE(f.histogram_kept);
  for (const auto& f : none.facts) EXPECT_FALSE(f.histogram_kept);
  for (const WindowInfo& w : windows()) {
    const Plan a = plan_conversion(source, kept, w.window);
    const Plan b = plan_conversion(source, none, w.window);
    EXPECT_EQ(a.refused(), b.refused());
    EXPECT_EQ(a.over_span.size(), b.over_span.size());
    ASSERT_EQ(a.modules.size(), b.modules.size());
    std::uint64_t canonical = 0;
    for (std::size_t i = 0; i < a.modules.size(); ++i) {
      EXPECT_EQ(a.modules[i].m, b.modules[i].m);
      EXPECT_EQ(a.modules[i].canonical_zero_groups, b.modules[i].canonical_zero_groups);
      EXPECT_EQ(a.modules[i].marlin_zeroed_groups, b.modules[i].marlin_zeroed_groups);
      EXPECT_EQ(a.modules[i].groups_outside, b.modules[i].groups_outside);
      canonical += a.modules[i].canonical_zero_groups;
    }
    EXPECT_GT(canonical, 0u);
  }
}

}  // namespace mx2nv::e2e

// Resources that must not grow with the checkpoint: open files. (Memory at
// Kimi K3's structure is measured by bench/benchmark.py; a test would need a
// timed or RSS assertion on a shared machine.)
#include "checkpoint/reader.hpp"
#include "common/error.hpp"
#include "destination/index_writer.hpp"
#include "e2e_support.hpp"
#include "fixture/fixture.hpp"
#include "safetensors/index.hpp"
#include "scan/planner.hpp"

namespace mx2nv::e2e {
namespace {

using json = nlohmann::json;

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

// The names of the index convert writes: kept from opening (an index of K3's
// size) or read again at the end (a larger one) give the same bytes, with
// BF16 modules renamed and their scales dropped either way; an index that
// changed in between is refused.
std::string target_index(const SourceCheckpoint& source, const Plan& plan) {
  std::string text;
  render_target_index(source, plan.modules, 12345, [&](std::string_view piece) { text += piece; });
  return text;
}

TEST(Scale, TheTargetIndexIsTheSameWhetherItsNamesWereKeptOrReadAgain) {
  ScratchDir d;
  write_fixture(d / "src", spec_with_over_span());
  const SourceCheckpoint kept = open_source_checkpoint(d / "src", 2, IndexNames::KeepIfSmall);
  const SourceCheckpoint dropped = open_source_checkpoint(d / "src", 2, IndexNames::Drop);
  ASSERT_GT(kept.checkpoint.index->tensors.size(), 0u);
  ASSERT_EQ(dropped.checkpoint.index->tensors.size(), 0u);
  Plan plan = plan_conversion(kept, scan_modules(kept, 2), Window::Marlin);
  EXPECT_EQ(target_index(kept, plan), target_index(dropped, plan));
  plan.modules[1].treatment = Treatment::Bf16;
  plan.modules[4].treatment = Treatment::Bf16;
  const std::string with_bf16 = target_index(kept, plan);
  EXPECT_EQ(with_bf16, target_index(dropped, plan));
  EXPECT_NE(with_bf16.find(std::string(kept.modules.modules[1].name) + std::string(kBf16WeightSuffix)),
            std::string::npos);

  // Whitespace changes nothing; a member DST's index carries over, or a
  // tensor mapped to another shard, does.
  const fs::path index_path = d / "src" / std::string(kIndexFileName);
  json index = json::parse(read_file(index_path));
  write_file(index_path, index.dump(4));
  EXPECT_EQ(with_bf16, target_index(dropped, plan));
  const auto refused = [&] {
    try {
      target_index(dropped, plan);
      ADD_FAILURE() << "a changed index was used";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
      EXPECT_NE(std::string(e.what()).find("changed while mx2nv was reading it"), std::string::npos) << e.what();
    }
  };
  json edited = index;
  edited["metadata"]["note"] = "added since";
  write_file(index_path, edited.dump());
  refused();
  auto& map = index["weight_map"];
  const std::string first_shard = map.begin().value().get<std::string>();
  for (auto it = map.begin(); it != map.end(); ++it) {
    if (it.value() != first_shard) {
      map.begin().value() = it.value();
      break;
    }
  }
  write_file(index_path, index.dump());
  refused();
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
    EXPECT_EQ(a.refused_spans.size(), b.refused_spans.size());
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

// The planned, per-shard conversion that schedulers run: every way of running
// the steps (split 1, 2 or 3 ways, any order, the same shard twice at once, a
// worker killed mid-shard, retries after the end) gives the bytes of a
// single-process convert; finalize refuses an incomplete DST; a stale plan is
// refused; partial verifies merge into one.
#include "e2e_support.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>

namespace mx2nv::e2e {
namespace {

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

class Distributed : public ::testing::Test {
 protected:
  void SetUp() override {
    FixtureSpec spec = tiny_spec();
    spec.layers = 3;
    spec.experts = 4;
    spec.shards = 6;
    write_fixture(d / "src", spec);
    ASSERT_EQ(run_cli("convert " + q(d / "src") + " " + q(d / "reference")).exit_code, 0);
    reference = snapshot(d / "reference");
  }
  std::string plan_of(const fs::path& dst) { return q(dst / ".mx2nv/plan.json"); }
  ScratchDir d;
  std::map<std::string, std::string> reference;
};

TEST_F(Distributed, EverySplitAndOrderGivesTheSingleProcessBytes) {
  std::mt19937 rng(7);
  for (const int ways : {1, 2, 3, 4}) {
    const fs::path dst = d / ("dst" + std::to_string(ways));
    ASSERT_EQ(run_cli("plan " + q(d / "src") + " " + q(dst)).exit_code, 0);
    std::vector<int> order(static_cast<std::size_t>(ways));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (const int i : order) {
      const CliResult r = run_cli("convert --plan " + plan_of(dst) + " --shards " + std::to_string(i) + "/" +
                                  std::to_string(ways));
      ASSERT_EQ(r.exit_code, 0) << r.err;
    }
    ASSERT_EQ(run_cli("convert --plan " + plan_of(dst) + " --finalize").exit_code, 0);
    EXPECT_TRUE(snapshot(dst) == reference) << ways << " ways";
  }
  // Single shards by number, plan kept outside DST.
  const fs::path dst = d / "by-number";
  ASSERT_EQ(run_cli("plan " + q(d / "src") + " " + q(dst) + " --plan-out " + q(d / "plan.json")).exit_code, 0);
  for (const int i : {5, 3, 1, 0, 2, 4}) {
    ASSERT_EQ(run_cli("convert --plan " + q(d / "plan.json") + " --shard " + std::to_string(i)).exit_code, 0);
  }
  EXPECT_EQ(run_cli("convert --plan " + q(d / "plan.json") + " --shard 6").exit_code, 2);  // out of range
  ASSERT_EQ(run_cli("convert --plan " + q(d / "plan.json") + " --finalize").exit_code, 0);
  EXPECT_TRUE(snapshot(dst) == reference);
}

TEST_F(Distributed, FinalizeRefusesAnIncompleteDestinationNamingTheMissingShards) {
  const fs::path dst = d / "dst";
  ASSERT_EQ(run_cli("plan " + q(d / "src") + " " + q(dst)).exit_code, 0);
  ASSERT_EQ(run_cli("convert --plan " + plan_of(dst) + " --shards 0/2").exit_code, 0);
  const CliResult r = run_cli("convert --plan " + plan_of(dst) + " --finalize");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("3 of 6 shards are not finished"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--shard 1"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dst / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dst / "config.json"));
  // A finished shard damaged since is not finished either.
  ASSERT_EQ(run_cli("convert --plan " + plan_of(dst) + " --shards 1/2").exit_code, 0);
  const fs::path shard = dst / "model-00003-of-00006.safetensors";
  write_file(shard, read_file(shard) + "x");
  EXPECT_EQ(run_cli("convert --plan " + plan_of(dst) + " --finalize").exit_code, 2);
  // Rerunning its part redoes it; then finalize succeeds.
  ASSERT_EQ(run_cli("convert --plan " + plan_of(dst) + " --shards 0/2").exit_code, 0);
  ASSERT_EQ(run_cli("convert --plan " + plan_of(dst) + " --finalize").exit_code, 0);
  EXPECT_TRUE(snapshot(dst) == reference);
}

TEST_F(Distributed, RetriesAfterTheEndAreNoOps) {
  const fs::path dst = d / "dst";
  ASSERT_EQ(run_cli("plan " + q(d / "src") + " " + q(dst)).exit_code, 0);
  ASSERT_EQ(run_cli("plan " + q(d / "src") + " " + q(dst)).exit_code, 0);  // the same plan again
  ASSERT_EQ(run_cli("convert --plan " + plan_of(dst) + " --shards 0/1").exit_code, 0);
  const CliResult again = run_cli("convert --plan " + plan_of(dst) + " --shards 0/1");
  ASSERT_EQ(again.exit_code, 0);
  EXPECT_NE(again.out.find("6 already done"), std::string::npos) << again.out;
  ASSERT_EQ(run_cli("convert --plan " + plan_of(dst) + " --finalize").exit_code, 0);
  // The plan kept in DST is gone with the rest of the state: retries still exit 0.
  for (const char* step : {" --shards 1/3", " --finalize", " --shard 2"}) {
    const CliResult r = run_cli("convert --plan " + plan_of(dst) + std::string(step));
    EXPECT_EQ(r.exit_code, 0) << step << r.err;
    EXPECT_NE(r.out.find("already complete"), std::string::npos) << r.out;
  }
  EXPECT_EQ(run_cli("plan " + q(d / "src") + " " + q(dst)).exit_code, 0);
  EXPECT_EQ(run_cli("convert --resume " + q(d / "src") + " " + q(dst)).exit_code, 0);
  EXPECT_TRUE(snapshot(dst) == reference);
}

TEST_F(Distributed, TheSameShardTwiceAtOnceAndAKilledWorker) {
  const fs::path dst = d / "dst";
  ASSERT_EQ(run_cli("plan " + q(d / "src") + " " + q(dst)).exit_code, 0);
  const std::string plan = (dst / ".mx2nv/plan.json").string();
  for (int round = 0; round < 3; ++round) {
    const pid_t a = spawn_cli({"convert", "--plan", plan, "--shards", "0/2", "--threads", "1"});
    const pid_t b = spawn_cli({"convert", "--plan", plan, "--shards", "0/2", "--threads", "1"});
    EXPECT_EQ(wait_exit(a), 0);
    EXPECT_EQ(wait_exit(b), 0);
  }
  // A worker killed at some point of its part; the rerun completes it.
  for (int delay_ms = 0; delay_ms < 60; delay_ms += 15) {
    const pid_t w = spawn_cli({"convert", "--plan", plan, "--shards", "1/2", "--threads", "1"});
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    kill(w, SIGKILL);
    wait_exit(w);
  }
  ASSERT_EQ(run_cli("convert --plan " + q(plan) + " --shards 1/2").exit_code, 0);
  ASSERT_EQ(run_cli("convert --plan " + q(plan) + " --finalize").exit_code, 0);
  EXPECT_TRUE(snapshot(dst) == reference);
}

TEST_F(Distributed, AStaleOrDamagedPlanIsRefused) {
  const fs::path dst = d / "dst";
  ASSERT_EQ(run_cli("plan " + q(d / "src") + " " + q(dst)).exit_code, 0);
  // SRC changed after planning.
  const fs::path shard = d / "src/model-00002-of-00006.safetensors";
  const auto when = fs::last_write_time(shard);
  fs::last_write_time(shard, when + std::chrono::seconds(5));
  CliResult r = run_cli("convert --plan " + plan_of(dst) + " --shards 0/2");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no longer matches the plan"), std::string::npos) << r.err;
  fs::last_write_time(shard, when);
  // A plan edited by hand.
  std::string text = read_file(dst / ".mx2nv/plan.json");
  const auto at = text.find("\"window\": \"marlin\"");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 18, "\"window\": \"e4m3\"  ");
  write_file(dst / ".mx2nv/plan.json", text);
  r = run_cli("convert --plan " + plan_of(dst) + " --shards 0/2");
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(r.err.find("checksum"), std::string::npos) << r.err;
  // Another plan for the same DST.
  EXPECT_EQ(run_cli("plan --window e4m3 " + q(d / "src") + " " + q(dst)).exit_code, 2);
  // A plan file that is not one.
  write_file(d / "junk.json", "[1]");
  EXPECT_EQ(run_cli("convert --plan " + q(d / "junk.json") + " --finalize").exit_code, 3);
  EXPECT_EQ(run_cli("convert --plan " + q(d / "absent.json") + " --finalize").exit_code, 2);
  // Plans never go into SRC.
  EXPECT_EQ(run_cli("plan " + q(d / "src") + " " + q(d / "x") + " --plan-out " + q(d / "src/plan.json")).exit_code, 2);
  EXPECT_FALSE(fs::exists(d / "src/plan.json"));
  // Bad selections.
  for (const char* sel : {"3/3", "1/0", "a/2", "1", "-1/2"}) {
    EXPECT_EQ(run_cli("convert --plan " + plan_of(dst) + " --shards " + std::string(sel)).exit_code, 2) << sel;
  }
  EXPECT_EQ(run_cli("convert --plan " + plan_of(dst)).exit_code, 2);
}

TEST_F(Distributed, PartialVerifiesMergeIntoOne) {
  const fs::path dst = d / "reference";
  for (int i = 0; i < 3; ++i) {
    const CliResult r = run_cli("verify " + q(d / "src") + " " + q(dst) + " --shards " + std::to_string(i) +
                                "/3 --report " + q(d / ("part" + std::to_string(i) + ".json")));
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  ASSERT_EQ(run_cli("verify " + q(d / "src") + " " + q(dst) + " --report " + q(d / "whole.json")).exit_code, 0);
  const CliResult m = run_cli("verify --merge " + q(d / "part2.json") + " " + q(d / "part0.json") + " " +
                              q(d / "part1.json") + " --report " + q(d / "merged.json"));
  ASSERT_EQ(m.exit_code, 0) << m.err;
  const auto merged = nlohmann::json::parse(read_file(d / "merged.json"));
  const auto whole = nlohmann::json::parse(read_file(d / "whole.json"));
  EXPECT_EQ(merged["values_compared"], whole["values_compared"]);
  EXPECT_EQ(merged["counts"], whole["counts"]);
  EXPECT_EQ(merged["result"], "ok");
  // A part missing, or given twice.
  EXPECT_EQ(run_cli("verify --merge " + q(d / "part0.json") + " " + q(d / "part1.json")).exit_code, 2);
  EXPECT_EQ(run_cli("verify --merge " + q(d / "part0.json") + " " + q(d / "part0.json") + " " + q(d / "part1.json") +
                    " " + q(d / "part2.json"))
                .exit_code,
            2);
  // A difference in one part makes the whole a mismatch.
  const fs::path shard = dst / "model-00002-of-00006.safetensors";
  std::string bytes = read_file(shard);
  bytes[bytes.size() - 1] = static_cast<char>(bytes[bytes.size() - 1] ^ 0x01);
  write_file(shard, bytes);
  ASSERT_EQ(run_cli("verify " + q(d / "src") + " " + q(dst) + " --shards 1/3 --report " + q(d / "part1.json")).exit_code, 1);
  EXPECT_EQ(run_cli("verify --merge " + q(d / "part0.json") + " " + q(d / "part1.json") + " " + q(d / "part2.json"))
                .exit_code,
            1);
}

}  // namespace
}  // namespace mx2nv::e2e

// mx2nv requantize through convert's steps: a run killed mid-way and
// continued with --resume, a retry on the finished DST, a DST finished by
// the other command, --copy copy against auto, and the planned path (plan
// --requantize, convert --plan P --shards I/N, --finalize) all give the
// bytes of one uninterrupted `mx2nv requantize`, or refuse.
#include "e2e_support.hpp"

#include <signal.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <thread>

namespace mx2nv::e2e {
namespace {

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

// Every regular file's mtime below root, to show a run wrote nothing.
std::map<std::string, std::int64_t> mtimes(const fs::path& root) {
  std::map<std::string, std::int64_t> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    struct stat st {};
    if (e.is_regular_file() && ::stat(e.path().c_str(), &st) == 0) {
      out[fs::relative(e.path(), root).generic_string()] = st.st_mtim.tv_sec * 1'000'000'000LL + st.st_mtim.tv_nsec;
    }
  }
  return out;
}

class RequantizeSteps : public ::testing::Test {
 protected:
  void SetUp() override {
    FixtureSpec spec = tiny_spec();
    spec.layers = 3;
    spec.experts = 4;
    spec.shards = 6;
    write_fixture(d / "src", spec);
    const CliResult r = run_cli("requantize --threads 2 " + q(d / "src") + " " + q(d / "reference"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    reference = snapshot(d / "reference");
  }
  std::string requantize(const fs::path& dst, const std::string& options = "") {
    return "requantize --threads 2 " + options + " " + q(d / "src") + " " + q(dst);
  }
  ScratchDir d;
  std::map<std::string, std::string> reference;
};

TEST_F(RequantizeSteps, ResumeAfterAKillFinishesWithTheSameBytes) {
  for (int delay_ms = 0; delay_ms < 80; delay_ms += 20) {
    const fs::path dst = d / ("killed" + std::to_string(delay_ms));
    const pid_t w = spawn_cli({"requantize", "--threads", "1", (d / "src").string(), dst.string()});
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    kill(w, SIGKILL);
    wait_exit(w);
    const CliResult r = run_cli(requantize(dst, "--resume"));
    ASSERT_EQ(r.exit_code, 0) << delay_ms << " ms: " << r.err;
    EXPECT_TRUE(snapshot(dst) == reference) << delay_ms << " ms";
  }
}

TEST(RequantizeResume, AShardRemovedFromAnInterruptedRunIsRedoneTheRestReused) {
  ScratchDir d;
  FixtureSpec spec;
  spec.layers = 2;
  spec.experts = 8;
  spec.hidden = 512;
  spec.intermediate = 256;
  spec.shards = 8;
  write_fixture(d / "src", spec);
  ASSERT_EQ(run_cli("requantize " + q(d / "src") + " " + q(d / "ref") + " --report " + q(d / "ref.json")).exit_code, 0);
  const fs::path dst = d / "dst";
  const fs::path second = dst / "model-00002-of-00008.safetensors";
  const fs::path third = dst / "model-00003-of-00008.safetensors";
  // Killed once the third shard is committed (one thread: the first two and
  // their records are, too) and before the index (finalize).
  for (int delay = 5; delay < 5000; delay += 5) {
    fs::remove_all(dst);
    const pid_t p = spawn_cli({"requantize", "--threads", "1", (d / "src").string(), dst.string()});
    std::this_thread::sleep_for(std::chrono::milliseconds(delay));
    kill(p, SIGKILL);
    wait_exit(p);
    if (fs::exists(third) && !fs::exists(dst / "model.safetensors.index.json")) break;
  }
  ASSERT_TRUE(fs::exists(third));
  ASSERT_FALSE(fs::exists(dst / "model.safetensors.index.json"));
  fs::remove(second);
  // Without --resume an earlier run's DST is refused.
  EXPECT_EQ(run_cli("requantize " + q(d / "src") + " " + q(dst)).exit_code, 2);
  const CliResult r = run_cli("requantize --resume " + q(d / "src") + " " + q(dst) + " --report " + q(d / "r.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("resumed"), std::string::npos) << r.out;
  EXPECT_TRUE(snapshot(dst) == snapshot(d / "ref"));
  const auto report = nlohmann::json::parse(read_file(d / "r.json"));
  EXPECT_GE(report["counts"]["resumed_shards"].get<int>(), 1) << report.dump();  // the first, recorded before the third commits
  EXPECT_LT(report["counts"]["resumed_shards"].get<int>(), 8) << report.dump();
  // The error table covers every module, reused shards' too (measured apart),
  // with the figures of the uninterrupted run.
  const auto ref = nlohmann::json::parse(read_file(d / "ref.json"));
  EXPECT_EQ(report["requantized"].size(), 2u * 8u * 3u);
  EXPECT_EQ(report["requantized"], ref["requantized"]);
  EXPECT_EQ(report["values_compared"], ref["values_compared"]);
  EXPECT_EQ(report["max_abs_error"], ref["max_abs_error"]);
}

TEST_F(RequantizeSteps, ARetryOnTheFinishedDestinationIsAlreadyCompleteAndWritesNothing) {
  const auto before = mtimes(d / "reference");
  const CliResult r = run_cli(requantize(d / "reference", "--resume"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("already complete"), std::string::npos) << r.out;
  EXPECT_TRUE(snapshot(d / "reference") == reference);
  EXPECT_EQ(mtimes(d / "reference"), before);
  // Without --resume, a finished DST is not empty: refused, as for convert.
  EXPECT_EQ(run_cli(requantize(d / "reference")).exit_code, 2);
}

TEST_F(RequantizeSteps, ADestinationFinishedByTheOtherCommandIsRefused) {
  ASSERT_EQ(run_cli("convert " + q(d / "src") + " " + q(d / "converted")).exit_code, 0);
  const auto converted = snapshot(d / "converted");
  const CliResult into_converted = run_cli(requantize(d / "converted", "--resume"));
  EXPECT_EQ(into_converted.exit_code, 2) << into_converted.err;
  EXPECT_NE(into_converted.err.find("not written by mx2nv requantize"), std::string::npos) << into_converted.err;
  EXPECT_TRUE(snapshot(d / "converted") == converted);
  const CliResult into_requantized = run_cli("convert --resume " + q(d / "src") + " " + q(d / "reference"));
  EXPECT_EQ(into_requantized.exit_code, 2) << into_requantized.err;
  EXPECT_TRUE(snapshot(d / "reference") == reference);
}

TEST_F(RequantizeSteps, CopyModesWriteTheSameBytes) {
  ASSERT_EQ(run_cli(requantize(d / "copied", "--copy copy")).exit_code, 0);
  ASSERT_EQ(run_cli(requantize(d / "auto", "--copy auto")).exit_code, 0);
  EXPECT_TRUE(snapshot(d / "copied") == reference);
  EXPECT_TRUE(snapshot(d / "auto") == reference);
  EXPECT_EQ(run_cli(requantize(d / "bad", "--copy share")).exit_code, 2);
}

TEST_F(RequantizeSteps, PlannedStepsGiveTheSingleProcessBytesAndVerifyAlike) {
  const fs::path dst = d / "planned";
  const CliResult planned = run_cli("plan --requantize " + q(d / "src") + " " + q(dst));
  ASSERT_EQ(planned.exit_code, 0) << planned.err;
  EXPECT_NE(read_file(dst / ".mx2nv/plan.json").find("\"kind\": \"requantize\""), std::string::npos);
  const std::string plan = q(dst / ".mx2nv/plan.json");
  for (const char* part : {"1/2", "0/2"}) {
    const CliResult r = run_cli("convert --plan " + plan + " --shards " + part);
    ASSERT_EQ(r.exit_code, 0) << part << ": " << r.err;
  }
  // A step given convert's options is refused: the plan has none.
  const CliResult windowed = run_cli("convert --plan " + plan + " --finalize --window marlin");
  EXPECT_EQ(windowed.exit_code, 2);
  EXPECT_NE(windowed.err.find("requantize plan"), std::string::npos) << windowed.err;
  const CliResult fin = run_cli("convert --plan " + plan + " --finalize");
  ASSERT_EQ(fin.exit_code, 0) << fin.err;
  EXPECT_TRUE(snapshot(dst) == reference);
  // Retries after the end are answered; convert's own plan options are refused with it.
  EXPECT_EQ(run_cli("convert --plan " + plan + " --finalize").exit_code, 0);
  EXPECT_EQ(run_cli("plan --requantize --window e4m3 " + q(d / "src") + " " + q(d / "other")).exit_code, 2);
  // verify judges the planned DST as it judges the one-process one.
  const CliResult a = run_cli("verify " + q(d / "src") + " " + q(d / "reference") + " --report " + q(d / "a.json"));
  const CliResult b = run_cli("verify " + q(d / "src") + " " + q(dst) + " --report " + q(d / "b.json"));
  EXPECT_EQ(a.exit_code, b.exit_code) << a.out << b.out;
  auto ja = nlohmann::json::parse(read_file(d / "a.json")), jb = nlohmann::json::parse(read_file(d / "b.json"));
  EXPECT_EQ(ja["result"], jb["result"]);
  EXPECT_EQ(ja["counts"], jb["counts"]);
  EXPECT_EQ(ja["differences"], jb["differences"]);
}

TEST_F(RequantizeSteps, AConversionPlanIsNotARequantizePlan) {
  // A conversion planned into a DST: requantize leaves it to its steps.
  ASSERT_EQ(run_cli("plan " + q(d / "src") + " " + q(d / "conv")).exit_code, 0);
  EXPECT_EQ(run_cli(requantize(d / "conv", "--resume")).exit_code, 2);
  // And a requantize plan does not take another kind of DST's shards.
  ASSERT_EQ(run_cli("plan --requantize " + q(d / "src") + " " + q(d / "rq")).exit_code, 0);
  EXPECT_EQ(run_cli("plan " + q(d / "src") + " " + q(d / "rq")).exit_code, 2);
}

}  // namespace
}  // namespace mx2nv::e2e

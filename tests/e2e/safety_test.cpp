// Crash safety: SIGKILL at many points then --resume gives the uninterrupted
// bytes; SIGINT cleans up; a second converter is locked out, a stale lock is
// taken over; a full disk is an I/O error with nothing complete-looking left.
#include "e2e_support.hpp"
#include "fixture/fixture.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace mx2nv::e2e {
namespace {

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

// The tree without an unfinished run's lock and records (a finished DST keeps
// only .mx2nv/finished.json, which is part of the deterministic output).
std::map<std::string, std::string> output_files(const fs::path& dir) {
  auto all = snapshot(dir);
  std::erase_if(all, [](const auto& kv) { return kv.first == ".mx2nv/lock" || kv.first.starts_with(".mx2nv/state/"); });
  return all;
}

// The data a reader sees: every file but mx2nv's own state. A kill between
// the index commit and the tidy leaves state that a retry removes.
std::map<std::string, std::string> data_files(const fs::path& dir) {
  auto all = snapshot(dir);
  std::erase_if(all, [](const auto& kv) { return kv.first.starts_with(".mx2nv/"); });
  return all;
}

// The names that differ between two trees, so a failure prints a short list
// rather than every byte of both.
std::string differing(const std::map<std::string, std::string>& a, const std::map<std::string, std::string>& b) {
  std::string out;
  for (const auto& [name, bytes] : a) {
    const auto it = b.find(name);
    if (it == b.end()) out += " only-left:" + name;
    else if (it->second != bytes) out += " differs:" + name;
  }
  for (const auto& kv : b) {
    if (!a.count(kv.first)) out += " only-right:" + kv.first;
  }
  return out;
}

// A finished conversion's state directory holds its record and nothing else.
bool finished_cleanly(const fs::path& dst) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dst / ".mx2nv")) names.push_back(e.path().filename().string());
  return names == std::vector<std::string>{"finished.json"};
}

bool has_temporaries(const fs::path& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.path().filename().string().starts_with(".mx2nv-tmp.")) return true;
  }
  return false;
}

FixtureSpec sizable() {
  FixtureSpec s;
  s.layers = 4;
  s.experts = 8;
  s.hidden = 1024;
  s.intermediate = 512;
  s.shards = 8;
  return s;
}

TEST(Safety, SigkillAnywhereThenResumeGivesTheSameBytes) {
  ScratchDir d;
  write_fixture(d / "src", sizable());
  ASSERT_EQ(run_cli("convert " + q(d / "src") + " " + q(d / "ref")).exit_code, 0);
  const auto reference = output_files(d / "ref");

  int interrupted = 0, partial_states = 0;
  for (int delay_ms = 0; delay_ms <= 240; delay_ms += 12) {
    const fs::path dst = d / ("k" + std::to_string(delay_ms));
    const pid_t pid = spawn_cli({"convert", "--threads", "2", (d / "src").string(), dst.string()});
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    kill(pid, SIGKILL);
    const int rc = wait_exit(pid);
    if (rc == -SIGKILL) ++interrupted;
    const bool finished = fs::exists(dst / "model.safetensors.index.json");
    if (finished) {
      // Never complete-looking unless complete: an index means every byte is
      // final, and a retry is a cheap no-op.
      EXPECT_EQ(differing(data_files(dst), data_files(d / "ref")), "") << "delay " << delay_ms;
      const CliResult again = run_cli("convert --resume " + q(d / "src") + " " + q(dst));
      EXPECT_EQ(again.exit_code, 0) << again.err;
      EXPECT_NE(again.out.find("already complete"), std::string::npos) << again.out;
    } else if (fs::exists(dst)) {
      const auto now = output_files(dst);
      if (now.count("model.safetensors.index.json")) {
        EXPECT_EQ(differing(data_files(dst), data_files(d / "ref")), "") << "delay " << delay_ms;
      } else if (!now.empty()) {
        ++partial_states;
      }
      const CliResult resumed = run_cli("convert --resume " + q(d / "src") + " " + q(dst));
      ASSERT_EQ(resumed.exit_code, 0) << "delay " << delay_ms << ": " << resumed.err;
    } else {
      ASSERT_EQ(run_cli("convert --resume " + q(d / "src") + " " + q(dst)).exit_code, 0);
    }
    EXPECT_EQ(differing(output_files(dst), reference), "") << "delay " << delay_ms;
    EXPECT_FALSE(has_temporaries(dst));
  }
  EXPECT_GE(interrupted, 2);     // the kills really landed mid-run
  EXPECT_GE(partial_states, 1);  // and some left finished shards to reuse
}

TEST(Safety, ResumeReusesMatchingShardsAndRedoesChangedOnes) {
  ScratchDir d;
  write_fixture(d / "src", sizable());
  ASSERT_EQ(run_cli("convert " + q(d / "src") + " " + q(d / "ref")).exit_code, 0);
  // Simulate an interruption after all shards: drop the index and config.
  const pid_t pid = spawn_cli({"convert", (d / "src").string(), (d / "dst").string()});
  wait_exit(pid);
  // Resuming a complete DST is a no-op that exits 0; to get a partial state,
  // interrupt at a known point below.
  EXPECT_EQ(run_cli("convert --resume " + q(d / "src") + " " + q(d / "dst")).exit_code, 0);

  // Kill late enough that some shards are done, then damage one finished shard.
  fs::remove_all(d / "dst");
  for (int delay = 10; delay < 3000; delay += 10) {
    fs::remove_all(d / "dst");
    const pid_t p = spawn_cli({"convert", "--threads", "1", (d / "src").string(), (d / "dst").string()});
    std::this_thread::sleep_for(std::chrono::milliseconds(delay));
    kill(p, SIGKILL);
    wait_exit(p);
    if (fs::exists(d / "dst/model-00001-of-00008.safetensors") && !fs::exists(d / "dst/model.safetensors.index.json")) break;
  }
  ASSERT_TRUE(fs::exists(d / "dst/model-00001-of-00008.safetensors"));
  ASSERT_FALSE(fs::exists(d / "dst/model.safetensors.index.json"));
  std::string shard = read_file(d / "dst/model-00001-of-00008.safetensors");
  shard[shard.size() / 2] ^= 0x01;
  write_file(d / "dst/model-00001-of-00008.safetensors", shard);  // checksum no longer matches

  const CliResult r = run_cli("convert --resume " + q(d / "src") + " " + q(d / "dst") + " --report " + q(d / "r.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(differing(output_files(d / "dst"), output_files(d / "ref")), "");
  EXPECT_NE(r.out.find("resumed"), std::string::npos);
}

TEST(Safety, SigintRemovesTemporariesAndExitsWithIoError) {
  ScratchDir d;
  FixtureSpec spec = sizable();
  spec.shards = 2;
  write_fixture(d / "src", spec);
  ASSERT_EQ(run_cli("convert " + q(d / "src") + " " + q(d / "ref")).exit_code, 0);
  int stopped = 0;
  // Later delays only while no run was stopped yet: on a loaded machine the
  // first ones may all land before the handler is installed.
  for (int delay = 5; delay <= 120 || (stopped == 0 && delay <= 3000); delay += delay < 120 ? 15 : 250) {
    const fs::path dst = d / ("i" + std::to_string(delay));
    const pid_t pid = spawn_cli({"convert", "--threads", "1", (d / "src").string(), dst.string()});
    std::this_thread::sleep_for(std::chrono::milliseconds(delay));
    kill(pid, SIGINT);
    const int rc = wait_exit(pid);
    // 4: stopped by our handler; -SIGINT: the signal beat the handler's installation
    // at process start, before anything was written.
    EXPECT_TRUE(rc == 0 || rc == 4 || rc == -SIGINT) << rc;
    if (rc == 4) ++stopped;
    if (rc != 0) {
      if (fs::exists(dst)) {
        EXPECT_FALSE(has_temporaries(dst));
        // A signal after the commit point exits 4 over a finished DST: then it must be complete and exact.
        if (fs::exists(dst / "model.safetensors.index.json")) {
          EXPECT_EQ(run_cli("verify " + q(d / "src") + " " + q(dst)).exit_code, 0);
        }
      }
      ASSERT_EQ(run_cli("convert --resume " + q(d / "src") + " " + q(dst)).exit_code, 0);
    }
    EXPECT_EQ(differing(output_files(dst), output_files(d / "ref")), "");
  }
  EXPECT_GT(stopped, 0);
}

TEST(Safety, SecondConverterIsLockedOutAndStaleLocksAreTakenOver) {
  ScratchDir d;
  write_fixture(d / "src", tiny_spec());
  fs::create_directories(d / "dst/.mx2nv");
  // A live holder: this process.
  const int fd = ::open((d / "dst/.mx2nv/lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  ASSERT_EQ(::write(fd, "4242", 4), 4);
  const CliResult locked = run_cli("convert --resume " + q(d / "src") + " " + q(d / "dst"));
  EXPECT_EQ(locked.exit_code, 2);
  EXPECT_NE(locked.err.find("another mx2nv (pid 4242)"), std::string::npos) << locked.err;
  // The holder dies: its lock file stays, but the lock is gone with it.
  ::close(fd);
  const CliResult resumed = run_cli("convert --resume " + q(d / "src") + " " + q(d / "dst"));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_TRUE(finished_cleanly(d / "dst"));
  EXPECT_EQ(run_cli("verify " + q(d / "src") + " " + q(d / "dst")).exit_code, 0);
}

TEST(Safety, FullDiskIsAnIoErrorAndLeavesNothingCompleteLooking) {
  ScratchDir d;
  write_fixture(d / "src", sizable());
  // RLIMIT_FSIZE makes writes past 2 MiB fail (EFBIG) like a full disk.
  const std::string cmd = "bash -c \"trap '' XFSZ; ulimit -f 2048; exec " + std::string(MX2NV_EXE) + " convert " +
                          q(d / "src") + " " + q(d / "dst") + " >" + q(d / "out") + " 2>" + q(d / "err") + "\"";
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 4);
  const std::string err = read_file(d / "err");
  EXPECT_NE(err.find((d / "dst").string()), std::string::npos) << err;
  EXPECT_NE(err.find("I/O error"), std::string::npos) << err;
  if (fs::exists(d / "dst")) {
    EXPECT_FALSE(has_temporaries(d / "dst"));
    EXPECT_FALSE(fs::exists(d / "dst/model.safetensors.index.json"));
  }
}

TEST(Safety, TwoConvertersRacingForOneDestinationLeaveOneCorrectOutput) {
  ScratchDir d;
  FixtureSpec spec = sizable();
  spec.shards = 3;
  write_fixture(d / "src", spec);
  ASSERT_EQ(run_cli("convert " + q(d / "src") + " " + q(d / "ref")).exit_code, 0);
  for (int i = 0; i < 8; ++i) {
    const fs::path dst = d / ("race" + std::to_string(i));
    const pid_t a = spawn_cli({"convert", (d / "src").string(), dst.string()});
    const pid_t b = spawn_cli({"convert", (d / "src").string(), dst.string()});
    const int ra = wait_exit(a), rb = wait_exit(b);
    EXPECT_TRUE((ra == 0 && rb == 2) || (ra == 2 && rb == 0)) << ra << " " << rb;
    EXPECT_EQ(differing(output_files(dst), output_files(d / "ref")), "") << i;
    EXPECT_TRUE(finished_cleanly(dst)) << i;
  }
}

TEST(Safety, ResumeRefusesADestinationHoldingForeignFiles) {
  ScratchDir d;
  write_fixture(d / "src", tiny_spec());
  fs::create_directories(d / "dst/.mx2nv");
  write_file(d / "dst/someone-elses-shard.safetensors", "x");
  const CliResult r = run_cli("convert --resume " + q(d / "src") + " " + q(d / "dst"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("someone-elses-shard.safetensors"), std::string::npos) << r.err;
  EXPECT_EQ(read_file(d / "dst/someone-elses-shard.safetensors"), "x");
  EXPECT_TRUE(fs::exists(d / "dst/.mx2nv"));  // an earlier run's state is not ours to delete
}

// A small tmpfs, where the machine lets the tests mount one (root); skipped otherwise.
class SmallFilesystem {
 public:
  SmallFilesystem(const fs::path& at, const std::string& options) : at_(at) {
    fs::create_directories(at);
    mounted_ = std::system(("mount -t tmpfs -o " + options + " tmpfs '" + at.string() + "' 2>/dev/null").c_str()) == 0;
  }
  ~SmallFilesystem() {
    if (mounted_) (void)std::system(("umount '" + at_.string() + "'").c_str());
  }
  bool mounted() const { return mounted_; }

 private:
  fs::path at_;
  bool mounted_ = false;
};

TEST(Safety, RealDiskFullIsAnIoErrorNamingThePath) {
  ScratchDir d;
  write_fixture(d / "src", sizable());
  SmallFilesystem small(d / "small", "size=4m");
  if (!small.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here";
  const CliResult r = run_cli("convert " + q(d / "src") + " " + q(d / "small/dst"));
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find((d / "small/dst").string()), std::string::npos) << r.err;
  if (fs::exists(d / "small/dst")) {
    EXPECT_FALSE(has_temporaries(d / "small/dst"));
    EXPECT_FALSE(fs::exists(d / "small/dst/model.safetensors.index.json"));
  }
}

TEST(Safety, ReadOnlyDestinationIsAnIoError) {
  ScratchDir d;
  write_fixture(d / "src", tiny_spec());
  SmallFilesystem ro(d / "ro", "ro,size=1m");
  if (!ro.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here";
  const CliResult r = run_cli("convert " + q(d / "src") + " " + q(d / "ro/dst"));
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_NE(r.err.find("Read-only file system"), std::string::npos) << r.err;
}

TEST(Safety, UnwritableDestinationIsAnIoError) {
  ScratchDir d;
  write_fixture(d / "src", tiny_spec());
  const CliResult r = run_cli("convert " + q(d / "src") + " /proc/mx2nv-cannot-exist/dst");
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_NE(r.err.find("/proc/mx2nv-cannot-exist"), std::string::npos);
}

TEST(Safety, SourceIsNeverModified) {
  ScratchDir d;
  write_fixture(d / "src", sizable());
  const auto before = snapshot(d / "src");
  ASSERT_EQ(run_cli("convert " + q(d / "src") + " " + q(d / "dst")).exit_code, 0);
  ASSERT_EQ(run_cli("verify " + q(d / "src") + " " + q(d / "dst")).exit_code, 0);
  EXPECT_TRUE(snapshot(d / "src") == before);
}

}  // namespace
}  // namespace mx2nv::e2e

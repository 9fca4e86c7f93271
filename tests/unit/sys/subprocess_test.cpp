// Running another program is bounded in every way (sys/subprocess.hpp), and
// gate's runtime asking turns every way it can fail into a "could not ask"
// opinion (gate/ask.hpp). Programs here are /bin/sh one-liners and
// small scripts standing in for an interpreter.
#include "gate/ask.hpp"
#include "sys/subprocess.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace mx2nv {
namespace {

namespace fs = std::filesystem;
using End = SubprocessResult::End;
using std::chrono::milliseconds;

SubprocessLimits quick(milliseconds timeout = milliseconds(20'000)) {
  SubprocessLimits l;
  l.timeout = timeout;
  return l;
}

SubprocessResult sh(const std::string& script, std::string_view input = {}, const SubprocessLimits& l = quick()) {
  return run_subprocess({"/bin/sh", "-c", script}, input, l);
}

TEST(Subprocess, StdinInStdoutOutExitCodeKept) {
  // 4 MiB through cat: more than any pipe buffer both ways, so writing and
  // reading must interleave.
  std::string big(4u << 20, 'a');
  for (std::size_t i = 0; i < big.size(); i += 4096) big[i] = static_cast<char>('a' + i % 26);
  SubprocessLimits l = quick();
  l.max_stdout = 8u << 20;
  const auto r = sh("cat; echo oops >&2; exit 3", big, l);
  EXPECT_EQ(r.end, End::Exited);
  EXPECT_EQ(r.status, 3);
  EXPECT_EQ(r.out, big);
  EXPECT_EQ(r.err_tail, "oops\n");
}

TEST(Subprocess, AMissingProgramIsReportedNotThrown) {
  const auto r = run_subprocess({"/nonexistent/python3"}, "x", quick());
  EXPECT_EQ(r.end, End::NotStarted);
  EXPECT_NE(r.start_error.find("No such file"), std::string::npos) << r.start_error;
  const auto p = run_subprocess({"mx2nv-no-such-interpreter-on-path"}, "", quick());
  EXPECT_EQ(p.end, End::NotStarted);
  EXPECT_NE(describe_end(p, quick()).find("could not be started"), std::string::npos);
}

TEST(Subprocess, AHangIsKilledAtTheTimeoutWithItsChildren) {
  const auto start = std::chrono::steady_clock::now();
  // The shell's child keeps stdout open after the shell is killed unless the
  // whole group goes.
  const auto r = sh("sleep 30 & sleep 30", {}, quick(milliseconds(300)));
  EXPECT_EQ(r.end, End::TimedOut);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_NE(describe_end(r, quick(milliseconds(300))).find("0.3 s"), std::string::npos);
}

TEST(Subprocess, EndlessOutputStopsAtTheCap) {
  SubprocessLimits l = quick();
  l.max_stdout = 100'000;
  const auto r = sh("yes", {}, l);
  EXPECT_EQ(r.end, End::OutputTooLarge);
  EXPECT_LE(r.out.size(), l.max_stdout);
}

TEST(Subprocess, OnlyTheTailOfStderrIsKept) {
  SubprocessLimits l = quick();
  l.max_stderr_tail = 1000;
  const auto r = sh("i=0; while [ $i -lt 5000 ]; do echo line$i >&2; i=$((i+1)); done; echo end >&2", {}, l);
  EXPECT_EQ(r.end, End::Exited);
  EXPECT_LE(r.err_tail.size(), 1000u);
  EXPECT_EQ(r.err_tail.substr(r.err_tail.size() - 4), "end\n");
}

TEST(Subprocess, AChildThatReadsNoStdinDoesNotKillUs) {
  // Writing to a child that exited raises SIGPIPE unless avoided.
  const auto r = sh("exec 0<&-; echo done", std::string(8u << 20, 'x'));
  EXPECT_EQ(r.end, End::Exited);
  EXPECT_EQ(r.out, "done\n");
}

TEST(Subprocess, ASignalIsReported) {
  const auto r = sh("kill -9 $$");
  EXPECT_EQ(r.end, End::Signaled);
  EXPECT_EQ(r.status, 9);
}

TEST(Subprocess, TheEnvironmentIsPassedUnchanged) {
  ::setenv("MX2NV_SUBPROCESS_TEST", "kept", 1);
  const auto r = sh("printf %s \"$MX2NV_SUBPROCESS_TEST\"");
  ::unsetenv("MX2NV_SUBPROCESS_TEST");
  EXPECT_EQ(r.out, "kept");
}

// An executable script standing in for the interpreter: it ignores its
// arguments (the probe) and answers `body`.
class FakeInterpreter {
 public:
  explicit FakeInterpreter(const std::string& body) {
    std::string tmpl = (fs::temp_directory_path() / "mx2nv-fake-python-XXXXXX").string();
    const int fd = ::mkstemp(tmpl.data());
    ::close(fd);
    path_ = tmpl;
    std::ofstream(path_) << "#!/bin/sh\n" << body << "\n";
    ::chmod(path_.c_str(), 0700);
  }
  ~FakeInterpreter() { fs::remove(path_); }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

AskResult ask(const std::string& python, std::chrono::seconds timeout = std::chrono::seconds(60)) {
  AskOptions o;
  o.python = python;
  o.timeout = timeout;
  return ask_runtimes(o, Json{{"quant_method", "compressed-tensors"}}, "model.layers.0.mlp.experts",
                      {"gate_proj", "up_proj", "down_proj"}, {Runtime::Vllm, Runtime::Sglang});
}

void expect_could_not_ask(const AskResult& r, const std::string& fragment) {
  ASSERT_EQ(r.opinions.size(), 2u);
  for (const auto& o : r.opinions) {
    EXPECT_EQ(o.answer, RuntimeOpinion::Answer::CouldNotAsk);
    EXPECT_NE(o.reason.find(fragment), std::string::npos) << o.reason;
  }
}

TEST(RuntimeAsk, NoInterpreterIsCouldNotAsk) {
  const AskResult r = ask("/nonexistent/bin/python3");
  EXPECT_FALSE(r.ran);
  expect_could_not_ask(r, "could not be started");
}

TEST(RuntimeAsk, GarbageCrashesAndHangsAreCouldNotAsk) {
  expect_could_not_ask(ask(FakeInterpreter("echo 'Hello from a Python 2 banner'").path()), "protocol");
  expect_could_not_ask(ask(FakeInterpreter("echo 'SyntaxError: invalid syntax' >&2; exit 1").path()),
                       "exited with status 1 (SyntaxError: invalid syntax)");
  expect_could_not_ask(ask(FakeInterpreter("sleep 30").path(), std::chrono::seconds(1)), "killed");
  expect_could_not_ask(ask(FakeInterpreter("yes '{}'").path()), "more than");
  expect_could_not_ask(ask(FakeInterpreter("kill -SEGV $$").path()), "signal 11");
}

TEST(RuntimeAsk, TheRequestAndTheProbeReachTheInterpreter) {
  // The fake echoes back what it got as a runtime's "reason": the probe text
  // as -c's argument, then --request -, and the request on stdin.
  const FakeInterpreter echo(R"sh(req=$(cat); first=$(printf %s "$2" | head -c 40 | tr -d '\n"\\')
printf '{"probe": 1, "python": "fake", "runtimes": [{"runtime": "vllm", "version": "", "outcome": "could-not-ask", "reason": "%s|%s|%s|%s"}]}' "$1" "$first" "$3 $4" "$(printf %s "$req" | head -c 60 | tr -d '"\\')")sh");
  const AskResult r = ask(echo.path());
  EXPECT_TRUE(r.ran);
  EXPECT_EQ(r.python_version, "fake");
  ASSERT_EQ(r.opinions.size(), 2u);
  EXPECT_EQ(r.opinions[0].reason.substr(0, 3), "-c|");
  EXPECT_NE(r.opinions[0].reason.find("Ask the installed runtimes"), std::string::npos) << r.opinions[0].reason;
  EXPECT_NE(r.opinions[0].reason.find("|--request -|"), std::string::npos);
  EXPECT_NE(r.opinions[0].reason.find("layer:model.layers.0.mlp.experts"), std::string::npos) << r.opinions[0].reason;
  EXPECT_EQ(r.opinions[1].reason, "the probe's answer has no entry for it");
}

TEST(RuntimeAsk, TheEmbeddedProbeIsTheShippedFile) {
  std::ifstream f(fs::path(MX2NV_SOURCE_DIR) / "python/mx2nv/runtime_probe.py", std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(runtime_probe_source(), file);
}

}  // namespace
}  // namespace mx2nv

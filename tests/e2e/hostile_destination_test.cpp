// What a hostile user can point mx2nv at: report paths inside SRC or DST,
// special files, symlinks planted in DST to redirect writes, finished DSTs
// retried by schedulers, paths that are not UTF-8, bad generate arguments.
// Each case: the documented exit code and message, SRC unchanged, nothing
// written outside DST, and no "internal error".
#include "e2e_support.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <thread>

namespace mx2nv::e2e {
namespace {

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

class Hostile : public ::testing::Test {
 protected:
  void SetUp() override {
    FixtureSpec spec = tiny_spec();
    spec.shards = 2;
    write_fixture(d / "src", spec);
    before_ = snapshot(d / "src");
  }
  void TearDown() override { EXPECT_TRUE(snapshot(d / "src") == before_) << "SRC was modified"; }
  CliResult cli(const std::string& args) {
    CliResult r = run_cli(args);
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
    return r;
  }
  ScratchDir d;

 private:
  std::map<std::string, std::string> before_;
};

// --- --report ---------------------------------------------------------------

TEST_F(Hostile, ReportInsideSrcOrDstIsRefusedBeforeAnyWork) {
  fs::create_directories(d / "elsewhere");
  fs::create_directory_symlink(d / "src", d / "elsewhere/link-to-src");
  for (const std::string& report : {(d / "src/config.json").string(), (d / "src/new-report.json").string(),
                                   (d / "dst/config.json").string(), (d / "dst/report.json").string(),
                                   (d / "elsewhere/link-to-src/config.json").string()}) {
    const CliResult r = cli("convert " + q(d / "src") + " " + q(d / "dst") + " --report " + q(report));
    EXPECT_EQ(r.exit_code, 2) << report << ": " << r.err;
    EXPECT_NE(r.err.find("never writes a report into SRC or DST"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(d / "dst")) << report;
  }
  // verify too.
  ASSERT_EQ(cli("convert " + q(d / "src") + " " + q(d / "dst")).exit_code, 0);
  const auto dst_before = snapshot(d / "dst");
  EXPECT_EQ(cli("verify " + q(d / "src") + " " + q(d / "dst") + " --report " + q(d / "dst/config.json")).exit_code, 2);
  EXPECT_TRUE(snapshot(d / "dst") == dst_before);
}

TEST_F(Hostile, ReportToADirectoryOrAMissingFolderIsAUsageErrorBeforeAnyWork) {
  fs::create_directories(d / "reports");
  CliResult r = cli("convert " + q(d / "src") + " " + q(d / "dst") + " --report " + q(d / "reports"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("is a directory"), std::string::npos) << r.err;
  r = cli("convert " + q(d / "src") + " " + q(d / "dst") + " --report " + q(d / "missing/r.json"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("does not exist"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(d / "dst"));
}

TEST_F(Hostile, ReportThroughSpecialFilesAndSymlinks) {
  // /dev/null stays the device.
  ASSERT_EQ(cli("convert " + q(d / "src") + " " + q(d / "a") + " --report /dev/null").exit_code, 0);
  struct stat st {};
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  // /dev/stdout: the summary, then the report, both on stdout.
  const CliResult out = cli("convert " + q(d / "src") + " " + q(d / "b") + " --report /dev/stdout");
  ASSERT_EQ(out.exit_code, 0) << out.err;
  const auto brace = out.out.find("\n{");
  ASSERT_NE(brace, std::string::npos) << out.out;
  EXPECT_EQ(nlohmann::json::parse(out.out.substr(brace + 1))["result"], "ok");
  // A FIFO is written through, not replaced.
  const fs::path fifo = d / "report.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  std::string received;
  std::thread reader([&] { received = read_file(fifo); });
  const CliResult f = cli("convert " + q(d / "src") + " " + q(d / "c") + " --report " + q(fifo));
  reader.join();
  EXPECT_EQ(f.exit_code, 0) << f.err;
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_EQ(nlohmann::json::parse(received)["command"], "convert");
  // A symlink to a regular file: the file is replaced, the link stays.
  write_file(d / "real.json", "old");
  fs::create_symlink(d / "real.json", d / "link.json");
  ASSERT_EQ(cli("convert " + q(d / "src") + " " + q(d / "e") + " --report " + q(d / "link.json")).exit_code, 0);
  EXPECT_TRUE(fs::is_symlink(d / "link.json"));
  EXPECT_EQ(nlohmann::json::parse(read_file(d / "real.json"))["result"], "ok");
}

// What a path is decides, not how it is spelled (issue 20, second round):
// /proc/self/root/..., a descriptor opened onto a file of SRC (/dev/fd/N),
// ".." after a symlinked folder, a dangling link into SRC, a hard link to
// SRC's file all lead into SRC and are refused before any work, by every
// command that writes an output.
TEST_F(Hostile, OutputsAreJudgedByWhatTheyAreNotHowTheyAreSpelled) {
  ASSERT_EQ(cli("convert " + q(d / "src") + " " + q(d / "ref")).exit_code, 0);
  const auto ref_before = snapshot(d / "ref");
  fs::create_directories(d / "src/sub");
  fs::create_directories(d / "l");
  fs::create_directory_symlink(d / "src/sub", d / "l/sub");
  fs::create_symlink(d / "src/new.json", d / "l/dangling");
  fs::create_hard_link(d / "src/config.json", d / "l/hard");
  const std::vector<std::string> targets = {
      "/proc/self/root" + (d / "src/config.json").string(), "/proc/self/root" + (d / "src/new.json").string(),
      (d / "l/sub/../config.json").string(),                 (d / "l/dangling").string(),
      (d / "l/hard").string(),                               "/dev/fd/7 7>>" + q(d / "src/tokenizer_config.json")};
  for (const std::string& target : targets) {
    for (const std::string& cmd : {"convert " + q(d / "src") + " " + q(d / "dst") + " --report ",
                                   "convert " + q(d / "src") + " " + q(d / "dst") + " --html ",
                                   "verify " + q(d / "src") + " " + q(d / "ref") + " --report ",
                                   "plan " + q(d / "src") + " " + q(d / "dst") + " --plan-out ",
                                   "inspect " + q(d / "src") + " --html "}) {
      const std::string quoted = target.starts_with("/dev/fd/") ? target : q(target);
      const CliResult r = cli(cmd + quoted);
      EXPECT_EQ(r.exit_code, 2) << cmd << target << ": " << r.err;
      EXPECT_FALSE(fs::exists(d / "dst")) << cmd << target;
    }
  }
  // verify's DST, likewise.
  for (const std::string& target : {"/proc/self/root" + (d / "ref/new.json").string(),
                                    "/dev/fd/7 7>>" + q(d / "ref/config.json")}) {
    const std::string quoted = target.starts_with("/dev/fd/") ? target : q(target);
    EXPECT_EQ(cli("verify " + q(d / "src") + " " + q(d / "ref") + " --report " + quoted).exit_code, 2) << target;
  }
  EXPECT_TRUE(snapshot(d / "ref") == ref_before);
  fs::remove_all(d / "src/sub");
}

// A FIFO nothing reads would block the open for writing forever: refused
// before any work (with a reader, it is written through, above).
TEST_F(Hostile, AFifoNobodyReadsIsRefusedBeforeAnyWork) {
  const fs::path fifo = d / "ff";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  for (const std::string& cmd : {"convert " + q(d / "src") + " " + q(d / "dst") + " --report " + q(fifo),
                                 "inspect " + q(d / "src") + " --html " + q(fifo)}) {
    const CliResult r = cli(cmd);
    EXPECT_EQ(r.exit_code, 2) << cmd << r.err;
    EXPECT_NE(r.err.find("nothing reads it"), std::string::npos) << r.err;
  }
  EXPECT_FALSE(fs::exists(d / "dst"));
}

TEST_F(Hostile, ErrorReportIsTheSuccessReportWithResultError) {
  fs::create_directories(d / "dst");
  write_file(d / "dst/occupied", "x");
  const CliResult r = cli("convert " + q(d / "src") + " " + q(d / "dst") + " --report " + q(d / "r.json"));
  ASSERT_EQ(r.exit_code, 2);
  const auto j = nlohmann::json::parse(read_file(d / "r.json"));
  EXPECT_EQ(j["result"], "error");
  EXPECT_EQ(j["error_kind"], "usage");
  EXPECT_EQ(j["exit_code"], 2);
  EXPECT_EQ(j["provenance"]["source"], fs::absolute(d / "src").lexically_normal().string());
  EXPECT_TRUE(j.contains("counts"));
}

// --- symlinks and special files inside DST ----------------------------------

TEST_F(Hostile, SymlinksPlantedInDstNeverRedirectWrites) {
  write_file(d / "victim", "precious");
  struct Case {
    std::string name;
    std::function<void(const fs::path&)> plant;
  };
  const std::vector<Case> cases = {
      {"lock", [&](const fs::path& dst) {
         fs::create_directories(dst / ".mx2nv");
         fs::create_symlink(d / "victim", dst / ".mx2nv/lock");
       }},
      {"state", [&](const fs::path& dst) {
         fs::create_directories(dst / ".mx2nv");
         fs::create_directories(d / "outside-state");
         fs::create_directory_symlink(d / "outside-state", dst / ".mx2nv/state");
       }},
      {"state-dir", [&](const fs::path& dst) {
         fs::create_directories(dst);
         fs::create_directories(d / "outside-root");
         fs::create_directory_symlink(d / "outside-root", dst / ".mx2nv");
       }},
      {"shard", [&](const fs::path& dst) {
         fs::create_directories(dst / ".mx2nv");
         fs::create_symlink(d / "src/model-00001-of-00002.safetensors", dst / "model-00001-of-00002.safetensors");
       }},
      {"subdir-into-src", [&](const fs::path& dst) {
         fs::create_directories(dst / ".mx2nv");
         fs::create_directory_symlink(d / "src", dst / "tokenizer");
       }},
      {"fifo", [&](const fs::path& dst) {
         fs::create_directories(dst / ".mx2nv");
         ASSERT_EQ(::mkfifo((dst / "config.json").c_str(), 0644), 0);
       }},
  };
  for (const auto& c : cases) {
    const fs::path dst = d / ("dst-" + c.name);
    c.plant(dst);
    for (const char* flags : {"", "--resume "}) {
      const CliResult r = cli(std::string("convert ") + flags + q(d / "src") + " " + q(dst));
      EXPECT_EQ(r.exit_code, 2) << c.name << " " << flags << r.err;
    }
    EXPECT_EQ(read_file(d / "victim"), "precious") << c.name;
    if (fs::exists(d / "outside-state")) {
      EXPECT_TRUE(fs::is_empty(d / "outside-state")) << c.name;
    }
    if (fs::exists(d / "outside-root")) {
      EXPECT_TRUE(fs::is_empty(d / "outside-root")) << c.name;
    }
  }
}

// --- retries ----------------------------------------------------------------

TEST_F(Hostile, ResumeOfAFinishedConversionIsANoOp) {
  ASSERT_EQ(cli("convert " + q(d / "src") + " " + q(d / "dst")).exit_code, 0);
  const auto before = snapshot(d / "dst");
  const auto index_mtime = fs::last_write_time(d / "dst/model.safetensors.index.json");
  for (int i = 0; i < 2; ++i) {
    const CliResult r = cli("convert --resume " + q(d / "src") + " " + q(d / "dst") + " --report " + q(d / "r.json"));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("already complete"), std::string::npos) << r.out;
    EXPECT_TRUE(nlohmann::json::parse(read_file(d / "r.json"))["already_complete"].get<bool>());
  }
  EXPECT_TRUE(snapshot(d / "dst") == before);
  EXPECT_EQ(fs::last_write_time(d / "dst/model.safetensors.index.json"), index_mtime);
  // Without --resume a finished DST is still "not empty".
  EXPECT_EQ(cli("convert " + q(d / "src") + " " + q(d / "dst")).exit_code, 2);
}

TEST_F(Hostile, ResumeOfAFinishedConversionOfSomethingElseIsRefused) {
  ASSERT_EQ(cli("convert " + q(d / "src") + " " + q(d / "dst")).exit_code, 0);
  // Another window: another plan.
  CliResult r = cli("convert --resume --window e4m3 " + q(d / "src") + " " + q(d / "dst"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("window marlin"), std::string::npos) << r.err;
  // Another source.
  FixtureSpec other = tiny_spec();
  other.shards = 2;
  other.seed = 99;
  write_fixture(d / "other", other);
  r = cli("convert --resume " + q(d / "other") + " " + q(d / "dst"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("not of this SRC"), std::string::npos) << r.err;
  // DST tampered with.
  const auto shard = d / "dst/model-00002-of-00002.safetensors";
  write_file(shard, read_file(shard) + "x");
  r = cli("convert --resume " + q(d / "src") + " " + q(d / "dst"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("model-00002-of-00002.safetensors changed"), std::string::npos) << r.err;
  // A finished DST whose record is unreadable is not guessed at.
  write_file(shard, read_file(shard).substr(0, read_file(shard).size() - 1));
  write_file(d / "dst/.mx2nv/finished.json", "{");
  EXPECT_EQ(cli("convert --resume " + q(d / "src") + " " + q(d / "dst")).exit_code, 2);
}

// --- paths that are not UTF-8 -----------------------------------------------

TEST_F(Hostile, PathsThatAreNotUtf8GiveValidJson) {
  const std::string bad = "bad\xff\xfe";
  fs::rename(d / "src", d / bad);
  fs::create_directories(d / bad / ("sub" + std::string("\xc3")));
  write_file(d / bad / ("sub" + std::string("\xc3")) / "notes.txt", "hi");
  const fs::path dst = d / ("out" + bad);
  CliResult r = cli("convert " + q(d / bad) + " " + q(dst) + " --report " + q(d / "c.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto c = nlohmann::json::parse(read_file(d / "c.json"));
  EXPECT_NE(c["provenance"]["source"].get<std::string>().find("bad\\xff\\xfe"), std::string::npos);
  r = cli("verify " + q(d / bad) + " " + q(dst) + " --report " + q(d / "v.json"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(read_file(d / "v.json"))["result"], "ok");
  r = cli("inspect --json " + q(d / bad));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(nlohmann::json::accept(r.out)) << r.out;
  EXPECT_EQ(cli("convert --resume " + q(d / bad) + " " + q(dst)).exit_code, 0);
  // A difference naming such a file is valid JSON too.
  fs::remove(dst / ("sub" + std::string("\xc3")) / "notes.txt");
  r = cli("verify " + q(d / bad) + " " + q(dst) + " --report " + q(d / "v2.json"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(nlohmann::json::parse(read_file(d / "v2.json"))["result"], "mismatch");
  fs::remove_all(d / bad / ("sub" + std::string("\xc3")));
  fs::rename(d / bad, d / "src");  // TearDown compares SRC
}

// --- generate and demo arguments --------------------------------------------

TEST_F(Hostile, GenerateAndDemoArgumentErrorsAreUsageErrors) {
  write_file(d / "a-file", "x");
  for (const std::string& args : {"generate " + q(d / "a-file"), "demo " + q(d / "a-file"),
                                 "generate " + q(d / "g") + " --set-span foo=abc",
                                 "generate " + q(d / "g") + " --set-span foo=", "generate " + q(d / "g") + " --set-span =3",
                                 "generate " + q(d / "g") + " --set-span foo=99999999999",
                                 "generate " + q(d / "g") + " --set-k-max foo=1x", "generate " + q(d / "src"),
                                 // names no module of the fixture it would write (misspelt, another layout's,
                                 // beyond its layers or experts, a leading zero)
                                 "generate " + q(d / "g") + " --set-k-max foo=3",
                                 "generate " + q(d / "g") + " --nan-scale model.layers.0.mlp.experts.0.gate_proj",
                                 "generate " + q(d / "g") + " --layers 2 --all-zero language_model.model.layers.2.block_sparse_moe.experts.0.w1",
                                 "generate " + q(d / "g") + " --experts 4 --set-span language_model.model.layers.0.block_sparse_moe.experts.4.w2=3",
                                 "generate " + q(d / "g") + " --set-span language_model.model.layers.0.block_sparse_moe.experts.01.w2=3",
                                 "generate " + q(d / "g") + " --set-span language_model.model.layers.0.block_sparse_moe.experts.0.w4=3",
                                 "convert --window nonsense " + q(d / "src") + " " + q(d / "x")}) {
    const CliResult r = cli(args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.err;
  }
  EXPECT_EQ(read_file(d / "a-file"), "x");
  EXPECT_FALSE(fs::exists(d / "x"));
  EXPECT_FALSE(fs::exists(d / "g"));
  // Names it does write are taken, in either layout.
  EXPECT_EQ(cli("generate " + q(d / "g") + " --layers 2 --experts 4 --nan-scale "
                "language_model.model.layers.1.block_sparse_moe.experts.3.w2")
                .exit_code,
            0);
  EXPECT_EQ(cli("generate " + q(d / "g2") + " --layout flat --set-k-max model.layers.0.mlp.experts.1.up_proj=2")
                .exit_code,
            0);
}

}  // namespace
}  // namespace mx2nv::e2e

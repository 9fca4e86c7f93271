// The command-line contract: exit codes, summaries, JSON reports.
#include "e2e_support.hpp"
#include "fixture/fixture.hpp"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <set>
#include <thread>

namespace mx2nv::e2e {
namespace {

using nlohmann::json;

// One shell word.
std::string q(const fs::path& p) {
  std::string out = "'";
  for (const char c : p.string()) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

TEST(Cli, HelpAndVersion) {
  const CliResult help = run_cli("--help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("convert"), std::string::npos);
  const CliResult version = run_cli("--version");
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_NE(version.out.find(MX2NV_VERSION), std::string::npos);
}

TEST(Cli, UsageErrorsExitTwo) {
  EXPECT_EQ(run_cli("frobnicate").exit_code, 2);
  EXPECT_EQ(run_cli("convert onlyone").exit_code, 2);
  EXPECT_EQ(run_cli("convert a b --window fp8").exit_code, 2);
  EXPECT_EQ(run_cli("convert a b --threads 0").exit_code, 2);
}

TEST(Cli, ConvertVerifyReportsAndExitCodes) {
  ScratchDir d;
  write_fixture(d / "src", tiny_spec());

  const CliResult c = run_cli("convert " + q(d / "src") + " " + q(d / "dst") + " --report " + q(d / "c.json"));
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_NE(c.out.find("ok"), std::string::npos);
  const json rc = json::parse(read_file(d / "c.json"));
  EXPECT_EQ(rc["result"], "ok");
  EXPECT_EQ(rc["window"], "marlin");
  for (const char* key : {"modules", "active_groups", "zero_groups", "canonicalised_zero_groups", "passthrough_tensors"}) {
    EXPECT_TRUE(rc["counts"].contains(key)) << key;
  }
  for (const char* key : {"source_tensor_bytes", "target_tensor_bytes", "size_change_percent", "values_compared",
                          "mismatches", "max_abs_error", "over_span", "provenance"}) {
    EXPECT_TRUE(rc.contains(key)) << key;
  }
  EXPECT_EQ(rc["provenance"]["tool_version"], MX2NV_VERSION);

  const CliResult v = run_cli("verify " + q(d / "src") + " " + q(d / "dst") + " --report " + q(d / "v.json"));
  EXPECT_EQ(v.exit_code, 0) << v.err;
  const json rv = json::parse(read_file(d / "v.json"));
  EXPECT_EQ(rv["result"], "ok");
  EXPECT_GT(rv["values_compared"].get<std::uint64_t>(), 0u);

  // DST now non-empty: usage.
  EXPECT_EQ(run_cli("convert " + q(d / "src") + " " + q(d / "dst")).exit_code, 2);

  // Damage one scale byte region of the output: verify exits 1 and names the tensor.
  const fs::path shard = d / "dst/model-00002-of-00003.safetensors";
  std::string bytes = read_file(shard);
  bytes[bytes.size() - 1] = static_cast<char>(bytes[bytes.size() - 1] ^ 0x40);
  write_file(shard, bytes);
  const CliResult bad = run_cli("verify " + q(d / "src") + " " + q(d / "dst") + " --report " + q(d / "bad.json"));
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("model-00002-of-00003.safetensors"), std::string::npos) << bad.err;
  EXPECT_EQ(json::parse(read_file(d / "bad.json"))["result"], "mismatch");
}

TEST(Cli, InspectPredictsRefusalAndConvertRefuses) {
  ScratchDir d;
  FixtureSpec spec = tiny_spec();
  spec.overrides[fixture_module_name(spec, 0, 0, 2)].span = 15;
  write_fixture(d / "src", spec);

  const CliResult in = run_cli("inspect " + q(d / "src") + " --json");
  EXPECT_EQ(in.exit_code, 1);
  const json j = json::parse(in.out);
  EXPECT_EQ(j["outcomes"]["marlin"]["result"], "refused");
  EXPECT_EQ(j["outcomes"]["e4m3"]["result"], "ok");
  EXPECT_EQ(j["max_span"], 15);
  EXPECT_EQ(run_cli("inspect " + q(d / "src") + " --window e4m3").exit_code, 0);

  const CliResult c = run_cli("convert " + q(d / "src") + " " + q(d / "dst") + " --report " + q(d / "r.json"));
  EXPECT_EQ(c.exit_code, 1);
  EXPECT_NE(c.out.find(fixture_module_name(spec, 0, 0, 2)), std::string::npos);
  EXPECT_EQ(json::parse(read_file(d / "r.json"))["result"], "refused");
  EXPECT_EQ(json::parse(read_file(d / "r.json"))["over_span"][0]["span"], 15);
  EXPECT_FALSE(fs::exists(d / "dst"));
}

TEST(Cli, InvalidInputExitsThree) {
  ScratchDir d;
  fs::create_directories(d / "src");
  write_file(d / "src/config.json", "{}");
  const CliResult r = run_cli("convert " + q(d / "src") + " " + q(d / "dst") + " --report " + q(d / "r.json"));
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(r.err.find("invalid input"), std::string::npos);
  EXPECT_EQ(json::parse(read_file(d / "r.json"))["result"], "error");
}

TEST(Cli, DemoRunsEndToEnd) {
  ScratchDir d;
  const CliResult r = run_cli("demo " + q(d / "demo"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("mx2nv verify: ok"), std::string::npos);
  // Re-running in the same demo directory works.
  EXPECT_EQ(run_cli("demo " + q(d / "demo")).exit_code, 0);
}


// ---- The conventions of the command line, for every command it lists ----

// The commands `mx2nv help` lists (CLI11's "Subcommands:" section).
std::vector<std::string> listed_commands() {
  const CliResult help = run_cli("help");
  EXPECT_EQ(help.exit_code, 0) << help.err;
  std::vector<std::string> names;
  const auto at = help.out.find("Subcommands:");
  EXPECT_NE(at, std::string::npos) << help.out;
  if (at == std::string::npos) return names;
  std::istringstream lines(help.out.substr(at));
  std::string line;
  std::getline(lines, line);
  while (std::getline(lines, line) && !line.empty() && line[0] == ' ') {
    std::istringstream words(line);
    std::string name;
    words >> name;
    if (name != "help") names.push_back(name);
  }
  return names;
}

struct HelpOption {
  std::string name;
  std::vector<std::string> choices;  // an enum option's {a,b,c}; empty otherwise
  std::string line;
};

// The long options a command's --help lists, with their choices.
std::vector<HelpOption> help_options(const std::string& help) {
  std::vector<HelpOption> out;
  std::istringstream lines(help);
  std::string line;
  const std::regex option(R"(^\s+(?:-\w,)?(--[a-z][a-z0-9-]*)(?:\s+\{([a-z0-9,-]+)\})?)");
  while (std::getline(lines, line)) {
    std::smatch m;
    if (!std::regex_search(line, m, option)) continue;
    HelpOption o{m[1], {}, line};
    std::string choices = m[2];
    for (std::size_t start = 0; !choices.empty() && start <= choices.size();) {
      const auto comma = choices.find(',', start);
      o.choices.push_back(choices.substr(start, comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    out.push_back(o);
  }
  return out;
}

TEST(Cli, BareMx2nvPrintsTheHelpAndExitsTwo) {
  const CliResult bare = run_cli("");
  EXPECT_EQ(bare.exit_code, 2);
  EXPECT_EQ(bare.out, "");
  EXPECT_NE(bare.err.find("Usage: mx2nv"), std::string::npos) << bare.err;
  EXPECT_NE(bare.err.find("convert"), std::string::npos) << bare.err;
  const CliResult help = run_cli("help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_EQ(help.out, run_cli("--help").out);
  EXPECT_EQ(help.out, bare.err);
}

TEST(Cli, UnknownCommandsAndTopLevelOptionsSuggestTheNearest) {
  for (const auto& name : listed_commands()) {
    // One letter changed in the middle: the nearest command is the one meant.
    std::string typo = name;
    typo[typo.size() / 2] = typo[typo.size() / 2] == 'x' ? 'y' : 'x';
    const CliResult r = run_cli(typo + " a b");
    EXPECT_EQ(r.exit_code, 2) << typo;
    EXPECT_NE(r.err.find("unknown command " + typo), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("did you mean " + name), std::string::npos) << typo << ": " << r.err;
    const CliResult h = run_cli("help " + typo);
    EXPECT_EQ(h.exit_code, 2) << typo;
    EXPECT_NE(h.err.find("did you mean " + name), std::string::npos) << h.err;
  }
  const CliResult v = run_cli("--versoin");
  EXPECT_EQ(v.exit_code, 2);
  EXPECT_NE(v.err.find("did you mean --version"), std::string::npos) << v.err;
  EXPECT_EQ(run_cli("frobnicate").exit_code, 2);
}

TEST(Cli, EveryCommandHasConventionalHelp) {
  const auto commands = listed_commands();
  ASSERT_GE(commands.size(), 10u);
  for (const auto& name : commands) {
    SCOPED_TRACE(name);
    const CliResult h = run_cli("help " + name);
    ASSERT_EQ(h.exit_code, 0) << h.err;
    const CliResult dash = run_cli(name + " --help");
    EXPECT_EQ(dash.exit_code, 0);
    EXPECT_EQ(dash.out, h.out);
    EXPECT_EQ(run_cli(name + " -h").out, h.out);
    EXPECT_NE(h.out.find("Usage: mx2nv " + name), std::string::npos) << h.out;
    // No parser internals: plain choices, plain value names.
    for (const char* internal : {"ENUM", " OR ", " in {", "TEXT:", "UINT:", "INT in", ":{"}) {
      EXPECT_EQ(h.out.find(internal), std::string::npos) << internal << " in\n" << h.out;
    }
    // It ends with an example of this very command.
    const auto example = h.out.rfind("Example:\n  mx2nv " + name + " ");
    ASSERT_NE(example, std::string::npos) << h.out;
    EXPECT_EQ(h.out.find('\n', h.out.find('\n', example) + 1), h.out.size() - 1) << h.out;

    for (const auto& o : help_options(h.out)) {
      if (o.name == "--help") continue;
      SCOPED_TRACE(o.name);
      // A misspelt option names the one meant.
      std::string typo = o.name;
      typo[2 + (typo.size() - 2) / 2] = typo[2 + (typo.size() - 2) / 2] == 'x' ? 'y' : 'x';
      const CliResult t = run_cli(name + " " + typo + " 1");
      EXPECT_EQ(t.exit_code, 2);
      EXPECT_NE(t.err.find("unknown option " + typo), std::string::npos) << t.err;
      EXPECT_NE(t.err.find("did you mean"), std::string::npos) << t.err;
      EXPECT_NE(t.err.find(o.name), std::string::npos) << t.err;
      if (o.choices.empty()) continue;
      // An enum option shows its default and takes its names only: never a
      // number (an index into the choices), a prefix or another case.
      EXPECT_NE(o.line.find("}="), std::string::npos) << o.line;
      std::vector<std::string> refused = {"0", "1", "2", "-1", "", " " + o.choices[0]};
      for (const auto& c : o.choices) {
        refused.push_back(c.substr(0, c.size() - 1));
        std::string upper = c;
        for (auto& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
        refused.push_back(upper);
      }
      for (const auto& value : refused) {
        if (std::find(o.choices.begin(), o.choices.end(), value) != o.choices.end()) continue;
        const CliResult r = run_cli(name + " " + o.name + " " + q(value));
        EXPECT_EQ(r.exit_code, 2) << "'" << value << "'";
        EXPECT_NE(r.err.find(o.name), std::string::npos) << r.err;
        EXPECT_NE(r.err.find("is not one of {"), std::string::npos) << r.err;
      }
    }
  }
  const CliResult version = run_cli("--version");
  EXPECT_EQ(version.out, std::string("mx2nv ") + MX2NV_VERSION + "\n");
}

// ---- Standard output that cannot be written, and interruptions ----

enum class Stdout {
  DevFull,     // > /dev/full
  Closed,      // >&-
  BrokenPipe,  // a pipe whose reader is gone (`| head -c 10` after head exited)
  FullPipe,    // a 4 KiB pipe already full that nobody reads
  FullPipeStderrToo,  // the same, as stdout and stderr (`2>&1 | ...`)
};

struct Child {
  pid_t pid = -1;
  int reader = -1;  // FullPipe: the read end, held open and never read
};

Child spawn_cli(const std::vector<std::string>& args, Stdout mode, const fs::path& err_file,
                const fs::path& cwd = {}) {
  std::vector<std::string> words = {MX2NV_EXE};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  int out = -1;
  Child c;
  if (mode == Stdout::DevFull) out = ::open("/dev/full", O_WRONLY | O_CLOEXEC);
  const bool full = mode == Stdout::FullPipe || mode == Stdout::FullPipeStderrToo;
  if (mode == Stdout::BrokenPipe || full) {
    int fds[2];
    EXPECT_EQ(::pipe2(fds, O_CLOEXEC), 0);
    out = fds[1];
    if (mode == Stdout::BrokenPipe) {
      ::close(fds[0]);
    } else {
      c.reader = fds[0];
      ::fcntl(out, F_SETPIPE_SZ, 4096);
      ::fcntl(out, F_SETFL, O_NONBLOCK);
      const std::string filler(4096, '#');
      while (::write(out, filler.data(), filler.size()) > 0) {
      }
      ::fcntl(out, F_SETFL, 0);
    }
  }
  const int err = ::open(err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int in = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  c.pid = ::fork();
  if (c.pid == 0) {
    ::dup2(in, 0);
    ::dup2(mode == Stdout::FullPipeStderrToo ? out : err, 2);
    if (out >= 0) {
      ::dup2(out, 1);
    } else {
      ::close(1);
    }
    if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) ::_exit(127);
    ::signal(SIGPIPE, SIG_DFL);  // as a shell starts it
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(err);
  ::close(in);
  if (out >= 0) ::close(out);
  return c;
}

// The exit status (128 + N for a signal N).
int wait_exit(const Child& c) {
  int status = 0;
  while (::waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (c.reader >= 0) ::close(c.reader);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Until the child's main thread waits to write stdout (in poll() or a pipe
// write): false when it exited first.
bool waits_on_stdout(const Child& c) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  int seen = 0;
  while (std::chrono::steady_clock::now() < until) {
    if (::waitpid(c.pid, nullptr, WNOHANG | WNOWAIT) == c.pid) return false;
    const std::string wchan = read_file("/proc/" + std::to_string(c.pid) + "/wchan");
    seen = (wchan.find("poll") != std::string::npos || wchan.find("pipe") != std::string::npos) ? seen + 1 : 0;
    if (seen >= 3) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// Inputs for every command that prints.
struct Checkpoints {
  ScratchDir d;
  fs::path src = d / "src", dst = d / "dst";
  Checkpoints() {
    FixtureSpec spec = tiny_spec();
    spec.experts = 8;  // compare's and inspect's documents larger than a 4 KiB pipe
    write_fixture(src, spec);
    const CliResult c = run_cli("convert " + q(src) + " " + q(dst) + " --threads 2");
    EXPECT_EQ(c.exit_code, 0) << c.err;
    const CliResult v = run_cli("verify " + q(src) + " " + q(dst) + " --report " + q(d / "v.json"));
    EXPECT_EQ(v.exit_code, 0) << v.err;
  }
  // Each command line that prints on stdout; `fresh` names a new directory.
  std::vector<std::vector<std::string>> command_lines(const fs::path& fresh) const {
    const std::string s = src.string(), t = dst.string();
    return {
        {"convert", s, (fresh / "c").string(), "--threads", "2"},
        {"verify", s, t},
        {"verify", s, t, "--report", "/dev/stdout"},
        {"compare", s, t},
        {"compare", s, t, "--json"},
        {"plan", s, (fresh / "p").string()},
        {"requantize", s, (fresh / "r").string()},
        {"inspect", s},
        {"inspect", s, "--json"},
        {"gate", t, "--quick", "--ask-runtimes", "never"},
        {"gate", t, "--quick", "--json", "--ask-runtimes", "never"},
        {"gate", t, "--ask-runtimes", "never", "--json"},
        {"card", s, t, "--verify-report", (d / "v.json").string()},
        {"generate", (fresh / "g").string()},
        {"demo", (fresh / "demo").string()},
        {"help"},
        {"help", "verify"},
        {"verify", "--help"},
        {"--version"},
    };
  }
};

std::string joined(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

TEST(Cli, StdoutThatCannotBeWrittenIsExitFourWithAPlainMessage) {
  const Checkpoints k;
  const std::map<Stdout, std::string> reasons = {{Stdout::DevFull, "No space left on device"},
                                                 {Stdout::Closed, "Bad file descriptor"},
                                                 {Stdout::BrokenPipe, "Broken pipe"}};
  for (const auto& [mode, reason] : reasons) {
    ScratchDir fresh;
    for (const auto& line : k.command_lines(fresh.path())) {
      SCOPED_TRACE(joined(line) + " with stdout: " + reason);
      // card writes DST/README.md: each run starts from the same DST.
      std::error_code ec;
      fs::remove(k.dst / "README.md", ec);
      fs::remove(k.dst / "README.source.md", ec);
      fs::remove_all(k.dst / ".mx2nv/card.json", ec);
      const Child c = spawn_cli(line, mode, fresh / "err");
      EXPECT_EQ(wait_exit(c), 4);
      const std::string err = read_file(fresh / "err");
      EXPECT_NE(err.find("cannot write to standard output: " + reason), std::string::npos) << err;
      EXPECT_EQ(err.find("internal error"), std::string::npos) << err;
    }
  }
}

TEST(Cli, InterruptedWhileWaitingToWriteStdoutIsExitFourForEveryCommand) {
  const Checkpoints k;
  for (const int sig : {SIGTERM, SIGINT}) {
    ScratchDir fresh;
    for (const auto& line : k.command_lines(fresh.path())) {
      const std::string name = line[0].rfind("--", 0) == 0 ? "" : line[0];
      SCOPED_TRACE(joined(line) + (sig == SIGTERM ? " SIGTERM" : " SIGINT"));
      std::error_code ec;
      fs::remove(k.dst / "README.md", ec);
      fs::remove(k.dst / "README.source.md", ec);
      fs::remove_all(k.dst / ".mx2nv/card.json", ec);
      const Child c = spawn_cli(line, Stdout::FullPipe, fresh / "err");
      ASSERT_TRUE(waits_on_stdout(c)) << read_file(fresh / "err");
      ::kill(c.pid, sig);
      EXPECT_EQ(wait_exit(c), 4);
      const std::string err = read_file(fresh / "err");
      // One message, the last line (card's warnings come before it).
      const std::string last = err.substr(err.rfind('\n', err.size() - 2) + 1);
      EXPECT_EQ(last.rfind("mx2nv", 0), 0u) << err;
      EXPECT_EQ(err.find("interrupted"), err.rfind("interrupted")) << err;
      EXPECT_NE(last.find(sig == SIGTERM ? "interrupted by SIGTERM" : "interrupted by SIGINT"), std::string::npos)
          << err;
      EXPECT_EQ(err.find("internal error"), std::string::npos) << err;
      // What to do next names only what this command accepts.
      if (name == "convert" || name == "requantize") {
        EXPECT_NE(err.find("--resume"), std::string::npos) << err;
      } else {
        EXPECT_EQ(err.find("--resume"), std::string::npos) << err;
        EXPECT_NE(err.find("run it again"), std::string::npos) << err;
      }
    }
  }
}

// stdout and stderr both in a pipe nobody reads: the interrupted command
// exits 4 at once, its message lost rather than its exit delayed.
TEST(Cli, InterruptedWithStderrInTheSameFullPipeExitsPromptly) {
  const Checkpoints k;
  const Child c = spawn_cli({"compare", k.src.string(), k.dst.string(), "--json"}, Stdout::FullPipeStderrToo,
                            k.d / "unused");
  ASSERT_TRUE(waits_on_stdout(c));
  const auto sent = std::chrono::steady_clock::now();
  ::kill(c.pid, SIGTERM);
  EXPECT_EQ(wait_exit(c), 4);
  EXPECT_LT(std::chrono::steady_clock::now() - sent, std::chrono::seconds(10));
}

// SIGINT as soon as the work is under way (mid-run, or at the latest while
// waiting to print): exit 4, one message that names only what the command
// accepts; convert's continuation finishes the conversion.
TEST(Cli, InterruptedMidRunSaysWhatThisCommandAccepts) {
  ScratchDir d;
  FixtureSpec spec = tiny_spec();
  spec.layers = 2;
  spec.experts = 32;
  spec.hidden = 1024;
  spec.intermediate = 512;
  spec.shards = 8;
  write_fixture(d / "src", spec);
  ASSERT_EQ(run_cli("convert " + q(d / "src") + " " + q(d / "ref")).exit_code, 0);
  const std::vector<std::vector<std::string>> lines = {
      {"convert", (d / "src").string(), (d / "dst").string(), "--threads", "1", "--progress", "json"},
      {"verify", (d / "src").string(), (d / "ref").string(), "--threads", "1", "--progress", "json"},
      {"compare", (d / "src").string(), (d / "ref").string(), "--threads", "1", "--progress", "json"},
  };
  for (const auto& line : lines) {
    SCOPED_TRACE(joined(line));
    const Child c = spawn_cli(line, Stdout::FullPipe, d / "err");
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (read_file(d / "err").find("\"bytes_done\"") == std::string::npos &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ::kill(c.pid, SIGINT);
    EXPECT_EQ(wait_exit(c), 4);
    const std::string err = read_file(d / "err");
    const std::string last = err.substr(err.rfind('\n', err.size() - 2) + 1);
    EXPECT_NE(last.find("mx2nv " + line[0] + ": interrupted by SIGINT"), std::string::npos) << err;
    if (line[0] != "convert") {
      EXPECT_EQ(last.find("--resume"), std::string::npos) << last;
      continue;
    }
    const std::string marker = "to continue: ";
    ASSERT_NE(last.find(marker), std::string::npos) << last;
    const std::string again = last.substr(last.find(marker) + marker.size(), last.size() - 1 - last.find(marker) -
                                                                               marker.size());
    const std::string cmd = "mx2nv() { " + std::string(MX2NV_EXE) + " \"$@\"; } && " + again;
    const CliResult resumed = run_cli("--version >/dev/null; bash -c " + q(cmd));
    EXPECT_EQ(resumed.exit_code, 0) << again << "\n" << resumed.err;
    EXPECT_EQ(run_cli("verify " + q(d / "src") + " " + q(d / "dst")).exit_code, 0);
  }
}

// requantize continues with --resume, as convert does: a DST holding a run
// is refused without it, and with it a requantized DST is answered while a
// converted one stays refused.
TEST(Cli, RequantizeSuggestsItsOwnResume) {
  ScratchDir d;
  write_fixture(d / "src", tiny_spec());
  ASSERT_EQ(run_cli("convert " + q(d / "src") + " " + q(d / "dst")).exit_code, 0);
  ASSERT_EQ(run_cli("requantize " + q(d / "src") + " " + q(d / "rq")).exit_code, 0);
  for (const char* dst : {"dst", "rq"}) {
    const CliResult r = run_cli("requantize " + q(d / "src") + " " + q(d / dst));
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("add --resume"), std::string::npos) << r.err;
  }
  EXPECT_EQ(run_cli("requantize --resume " + q(d / "src") + " " + q(d / "rq")).exit_code, 0);
  EXPECT_EQ(run_cli("requantize --resume " + q(d / "src") + " " + q(d / "dst")).exit_code, 2);
}

// The continuation convert prints after an interruption runs as printed.
TEST(Cli, InterruptedConvertSaysHowToContinueRunnably) {
  ScratchDir d;
  write_fixture(d / "src", tiny_spec());
  const fs::path weird = d / "it's $HOME `x` é";
  fs::create_directories(weird);
  const Child c = spawn_cli({"convert", "--window", "e4m3", "--", "../src", "-dst"}, Stdout::FullPipe, d / "err",
                            weird);
  ASSERT_TRUE(waits_on_stdout(c)) << read_file(d / "err");
  ::kill(c.pid, SIGINT);
  EXPECT_EQ(wait_exit(c), 4);
  const std::string err = read_file(d / "err");
  const std::string marker = "to continue: ";
  const auto at = err.find(marker);
  ASSERT_NE(at, std::string::npos) << err;
  const std::string line = err.substr(at + marker.size(), err.find('\n', at) - at - marker.size());
  EXPECT_NE(line.find("--resume"), std::string::npos) << line;
  const std::string exe = std::string(MX2NV_EXE);
  const std::string cmd = "cd " + q(weird) + " && mx2nv() { " + exe + " \"$@\"; } && " + line;
  const CliResult again = run_cli("--version >/dev/null; bash -c " + q(cmd));
  EXPECT_EQ(again.exit_code, 0) << line << "\n" << again.err;
  EXPECT_NE(again.out.find("already complete"), std::string::npos) << again.out;
}

// convert's `next` line runs as printed, for every window and --overspan,
// with paths no shell takes literally.
TEST(Cli, ConvertNextLineRunsAsPrinted) {
  ScratchDir d;
  FixtureSpec spec = tiny_spec();
  spec.overrides[fixture_module_name(spec, 0, 0, 2)].span = 16;  // beyond marlin (14), within e4m3 (17)
  const fs::path cwd = d / "work é";
  fs::create_directories(cwd);
  write_fixture(cwd / "-src 'q' $x", spec);
  int n = 0;
  for (const std::string window : {"marlin", "e4m3"}) {
    for (const std::string overspan : {"fail", "bf16", "requantize"}) {
      SCOPED_TRACE(window + " " + overspan);
      // Quotes, $, a backslash, a backquote and (a terminal escape, a newline) control characters.
      ++n;
      const std::string dst = "-dst \"" + std::to_string(n) + "\" $(false) \\ `x`" +
                              (n % 2 == 0 ? std::string("\x1b[31m\n") : std::string());
      const std::string args = "convert --window " + window + " --overspan " + overspan + " -- " +
                               q("-src 'q' $x") + " " + q(dst);
      const std::string exe = std::string(MX2NV_EXE);
      const CliResult c = run_cli("--version >/dev/null; cd " + q(cwd) + " && " + exe + " " + args);
      if (window == "marlin" && overspan == "fail") {
        EXPECT_EQ(c.exit_code, 1) << c.err;  // refused: nothing to verify
        EXPECT_EQ(c.out.find("next"), std::string::npos);
        continue;
      }
      ASSERT_EQ(c.exit_code, 0) << c.err;
      EXPECT_EQ(c.out.find('\x1b'), std::string::npos) << c.out;  // escaped, never sent to a terminal raw
      const auto at = c.out.find("  next     ");
      ASSERT_NE(at, std::string::npos) << c.out;
      const std::string line = c.out.substr(at + 11, c.out.find('\n', at) - at - 11);
      const std::string cmd = "cd " + q(cwd) + " && mx2nv() { " + exe + " \"$@\"; } && " + line;
      const CliResult v = run_cli("--version >/dev/null; bash -c " + q(cmd));
      EXPECT_EQ(v.exit_code, 0) << line << "\n" << v.out << v.err;
      EXPECT_NE(v.out.find("mx2nv verify: ok"), std::string::npos) << v.out;
    }
  }
}

// verify without --window uses the window DST records; a --window that
// differs from it is said, and so is a DST that records none.
TEST(Cli, VerifyDefaultsToTheWindowDstRecords) {
  ScratchDir d;
  FixtureSpec spec = tiny_spec();
  spec.overrides[fixture_module_name(spec, 0, 0, 2)].span = 16;
  write_fixture(d / "src", spec);
  ASSERT_EQ(run_cli("convert " + q(d / "src") + " " + q(d / "dst") + " --window e4m3").exit_code, 0);
  const CliResult v = run_cli("verify " + q(d / "src") + " " + q(d / "dst"));
  EXPECT_EQ(v.exit_code, 0) << v.err;
  EXPECT_NE(v.out.find("window e4m3"), std::string::npos) << v.out;
  EXPECT_EQ(v.err, "");
  const CliResult m = run_cli("verify " + q(d / "src") + " " + q(d / "dst") + " --window marlin");
  EXPECT_EQ(m.exit_code, 1);
  EXPECT_NE(m.err.find("DST was converted under window e4m3; verifying under --window marlin"), std::string::npos)
      << m.err;
  // A DST without records: the window used is said.
  const CliResult none = run_cli("verify " + q(d / "src") + " " + q(d / "src"));
  EXPECT_NE(none.err.find("DST records no window; verifying under window marlin"), std::string::npos) << none.err;
}

}  // namespace
}  // namespace mx2nv::e2e

namespace mx2nv::e2e {
namespace {

// Every option of every command given an empty value (an unset shell
// variable) is exit 2, never taken as "not given"; the positionals say
// "empty value".
TEST(Cli, AnEmptyValueIsAUsageErrorForEveryOption) {
  const std::map<std::string, std::string> positionals = {
      {"convert", "s d"}, {"verify", "s d"}, {"compare", "s o"}, {"plan", "s d"},    {"requantize", "s d"},
      {"inspect", "s"},   {"gate", "c"},     {"generate", "g"},  {"demo", "dir"},    {"card", "s d"}};
  const auto commands = listed_commands();
  ASSERT_GE(commands.size(), 10u);
  for (const auto& name : commands) {
    ASSERT_TRUE(positionals.count(name)) << "a new command: give it positionals here: " << name;
    const auto options = help_options(run_cli("help " + name).out);
    for (const auto& o : options) {
      if (o.name == "--help") continue;
      SCOPED_TRACE(name + " " + o.name);
      const CliResult r = run_cli(name + " " + positionals.at(name) + " " + o.name + " ''");
      EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
      EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
      // Refused by the option's own rule (a range, a choice, an option it needs) or as an empty value.
      EXPECT_NE(r.err.find("usage: "), std::string::npos) << r.err;
    }
    const std::string first = positionals.at(name).substr(positionals.at(name).find(' ') + 1);
    const CliResult r = run_cli(name + " '' " + (first == positionals.at(name) ? "" : first));
    EXPECT_EQ(r.exit_code, 2) << name << r.err;
    EXPECT_NE(r.err.find("given an empty value"), std::string::npos) << name << r.err;
  }
}

}  // namespace
}  // namespace mx2nv::e2e

// Helpers for end-to-end tests: scratch directories, whole-tree snapshots,
// running the built CLI.
#pragma once

#include "fixture/fixture.hpp"

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace mx2nv::e2e {

namespace fs = std::filesystem;

// The smallest useful checkpoint: default layout and counts, 64-wide modules.
inline FixtureSpec tiny_spec() {
  FixtureSpec spec;
  spec.hidden = 64;
  spec.intermediate = 64;
  return spec;
}

// Two layers of three experts over three shards, one down projection with a
// scale span far beyond any window (the over-span choices' input).
inline FixtureSpec spec_with_over_span() {
  FixtureSpec s;
  s.layers = 2;
  s.experts = 3;
  s.hidden = 128;
  s.intermediate = 64;
  s.shards = 3;
  s.overrides[fixture_module_name(s, 1, 2, 2)].span = 30;
  return s;
}

class ScratchDir {
 public:
  ScratchDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base ? base : "/tmp") + "/mx2nv-test-XXXXXX";
    path_ = fs::path(::mkdtemp(tmpl.data()));
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& p) const { return path_ / p; }

 private:
  fs::path path_;
};

inline std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void write_file(const fs::path& p, const std::string& data) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << data;
}

// Relative path -> contents, for every regular file below root.
inline std::map<std::string, std::string> snapshot(const fs::path& root) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (e.is_regular_file()) out[fs::relative(e.path(), root).generic_string()] = read_file(e.path());
  }
  return out;
}

// One tensor's bytes, located through the shard's own header (parsed here
// with nlohmann directly, not with mx2nv's reader).
inline std::string tensor_bytes(const fs::path& shard, const std::string& name) {
  const std::string all = read_file(shard);
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t(static_cast<unsigned char>(all[static_cast<std::size_t>(i)])) << (8 * i);
  const nlohmann::json header = nlohmann::json::parse(all.substr(8, n));
  const auto begin = header[name]["data_offsets"][0].get<std::uint64_t>();
  const auto end = header[name]["data_offsets"][1].get<std::uint64_t>();
  return all.substr(8 + n + begin, end - begin);
}

struct CliResult {
  int exit_code = -1;
  std::string out, err;
};

inline CliResult run_cli(const std::string& args) {
  ScratchDir io;
  const std::string cmd = std::string(MX2NV_EXE) + " " + args + " >" + (io / "out").string() + " 2>" +
                          (io / "err").string() + " </dev/null";
  const int status = std::system(cmd.c_str());
  CliResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_file(io / "out");
  r.err = read_file(io / "err");
  return r;
}

// Starts the CLI in the background (output discarded), for tests that kill
// it or race two of it.
inline pid_t spawn_cli(const std::vector<std::string>& args) {
  std::vector<std::string> argv_s{MX2NV_EXE};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, MX2NV_EXE, &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  // A failed spawn leaves pid 0, and kill(0, ...) would signal the whole test's
  // process group: stop here instead.
  if (rc != 0 || pid <= 0) std::abort();
  return pid;
}

inline int wait_exit(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

}  // namespace mx2nv::e2e

// The scale-out surfaces treated as hostile (issue 20, part A): every path a
// command writes is checked against the SRC and DST it actually uses (the
// plan's, for a planned step); a finished DST is never written again, even
// by a worker that opened it before finalize; plans record SRC and DST byte
// for byte and are checked against SRC before a step writes (selections that
// never wrap, option changes across steps, options a form does not use,
// --copy reflink, forged rows). Every case checks the exit code and message,
// SRC unchanged, DST unchanged where nothing may be written, and no
// "internal error".
#include "e2e_support.hpp"

#include "checkpoint/reader.hpp"
#include "common/error.hpp"
#include "convert/convert.hpp"
#include "convert/planned.hpp"
#include "destination/destination.hpp"
#include "destination/records.hpp"
#include "numerics/formats.hpp"
#include "plan/plan_file.hpp"
#include "plan/target_layout.hpp"

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <spawn.h>
#include <sys/resource.h>
#include <sys/statfs.h>
#include <sys/wait.h>

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <set>
#include <tuple>

namespace mx2nv::e2e {
namespace {

// A shell word for any path (run_cli goes through sh): single quotes, with
// each ' written as '\''.
std::string q(const fs::path& p) {
  std::string out = "'";
  for (const char c : p.string()) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// Every entry below `root` (directories, links and special files too), with
// the contents of regular files; {"": "<absent>"} when root does not exist.
std::map<std::string, std::string> tree(const fs::path& root) {
  if (!fs::exists(fs::symlink_status(root))) return {{"", "<absent>"}};
  std::map<std::string, std::string> out;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
    const std::string rel = fs::relative(it->path(), root).string();
    const fs::file_status st = it->symlink_status();
    if (fs::is_symlink(st)) {
      out[rel] = "<link>" + fs::read_symlink(it->path()).string();
    } else if (fs::is_directory(st)) {
      out[rel] = "<dir>";
    } else if (fs::is_regular_file(st)) {
      out[rel] = read_file(it->path());
    } else {
      out[rel] = "<special>";
    }
  }
  return out;
}

// The converted files only (no .mx2nv), to compare outputs made from copies
// of SRC (whose mtimes, recorded in finished.json, differ).
std::map<std::string, std::string> outputs_of(const fs::path& root) {
  auto all = snapshot(root);
  std::erase_if(all, [](const auto& kv) { return kv.first.starts_with(".mx2nv/"); });
  return all;
}

CliResult cli(const std::string& args) {
  CliResult r = run_cli(args);
  EXPECT_EQ(r.err.find("internal error"), std::string::npos) << args << "\n" << r.err;
  return r;
}

// Exact arithmetic on selections near 2^64 (the test's own, not mx2nv's).
__extension__ typedef unsigned __int128 U128;

std::string uint_text(U128 v) {
  if (v == 0) return "0";
  std::string s;
  while (v > 0) {
    s.insert(s.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  }
  return s;
}

constexpr std::uint64_t kMax = ~std::uint64_t{0};

// Rewrites a plan with `edit` applied, its checksum recomputed and (with
// `refingerprint`) every shard's fingerprint and output size recomputed from
// SRC for the edited rows: a forgery consistent in everything a checksum or
// fingerprint can show.
void forge(const fs::path& plan_path, const fs::path& src, const std::function<void(PlanFile&)>& edit,
           bool refingerprint = true) {
  PlanFile f = plan_file_from_text(read_file(plan_path), "forge");
  edit(f);
  if (refingerprint) {
    const SourceCheckpoint s = open_source_checkpoint(src, 1, IndexNames::Drop);
    Plan p;
    p.window = f.window;
    p.over_span_choice = f.over_span_choice;
    p.kind = f.kind;
    p.format = f.format;
    p.modules = f.modules;
    for (std::size_t i = 0; i < f.shards.size(); ++i) {
      const OpenShard in = s.checkpoint.read_shard(i);
      const TargetLayout layout = make_target_layout(in.header, i, s.modules, p);
      f.shards[i].plan_hash = expected_record(s, p, in, layout).plan_hash;
      f.shards[i].output_data_bytes = layout.data_size;
      f.shards[i].output_tensors = layout.tensors.size();
    }
  }
  write_file(plan_path, plan_file_to_text(f));
}

// The plan in the format of the earlier mx2nv (mx2nv-plan/2: paths as text),
// with `target` as its DST text, checksummed as that format was.
void write_v2_plan(const fs::path& from_v3, const fs::path& out, const std::optional<std::string>& target = {}) {
  nlohmann::json j = nlohmann::json::parse(read_file(from_v3));
  j.erase("fingerprint");
  j.erase("source_bytes");
  j.erase("target_bytes");
  j["format"] = "mx2nv-plan/2";
  if (target) j["target"] = *target;
  const std::string text = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  j["fingerprint"] = fmt::format("{:016x}", XXH3_64bits(text.data(), text.size()));
  write_file(out, j.dump(1) + "\n");
}

// A state file of DST (conversion.json, finished.json) claiming another mx2nv wrote it.
std::string with_tool_version(const std::string& record, const std::string& version) {
  nlohmann::json j = nlohmann::json::parse(record);
  j["tool_version"] = version;
  return j.dump(2) + "\n";
}

bool reflinks_possible_at(const fs::path& dir) {
  struct statfs st {};
  if (::statfs(dir.c_str(), &st) != 0) return true;
  constexpr long kXfs = 0x58465342, kBtrfs = 0x9123683E, kBcachefs = 0xca451a4e, kZfs = 0x2fc12fc1;
  const auto type = static_cast<long>(st.f_type);
  return type == kXfs || type == kBtrfs || type == kBcachefs || type == kZfs;
}

bool sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; }

class PlannedHostile : public ::testing::Test {
 protected:
  void SetUp() override {
    spec = tiny_spec();
    spec.layers = 3;
    spec.experts = 2;
    spec.shards = 6;
    write_fixture(src(), spec);
    ASSERT_EQ(cli("convert " + q(src()) + " " + q(d / "reference")).exit_code, 0);
    reference = outputs_of(d / "reference");
    src_before = tree(src());
  }
  void TearDown() override { EXPECT_TRUE(tree(src()) == src_before) << "SRC changed"; }
  fs::path src() const { return d / "src"; }
  std::string plan_in(const fs::path& dst) const { return q(dst / ".mx2nv/plan.json"); }
  // plan, every shard, finalize: the CLI's planned conversion into `dst`.
  void convert_planned(const fs::path& dst, const std::string& plan_flags = "") {
    ASSERT_EQ(cli("plan " + plan_flags + " " + q(src()) + " " + q(dst)).exit_code, 0);
    ASSERT_EQ(cli("convert --plan " + plan_in(dst) + " --shards 0/2").exit_code, 0);
    ASSERT_EQ(cli("convert --plan " + plan_in(dst) + " --shards 1/2").exit_code, 0);
    ASSERT_EQ(cli("convert --plan " + plan_in(dst) + " --finalize").exit_code, 0);
  }
  ScratchDir d;
  FixtureSpec spec;
  std::map<std::string, std::string> reference, src_before;
};

// --- 1. writes into SRC or DST -------------------------------------------

// Every way to name a file in SRC or DST: directly, new or existing, through
// a symlink to the file, through a symlinked directory.
std::vector<fs::path> targets_in(const fs::path& scratch, const fs::path& src, const fs::path& dst) {
  fs::create_symlink(src / "config.json", scratch / "into-src-config");
  fs::create_directory_symlink(src, scratch / "src-link");
  fs::create_directory_symlink(dst, scratch / "dst-link");
  return {src / "config.json",
          src / "brand-new.json",
          src / "model-00001-of-00006.safetensors",
          src / "." / "config.json",
          dst / "config.json",
          dst / "model.safetensors.index.json",
          dst / ".mx2nv/plan.json",
          dst / ".mx2nv/brand-new.json",
          dst / "brand-new.json",
          scratch / "into-src-config",
          scratch / "src-link/config.json",
          scratch / "src-link/new.json",
          scratch / "dst-link/config.json",
          scratch / "dst-link/new.json"};
}

TEST_F(PlannedHostile, ReportPathsAreCheckedAgainstThePlansSrcAndDstInEveryForm) {
  const fs::path dst = d / "dst";
  ASSERT_EQ(cli("plan " + q(src()) + " " + q(dst)).exit_code, 0);
  const auto targets = targets_in(d.path(), src(), dst);
  const std::vector<std::string> steps = {"--shards 0/1", "--shard 3", "--shards 1/4",
                                          "--shards 0/2 " + q(src()) + " " + q(dst), "--shard 5 " + q(src())};
  for (const auto& step : steps) {
    for (const auto& target : targets) {
      const auto before = tree(dst);
      const CliResult r = cli("convert --plan " + plan_in(dst) + " " + step + " --report " + q(target));
      EXPECT_EQ(r.exit_code, 2) << step << " " << target << "\n" << r.err;
      EXPECT_NE(r.err.find("--report"), std::string::npos) << r.err;
      EXPECT_TRUE(tree(dst) == before) << step << " " << target;
    }
  }
  // Every shard done: finalize is checked the same way, for --report and --html.
  ASSERT_EQ(cli("convert --plan " + plan_in(dst) + " --shards 0/1").exit_code, 0);
  for (const char* option : {"--report", "--html"}) {
    for (const auto& target : targets) {
      const auto before = tree(dst);
      const CliResult r = cli("convert --plan " + plan_in(dst) + " --finalize " + option + " " + q(target));
      EXPECT_EQ(r.exit_code, 2) << option << " " << target << "\n" << r.err;
      EXPECT_TRUE(tree(dst) == before) << option << " " << target;
    }
  }
  ASSERT_EQ(cli("convert --plan " + plan_in(dst) + " --finalize").exit_code, 0);
  const auto finished = tree(dst);
  // The plan is gone with DST's state: retries are checked against DST, and
  // against SRC, recognised by DST's record of it even when not given (and
  // touched since).
  const fs::path first_shard = src() / "model-00001-of-00006.safetensors";
  fs::last_write_time(first_shard, fs::last_write_time(first_shard) + std::chrono::seconds(3));
  for (const std::string& extra : std::vector<std::string>{std::string(), " " + q(src()) + " " + q(dst)}) {
    for (const std::string& step : std::vector<std::string>{"--finalize", "--shards 0/1", "--shard 2"}) {
      for (const auto& target : targets) {
        if (target == dst / ".mx2nv/plan.json") continue;  // the plan itself: gone
        const CliResult r = cli("convert --plan " + plan_in(dst) + " " + step + extra + " --report " + q(target));
        EXPECT_EQ(r.exit_code, 2) << step << extra << " " << target << "\n" << r.err;
        EXPECT_TRUE(tree(dst) == finished) << step << " " << target;
      }
    }
  }
  const CliResult ok = cli("convert --plan " + plan_in(dst) + " --finalize --report " + q(d / "ok.json"));
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_TRUE(nlohmann::json::parse(read_file(d / "ok.json"))["already_complete"].get<bool>());
  EXPECT_TRUE(tree(dst) == finished);
  EXPECT_EQ(cli("verify " + q(src()) + " " + q(dst)).exit_code, 0);
}

TEST_F(PlannedHostile, APlanOutsideDstAndThePlanFileItselfAreProtectedToo) {
  const fs::path dst = d / "dst", plan = d / "plan.json";
  ASSERT_EQ(cli("plan " + q(src()) + " " + q(dst) + " --plan-out " + q(plan)).exit_code, 0);
  const std::string plan_text = read_file(plan);
  // A report replacing the plan it reads, an HTML page replacing the report.
  CliResult r = cli("convert --plan " + q(plan) + " --shards 0/1 --report " + q(plan));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("the plan this step reads"), std::string::npos) << r.err;
  fs::create_symlink(plan, d / "plan-link");
  EXPECT_EQ(cli("convert --plan " + q(plan) + " --shards 0/1 --report " + q(d / "plan-link")).exit_code, 2);
  EXPECT_EQ(read_file(plan), plan_text);
  EXPECT_TRUE(tree(dst) == tree(d / "absent")) << "a refused step created DST";
  ASSERT_EQ(cli("convert --plan " + q(plan) + " --shards 0/1").exit_code, 0);
  EXPECT_EQ(cli("convert --plan " + q(plan) + " --finalize --html " + q(plan)).exit_code, 2);
  r = cli("convert --plan " + q(plan) + " --finalize --report " + q(d / "same") + " --html " + q(d / "same"));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_FALSE(fs::exists(d / "same"));
  EXPECT_FALSE(fs::exists(dst / "model.safetensors.index.json"));
  EXPECT_EQ(read_file(plan), plan_text);
  // plan: --report against SRC, DST and the --plan-out file.
  for (const auto& target : {src() / "x.json", d / "dst2/x.json", d / "p2.json"}) {
    fs::create_directories(d / "dst2");
    r = cli("plan " + q(src()) + " " + q(d / "dst2") + " --plan-out " + q(d / "p2.json") + " --report " + q(target));
    EXPECT_EQ(r.exit_code, 2) << target << r.err;
    EXPECT_FALSE(fs::exists(d / "p2.json"));
    EXPECT_TRUE(fs::is_empty(d / "dst2"));
  }
  // A plan that cannot be read: its SRC and DST are unknown, so no report is written.
  write_file(d / "damaged.json", plan_text.substr(0, plan_text.size() / 2));
  for (const auto& target : {src() / "config.json", d / "r.json"}) {
    r = cli("convert --plan " + q(d / "damaged.json") + " --shards 0/1 --report " + q(target));
    EXPECT_EQ(r.exit_code, 3) << r.err;
  }
  EXPECT_FALSE(fs::exists(d / "r.json"));
  // Empty paths are usage errors, never "not given".
  for (const std::string& args : std::vector<std::string>{"convert --plan " + q(plan) + " --shards 0/1 --report ''",
                                 "convert --plan " + q(plan) + " --finalize --html ''",
                                 "convert --plan '' --shards 0/1 " + q(src()) + " " + q(d / "x"),
                                 "plan " + q(src()) + " " + q(d / "x") + " --plan-out ''",
                                 "convert " + q(src()) + " " + q(d / "x") + " --report ''",
                                 "verify " + q(src()) + " " + q(d / "reference") + " --html ''"}) {
    r = cli(args);
    EXPECT_EQ(r.exit_code, 2) << args << r.err;
    EXPECT_NE(r.err.find("given an empty value"), std::string::npos) << r.err;
  }
  EXPECT_FALSE(fs::exists(d / "x"));
}

TEST_F(PlannedHostile, EveryOtherCommandChecksItsOutputsAgainstItsSrcAndDst) {
  const fs::path dst = d / "fresh";
  for (const std::string& target : std::vector<std::string>{(src() / "config.json").string(), (src() / "n.json").string()}) {
    for (const std::string& cmd : std::vector<std::string>{"convert " + q(src()) + " " + q(dst) + " --report " + q(target),
          "convert " + q(src()) + " " + q(dst) + " --html " + q(target),
          "requantize " + q(src()) + " " + q(dst) + " --report " + q(target),
          "plan " + q(src()) + " " + q(dst) + " --report " + q(target),
          "verify " + q(src()) + " " + q(d / "reference") + " --report " + q(target),
          "verify " + q(src()) + " " + q(d / "reference") + " --html " + q(target),
          "inspect " + q(src()) + " --html " + q(target)}) {
      const CliResult r = cli(cmd);
      EXPECT_EQ(r.exit_code, 2) << cmd << r.err;
    }
  }
  EXPECT_FALSE(fs::exists(dst));
  const auto reference_tree = tree(d / "reference");
  for (const std::string& cmd : std::vector<std::string>{"verify " + q(src()) + " " + q(d / "reference") + " --report " + q(d / "reference/config.json"),
        "verify " + q(src()) + " " + q(d / "reference") + " --html " + q(d / "reference/x.html"),
        "convert --resume " + q(src()) + " " + q(d / "reference") + " --report " + q(d / "reference/config.json")}) {
    EXPECT_EQ(cli(cmd).exit_code, 2) << cmd;
  }
  EXPECT_TRUE(tree(d / "reference") == reference_tree);
}

// --- 2. a finished DST is never written again ------------------------------

class FinishedUnderTheLock : public PlannedHostile {
 protected:
  void SetUp() override {
    PlannedHostile::SetUp();
    ASSERT_EQ(cli("plan " + q(src()) + " " + q(dst) + " --plan-out " + q(plan)).exit_code, 0);
    ASSERT_EQ(cli("convert --plan " + q(plan) + " --shards 0/1").exit_code, 0);
  }
  PlannedOptions planned() const {
    PlannedOptions o;
    o.plan = plan;
    return o;
  }
  fs::path dst = d / "dst", plan = d / "plan.json";
};

// The worker of the issue: it opened DST (unfinished), finalize ran to the
// end, then the worker took its locks. It must find DST finished there and
// write nothing (it used to rewrite every shard and leave .mx2nv state; killed
// in between, an index naming a missing shard).
TEST_F(FinishedUnderTheLock, AShardWorkerThatOpenedDstBeforeFinalizeWritesNothingAfterIt) {
  for (const ShardSelection& selection : {ShardSelection{0, 1}, ShardSelection{2, 0}, ShardSelection{1, 3}}) {
    if (fs::exists(dst / "model.safetensors.index.json")) {
      fs::remove_all(dst);
      ASSERT_EQ(cli("convert --plan " + q(plan) + " --shards 0/1").exit_code, 0);
    }
    bool raced = false;
    std::map<std::string, std::string> finished;
    PlannedOptions worker = planned();
    worker.progress = [&](const Progress& p) {
      // Between opening DST and locking it: finalize, run to the end.
      if (p.phase != ProgressPhase::Shards || raced) return;
      raced = true;
      EXPECT_EQ(finalize_planned(planned()).result, Outcome::Ok);
      finished = tree(dst);
    };
    const Report r = convert_planned_shards(worker, selection);
    ASSERT_TRUE(raced);
    EXPECT_TRUE(r.already_complete);
    EXPECT_EQ(r.result, Outcome::Ok);
    EXPECT_TRUE(tree(dst) == finished) << "a finished DST was written";
    EXPECT_EQ(cli("verify " + q(src()) + " " + q(dst)).exit_code, 0);
  }
  EXPECT_TRUE(outputs_of(dst) == reference);
}

TEST_F(FinishedUnderTheLock, AFinalizeOrAResumeThatOpenedDstBeforeAnotherFinalizeWritesNothingAfterIt) {
  {  // finalize against finalize
    bool raced = false;
    std::map<std::string, std::string> finished;
    PlannedOptions first = planned();
    first.progress = [&](const Progress& p) {
      if (p.phase != ProgressPhase::Finalize || raced) return;
      raced = true;
      EXPECT_EQ(finalize_planned(planned()).result, Outcome::Ok);
      finished = tree(dst);
    };
    const Report r = finalize_planned(first);
    ASSERT_TRUE(raced);
    EXPECT_TRUE(r.already_complete);
    EXPECT_TRUE(tree(dst) == finished);
  }
  fs::remove_all(dst);
  ASSERT_EQ(cli("convert --plan " + q(plan) + " --shards 0/1").exit_code, 0);
  {  // a whole-DST convert --resume against finalize
    bool raced = false;
    std::map<std::string, std::string> finished;
    ConvertOptions resume;
    resume.source = src();
    resume.target = dst;
    resume.resume = true;
    resume.progress = [&](const Progress& p) {
      if (p.phase != ProgressPhase::Shards || raced) return;
      raced = true;
      EXPECT_EQ(finalize_planned(planned()).result, Outcome::Ok);
      finished = tree(dst);
    };
    const Report r = convert_checkpoint(resume);
    ASSERT_TRUE(raced);
    EXPECT_TRUE(r.already_complete);
    EXPECT_TRUE(tree(dst) == finished);
  }
  EXPECT_EQ(cli("verify " + q(src()) + " " + q(dst)).exit_code, 0);
}

// The lock order itself: a Destination seen unfinished, then finished by
// another; taking the lock (shared or exclusive) finds it finished and
// creates nothing, not even a lock file.
TEST_F(FinishedUnderTheLock, TakingTheLockDecidesFinished) {
  for (const bool shards : {true, false}) {
    if (fs::exists(dst / "model.safetensors.index.json")) {
      fs::remove_all(dst);
      ASSERT_EQ(cli("convert --plan " + q(plan) + " --shards 0/1").exit_code, 0);
    }
    Destination late(src(), dst, true);
    ASSERT_EQ(late.state(), DestinationState::Interrupted);
    ASSERT_EQ(finalize_planned(planned()).result, Outcome::Ok);
    const auto finished = tree(dst);
    EXPECT_FALSE(shards ? late.open_for_shards() : late.open_for_writing({}));
    EXPECT_EQ(late.state(), DestinationState::Finished);
    ASSERT_TRUE(late.finished().has_value());
    EXPECT_TRUE(tree(dst) == finished);
  }
  // A fresh (non-resume) writer finding DST finished under the lock is refused.
  fs::remove_all(d / "empty");
  fs::create_directories(d / "empty");
  Destination fresh(src(), d / "empty", false);
  ASSERT_EQ(cli("convert " + q(src()) + " " + q(d / "empty")).exit_code, 0);
  const auto finished = tree(d / "empty");
  try {
    static_cast<void>(fresh.open_for_writing({}));
    FAIL() << "a fresh writer took a finished DST";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
  }
  EXPECT_TRUE(tree(d / "empty") == finished);
}

// --- 3. SRC and DST round-trip byte for byte --------------------------------

TEST_F(PlannedHostile, PlannedPathsRoundTripByteForByte) {
  const std::vector<std::string> names = {"bad\xff\xfe", "lit\\xff", "new\nline", "quo\"te", "sp ace",
                                          "half\xc3",    "\xc3\xa9t\xc3\xa9", "tab\tx", "back\\slash", "it's"};
  int i = 0;
  for (const auto& name : names) {
    const fs::path s = d / ("s" + std::to_string(i) + name);
    const fs::path t = d / ("t" + std::to_string(i) + name);
    ++i;
    fs::copy(src(), s, fs::copy_options::recursive);
    // Plan kept in DST, and plan kept outside.
    for (const bool outside : {false, true}) {
      const fs::path dst = outside ? fs::path(t.string() + "-out") : t;
      const std::string plan = outside ? q(d / ("plan" + std::to_string(i) + ".json")) : plan_in(dst);
      const std::string plan_flag = outside ? " --plan-out " + plan : "";
      CliResult r = cli("plan " + q(s) + " " + q(dst) + plan_flag);
      ASSERT_EQ(r.exit_code, 0) << name << r.err;
      for (const char* step : {" --shards 1/2", " --shards 0/2", " --finalize"}) {
        r = cli("convert --plan " + plan + step);
        ASSERT_EQ(r.exit_code, 0) << name << step << r.err;
      }
      EXPECT_TRUE(outputs_of(dst) == reference) << name;
      EXPECT_EQ(cli("verify " + q(s) + " " + q(dst)).exit_code, 0) << name;
    }
    // Exactly the planned directories, and nothing beside them.
    std::set<std::string> top;
    for (const auto& e : fs::directory_iterator(d.path())) top.insert(e.path().filename().string());
    EXPECT_TRUE(top.count(t.filename().string()) && top.count(t.filename().string() + "-out")) << name;
  }
  std::set<std::string> top;
  for (const auto& e : fs::directory_iterator(d.path())) top.insert(e.path().filename().string());
  // src, reference, per name: a copy of SRC, two DSTs, one plan.
  EXPECT_EQ(top.size(), 2 + 4 * names.size());
}

TEST_F(PlannedHostile, ADstNamedLikeAnotherDstsDisplayFormIsNeverConfused) {
  const fs::path real = d / "out\xff", lookalike = d / "out\\xff";
  fs::create_directories(lookalike);
  write_file(lookalike / "keep.txt", "mine");
  const auto lookalike_before = tree(lookalike);
  ASSERT_EQ(cli("plan " + q(src()) + " " + q(real) + " --plan-out " + q(d / "p.json")).exit_code, 0);
  ASSERT_EQ(cli("convert --plan " + q(d / "p.json") + " --shards 0/1").exit_code, 0);
  ASSERT_EQ(cli("convert --plan " + q(d / "p.json") + " --finalize").exit_code, 0);
  EXPECT_TRUE(outputs_of(real) == reference);
  EXPECT_TRUE(tree(lookalike) == lookalike_before);
}

TEST_F(PlannedHostile, PlansOfTheEarlierFormatAreReadWhenExactAndRefusedOtherwise) {
  const fs::path dst = d / "dst";
  ASSERT_EQ(cli("plan " + q(src()) + " " + q(dst) + " --plan-out " + q(d / "v3.json")).exit_code, 0);
  write_v2_plan(d / "v3.json", d / "v2.json");
  ASSERT_EQ(cli("convert --plan " + q(d / "v2.json") + " --shards 0/1").exit_code, 0);
  ASSERT_EQ(cli("convert --plan " + q(d / "v2.json") + " --finalize").exit_code, 0);
  EXPECT_TRUE(outputs_of(dst) == reference);
  // A path with a backslash: json_text() may have written it; refused, not guessed.
  for (const std::string& text : std::vector<std::string>{(d / "x\\xffy").string(), (d / "back\\slash").string()}) {
    write_v2_plan(d / "v3.json", d / "v2bad.json", text);
    const CliResult r = cli("convert --plan " + q(d / "v2bad.json") + " --shards 0/1");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("mx2nv-plan/2"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("run mx2nv plan again"), std::string::npos) << r.err;
  }
  EXPECT_FALSE(fs::exists(d / "x\\xffy"));
  EXPECT_FALSE(fs::exists(d / "x\xffy"));
  EXPECT_FALSE(fs::exists(d / "back\\slash"));
}

TEST_F(PlannedHostile, APlanKeptInOneDstNeverConvertsIntoAnother) {
  const fs::path one = d / "one", two = d / "two";
  ASSERT_EQ(cli("plan " + q(src()) + " " + q(one)).exit_code, 0);
  fs::create_directories(two / ".mx2nv");
  fs::copy_file(one / ".mx2nv/plan.json", two / ".mx2nv/plan.json");
  const auto one_before = tree(one), two_before = tree(two);
  for (const std::string& step : std::vector<std::string>{"--shards 0/1", "--finalize"}) {
    CliResult r = cli("convert --plan " + plan_in(two) + " " + step);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("is the plan kept in DST"), std::string::npos) << r.err;
    r = cli("convert --plan " + plan_in(one) + " " + step + " " + q(src()) + " " + q(d / "three"));
    EXPECT_EQ(r.exit_code, 2) << r.err;
  }
  EXPECT_TRUE(tree(one) == one_before);
  EXPECT_TRUE(tree(two) == two_before);
  EXPECT_FALSE(fs::exists(d / "three"));
  // Given as itself (a symlink to it), it is that DST.
  fs::create_directory_symlink(one, d / "one-link");
  EXPECT_EQ(cli("convert --plan " + plan_in(one) + " --shards 0/1 " + q(src()) + " " + q(d / "one-link")).exit_code, 0);
}

// --- 4. selections never wrap ----------------------------------------------

TEST_F(PlannedHostile, ShardSelectionsNeverWrap) {
  const fs::path plan = d / "plan.json";
  ASSERT_EQ(cli("plan " + q(src()) + " " + q(d / "unused") + " --plan-out " + q(plan)).exit_code, 0);
  const std::vector<std::pair<std::uint64_t, std::uint64_t>> cases = {
      {0, 1}, {5, 6}, {0, kMax}, {1, kMax}, {5, kMax}, {kMax - 1, kMax}, {0, kMax - 1}, {3, kMax - 1},
      {0, std::uint64_t{1} << 63}, {2, (std::uint64_t{1} << 63) + 1}, {1, (std::uint64_t{1} << 32) + 1},
      {4, 5}, {0, 4}, {3, 4}, {6, 7}, {1, 5}};
  int k = 0;
  for (const auto& [i, n] : cases) {
    const fs::path dst = d / ("sel" + std::to_string(k++));
    const std::string sel = uint_text(i) + "/" + uint_text(n);
    const CliResult r = cli("convert --plan " + q(plan) + " --shards " + sel + " " + q(src()) + " " + q(dst));
    ASSERT_EQ(r.exit_code, 0) << sel << r.err;
    std::set<std::string> expected;
    for (U128 s = i; s < 6; s += n) expected.insert(fmt::format("model-{:05}-of-00006.safetensors", static_cast<unsigned>(s) + 1));
    std::set<std::string> written;
    if (fs::exists(dst)) {
      for (const auto& e : fs::directory_iterator(dst)) {
        if (e.path().extension() == ".safetensors") written.insert(e.path().filename().string());
      }
    }
    EXPECT_EQ(written, expected) << sel;
    if (expected.empty()) {
      EXPECT_FALSE(fs::exists(dst)) << sel << ": nothing selected, nothing written";
    }
  }
  for (const std::string& bad : std::vector<std::string>{"6/7x", "1/0", "7/7", uint_text(kMax) + "/" + uint_text(kMax),
                                "1/" + uint_text(static_cast<U128>(kMax) + 1), "0/0", "1/2/3", "-1/2",
                                "+1/2", " 1/2", "1/ 2", "0x1/2", "/2", "1/", ""}) {
    const CliResult r = cli("convert --plan " + q(plan) + " --shards '" + bad + "' " + q(src()) + " " + q(d / "bad"));
    EXPECT_EQ(r.exit_code, 2) << "'" << bad << "' " << r.err;
  }
  for (const std::string& bad : std::vector<std::string>{"6", uint_text(kMax), uint_text(static_cast<U128>(kMax) + 1), "-1",
                                "+1", " 1", "1 ", "0x1", ""}) {
    const CliResult r = cli("convert --plan " + q(plan) + " --shard '" + bad + "' " + q(src()) + " " + q(d / "bad"));
    EXPECT_EQ(r.exit_code, 2) << "'" << bad << "' " << r.err;
  }
  EXPECT_FALSE(fs::exists(d / "bad"));
  // verify --shards: the same selections.
  const auto compared = [&](const std::string& sel) {
    const CliResult r = cli("verify " + q(src()) + " " + q(d / "reference") + " --shards " + sel + " --report " +
                            q(d / "v.json"));
    EXPECT_EQ(r.exit_code, 0) << sel << r.err;
    return nlohmann::json::parse(read_file(d / "v.json"))["values_compared"].get<std::uint64_t>();
  };
  EXPECT_EQ(compared("1/" + uint_text(kMax)), compared("1/6"));
  EXPECT_EQ(compared("5/" + uint_text(kMax)), compared("5/6"));
  EXPECT_EQ(compared(uint_text(kMax - 1) + "/" + uint_text(kMax)), 0u);
  EXPECT_EQ(cli("verify " + q(src()) + " " + q(d / "reference") + " --shards 1/" +
                uint_text(static_cast<U128>(kMax) + 1))
                .exit_code,
            2);
}

TEST(ShardSelection, TheArithmeticItself) {
  for (const auto& [i, n, total] : std::vector<std::tuple<std::size_t, std::size_t, std::size_t>>{
           {0, kMax, 10}, {9, kMax, 10}, {kMax - 1, kMax, kMax}, {kMax - 2, kMax - 1, kMax}, {1, 2, 11},
           {0, 3, 10}, {2, 4, 3}, {0, 1, 0}, {5, 6, 6}}) {
    std::vector<std::size_t> want;
    for (U128 s = i; s < total && want.size() <= 1000; s += n) want.push_back(static_cast<std::size_t>(s));
    ASSERT_LE(want.size(), 1000u) << "a case listing too many shards";
    const auto got = selected_shards({i, n}, total);
    EXPECT_EQ(got, want) << i << "/" << n << " of " << total;
  }
  EXPECT_THROW(selected_shards({0, 0}, 0), Error);
  EXPECT_THROW(selected_shards({kMax, 0}, 5), Error);
}

// --- 5. a DST receives one conversion ---------------------------------------

TEST(PlannedOptionChanges, ADstHoldingAPlanOrAnotherConversionIsRefused) {
  ScratchDir d;
  const FixtureSpec spec = spec_with_over_span();
  write_fixture(d / "src", spec);
  const auto src_before = tree(d / "src");
  const fs::path dst = d / "dst";
  ASSERT_EQ(cli("plan --overspan bf16 " + q(d / "src") + " " + q(dst)).exit_code, 0);
  ASSERT_EQ(cli("convert --plan " + q(dst / ".mx2nv/plan.json") + " --shards 0/2").exit_code, 0);
  auto before = tree(dst);
  // The sequence: a resume with another choice would finish DST
  // under its own options and a later finalize say "already complete".
  for (const std::string& flags : std::vector<std::string>{"--overspan requantize", "--overspan bf16", "", "--window e4m3 --overspan bf16"}) {
    const CliResult r = cli("convert --resume " + flags + " " + q(d / "src") + " " + q(dst));
    EXPECT_EQ(r.exit_code, 2) << flags << r.err;
    EXPECT_TRUE(tree(dst) == before) << flags;
  }
  const CliResult r = cli("convert --resume --overspan requantize " + q(d / "src") + " " + q(dst));
  EXPECT_NE(r.err.find("holds a plan"), std::string::npos) << r.err;
  // Another plan into the same DST (kept elsewhere) is refused too.
  for (const std::string& flags : std::vector<std::string>{"--overspan requantize", "--window e4m3 --overspan bf16"}) {
    const CliResult p = cli("plan " + flags + " " + q(d / "src") + " " + q(dst) + " --plan-out " + q(d / "p2.json"));
    EXPECT_EQ(p.exit_code, 2) << flags << p.err;
    EXPECT_FALSE(fs::exists(d / "p2.json"));
  }
  ASSERT_EQ(cli("convert --plan " + q(dst / ".mx2nv/plan.json") + " --shards 1/2").exit_code, 0);
  ASSERT_EQ(cli("convert --plan " + q(dst / ".mx2nv/plan.json") + " --finalize").exit_code, 0);
  EXPECT_EQ(cli("verify " + q(d / "src") + " " + q(dst)).exit_code, 0);
  before = tree(dst);
  // Retries after the end: the plan is gone; the options given and SRC are still checked.
  for (const std::string& flags : std::vector<std::string>{"--overspan requantize", "--window e4m3", "--window e4m3 --overspan bf16"}) {
    const CliResult f = cli("convert --plan " + q(dst / ".mx2nv/plan.json") + " --finalize " + flags + " --report " +
                            q(d / "r.json"));
    EXPECT_EQ(f.exit_code, 2) << flags << f.err;
    const auto report = nlohmann::json::parse(read_file(d / "r.json"));  // the error report, SRC unknown
    EXPECT_EQ(report["result"], "error");
    EXPECT_EQ(report["exit_code"], 2);
  }
  for (const std::string& flags : std::vector<std::string>{"", "--overspan bf16", "--window marlin"}) {
    const CliResult f = cli("convert --plan " + q(dst / ".mx2nv/plan.json") + " --finalize " + flags);
    EXPECT_EQ(f.exit_code, 0) << flags << f.err;
    EXPECT_NE(f.out.find("already complete"), std::string::npos);
  }
  FixtureSpec other = spec;
  other.seed = 77;
  write_fixture(d / "other", other);
  EXPECT_EQ(cli("convert --plan " + q(dst / ".mx2nv/plan.json") + " --finalize " + q(d / "other")).exit_code, 2);
  EXPECT_TRUE(tree(dst) == before);
  EXPECT_TRUE(tree(d / "src") == src_before);
}

TEST_F(PlannedHostile, StepsOfAnotherConversionAreRefused) {
  const fs::path dst = d / "dst";
  ASSERT_EQ(cli("plan " + q(src()) + " " + q(dst) + " --plan-out " + q(d / "a.json")).exit_code, 0);
  ASSERT_EQ(cli("convert --plan " + q(d / "a.json") + " --shard 0").exit_code, 0);
  const auto before = tree(dst);
  // Another window, another SRC, another mx2nv: each refused, DST as it was.
  FixtureSpec other = spec;
  other.seed = 99;
  write_fixture(d / "other", other);
  for (const std::string& cmd : std::vector<std::string>{"convert --resume --window e4m3 " + q(src()) + " " + q(dst),
        "convert --resume " + q(d / "other") + " " + q(dst),
        "plan --window e4m3 " + q(src()) + " " + q(dst) + " --plan-out " + q(d / "b.json"),
        "plan " + q(d / "other") + " " + q(dst) + " --plan-out " + q(d / "c.json"),
        "plan --window e4m3 " + q(src()) + " " + q(dst)}) {
    const CliResult r = cli(cmd);
    EXPECT_EQ(r.exit_code, 2) << cmd << r.err;
    EXPECT_TRUE(tree(dst) == before) << cmd;
  }
  ASSERT_EQ(cli("plan --window e4m3 " + q(src()) + " " + q(d / "fresh") + " --plan-out " + q(d / "e.json")).exit_code, 0);
  CliResult r = cli("convert --plan " + q(d / "e.json") + " --shard 1 " + q(src()) + " " + q(dst));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("another conversion"), std::string::npos) << r.err;
  EXPECT_TRUE(tree(dst) == before);
  // DST's record of its conversion written by another version.
  const std::string identity = read_file(dst / ".mx2nv/conversion.json");
  write_file(dst / ".mx2nv/conversion.json", with_tool_version(identity, "9.9.9"));
  r = cli("convert --plan " + q(d / "a.json") + " --shard 1");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  write_file(dst / ".mx2nv/conversion.json", "{");
  EXPECT_EQ(cli("convert --plan " + q(d / "a.json") + " --shard 1").exit_code, 2);
  write_file(dst / ".mx2nv/conversion.json", identity);
  // A plan claiming another mx2nv made it.
  fs::copy_file(d / "a.json", d / "forged.json");
  forge(d / "forged.json", src(), [](PlanFile& f) { f.tool_version = "0.0.1"; }, false);
  r = cli("convert --plan " + q(d / "forged.json") + " --shard 1");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("mx2nv 0.0.1"), std::string::npos) << r.err;
  // The same conversion, resumed as a whole: allowed, and the plan's finalize then answers for it.
  ASSERT_EQ(cli("convert --resume " + q(src()) + " " + q(dst)).exit_code, 0);
  const auto finished = tree(dst);
  r = cli("convert --plan " + q(d / "a.json") + " --finalize");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("already complete"), std::string::npos);
  EXPECT_TRUE(tree(dst) == finished);
  // A finished DST written by another version is not "already complete".
  write_file(dst / ".mx2nv/finished.json", with_tool_version(read_file(dst / ".mx2nv/finished.json"), "9.9.9"));
  EXPECT_EQ(cli("convert --plan " + q(d / "a.json") + " --finalize").exit_code, 2);
  EXPECT_EQ(cli("convert --plan " + q(d / "a.json") + " --shards 0/1").exit_code, 2);
}

// --- 6. options a form does not use -----------------------------------------

TEST_F(PlannedHostile, OptionsAPlannedStepDoesNotUseAreRefusedOrHonoured) {
  const fs::path dst = d / "dst";
  ASSERT_EQ(cli("plan " + q(src()) + " " + q(dst)).exit_code, 0);
  const auto before = tree(dst);
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"--shards 0/1 --resume", "--resume is implied"},
      {"--finalize --resume", "--resume is implied"},
      {"--shards 0/1 --window e4m3", "--window e4m3"},
      {"--finalize --window e4m3", "--window e4m3"},
      {"--shards 0/1 --overspan bf16", "--overspan bf16"},
      {"--finalize --overspan requantize", "--overspan requantize"},
      {"--shards 0/1 --html " + q(d / "x.html"), "--html"},
      {"--shard 1 --html " + q(d / "x.html"), "--html"},
      {"", "--plan needs"},
      {"--shard 1 --shards 0/2", ""},
      {"--shard 1 --finalize", ""},
      {"--shards 0/2 --finalize", ""},
  };
  for (const auto& [flags, message] : refused) {
    const CliResult r = cli("convert --plan " + plan_in(dst) + " " + flags);
    EXPECT_EQ(r.exit_code, 2) << flags << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << flags << r.err;
    EXPECT_TRUE(tree(dst) == before) << flags;
  }
  EXPECT_FALSE(fs::exists(d / "x.html"));
  // --shard/--shards/--finalize without --plan are usage errors too.
  for (const std::string& flags : std::vector<std::string>{"--shard 1", "--shards 0/1", "--finalize"}) {
    EXPECT_EQ(cli("convert " + flags + " " + q(src()) + " " + q(d / "y")).exit_code, 2) << flags;
  }
  EXPECT_FALSE(fs::exists(d / "y"));
  // Honoured: the plan's own window and choice, --threads, --progress json,
  // --copy, and --html / --report on finalize.
  CliResult r = cli("convert --plan " + plan_in(dst) +
                    " --shards 0/2 --window marlin --overspan fail --threads 1 --progress json --copy copy");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("\"phase\""), std::string::npos) << r.err;
  r = cli("convert --plan " + plan_in(dst) + " --shards 1/2 --progress never");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = cli("convert --plan " + plan_in(dst) + " --finalize --html " + q(d / "f.html") + " --report " + q(d / "f.json"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(read_file(d / "f.html").starts_with("<!DOCTYPE html>"));
  EXPECT_EQ(nlohmann::json::parse(read_file(d / "f.json"))["result"], "ok");
  EXPECT_TRUE(outputs_of(dst) == reference);
}

// --- 7. --copy reflink is refused before anything is written ----------------

TEST_F(PlannedHostile, CopyReflinkWithoutReflinksIsRefusedBeforeAnyWrite) {
  std::vector<fs::path> roots{d.path()};
  const fs::path tmpfs = d / "tmpfs";
  fs::create_directories(tmpfs);
  const bool mounted = sh("mount -t tmpfs -o size=64m tmpfs " + q(tmpfs));
  if (mounted) roots.push_back(tmpfs);
  for (const auto& root : roots) {
    if (reflinks_possible_at(root)) continue;
    const fs::path dst = root / "dst", plan = root / "plan.json";
    CliResult r = cli("convert --copy reflink " + q(src()) + " " + q(dst));
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("--copy reflink"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(dst));
    ASSERT_EQ(cli("plan " + q(src()) + " " + q(dst) + " --plan-out " + q(plan)).exit_code, 0);
    r = cli("convert --plan " + q(plan) + " --shards 0/2 --copy reflink");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_FALSE(fs::exists(dst)) << "a refused step created DST";
    ASSERT_EQ(cli("convert --plan " + q(plan) + " --shards 0/2").exit_code, 0);
    auto before = tree(dst);
    EXPECT_EQ(cli("convert --plan " + q(plan) + " --shards 1/2 --copy reflink").exit_code, 2);
    EXPECT_TRUE(tree(dst) == before);
    ASSERT_EQ(cli("convert --plan " + q(plan) + " --shards 1/2").exit_code, 0);
    before = tree(dst);
    r = cli("convert --plan " + q(plan) + " --finalize --copy reflink --report " + q(root / "r.json"));
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_TRUE(tree(dst) == before) << "finalize wrote before refusing --copy reflink";
    EXPECT_EQ(nlohmann::json::parse(read_file(root / "r.json"))["result"], "error");
    EXPECT_EQ(cli("convert --resume --copy reflink " + q(src()) + " " + q(dst)).exit_code, 2);
    EXPECT_TRUE(tree(dst) == before);
    ASSERT_EQ(cli("convert --plan " + q(plan) + " --finalize --copy copy").exit_code, 0);
    EXPECT_TRUE(outputs_of(dst) == reference);
  }
  if (mounted) sh("umount " + q(tmpfs));
}

TEST_F(PlannedHostile, CopyReflinkWorksInEveryFormWhereReflinksDo) {
  const fs::path mnt = d / "xfs";
  fs::create_directories(mnt);
  if (!sh("command -v mkfs.xfs") || !sh("truncate -s 320M " + q(d / "image")) ||
      !sh("mkfs.xfs -q -m reflink=1 " + q(d / "image")) || !sh("mount -o loop " + q(d / "image") + " " + q(mnt))) {
    GTEST_SKIP() << "cannot loop-mount an XFS image here (needs root, loop devices and xfsprogs)";
  }
  fs::copy(src(), mnt / "src", fs::copy_options::recursive);
  const fs::path dst = mnt / "dst";
  EXPECT_EQ(cli("plan " + q(mnt / "src") + " " + q(dst)).exit_code, 0);
  EXPECT_EQ(cli("convert --plan " + plan_in(dst) + " --shards 0/1 --copy reflink").exit_code, 0);
  EXPECT_EQ(cli("convert --plan " + plan_in(dst) + " --finalize --copy reflink").exit_code, 0);
  EXPECT_TRUE(outputs_of(dst) == reference);
  EXPECT_EQ(cli("convert --copy reflink " + q(mnt / "src") + " " + q(mnt / "whole")).exit_code, 0);
  sh("umount " + q(mnt));
}

// --- 8. forged plans --------------------------------------------------------

TEST_F(PlannedHostile, AForgedPlanNeverMakesAStepWriteWhatVerifyRejects) {
  const SourceCheckpoint source = open_source_checkpoint(src(), 1, IndexNames::Drop);
  const auto& modules = source.modules.modules;
  // A module with active groups whose tensors are all in one shard.
  std::size_t target = 0;
  while (target < modules.size() && modules[target].packed_shard != modules[target].scale_shard) ++target;
  ASSERT_LT(target, modules.size());
  const std::size_t shard = modules[target].scale_shard;
  std::size_t other_shard = 0;
  while (other_shard == shard) ++other_shard;
  struct Case {
    std::string name;
    std::function<void(PlanFile&)> edit;
    bool refingerprint;
    int exit_code;
  };
  const auto row = [target](PlanFile& f) -> ModulePlan& { return f.modules[target]; };
  const std::vector<Case> cases = {
      {"m+1, global consistent", [&](PlanFile& f) { row(f).m += 1; row(f).divisor = *global_divisor_for(row(f).m); }, true, 3},
      {"m-1, global consistent", [&](PlanFile& f) { row(f).m -= 1; row(f).divisor = *global_divisor_for(row(f).m); }, true, 3},
      {"m+1, global stale", [&](PlanFile& f) { row(f).m += 1; }, true, 3},
      {"global halved", [&](PlanFile& f) { row(f).divisor /= 2; }, true, 3},
      {"zero scales", [&](PlanFile& f) { row(f).zero_scales = true; }, true, 3},
      {"span", [&](PlanFile& f) { row(f).span += 1; }, true, 3},
      {"canonicalised count", [&](PlanFile& f) { row(f).canonical_zero_groups += 1; }, true, 3},
      {"Marlin-zeroed count", [&](PlanFile& f) { row(f).marlin_zeroed_groups += 1; }, true, 3},
      {"BF16 though it fits", [&](PlanFile& f) {
         f.over_span_choice = OverSpanChoice::Bf16;
         row(f) = ModulePlan{Treatment::Bf16, 0, 1.0f, false, row(f).span, 0, 0, 0};
       }, true, 3},
      {"requantized though it fits", [&](PlanFile& f) {
         f.over_span_choice = OverSpanChoice::Requantize;
         row(f) = ModulePlan{Treatment::Requantized, 0, 3.0f, false, row(f).span, 0, 0, 0};
       }, true, 3},
      {"BF16 in a plan that fails", [&](PlanFile& f) { row(f).treatment = Treatment::Bf16; }, true, 3},
      {"a shard's fingerprint", [&](PlanFile& f) { f.shards[shard].plan_hash ^= 1; }, false, 3},
      {"a shard's output size", [&](PlanFile& f) { f.shards[shard].output_data_bytes += 16; }, false, 3},
      {"a shard's tensor count", [&](PlanFile& f) { f.shards[shard].output_tensors -= 1; }, false, 3},
      {"a relative DST", [&](PlanFile& f) { f.target = "relative/dst"; }, false, 3},
      {"the tool version", [&](PlanFile& f) { f.tool_version = "99.0"; }, false, 2},
      {"the choice, where nothing needs it", [&](PlanFile& f) { f.over_span_choice = OverSpanChoice::Bf16; }, true, 0},
  };
  int k = 0;
  for (const auto& c : cases) {
    // A plan kept outside a DST not created yet: the rows are what a step
    // checks first (a plan kept in DST would be refused sooner, as another
    // conversion than the one DST records, where a forged row changes the
    // conversion's mode).
    const fs::path dst = d / ("forged" + std::to_string(k)), plan = d / ("forged" + std::to_string(k) + ".json");
    ++k;
    ASSERT_EQ(cli("plan " + q(src()) + " " + q(dst) + " --plan-out " + q(plan)).exit_code, 0);
    forge(plan, src(), c.edit, c.refingerprint);
    const CliResult r = cli("convert --plan " + q(plan) + " --shard " + std::to_string(shard));
    EXPECT_EQ(r.exit_code, c.exit_code) << c.name << "\n" << r.err;
    if (r.exit_code != 0) {
      EXPECT_FALSE(fs::exists(dst)) << c.name << ": a refused step wrote";
      continue;
    }
    // Accepted: then it is a plan verify accepts the result of.
    ASSERT_EQ(cli("convert --plan " + q(plan) + " --shards 0/1").exit_code, 0) << c.name;
    ASSERT_EQ(cli("convert --plan " + q(plan) + " --finalize").exit_code, 0) << c.name;
    EXPECT_EQ(cli("verify " + q(src()) + " " + q(dst)).exit_code, 0) << c.name;
  }
  {  // In a DST that records its conversion, a forged mode is another conversion.
    const fs::path dst = d / "recorded";
    ASSERT_EQ(cli("plan " + q(src()) + " " + q(dst)).exit_code, 0);
    forge(dst / ".mx2nv/plan.json", src(), cases[8].edit);
    const auto before = tree(dst);
    const CliResult r = cli("convert --plan " + plan_in(dst) + " --shards 0/1");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_TRUE(tree(dst) == before);
  }
  // A forged row is the business of the steps that write its module only.
  const fs::path dst = d / "scoped";
  ASSERT_EQ(cli("plan " + q(src()) + " " + q(dst)).exit_code, 0);
  forge(dst / ".mx2nv/plan.json", src(), [&](PlanFile& f) {
    row(f).m += 1;
    row(f).divisor = *global_divisor_for(row(f).m);
  });
  EXPECT_EQ(cli("convert --plan " + plan_in(dst) + " --shard " + std::to_string(other_shard)).exit_code,
            modules[target].packed_shard == other_shard ? 3 : 0);
  const CliResult r = cli("convert --plan " + plan_in(dst) + " --shard " + std::to_string(shard));
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(r.err.find(std::string(modules[target].name)), std::string::npos) << r.err;
  EXPECT_EQ(cli("convert --plan " + plan_in(dst) + " --finalize").exit_code, 2);  // that shard is not finished
  EXPECT_FALSE(fs::exists(dst / "model.safetensors.index.json"));
}

// A step reads every shard's rows, so damage anywhere is refused, in the
// rows of a shard the step leaves to others too; a shard's fingerprint
// forged with the checksum made to agree is the business of the steps that
// convert that shard and of finalize, which checks every shard.
TEST_F(PlannedHostile, DamageAnywhereIsRefusedAndAForgedShardByItsOwnStepsAndFinalize) {
  const SourceCheckpoint source = open_source_checkpoint(src(), 1, IndexNames::Drop);
  const std::size_t last = source.checkpoint.shards.size() - 1;
  ASSERT_GT(last, 0u);
  std::size_t module = 0;
  while (module < source.modules.modules.size() && source.modules.modules[module].packed_shard != last) ++module;
  ASSERT_LT(module, source.modules.modules.size());
  const std::string row = "[\"" + std::string(source.modules.modules[module].name) + "\",";
  {  // One digit of a row of the last shard's module, the checksum as it was.
    const fs::path dst = d / "damaged-row";
    ASSERT_EQ(cli("plan " + q(src()) + " " + q(dst)).exit_code, 0);
    const fs::path plan = dst / ".mx2nv/plan.json";
    std::string text = read_file(plan);
    const std::size_t at = text.find(row);
    ASSERT_NE(at, std::string::npos) << row;
    const std::size_t digit = text.find_first_of("0123456789", at + row.size());
    text[digit] = text[digit] == '9' ? '8' : static_cast<char>(text[digit] + 1);
    write_file(plan, text);
    const auto before = tree(dst);
    const CliResult r = cli("convert --plan " + plan_in(dst) + " --shard 0");
    EXPECT_EQ(r.exit_code, 3) << r.err;
    EXPECT_NE(r.err.find("checksum mismatch"), std::string::npos) << r.err;
    EXPECT_TRUE(tree(dst) == before);
  }
  // The last shard's fingerprint forged, the checksum made to agree.
  const fs::path dst = d / "forged-shard";
  ASSERT_EQ(cli("plan " + q(src()) + " " + q(dst)).exit_code, 0);
  forge(dst / ".mx2nv/plan.json", src(), [&](PlanFile& f) { f.shards[last].plan_hash ^= 1; }, false);
  const auto before = tree(dst);
  const CliResult mine = cli("convert --plan " + plan_in(dst) + " --shard " + std::to_string(last));
  EXPECT_EQ(mine.exit_code, 3) << mine.err;
  EXPECT_NE(mine.err.find("does not match the plan's own fingerprint"), std::string::npos) << mine.err;
  EXPECT_TRUE(tree(dst) == before);
  EXPECT_EQ(cli("convert --plan " + plan_in(dst) + " --shards 0/" + std::to_string(last + 1)).exit_code, 0);
  const CliResult all = cli("convert --plan " + plan_in(dst) + " --shards 0/1");
  EXPECT_EQ(all.exit_code, 3) << all.err;
  const CliResult finalize = cli("convert --plan " + plan_in(dst) + " --finalize");
  EXPECT_EQ(finalize.exit_code, 3) << finalize.err;
  EXPECT_NE(finalize.err.find("does not match the plan's own fingerprint"), std::string::npos) << finalize.err;
  EXPECT_FALSE(fs::exists(dst / "model.safetensors.index.json"));
}

TEST(PlannedForgery, RewrittenModulesAreCheckedAgainstSrcToo) {
  ScratchDir d;
  const FixtureSpec spec = spec_with_over_span();
  write_fixture(d / "src", spec);
  const auto src_before = tree(d / "src");
  const SourceCheckpoint source = open_source_checkpoint(d / "src", 1, IndexNames::Drop);
  const std::string over = fixture_module_name(spec, 1, 2, 2);
  const std::size_t module = *source.modules.find(over);
  struct Case {
    std::string flags;  // what the plan was made with
    std::function<void(PlanFile&)> edit;
  };
  // A stored second-level scale one bit off what the layout's quantizer gives.
  const auto next_up = [&](PlanFile& f) {
    f.modules[module].divisor = std::nextafter(f.modules[module].divisor, 1e30f);
  };
  const std::vector<Case> cases = {
      {"--overspan requantize", [&](PlanFile& f) { f.modules[module].divisor *= 2; }},
      {"--overspan requantize", [&](PlanFile& f) { f.modules[module] = ModulePlan{}; f.modules[module].m = 0; }},
      {"--overspan requantize --format modelopt", next_up},
      {"--requantize --format modelopt", next_up},
      {"--requantize", next_up},
      {"--overspan bf16", [&](PlanFile& f) {
         // Only the refused module as BF16, not its whole layer.
         for (std::size_t i = 0; i < f.modules.size(); ++i) {
           if (i != module && f.modules[i].treatment == Treatment::Bf16) {
             f.modules[i] = ModulePlan{};
             f.modules[i].divisor = 1.0f;
           }
         }
       }},
  };
  int k = 0;
  for (const auto& c : cases) {
    const fs::path dst = d / ("dst" + std::to_string(k)), plan = d / ("plan" + std::to_string(k) + ".json");
    ++k;
    ASSERT_EQ(cli("plan " + c.flags + " " + q(d / "src") + " " + q(dst) + " --plan-out " + q(plan)).exit_code, 0);
    forge(plan, d / "src", c.edit);
    for (const std::string& step : std::vector<std::string>{"--shards 0/1", "--finalize"}) {
      const CliResult r = cli("convert --plan " + q(plan) + " " + step);
      EXPECT_EQ(r.exit_code, step == "--finalize" ? 2 : 3) << c.flags << r.err;  // finalize: no shard is finished
      EXPECT_FALSE(fs::exists(dst));
    }
  }
  EXPECT_TRUE(tree(d / "src") == src_before);
}

// --- plans at and past their caps --------------------------------------------

struct Measured {
  int exit_code = -1;
  std::string err;
  long rss_kib = 0;  // the command's peak RSS (wait4)
};

Measured run_measured(const std::vector<std::string>& args) {
  ScratchDir io;
  std::vector<std::string> argv_s{MX2NV_EXE};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string err_path = (io / "err").string();
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, MX2NV_EXE, &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0 || pid <= 0) std::abort();
  int status = 0;
  rusage usage {};
  ::wait4(pid, &status, 0, &usage);
  Measured m;
  m.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  m.err = read_file(io / "err");
  m.rss_kib = usage.ru_maxrss;
  return m;
}

// A plan is input: what it claims is capped before anything is allocated
// for it (the file's size, its shards, its module rows, the length of a path
// or of any string), a message quotes at most an excerpt of what it holds,
// and memory stays bounded whatever it claims (it used to be read into a DOM:
// 1.05 GiB for a 10 MB path, 1.8 GiB for 1.2M rows).
TEST_F(PlannedHostile, PlansAreCappedBeforeAllocationAndReadInBoundedMemory) {
  const fs::path plan = d / "plan.json", dst = d / "dst";
  ASSERT_EQ(cli("plan " + q(src()) + " " + q(dst) + " --plan-out " + q(plan)).exit_code, 0);
  const PlanFile good = plan_file_from_text(read_file(plan), "good");
  const auto resigned = [&](const std::function<void(PlanFile&)>& edit) {
    PlanFile f = good;
    edit(f);
    return plan_file_to_text(f);
  };
  struct Case {
    std::string name;
    std::function<void()> write;
    int exit_code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"a DST longer than PATH_MAX",
       [&] { write_file(plan, resigned([](PlanFile& f) { f.target = "/" + std::string(kMaxPlanPathBytes, 'x'); })); },
       3, "longer than"},
      {"module rows past the cap",
       [&] {
         write_file(plan, resigned([](PlanFile& f) {
           const ModulePlan row = f.modules.front();
           f.module_names.clear();
           f.modules.assign(kMaxPlanModules + 1, row);
           for (std::size_t i = 0; i <= kMaxPlanModules; ++i) f.module_names.push_back("m." + std::to_string(i));
         }));
       },
       3, fmt::format("more than {} module rows", kMaxPlanModules)},
      {"shards past the cap",
       [&] {
         write_file(plan, resigned([](PlanFile& f) {
           const PlannedShard shard = f.shards.front();
           f.shards.clear();
           for (std::size_t i = 0; i <= kMaxPlanShards; ++i) {
             f.shards.push_back(shard);
             f.shards.back().file = "s" + std::to_string(i) + ".safetensors";
           }
         }));
       },
       3, fmt::format("more than {} shards", kMaxPlanShards)},
      {"a member of 3 MiB, unknown",
       [&] {
         std::string text = read_file(d / "good.json");
         text.insert(text.find('{') + 1, "\"" + std::string(3 << 20, 'k') + "\": 1,");
         write_file(plan, text);
       },
       3, "is not a field of a plan"},
      {"a module name of 3 MiB, signed",
       [&] { write_file(plan, resigned([](PlanFile& f) { f.module_names.front() = std::string(3 << 20, 'n'); })); },
       2, "other quantized modules"},
      {"a file past the cap",
       [&] {
         write_file(plan, read_file(d / "good.json"));
         fs::resize_file(plan, kMaxPlanBytes + 1);  // sparse: nothing of it is read
       },
       3, fmt::format("more than the {} a plan may have", kMaxPlanBytes)},
  };
  fs::copy_file(plan, d / "good.json");
  // ~40 MB at the module rows' cap; under AddressSanitizer the shadow memory counts too.
  const long rss_limit_kib = (std::getenv("ASAN_OPTIONS") != nullptr ? 1536 : 128) * 1024;
  for (const auto& c : cases) {
    c.write();
    for (const char* step : {"--shards", "--finalize"}) {
      std::vector<std::string> args{"convert", "--plan", plan.string()};
      args.push_back(step);
      if (std::string(step) == "--shards") args.push_back("0/1");
      const Measured r = run_measured(args);
      EXPECT_EQ(r.exit_code, c.exit_code) << c.name << " " << step << ": " << r.err.substr(0, 300);
      EXPECT_NE(r.err.find(c.message), std::string::npos) << c.name << ": " << r.err.substr(0, 300);
      EXPECT_LT(r.err.size(), 2048u) << c.name;  // an excerpt at most, never the hostile text
      EXPECT_EQ(r.err.find("internal error"), std::string::npos) << c.name;
      EXPECT_LT(r.rss_kib, rss_limit_kib) << c.name << " " << step;
      EXPECT_FALSE(fs::exists(dst)) << c.name;
    }
  }
  // The plan as mx2nv writes it still reads back, and converts.
  fs::copy_file(d / "good.json", plan, fs::copy_options::overwrite_existing);
  ASSERT_EQ(cli("convert --plan " + q(plan) + " --shards 0/1").exit_code, 0);
  ASSERT_EQ(cli("convert --plan " + q(plan) + " --finalize").exit_code, 0);
  EXPECT_TRUE(outputs_of(dst) == reference);
}

}  // namespace
}  // namespace mx2nv::e2e

// mx2nv card: the model card from a verify report, its refusals, and the
// commands that must not be confused by a carded DST (verify, convert
// --resume).
#include "e2e_support.hpp"
#include "fixture/fixture.hpp"

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <csignal>
#include <cstdlib>
#include <thread>

namespace mx2nv::e2e {
namespace {

using nlohmann::json;

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

const std::string kSourceReadme =
    "---\nlicense: other\nlicense_name: \"d\xC3\xA9mo-license\"\nlibrary_name: transformers\nlanguage:\n- en\n- zh\n"
    "tags:\n- mxfp4\nwidget:\n- text: \"Hello\"\nnote: \"a value with --- inside\"\n---\n\n# The source's card\n";

// SRC with a README.md, converted and verified: the inputs of `card`.
struct Carded {
  ScratchDir d;
  fs::path src = d / "src", dst = d / "dst", report = d / "v.json";
  explicit Carded(const std::string& readme = kSourceReadme, const std::string& convert_options = "") {
    write_fixture(src, tiny_spec());
    if (!readme.empty()) write_file(src / "README.md", readme);
    EXPECT_EQ(run_cli("convert " + convert_options + " " + q(src) + " " + q(dst)).exit_code, 0);
    const CliResult v = run_cli("verify " + q(src) + " " + q(dst) + " --report " + q(report));
    EXPECT_EQ(v.exit_code, 0) << v.err;
  }
  CliResult card(const std::string& extra = "") const {
    return run_cli("card " + q(src) + " " + q(dst) + " --verify-report " + q(report) + " " + extra);
  }
};

TEST(Card, WritesTheCardKeepsTheSourceCardAndVerifyStillPasses) {
  Carded c;
  const json report = json::parse(read_file(c.report));
  ASSERT_TRUE(report.contains("fingerprint"));
  const CliResult r = c.card("--base-model example-org/K3-demo-MXFP4 --repo-id example-org/K3-demo-NVFP4A16");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string card = read_file(c.dst / "README.md");
  EXPECT_EQ(read_file(c.dst / "README.source.md"), kSourceReadme);
  EXPECT_EQ(card.rfind("---\nbase_model: \"example-org/K3-demo-MXFP4\"\nbase_model_relation: \"quantized\"\n"
                      "license: \"other\"\nlicense_name: \"d\\xE9mo-license\"\n", 0), 0u) << card;
  EXPECT_NE(card.find(fmt::format("| Values compared | {} |", report["values_compared"].get<std::uint64_t>())),
            std::string::npos);
  EXPECT_NE(card.find(fmt::format("| Quantized modules | {} |", report["counts"]["modules"].get<std::uint64_t>())),
            std::string::npos);
  EXPECT_NE(card.find("vllm serve example-org/K3-demo-NVFP4A16 --tensor-parallel-size 1"), std::string::npos);
  EXPECT_EQ(card.find(c.d.path().string()), std::string::npos) << "no local path in a published card";
  const json record = json::parse(read_file(c.dst / ".mx2nv/card.json"));
  EXPECT_EQ(record["format"], "mx2nv-card/1");
  EXPECT_EQ(record["card_bytes"], card.size());

  // verify still passes, and card again (same inputs) writes the same bytes.
  const CliResult v = run_cli("verify " + q(c.src) + " " + q(c.dst));
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
  ASSERT_EQ(c.card("--base-model example-org/K3-demo-MXFP4 --repo-id example-org/K3-demo-NVFP4A16").exit_code, 0);
  EXPECT_EQ(read_file(c.dst / "README.md"), card);

  // convert --resume answers "already complete" and leaves the card alone.
  const CliResult resume = run_cli("convert " + q(c.src) + " " + q(c.dst) + " --resume");
  EXPECT_EQ(resume.exit_code, 0) << resume.out << resume.err;
  EXPECT_EQ(read_file(c.dst / "README.md"), card);
  EXPECT_TRUE(fs::exists(c.dst / ".mx2nv/card.json"));

  // A changed SRC README.md is a difference verify reports.
  write_file(c.src / "README.md", kSourceReadme + "edited\n");
  EXPECT_EQ(run_cli("verify " + q(c.src) + " " + q(c.dst)).exit_code, 1);
}

// The SGLang commands of a card (lines of its sh blocks).
std::vector<std::string> sglang_commands(const std::string& card) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while ((at = card.find("python -m sglang.launch_server", at)) != std::string::npos) {
    const std::size_t start = card.rfind('\n', at) + 1;
    out.push_back(card.substr(start, card.find('\n', at) - start));
    at = card.find('\n', at);
  }
  return out;
}

// Whether gate says SGLang's Marlin runs DST at TP 1 in `dtype`.
bool sglang_marlin_runs(const fs::path& dst, const std::string& dtype) {
  const CliResult g = run_cli("gate " + q(dst) + " --runtime all --dtype both --tp 1 --ask-runtimes never --json");
  const json gate = json::parse(g.out);  // named: a range-for over a temporary's member reads freed memory
  for (const auto& v : gate["verdicts"]) {
    if (v["runtime"] == "sglang" && v["backend"] == "marlin" && v["dtype"] == dtype && v["verdict"] == "RUN") return true;
  }
  return false;
}

// A ModelOpt DST's card says so, from DST's finished record and config: the
// tag, the Format row, the summary, convert's --format, and SGLang's runner.
TEST(Card, FollowsAModelOptDestination) {
  Carded c(kSourceReadme, "--format modelopt");
  const CliResult r = c.card();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string card = read_file(c.dst / "README.md");
  EXPECT_NE(card.find("tags:\n- \"nvfp4\"\n- \"modelopt\"\n- \"mx2nv\"\n---\n"), std::string::npos) << card;
  EXPECT_EQ(card.find("compressed-tensors"), std::string::npos) << card;
  EXPECT_NE(card.find("| Format | ModelOpt `W4A16_NVFP4` (`weight`, `weight_scale`, `weight_scale_2`) |"),
            std::string::npos) << card;
  EXPECT_NE(card.find("transcoded to ModelOpt W4A16_NVFP4 by mx2nv"), std::string::npos) << card;
  EXPECT_NE(card.find("an exact FP32 multiplier (`weight_scale_2`)"), std::string::npos) << card;
  EXPECT_NE(card.find("\nmx2nv convert SRC DST --window marlin --format modelopt\n"), std::string::npos) << card;
  // Every SGLang command names the weight-only Marlin runner (SGLang's `auto`
  // picks a W4A4 runner on Blackwell); one per dtype gate says RUN.
  for (const auto& line : sglang_commands(card)) {
    EXPECT_NE(line.find(" --moe-runner-backend "), std::string::npos) << line;
  }
  for (const auto& [dtype, flag] : {std::pair<std::string, std::string>{"bf16", "bfloat16"}, {"fp16", "float16"}}) {
    const std::string want = "--tp-size 1 --dtype " + flag + " --moe-runner-backend marlin";
    EXPECT_EQ(card.find(want) != std::string::npos, sglang_marlin_runs(c.dst, dtype)) << dtype << "\n" << card;
  }
  const json record = json::parse(read_file(c.dst / ".mx2nv/card.json"));
  EXPECT_EQ(record["card_bytes"], card.size());
  EXPECT_EQ(run_cli("verify " + q(c.src) + " " + q(c.dst)).exit_code, 0);

  // A finished record that names another format than the config: exit 3, nothing written.
  const std::string finished = read_file(c.dst / ".mx2nv/finished.json");
  const std::size_t at = finished.find("\"marlin@modelopt\"");
  ASSERT_NE(at, std::string::npos) << finished;
  write_file(c.dst / ".mx2nv/finished.json", finished.substr(0, at) + "\"marlin\"" + finished.substr(at + 17));
  const auto before = snapshot(c.dst);
  const CliResult mixed = c.card();
  EXPECT_EQ(mixed.exit_code, 3) << mixed.err;
  EXPECT_NE(mixed.err.find("finished record says format compressed-tensors, its config says modelopt"),
            std::string::npos) << mixed.err;
  EXPECT_EQ(snapshot(c.dst), before);
}

// A compressed-tensors DST's card is the one it always was: its tag, Format
// row, summary and commands, nothing of ModelOpt.
TEST(Card, CompressedTensorsCardIsUnchanged) {
  Carded c;
  ASSERT_EQ(c.card().exit_code, 0);
  const std::string card = read_file(c.dst / "README.md");
  EXPECT_NE(card.find("tags:\n- \"nvfp4\"\n- \"compressed-tensors\"\n- \"mx2nv\"\n---\n"), std::string::npos) << card;
  EXPECT_NE(card.find("| Format | `compressed-tensors` `nvfp4-pack-quantized` (NVFP4A16) |"), std::string::npos);
  EXPECT_NE(card.find("transcoded to compressed-tensors NVFP4A16 by mx2nv"), std::string::npos);
  EXPECT_NE(card.find("re-expressed as an FP8 E4M3 scale and an FP32 global: `mx2nv verify`"), std::string::npos);
  EXPECT_NE(card.find(" FP32 global scales (one per module; a gate/up pair shares one) |"), std::string::npos);
  EXPECT_NE(card.find("\nmx2nv convert SRC DST --window marlin\n"), std::string::npos) << card;
  // (gate's reasons may name ModelOpt; the card's own words never do here)
  EXPECT_EQ(card.find("- \"modelopt\""), std::string::npos);
  EXPECT_EQ(card.find("--format"), std::string::npos);
  EXPECT_EQ(card.find("W4A16_NVFP4 by"), std::string::npos);
  EXPECT_EQ(card.find("`weight_scale_2`"), std::string::npos);
  EXPECT_EQ(card.find("--moe-runner-backend"), std::string::npos);
  EXPECT_EQ(card.find("SGLang's MoE runner"), std::string::npos);
  if (sglang_marlin_runs(c.dst, "bf16")) {
    EXPECT_NE(card.find("python -m sglang.launch_server --model-path \"$MODEL\" --tp-size 1 --dtype bfloat16"),
              std::string::npos) << card;
  }
}

TEST(Card, RefusesWhatTheReportDoesNotProve) {
  Carded c;
  const std::string before = read_file(c.dst / "README.md");
  const json good = json::parse(read_file(c.report));
  const auto refused = [&](const json& report, const std::string& why) {
    write_file(c.d / "r.json", report.dump());
    const CliResult r = run_cli("card " + q(c.src) + " " + q(c.dst) + " --verify-report " + q(c.d / "r.json"));
    EXPECT_EQ(r.exit_code, 2) << why << ": " << r.err;
    EXPECT_EQ(read_file(c.dst / "README.md"), before) << why;
    EXPECT_FALSE(fs::exists(c.dst / ".mx2nv/card.json")) << why;
    EXPECT_FALSE(fs::exists(c.dst / "README.source.md")) << why;
  };
  json bad = good;
  bad["result"] = "mismatch";
  refused(bad, "failing report");
  bad = good;
  bad["mismatches"] = 1;
  refused(bad, "mismatches");
  bad = good;
  bad["provenance"]["tool_version"] = "0.0.1";
  refused(bad, "another version");
  bad = good;
  bad["provenance"]["target"] = (c.d / "elsewhere").string();
  refused(bad, "another DST");
  bad = good;
  bad.erase("fingerprint");
  refused(bad, "no fingerprint");
  bad = good;
  bad["command"] = "convert";
  refused(bad, "not a verify report");
  bad = good;
  bad["shard_subset"] = "0/2";
  refused(bad, "a part");

  // A report of another DST of the same SRC: the bytes agree, the identity does not.
  ASSERT_EQ(run_cli("convert " + q(c.src) + " " + q(c.d / "dst2")).exit_code, 0);
  ASSERT_EQ(run_cli("verify " + q(c.src) + " " + q(c.d / "dst2") + " --report " + q(c.d / "v2.json")).exit_code, 0);
  refused(json::parse(read_file(c.d / "v2.json")), "report of another DST");

  // DST changed after verify: a companion edited, then a shard rewritten in place with its mtime restored.
  write_file(c.dst / "generation_config.json", read_file(c.dst / "generation_config.json") + " ");
  refused(good, "DST companion changed after verify");
  const CliResult again = run_cli("verify " + q(c.src) + " " + q(c.dst) + " --report " + q(c.report));
  EXPECT_EQ(again.exit_code, 1);  // (the edit is a difference for verify too)
  EXPECT_EQ(run_cli("card " + q(c.src) + " " + q(c.dst) + " --verify-report " + q(c.report)).exit_code, 2);
}

TEST(Card, ShardRewrittenAfterVerifyIsRefused) {
  Carded c;
  const fs::path shard = c.dst / "model-00001-of-00003.safetensors";
  const auto mtime = fs::last_write_time(shard);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  write_file(shard, read_file(shard));  // same bytes, same size: a new ctime
  fs::last_write_time(shard, mtime);
  const CliResult r = c.card();
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("DST changed since verify"), std::string::npos) << r.err;
  // A fresh verify makes the card possible again.
  ASSERT_EQ(run_cli("verify " + q(c.src) + " " + q(c.dst) + " --report " + q(c.report)).exit_code, 0);
  EXPECT_EQ(c.card().exit_code, 0);
}

TEST(Card, HostileSourceCardGivesACardWithoutInheritedFields) {
  Carded c("---\nlicense: [mit\nlibrary_name: transformers\n---\n# broken\n");
  const CliResult r = c.card();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("front matter is not valid YAML"), std::string::npos) << r.err;
  const std::string card = read_file(c.dst / "README.md");
  EXPECT_EQ(card.rfind("---\ntags:\n- \"nvfp4\"\n", 0), 0u) << card;
  EXPECT_NE(card.find("could not be read"), std::string::npos);
  EXPECT_EQ(run_cli("verify " + q(c.src) + " " + q(c.dst)).exit_code, 0);
}

TEST(Card, WithoutSourceReadme) {
  Carded c("");
  const CliResult r = c.card();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::exists(c.dst / "README.source.md"));
  EXPECT_NE(read_file(c.dst / "README.md").find("The source has no README.md; nothing was inherited."), std::string::npos);
  const CliResult v = run_cli("verify " + q(c.src) + " " + q(c.dst));
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
}

TEST(Card, OptionsRefused) {
  Carded c;
  EXPECT_EQ(run_cli("card " + q(c.src) + " " + q(c.dst)).exit_code, 2);
  EXPECT_EQ(c.card("--base-model 'a--b/c'").exit_code, 2);
  EXPECT_EQ(c.card("--companion org/name@main").exit_code, 2);
  EXPECT_EQ(c.card("--repo-id /abs").exit_code, 2);
  EXPECT_EQ(c.card("--requantize-report " + q(c.report)).exit_code, 2);
  EXPECT_FALSE(fs::exists(c.dst / ".mx2nv/card.json"));
}


// DST before its first card: SRC's README.md as convert copied it.
void uncard(const Carded& c) {
  fs::remove(c.dst / "README.source.md");
  fs::remove(c.dst / ".mx2nv/card.json");
  write_file(c.dst / "README.md", read_file(c.src / "README.md"));
}

std::vector<std::string> card_temporaries(const fs::path& dst) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dst)) {
    if (e.path().filename().string().starts_with(".mx2nv-tmp.")) out.push_back(fs::relative(e.path(), dst).string());
  }
  return out;
}

// Killed at its N-th write step (lock file, temporary created, written,
// synced, renamed, directory synced), for every N, from an uncarded and from
// a carded DST: verify, gate and convert --resume take what is left as
// card's, and the next card leaves DST as a clean run does.
TEST(Card, KilledAtEveryWriteIsFinishedByTheNextRun) {
  Carded c;
  ASSERT_EQ(c.card().exit_code, 0);
  const auto clean = snapshot(c.dst);
  ASSERT_FALSE(fs::exists(c.dst / ".mx2nv/lock"));
  for (const bool carded_before : {false, true}) {
    std::size_t killed = 0;
    for (int n = 1; n < 64; ++n) {
      if (!carded_before) uncard(c);
      ::setenv("MX2NV_TEST_CARD_KILL_AT", std::to_string(n).c_str(), 1);
      const CliResult k = c.card();
      ::unsetenv("MX2NV_TEST_CARD_KILL_AT");
      if (k.exit_code == 0) break;  // past its last write
      // Killed: the shell run_cli starts reports 128 + SIGKILL.
      ASSERT_TRUE(k.exit_code == 128 + SIGKILL || k.exit_code == -1) << "step " << n << ": " << k.exit_code << k.err;
      ++killed;
      const std::string at = fmt::format("killed at step {} ({})", n, carded_before ? "carded" : "uncarded");
      // What is left is card's: never "not a valid checkpoint".
      const CliResult v = run_cli("verify " + q(c.src) + " " + q(c.dst));
      EXPECT_TRUE(v.exit_code == 0 || v.exit_code == 1) << at << ": " << v.out << v.err;
      EXPECT_EQ(v.err.find("not a valid checkpoint"), std::string::npos) << at;
      EXPECT_EQ(v.err.find("temporary file"), std::string::npos) << at << ": " << v.err;
      const CliResult g = run_cli("gate " + q(c.dst) + " --ask-runtimes never");
      EXPECT_NE(g.exit_code, 3) << at << ": " << g.err;
      EXPECT_NE(g.exit_code, 4) << at << ": " << g.err;
      // The next card finishes it exactly as a clean run would.
      const CliResult again = c.card();
      ASSERT_EQ(again.exit_code, 0) << at << ": " << again.err;
      EXPECT_EQ(snapshot(c.dst), clean) << at;
      EXPECT_EQ(card_temporaries(c.dst), std::vector<std::string>{}) << at;
      EXPECT_EQ(run_cli("verify " + q(c.src) + " " + q(c.dst)).exit_code, 0) << at;
    }
    EXPECT_GE(killed, 16u) << "every write step was reached";
  }
  // convert --resume on a DST a killed card left: complete, its temporaries tidied.
  for (int n = 1; n < 17; ++n) {
    ::setenv("MX2NV_TEST_CARD_KILL_AT", std::to_string(n).c_str(), 1);
    const int killed_run = c.card().exit_code;
    ::unsetenv("MX2NV_TEST_CARD_KILL_AT");
    ASSERT_TRUE(killed_run == 128 + SIGKILL || killed_run == -1) << "step " << n;
    const CliResult resume = run_cli("convert " + q(c.src) + " " + q(c.dst) + " --resume");
    EXPECT_EQ(resume.exit_code, 0) << n << ": " << resume.out << resume.err;
    EXPECT_EQ(card_temporaries(c.dst), std::vector<std::string>{}) << "step " << n;
    EXPECT_FALSE(fs::exists(c.dst / ".mx2nv/lock")) << "step " << n;
    ASSERT_EQ(c.card().exit_code, 0);
  }
}

// Every path card opens or writes in DST, planted as a symlink, a hard link,
// a directory or a FIFO: refused as convert refuses them (exit 2), nothing
// written, nothing outside DST touched.
TEST(Card, PlantedLinksAndSpecialFilesAreRefused) {
  Carded c;
  ASSERT_EQ(c.card().exit_code, 0);
  const fs::path outside = c.d / "outside.txt";
  write_file(outside, "not DST's\n");
  const auto before = snapshot(c.dst);
  const std::vector<std::string> paths = {".mx2nv/lock", "README.md", "README.source.md", ".mx2nv/card.json",
                                          ".mx2nv-tmp.card.README.md", ".mx2nv-tmp.card.README.source.md",
                                          ".mx2nv/.mx2nv-tmp.card.card.json"};
  for (const auto& rel : paths) {
    for (const std::string kind : {"symlink", "hardlink", "directory", "fifo"}) {
      const fs::path p = c.dst / rel;
      const std::string saved = fs::exists(fs::symlink_status(p)) ? read_file(p) : std::string();
      const bool existed = fs::exists(fs::symlink_status(p));
      fs::remove(p);
      if (kind == "symlink") fs::create_symlink(outside, p);
      if (kind == "hardlink") fs::create_hard_link(outside, p);
      if (kind == "directory") fs::create_directory(p);
      if (kind == "fifo") {
        ASSERT_EQ(::mkfifo(p.c_str(), 0644), 0);
      }
      const CliResult r = c.card();
      EXPECT_EQ(r.exit_code, 2) << rel << " " << kind << ": " << r.err;
      EXPECT_NE(r.err.find("DST"), std::string::npos) << r.err;
      EXPECT_EQ(read_file(outside), "not DST's\n");
      fs::remove(p);
      if (existed) write_file(p, saved);
      EXPECT_EQ(snapshot(c.dst), before) << rel << " " << kind;
    }
  }
  // .mx2nv itself a symlink to a copy of it.
  fs::rename(c.dst / ".mx2nv", c.d / "state");
  fs::create_directory_symlink(c.d / "state", c.dst / ".mx2nv");
  const CliResult r = c.card();
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("symbolic link"), std::string::npos) << r.err;
  fs::remove(c.dst / ".mx2nv");
  fs::rename(c.d / "state", c.dst / ".mx2nv");
  // DST given through a symlink to it is DST (as for convert).
  fs::create_directory_symlink(c.dst, c.d / "link");
  const CliResult via = run_cli("card " + q(c.src) + " " + q(c.d / "link") + " --verify-report " + q(c.report));
  EXPECT_EQ(via.exit_code, 2) << via.err;  // the report names DST, not the link
  EXPECT_EQ(via.err.find("symbolic links"), std::string::npos) << via.err;
}

// An option given with an empty value is a usage error naming it, never
// "not given"; any other value is used as given or refused.
TEST(Card, EmptyOptionValuesAreUsageErrors) {
  Carded c;
  for (const std::string option : {"--base-model", "--companion", "--repo-id", "--gpu-check"}) {
    const CliResult r = c.card(option + " ''");
    EXPECT_EQ(r.exit_code, 2) << option << ": " << r.err;
    EXPECT_NE(r.err.find(option), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(c.dst / ".mx2nv/card.json")) << option;
  }
  for (const std::string option : {"--verify-report", "--requantize-report"}) {
    const CliResult r = run_cli("card " + q(c.src) + " " + q(c.dst) + " " + option + " ''");
    EXPECT_EQ(r.exit_code, 2) << option << ": " << r.err;
    EXPECT_NE(r.err.find(option), std::string::npos) << r.err;
  }
  for (const auto& [src, dst] : {std::pair<std::string, std::string>{"''", q(c.dst)}, {q(c.src), "''"}}) {
    const CliResult r = run_cli("card " + src + " " + dst + " --verify-report " + q(c.report));
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("given an empty value"), std::string::npos) << r.err;
  }
  EXPECT_EQ(c.card("--companion 0").exit_code, 0);
  const CliResult zero = c.card("--base-model 0");
  ASSERT_EQ(zero.exit_code, 0) << zero.err;
  EXPECT_EQ(read_file(c.dst / "README.md").rfind("---\nbase_model: \"0\"\n", 0), 0u);
  EXPECT_EQ(c.card("--base-model ' '").exit_code, 2);
}

// Every field card reads from a report has a declared type: any other type
// is refused (exit 2, the key path named); null is "not computed" and leaves
// its row out.
TEST(Card, ReportFieldsOfTheWrongTypeAreRefused) {
  Carded c;
  const json good = json::parse(read_file(c.report));
  const auto card_with = [&](const std::string& text) {
    write_file(c.d / "r.json", text);
    return run_cli("card " + q(c.src) + " " + q(c.dst) + " --verify-report " + q(c.d / "r.json"));
  };
  enum T { Count, Finite, Error, Text };
  const std::vector<std::pair<std::string, T>> fields = {
      {"/values_compared", Count}, {"/mismatches", Count}, {"/source_tensor_bytes", Count}, {"/target_tensor_bytes", Count},
      {"/size_change_percent", Finite}, {"/max_abs_error", Error}, {"/counts/modules", Count},
      {"/counts/scale_groups", Count}, {"/counts/passthrough_tensors", Count}, {"/counts/companion_files", Count},
      {"/counts/shards", Count}, {"/counts/active_groups", Count}, {"/counts/zero_groups", Count},
      {"/counts/canonicalised_zero_groups", Count}, {"/counts/marlin_zeroed_groups", Count},
      {"/counts/raised_globals", Count}, {"/window", Text}, {"/provenance/source", Text}};
  const std::vector<std::pair<json, std::vector<T>>> wrong = {
      {"many", {Count, Finite, Error}}, {"0", {Count, Finite, Error}}, {"inf", {Count, Finite, Error}},
      {-1, {Count, Error}}, {1.5, {Count}}, {-0.5, {Count, Error}}, {true, {Count, Finite, Error, Text}},
      {json::array(), {Count, Finite, Error, Text}}, {json::object(), {Count, Finite, Error, Text}},
      {7, {Text}}};
  std::size_t refused = 0;
  for (const auto& [path, type] : fields) {
    const json::json_pointer ptr(path);
    std::string dotted = path.substr(1);
    std::replace(dotted.begin(), dotted.end(), '/', '.');
    for (const auto& [value, types] : wrong) {
      if (std::find(types.begin(), types.end(), type) == types.end()) continue;
      json bad = good;
      bad[ptr] = value;
      const CliResult r = card_with(bad.dump());
      EXPECT_EQ(r.exit_code, 2) << path << " = " << value.dump() << ": " << r.err;
      EXPECT_NE(r.err.find(dotted), std::string::npos) << path << ": " << r.err;
      EXPECT_FALSE(fs::exists(c.dst / ".mx2nv/card.json")) << path;
      ++refused;
    }
  }
  EXPECT_GT(refused, 100u);
  // A number JSON cannot hold finitely.
  std::string text = good.dump();
  const std::string key = "\"size_change_percent\":";
  const std::size_t at = text.find(key);
  ASSERT_NE(at, std::string::npos);
  text.insert(at + key.size(), "1e999,\"x\":");
  EXPECT_EQ(card_with(text).exit_code, 2);
  // The report is read as mx2nv reads every report (report_from_json): a key
  // mx2nv does not write, or a derived field that contradicts the rest, is
  // no report of this mx2nv either.
  const std::vector<std::pair<std::string, json>> foreign = {
      {"/counts/extra", 1}, {"/exit_code", 1}, {"/counts/global_conflicts", 3}, {"/provenance/tool", "other"}};
  for (const auto& [path, value] : foreign) {
    json bad = good;
    bad[json::json_pointer(path)] = value;
    const CliResult r = card_with(bad.dump());
    std::string dotted = path.substr(1);
    std::replace(dotted.begin(), dotted.end(), '/', '.');
    EXPECT_EQ(r.exit_code, 2) << path << ": " << r.err;
    EXPECT_NE(r.err.find(dotted), std::string::npos) << path << ": " << r.err;
    EXPECT_FALSE(fs::exists(c.dst / ".mx2nv/card.json")) << path;
  }

  // null: the row (and the sentence citing it) is left out.
  const std::vector<std::pair<std::string, std::string>> rows = {
      {"/counts/raised_globals", "| Globals raised for fp16 |"},
      {"/counts/canonicalised_zero_groups", "| All-zero groups written with scale byte 0x00 |"},
      {"/counts/active_groups", "| Active 32-value groups |"},
      {"/values_compared", "| Values compared |"},
      {"/max_abs_error", "| Max abs error |"},
      {"/counts/scale_groups", "| Global scales |"},
      {"/size_change_percent", "| Size change |"},
      {"/counts/modules", "| Packed bytes identical |"}};
  for (const auto& [path, row] : rows) {
    json partial = good;
    partial[json::json_pointer(path)] = nullptr;
    const CliResult r = card_with(partial.dump());
    ASSERT_EQ(r.exit_code, 0) << path << ": " << r.err;
    const std::string card = read_file(c.dst / "README.md");
    EXPECT_EQ(card.find(row), std::string::npos) << path;
    EXPECT_EQ(card.find("| ? |"), std::string::npos) << path;
    if (path == "/values_compared") {
      EXPECT_EQ(card.find("compared all"), std::string::npos);
    }
    json whole = good;
    ASSERT_EQ(card_with(whole.dump()).exit_code, 0);
    if (path != "/counts/canonicalised_zero_groups" && path != "/counts/raised_globals") {
      EXPECT_NE(read_file(c.dst / "README.md").find(row), std::string::npos) << path;
    }
  }
}

}  // namespace
}  // namespace mx2nv::e2e

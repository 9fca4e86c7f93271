// mx2nv card: the model card from a verify report, its refusals, and the
// commands that must not be confused by a carded DST (verify, convert
// --resume).
#include "e2e_support.hpp"
#include "fixture/fixture.hpp"

#include <fmt/core.h>
#include <nlohmann/json.hpp>

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
  explicit Carded(const std::string& readme = kSourceReadme) {
    write_fixture(src, tiny_spec());
    if (!readme.empty()) write_file(src / "README.md", readme);
    EXPECT_EQ(run_cli("convert " + q(src) + " " + q(dst)).exit_code, 0);
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

}  // namespace
}  // namespace mx2nv::e2e

// The command-line contract: exit codes, summaries, JSON reports.
#include "e2e_support.hpp"
#include "fixture/fixture.hpp"

#include <nlohmann/json.hpp>

namespace mx2nv::e2e {
namespace {

using nlohmann::json;

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

TEST(Cli, HelpAndVersion) {
  const CliResult help = run_cli("--help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("convert"), std::string::npos);
  const CliResult version = run_cli("--version");
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_NE(version.out.find(MX2NV_VERSION), std::string::npos);
}

TEST(Cli, UsageErrorsExitTwo) {
  EXPECT_EQ(run_cli("").exit_code, 2);
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

}  // namespace
}  // namespace mx2nv::e2e

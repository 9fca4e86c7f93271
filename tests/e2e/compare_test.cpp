// mx2nv compare end to end on generated checkpoints: exact on convert's
// output (exit 0, as verify), different on requantize's (exit 1, as
// verify), invalid OTHER exits 3 naming the tensor, --report and --html
// write their files, --modules narrows. Every figure against an independent
// recomputation: tests/conformance/test_compare.py.
#include "e2e_support.hpp"

#include <nlohmann/json.hpp>

namespace mx2nv::e2e {
namespace {

using nlohmann::json;

struct Trees {
  ScratchDir dir;
  fs::path src = dir / "src", nv = dir / "nv", rq = dir / "rq";
  Trees() {
    write_fixture(src, spec_with_over_span());
    EXPECT_EQ(run_cli("convert " + src.string() + " " + nv.string() + " --overspan bf16").exit_code, 0);
    EXPECT_EQ(run_cli("requantize " + src.string() + " " + rq.string()).exit_code, 0);
  }
};

TEST(Compare, OverspanBf16OutputIsExactAndAgreesWithVerify) {
  Trees t;
  // --overspan bf16 holds the over-span module's bank as BF16, its values exact.
  const CliResult c = run_cli("compare " + t.src.string() + " " + t.nv.string() + " --json --threads 2");
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_EQ(run_cli("verify " + t.src.string() + " " + t.nv.string()).exit_code, 0);
  const json doc = json::parse(c.out);
  EXPECT_EQ(doc["format"], "compressed-tensors");
  EXPECT_EQ(doc["activations"], "A16");
  // convert writes the over-span module's whole MoE bank (layer 1: 3 experts x 3 projections) as BF16.
  ASSERT_EQ(doc["unquantized_in_other"].size(), 9u);
  for (const auto& n : doc["unquantized_in_other"]) EXPECT_NE(n.get<std::string>().find("layers.1."), std::string::npos);
  EXPECT_EQ(doc["totals"]["modules_unquantized"], 9);
  EXPECT_EQ(doc["totals"]["exact_values"], doc["totals"]["values"]);
  EXPECT_EQ(doc["missing_in_other"].size() + doc["extra_in_other"].size(), 0u);
}

TEST(Compare, ExactOutputExitsZeroLikeVerify) {
  ScratchDir dir;
  write_fixture(dir / "src", tiny_spec());
  ASSERT_EQ(run_cli("convert " + (dir / "src").string() + " " + (dir / "nv").string()).exit_code, 0);
  const CliResult c = run_cli("compare " + (dir / "src").string() + " " + (dir / "nv").string() + " --report " +
                              (dir / "r.json").string() + " --html " + (dir / "r.html").string());
  EXPECT_EQ(c.exit_code, 0) << c.err;
  EXPECT_EQ(run_cli("verify " + (dir / "src").string() + " " + (dir / "nv").string()).exit_code, 0);
  EXPECT_NE(c.out.find("EXACT"), std::string::npos) << c.out;
  const json doc = json::parse(read_file(dir / "r.json"));
  EXPECT_EQ(doc["exit_code"], 0);
  EXPECT_EQ(doc["totals"]["rel_rmse"], 0.0);
  EXPECT_EQ(doc["totals"]["cosine"], 1.0);
  const std::string page = read_file(dir / "r.html");
  EXPECT_NE(page.find("<svg class=\"heatmap\""), std::string::npos);
  EXPECT_NE(page.find("data-projection=\"gate\""), std::string::npos);
}

TEST(Compare, RequantizedOutputDiffersLikeVerifySays) {
  Trees t;
  const CliResult c = run_cli("compare " + t.src.string() + " " + t.rq.string() + " --json");
  EXPECT_EQ(c.exit_code, 1) << c.err;
  EXPECT_EQ(run_cli("verify " + t.src.string() + " " + t.rq.string()).exit_code, 1);
  const json doc = json::parse(c.out);
  EXPECT_LT(doc["totals"]["exact_values"].get<std::uint64_t>(), doc["totals"]["values"].get<std::uint64_t>());
  EXPECT_GT(doc["totals"]["rel_rmse"].get<double>(), 0.0);
  EXPECT_LT(doc["totals"]["rel_rmse"].get<double>(), 0.2);
  // --modules narrows to layer 0's modules.
  const json narrow = json::parse(run_cli("compare " + t.src.string() + " " + t.rq.string() +
                                          " --json --modules 'layers\\.0\\.'").out);
  EXPECT_LT(narrow["modules"].size(), doc["modules"].size());
  for (const auto& m : narrow["modules"]) EXPECT_EQ(m["layer"], 0);
}

TEST(Compare, InvalidOtherExitsThreeNamingTheTensor) {
  ScratchDir dir;
  write_fixture(dir / "src", tiny_spec());
  // SRC itself is no NVFP4 checkpoint.
  const CliResult self = run_cli("compare " + (dir / "src").string() + " " + (dir / "src").string());
  EXPECT_EQ(self.exit_code, 3) << self.err;
  EXPECT_NE(self.err.find("nvfp4-pack-quantized"), std::string::npos) << self.err;
  EXPECT_EQ(run_cli("compare " + (dir / "src").string() + " " + (dir / "absent").string()).exit_code == 0, false);
  EXPECT_EQ(run_cli("compare " + (dir / "src").string()).exit_code, 2);
  EXPECT_EQ(run_cli("compare a b --modules '('").exit_code, 2);
}

}  // namespace
}  // namespace mx2nv::e2e

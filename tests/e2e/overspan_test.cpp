// convert --overspan fail|bf16|requantize end to end on generated checkpoints
// with over-span modules: the default refuses as before; requantize rewrites
// exactly the refused scale groups (as the companion would) and keeps every
// other byte; bf16 writes every expert of an affected MoE layer as an exact
// BF16 weight listed in the config's ignore; verify checks both and catches a
// changed byte; inspect predicts what convert then reports; the planned,
// per-shard path writes the single-process bytes.
#include "common/error.hpp"
#include "convert/convert.hpp"
#include "requantize/requantize.hpp"
#include "e2e_support.hpp"
#include "fixture/fixture.hpp"
#include "inspect/inspect.hpp"
#include "plan/overspan.hpp"
#include "safetensors/index.hpp"
#include "verify/verify.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <set>

namespace mx2nv::e2e {
namespace {

Report verify(const fs::path& src, const fs::path& dst) {
  VerifyOptions o;
  o.source = src;
  o.target = dst;
  o.window = Window::Marlin;
  o.threads = 2;
  return verify_checkpoint(o);
}

using nlohmann::json;

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

ConvertOptions options(const fs::path& src, const fs::path& dst, OverSpanChoice choice) {
  ConvertOptions o{src, dst, Window::Marlin, 2};
  o.over_span_choice = choice;
  return o;
}

// Flips one byte of tensor `name` in DST's copy at `dst`.
void damage_tensor(const fs::path& dst, const std::string& name, std::size_t at) {
  const json index = json::parse(read_file(dst / std::string(kIndexFileName)));
  const fs::path shard = dst / index["weight_map"][name].get<std::string>();
  std::string all = read_file(shard);
  const std::string bytes = tensor_bytes(shard, name);
  const auto where = all.find(bytes);
  ASSERT_NE(where, std::string::npos);
  all[where + at] = static_cast<char>(all[where + at] ^ 0x11);
  write_file(shard, all);
}

TEST(OverSpanRequantize, OnlyRefusedGroupsAreRequantizedAsTheCompanionWouldAndTheRestIsByteIdentical) {
  ScratchDir d;
  FixtureSpec spec = spec_with_over_span();
  const std::string gate = fixture_module_name(spec, 0, 1, 0), up = fixture_module_name(spec, 0, 1, 1);
  const std::string down = fixture_module_name(spec, 1, 2, 2);
  spec.overrides[gate].span = 20;  // the pair goes together
  write_fixture(d / "src", spec);

  EXPECT_EQ(convert_checkpoint(options(d / "src", d / "refused", OverSpanChoice::Fail)).result, Outcome::Refused);
  EXPECT_FALSE(fs::exists(d / "refused"));  // the default is unchanged

  const Report r = convert_checkpoint(options(d / "src", d / "dst", OverSpanChoice::Requantize));
  ASSERT_EQ(r.result, Outcome::Ok);
  EXPECT_TRUE(r.refused_spans.empty());
  EXPECT_EQ(r.over_span_choice, OverSpanChoice::Requantize);
  ASSERT_EQ(r.requantized.size(), 3u);
  std::set<std::string> lossy;
  for (const auto& m : r.requantized) lossy.insert(m.module);
  EXPECT_EQ(lossy, (std::set<std::string>{gate, up, down}));
  EXPECT_EQ(report_to_json(r)["overspan"]["lossy"], true);
  // The config names the lossy modules too.
  const json config = json::parse(read_file(d / "dst" / std::string(kConfigFileName)));
  const json& listed = config["text_config"]["quantization_config"]["mx2nv_requantized_modules"];
  EXPECT_EQ(std::set<std::string>(listed.begin(), listed.end()), lossy);

  // Requantized modules hold what the companion writes for them; the rest is a lossless conversion.
  const Report companion = requantize_checkpoint({d / "src", d / "companion", 2});
  const json src_index = json::parse(read_file(d / "src" / std::string(kIndexFileName)));
  const json index = json::parse(read_file(d / "dst" / std::string(kIndexFileName)));
  for (const auto& [name, shard] : index["weight_map"].items()) {
    const fs::path ours = d / "dst" / shard.get<std::string>();
    const std::string module = name.substr(0, name.rfind(".weight"));
    if (lossy.contains(module)) {
      EXPECT_EQ(tensor_bytes(ours, name), tensor_bytes(d / "companion" / shard.get<std::string>(), name)) << name;
    } else if (name.ends_with(".weight_packed") || name.find(".experts.") == std::string::npos) {
      EXPECT_EQ(tensor_bytes(ours, name), tensor_bytes(d / "src" / src_index["weight_map"][name].get<std::string>(), name))
          << name;  // packed FP4 bytes and pass-through tensors are untouched
    }
  }
  for (const auto& m : r.requantized) {
    for (const auto& c : companion.requantized) {
      if (c.module != m.module) continue;
      EXPECT_EQ(m.global_scale, c.global_scale);
      EXPECT_EQ(m.relative_rmse, c.relative_rmse);
      EXPECT_EQ(m.cosine, c.cosine);
      EXPECT_EQ(m.max_abs_error, c.max_abs_error);
      EXPECT_GT(m.relative_rmse, 0.0);  // lossy, and measured
    }
  }

  // verify: lossless modules exactly, requantized ones bit for bit against the recomputation.
  const Report v = verify(d / "src", d / "dst");
  EXPECT_EQ(v.result, Outcome::Ok) << (v.differences.empty() ? "" : v.differences[0]);
  ASSERT_EQ(v.requantized.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(v.requantized[i].module, r.requantized[i].module);
    EXPECT_EQ(v.requantized[i].relative_rmse, r.requantized[i].relative_rmse);
    EXPECT_EQ(v.requantized[i].max_abs_error, r.requantized[i].max_abs_error);
  }
  {  // ... and a config that hides the lossy modules.
    ScratchDir hidden;
    fs::copy(d / "dst", hidden / "dst", fs::copy_options::recursive);
    json c = json::parse(read_file(hidden / "dst" / std::string(kConfigFileName)));
    c["text_config"]["quantization_config"].erase("mx2nv_requantized_modules");
    write_file(hidden / "dst" / std::string(kConfigFileName), c.dump(2));
    EXPECT_EQ(verify(d / "src", hidden / "dst").result, Outcome::Mismatch);
  }
  {  // ... and catches a changed byte in a requantized module.
    ScratchDir broken;
    fs::copy(d / "dst", broken / "dst", fs::copy_options::recursive);
    damage_tensor(broken / "dst", down + ".weight_packed", 5);
    EXPECT_EQ(verify(d / "src", broken / "dst").result, Outcome::Mismatch);
  }
  // The companion requantizes modules that fit too: verify does not take it for a conversion.
  EXPECT_EQ(verify(d / "src", d / "companion").result, Outcome::Mismatch);

  // A retried lossy conversion is complete; a lossless retry of it is not this conversion.
  ConvertOptions again = options(d / "src", d / "dst", OverSpanChoice::Requantize);
  again.resume = true;
  EXPECT_TRUE(convert_checkpoint(again).already_complete);
  ConvertOptions lossless = options(d / "src", d / "dst", OverSpanChoice::Fail);
  lossless.resume = true;
  try {
    convert_checkpoint(lossless);
    FAIL() << "a lossy DST was taken for a lossless conversion";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find("requantize"), std::string::npos) << e.what();
  }
}

TEST(OverSpanBf16, EveryExpertOfTheAffectedLayerIsExactBf16AndIgnored) {
  ScratchDir d;
  const FixtureSpec spec = spec_with_over_span();
  write_fixture(d / "src", spec);
  const Report r = convert_checkpoint(options(d / "src", d / "dst", OverSpanChoice::Bf16));
  ASSERT_EQ(r.result, Outcome::Ok);
  EXPECT_TRUE(r.requantized.empty());
  ASSERT_EQ(r.bf16_layers.size(), 1u);
  const Bf16Layer& layer = r.bf16_layers[0];
  EXPECT_EQ(layer.layer, moe_layer_of(fixture_module_name(spec, 1, 0, 0)));
  EXPECT_EQ(layer.modules.size(), 9u);  // 3 experts x 3 projections
  EXPECT_EQ(layer.refused, std::vector<std::string>{fixture_module_name(spec, 1, 2, 2)});
  EXPECT_GT(layer.bf16_bytes, layer.nvfp4_bytes);

  // The config ignores exactly those modules; the index names their weights and no scales.
  const json config = json::parse(read_file(d / "dst" / std::string(kConfigFileName)));
  const json& ignore = config["text_config"]["quantization_config"]["ignore"];
  std::set<std::string> ignored;
  for (const auto& n : ignore) ignored.insert(n.get<std::string>());
  for (const auto& m : layer.modules) EXPECT_TRUE(ignored.contains(m)) << m;
  const json index = json::parse(read_file(d / "dst" / std::string(kIndexFileName)));
  for (const auto& m : layer.modules) {
    EXPECT_TRUE(index["weight_map"].contains(m + ".weight")) << m;
    EXPECT_FALSE(index["weight_map"].contains(m + ".weight_scale")) << m;
    EXPECT_FALSE(index["weight_map"].contains(m + ".weight_global_scale")) << m;
  }
  // Layer 0 stays NVFP4.
  EXPECT_TRUE(index["weight_map"].contains(fixture_module_name(spec, 0, 0, 0) + ".weight_global_scale"));

  // inspect predicted the layers and the size; the report says the cost.
  const Inspection in = inspect_checkpoint(d / "src", Window::Marlin, 2);
  ASSERT_TRUE(in.overspan.has_value());
  ASSERT_EQ(in.overspan->bf16_layers.size(), 1u);
  EXPECT_EQ(static_cast<std::int64_t>(*in.report.target_tensor_bytes) + in.overspan->bf16_size_change,
            static_cast<std::int64_t>(*r.target_tensor_bytes));
  EXPECT_EQ(inspection_to_json(in)["overspan"]["bf16"]["size_change_bytes"], in.overspan->bf16_size_change);
  EXPECT_EQ(report_to_json(r)["overspan"]["bf16_layers"][0]["size_cost_bytes"],
            static_cast<std::int64_t>(layer.bf16_bytes - layer.nvfp4_bytes));

  // verify: every value exact, the BF16 ones included.
  const Report v = verify(d / "src", d / "dst");
  EXPECT_EQ(v.result, Outcome::Ok) << (v.differences.empty() ? "" : v.differences[0]);
  EXPECT_EQ(v.mismatches, 0u);
  EXPECT_EQ(v.bf16_layers.size(), 1u);
  {
    ScratchDir broken;
    fs::copy(d / "dst", broken / "dst", fs::copy_options::recursive);
    damage_tensor(broken / "dst", fixture_module_name(spec, 1, 1, 0) + ".weight", 7);
    const Report bad = verify(d / "src", broken / "dst");
    EXPECT_EQ(bad.result, Outcome::Mismatch);
  }

  // A value BF16 cannot hold (beyond float32) is refused before anything is written.
  ScratchDir huge;
  FixtureSpec big = spec_with_over_span();
  big.overrides[fixture_module_name(big, 1, 0, 1)].k_max = 127;  // 6 x 2^127 > BF16's largest
  write_fixture(huge / "src", big);
  try {
    convert_checkpoint(options(huge / "src", huge / "dst", OverSpanChoice::Bf16));
    FAIL() << "a value beyond BF16 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput) << e.what();
  }
  EXPECT_FALSE(fs::exists(huge / "dst" / std::string(kIndexFileName)));
}

TEST(OverSpan, ACheckpointThatFitsIsConvertedLosslesslyWhateverTheChoice) {
  ScratchDir d;
  FixtureSpec spec = spec_with_over_span();
  spec.overrides.clear();
  write_fixture(d / "src", spec);
  ASSERT_EQ(convert_checkpoint(options(d / "src", d / "fail", OverSpanChoice::Fail)).result, Outcome::Ok);
  for (const auto choice : {OverSpanChoice::Requantize, OverSpanChoice::Bf16}) {
    const fs::path dst = d / std::string(choice_name(choice));
    const Report r = convert_checkpoint(options(d / "src", dst, choice));
    EXPECT_TRUE(r.requantized.empty());
    EXPECT_TRUE(r.bf16_layers.empty());
    EXPECT_EQ(snapshot(dst), snapshot(d / "fail"));
  }
}

TEST(OverSpan, InspectPredictsTheLossyModulesAndTheirError) {
  ScratchDir d;
  write_fixture(d / "src", spec_with_over_span());
  const Inspection in = inspect_checkpoint(d / "src", Window::Marlin, 2);
  ASSERT_TRUE(in.overspan.has_value());
  ASSERT_EQ(in.overspan->requantized.size(), 1u);
  const Report r = convert_checkpoint(options(d / "src", d / "dst", OverSpanChoice::Requantize));
  ASSERT_EQ(r.requantized.size(), 1u);
  EXPECT_EQ(in.overspan->requantized[0].module, r.requantized[0].module);
  EXPECT_EQ(in.overspan->requantized[0].relative_rmse, r.requantized[0].relative_rmse);
  EXPECT_EQ(in.report.target_tensor_bytes, r.target_tensor_bytes);  // same size
  const json j = inspection_to_json(in);
  EXPECT_EQ(j["overspan"]["fail"]["result"], "refused");
  EXPECT_EQ(j["overspan"]["requantize"]["lossy_modules"].size(), 1u);
  EXPECT_EQ(j["overspan"]["bf16"]["layers"].size(), 1u);
}

// mx2nv plan --overspan C, then convert --plan P --shards I/N and --finalize:
// the plan carries the choice and each module's treatment, and the bytes are
// the single-process conversion's.
TEST(OverSpan, PlannedPerShardConversionGivesTheSingleProcessBytes) {
  ScratchDir d;
  write_fixture(d / "src", spec_with_over_span());
  for (const std::string choice : {"requantize", "bf16"}) {
    const fs::path reference = d / ("reference-" + choice), dst = d / ("planned-" + choice);
    ASSERT_EQ(run_cli("convert " + q(d / "src") + " " + q(reference) + " --overspan " + choice).exit_code, 0);
    ASSERT_EQ(run_cli("plan " + q(d / "src") + " " + q(dst)).exit_code, 1);  // refused without the choice
    const CliResult planned = run_cli("plan " + q(d / "src") + " " + q(dst) + " --overspan " + choice);
    ASSERT_EQ(planned.exit_code, 0) << planned.err;
    const std::string plan = q(dst / ".mx2nv/plan.json");
    for (const char* part : {"1/2", "0/2"}) {
      const CliResult r = run_cli("convert --plan " + plan + " --shards " + part);
      ASSERT_EQ(r.exit_code, 0) << r.err;
    }
    ASSERT_EQ(run_cli("convert --plan " + plan + " --finalize").exit_code, 0);
    EXPECT_TRUE(snapshot(dst) == snapshot(reference)) << choice;
    EXPECT_EQ(run_cli("verify " + q(d / "src") + " " + q(dst)).exit_code, 0) << choice;
  }
  // verify --shards I/N and --merge: the merged report lists every requantized module once, as a whole verify does.
  const fs::path dst = d / "planned-requantize";
  ASSERT_EQ(run_cli("verify " + q(d / "src") + " " + q(dst) + " --report " + q(d / "whole.json")).exit_code, 0);
  for (const char* part : {"0", "1", "2"}) {
    ASSERT_EQ(run_cli("verify " + q(d / "src") + " " + q(dst) + " --shards " + part + "/3 --report " +
                      q(d / (std::string("part") + part + ".json")))
                  .exit_code,
              0);
  }
  const CliResult merging = run_cli("verify --merge " + q(d / "part0.json") + " " + q(d / "part1.json") + " " +
                                   q(d / "part2.json") + " --report " + q(d / "merged.json"));
  ASSERT_EQ(merging.exit_code, 0) << merging.err;
  const json whole = json::parse(read_file(d / "whole.json")), merged = json::parse(read_file(d / "merged.json"));
  ASSERT_EQ(whole["requantized"].size(), 1u);
  EXPECT_EQ(merged["requantized"], whole["requantized"]);
  EXPECT_EQ(merged["values_compared"], whole["values_compared"]);
}

TEST(OverSpan, CliFlag) {
  ScratchDir d;
  write_fixture(d / "src", spec_with_over_span());
  const CliResult refused = run_cli("convert " + q(d / "src") + " " + q(d / "no"));
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.out.find("--overspan"), std::string::npos) << refused.out;
  const CliResult r = run_cli("convert " + q(d / "src") + " " + q(d / "dst") + " --overspan requantize --report " +
                              q(d / "report.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("LOSSY"), std::string::npos) << r.out;
  const json report = json::parse(read_file(d / "report.json"));
  ASSERT_EQ(report["requantized"].size(), 1u);
  EXPECT_EQ(report["requantized"][0]["module"], fixture_module_name(spec_with_over_span(), 1, 2, 2));
  const CliResult b = run_cli("convert " + q(d / "src") + " " + q(d / "bf16") + " --overspan bf16");
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_NE(b.out.find("BF16"), std::string::npos) << b.out;
  EXPECT_EQ(run_cli("verify " + q(d / "src") + " " + q(d / "bf16")).exit_code, 0);
  EXPECT_EQ(run_cli("convert " + q(d / "src") + " " + q(d / "x") + " --overspan bogus").exit_code, 2);
}

}  // namespace
}  // namespace mx2nv::e2e

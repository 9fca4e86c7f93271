#include "common/error.hpp"
#include "json/config_splice.hpp"
#include "model/quant_config.hpp"

#include <gtest/gtest.h>

namespace mx2nv {
namespace {

Json mxfp4_qc() {
  return Json::parse(R"({
    "config_groups": {"group_0": {"format": "mxfp4-pack-quantized", "input_activations": null,
      "output_activations": null, "targets": ["Linear"],
      "weights": {"actorder": null, "block_structure": null, "dynamic": false, "group_size": 32, "num_bits": 4,
                  "observer": "minmax", "observer_kwargs": {}, "scale_dtype": "torch.uint8", "strategy": "group",
                  "symmetric": true, "type": "float", "zp_dtype": "torch.uint8"}}},
    "format": "mxfp4-pack-quantized", "ignore": ["lm_head"], "kv_cache_scheme": null,
    "quant_method": "compressed-tensors", "quantization_status": "compressed", "version": "0.14.0"})");
}

std::string nested_config(const Json& qc) {
  Json c = {{"architectures", {"KimiK3ForConditionalGeneration"}},
            {"text_config", {{"hidden_size", 7168}, {"quantization_config", qc}, {"rope_theta", 50000.0}}},
            {"vision_config", {{"hidden_size", 1152}}}};
  return c.dump(2);
}

void expect_refused(const Json& qc, const std::string& fragment) {
  try {
    read_source_quant_config(nested_config(qc));
    ADD_FAILURE() << "accepted; expected " << fragment;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(QuantConfig, FindsNestedAndTopLevel) {
  const auto nested = read_source_quant_config(nested_config(mxfp4_qc()));
  EXPECT_EQ(nested.parent, "text_config");
  Json top = {{"quantization_config", mxfp4_qc()}, {"hidden_size", 1}};
  const auto flat = read_source_quant_config(top.dump());
  EXPECT_EQ(flat.parent, "");
}

TEST(QuantConfig, RefusesAmbiguousOrMissing) {
  Json both = Json::parse(nested_config(mxfp4_qc()));
  both["quantization_config"] = mxfp4_qc();
  EXPECT_THROW(read_source_quant_config(both.dump()), Error);
  EXPECT_THROW(read_source_quant_config(R"({"hidden_size": 1})"), Error);
  EXPECT_THROW(read_source_quant_config("[]"), Error);
}

TEST(QuantConfig, RefusesWhatIsNotMxfp4WeightOnly) {
  Json q = mxfp4_qc();
  q["quant_method"] = "fp8";
  expect_refused(q, "compressed-tensors");
  q = mxfp4_qc();
  q["format"] = "nvfp4-pack-quantized";
  expect_refused(q, "format");
  q = mxfp4_qc();
  q["config_groups"]["group_0"]["format"] = "pack-quantized";
  expect_refused(q, "format");
  q = mxfp4_qc();
  q["config_groups"]["group_0"]["input_activations"] = {{"num_bits", 4}};
  expect_refused(q, "input activations");
  q = mxfp4_qc();
  q["config_groups"]["group_0"]["weights"]["group_size"] = 16;
  expect_refused(q, "group_size");
  q = mxfp4_qc();
  q["config_groups"]["group_0"]["weights"]["num_bits"] = 8;
  expect_refused(q, "num_bits");
  q = mxfp4_qc();
  q["config_groups"]["group_0"]["weights"]["type"] = "int";
  expect_refused(q, "type");
  q = mxfp4_qc();
  q["config_groups"]["group_0"]["weights"]["symmetric"] = false;
  expect_refused(q, "asymmetric");
  q = mxfp4_qc();
  q["config_groups"]["group_0"]["weights"]["made_up"] = 1;
  expect_refused(q, "unknown");
  q = mxfp4_qc();
  q["config_groups"]["group_0"] = {"Linear"};
  expect_refused(q, "preset");
  q = mxfp4_qc();
  q["quantization_status"] = "frozen";
  expect_refused(q, "quantization_status");
  q = mxfp4_qc();
  q["config_groups"] = Json::object();
  expect_refused(q, "config_groups");
}

TEST(QuantConfig, Nvfp4RewriteChangesOnlyWhatItMust) {
  const Json out = nvfp4_quant_config(mxfp4_qc());
  EXPECT_EQ(out["format"], "nvfp4-pack-quantized");
  const Json& g = out["config_groups"]["group_0"];
  EXPECT_EQ(g["format"], "nvfp4-pack-quantized");
  EXPECT_EQ(g["weights"]["strategy"], "tensor_group");
  EXPECT_EQ(g["weights"]["group_size"], 16);
  EXPECT_EQ(g["weights"]["scale_dtype"], "torch.float8_e4m3fn");
  EXPECT_TRUE(g["weights"]["zp_dtype"].is_null());
  EXPECT_EQ(g["weights"]["observer"], "minmax");
  EXPECT_EQ(g["weights"]["symmetric"], true);
  EXPECT_TRUE(g["input_activations"].is_null());
  EXPECT_EQ(out["ignore"], mxfp4_qc()["ignore"]);
  for (const auto& [k, _] : g["weights"].items()) EXPECT_TRUE(is_known_quantization_args_key(k)) << k;
}

TEST(QuantConfig, TextRewriteKeepsEveryOtherByte) {
  const std::string text = nested_config(mxfp4_qc());
  const auto src = read_source_quant_config(text);
  const std::string out = rewrite_config_text(text, src);
  const auto span_in = find_member_value(text, find_member_value(text, 0, "text_config")->begin, "quantization_config");
  const auto span_out = find_member_value(out, find_member_value(out, 0, "text_config")->begin, "quantization_config");
  ASSERT_TRUE(span_in && span_out);
  EXPECT_EQ(text.substr(0, span_in->begin), out.substr(0, span_out->begin));
  EXPECT_EQ(text.substr(span_in->end), out.substr(span_out->end));
  const Json parsed = Json::parse(out);
  EXPECT_EQ(parsed["text_config"]["quantization_config"], nvfp4_quant_config(mxfp4_qc()));
  EXPECT_EQ(parsed["text_config"]["rope_theta"], 50000.0);
}

TEST(QuantConfig, TextRewriteOfCompactConfigStaysCompact) {
  Json c = {{"a", 1}, {"quantization_config", mxfp4_qc()}, {"z", "q\"uote"}};
  const std::string text = c.dump();
  const std::string out = rewrite_config_text(text, read_source_quant_config(text));
  EXPECT_EQ(out.find('\n'), std::string::npos);
  EXPECT_EQ(Json::parse(out)["z"], "q\"uote");
}

TEST(ConfigSplice, FindsMembersPastTrickyStrings) {
  const std::string text = R"({"a\"b": "}{,", "x": [1, {"quantization_config": 1}], "quantization_config": {"k": "]"}})";
  const auto span = find_member_value(text, 0, "quantization_config");
  ASSERT_TRUE(span);
  EXPECT_EQ(text.substr(span->begin, span->end - span->begin), R"({"k": "]"})");
  EXPECT_FALSE(find_member_value(text, 0, "absent"));
}

}  // namespace
}  // namespace mx2nv

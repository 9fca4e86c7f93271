// compare's pure parts: name matching, the power-of-two test on F32 bits,
// the exact 0 / 1 cases of rel RMSE and cosine, and OTHER's format from its
// config. (Values against the oracle: tests/conformance/test_compare.py.)
#include "common/error.hpp"
#include "compare/compare.hpp"
#include "compare/module_key.hpp"
#include "compare/other_tree.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>

namespace mx2nv {
namespace {

TEST(CompareModuleKey, RoutedExpertsMatchAcrossPrefixesContainersAndSpellings) {
  const std::string k = module_key("language_model.model.layers.3.block_sparse_moe.experts.17.w1");
  EXPECT_EQ(module_key("model.language_model.layers.3.mlp.experts.17.gate_proj"), k);
  EXPECT_EQ(module_key("layers.3.ffn.experts.17.w1"), k);
  EXPECT_EQ(module_key("model.layers.03.mlp.experts.017.gate_proj"), k);
  EXPECT_NE(module_key("model.layers.3.mlp.experts.17.up_proj"), k);
  EXPECT_EQ(module_key("model.layers.3.mlp.experts.17.up_proj"), module_key("layers.3.ffn.experts.17.w3"));
  EXPECT_EQ(module_key("model.layers.3.mlp.experts.17.down_proj"), module_key("layers.3.ffn.experts.17.w2"));
  const auto e = routed_expert("language_model.layers.2.mlp.experts.5.w3");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->layer, 2u);
  EXPECT_EQ(e->expert, 5u);
  EXPECT_EQ(e->projection, "up");
}

TEST(CompareModuleKey, OtherModulesDropOneLeadingPrefixOnly) {
  EXPECT_EQ(module_key("model.layers.0.self_attn.q_proj"), module_key("layers.0.self_attn.q_proj"));
  EXPECT_EQ(module_key("language_model.model.lm_head"), module_key("lm_head"));
  EXPECT_NE(module_key("model.model.lm_head"), module_key("lm_head"));
  EXPECT_FALSE(routed_expert("model.layers.0.mlp.experts.1.w4"));
  EXPECT_FALSE(routed_expert("model.layers.0.mlp.shared_experts.w1"));
  EXPECT_FALSE(routed_expert("model.layers.x.mlp.experts.1.w1"));
  EXPECT_FALSE(routed_expert("x.model.layers.0.mlp.experts.1.w1"));
  // Expert and non-expert keys never collide.
  EXPECT_NE(module_key("layers.0.mlp.experts.1.w1"), module_key("E0.1.gate"));
  EXPECT_THROW(module_key("layers.99999999999999999999.mlp.experts.1.w1"), Error);
}

TEST(CompareFigures, PowerOfTwoOnF32Bits) {
  EXPECT_TRUE(f32_is_power_of_two(std::bit_cast<std::uint32_t>(1.0f)));
  EXPECT_TRUE(f32_is_power_of_two(std::bit_cast<std::uint32_t>(0x1p-11f)));
  EXPECT_TRUE(f32_is_power_of_two(0x00000001u));  // smallest subnormal
  EXPECT_TRUE(f32_is_power_of_two(0x00400000u));  // 2^-127
  EXPECT_FALSE(f32_is_power_of_two(0x00000003u));
  EXPECT_FALSE(f32_is_power_of_two(std::bit_cast<std::uint32_t>(0.75f)));
  EXPECT_FALSE(f32_is_power_of_two(std::bit_cast<std::uint32_t>(-2.0f)));
  EXPECT_FALSE(f32_is_power_of_two(0u));
  EXPECT_FALSE(f32_is_power_of_two(0x7F800000u));  // +inf
}

TEST(CompareFigures, ExactCasesAreExactlyZeroAndOne) {
  EXPECT_EQ(relative_rmse(0, 0), 0.0);
  EXPECT_EQ(relative_rmse(0, 5), 0.0);
  EXPECT_FALSE(relative_rmse(1, 0));
  EXPECT_DOUBLE_EQ(*relative_rmse(4, 16), 0.5);
  EXPECT_EQ(cosine_similarity(true, 0, 0, 0), 1.0);
  EXPECT_EQ(cosine_similarity(false, 0, 0, 3), 0.0);
  EXPECT_EQ(cosine_similarity(false, -2, 1, 4), -1.0);
  EXPECT_EQ(cosine_similarity(false, 3, 1, 4), 1.0);  // clamped
}

TEST(CompareFormat, FromConfigOrHfQuantConfig) {
  EXPECT_EQ(detect_other_format(R"({"quantization_config":{"quant_method":"compressed-tensors",
      "config_groups":{"g":{"format":"nvfp4-pack-quantized"}}}})", ""), OtherFormat::CompressedTensors);
  EXPECT_EQ(detect_other_format(R"({"text_config":{"quantization_config":{"quant_method":"modelopt_mixed"}}})", ""),
            OtherFormat::ModelOpt);
  EXPECT_EQ(detect_other_format(R"({})", R"({"producer":{"name":"modelopt"}})"), OtherFormat::ModelOpt);
  EXPECT_EQ(detect_other_format(R"({})", R"({"quantization":{}})"), OtherFormat::ModelOpt);
  // An MXFP4 config is no NVFP4 OTHER; nor is a config without one.
  EXPECT_THROW(detect_other_format(R"({"quantization_config":{"quant_method":"compressed-tensors",
      "format":"mxfp4-pack-quantized"}})", ""), Error);
  EXPECT_THROW(detect_other_format(R"({})", ""), Error);
  EXPECT_THROW(detect_other_format(R"({"a":1,"a":2})", ""), Error);
}

}  // namespace
}  // namespace mx2nv

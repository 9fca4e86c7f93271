// gate's reading of a ModelOpt exclude list as each runtime does
// (gate/exclusion.hpp): what leaves a routed-expert layer unquantized.
#include "gate/exclusion.hpp"

#include <gtest/gtest.h>

namespace mx2nv {
namespace {

const std::vector<std::string> kK3 = {"language_model.model.layers.1.block_sparse_moe.experts"};
const std::vector<std::string> kDs = {"model.layers.1.mlp.experts"};

bool excluded(Runtime r, bool k3, std::vector<std::string> entries) {
  return excluded_expert_layer(r, k3, entries, k3 ? kK3 : kDs).has_value();
}

TEST(Exclusion, FullNamesOfOtherModulesLeaveTheExpertsQuantized) {
  const std::vector<std::string> k3 = {"language_model.lm_head", "language_model.model.layers.1.block_sparse_moe.gate",
                                       "language_model.model.layers.1.block_sparse_moe.shared_experts.w1",
                                       "language_model.model.layers.11.self_attn.o_proj"};
  EXPECT_FALSE(excluded(Runtime::Vllm, true, k3));
  EXPECT_FALSE(excluded(Runtime::Sglang, true, k3));
  const std::vector<std::string> ds = {"lm_head", "model.layers.1.mlp.gate", "model.layers.1.mlp.shared_experts.gate_proj"};
  EXPECT_FALSE(excluded(Runtime::Vllm, false, ds));
  EXPECT_FALSE(excluded(Runtime::Sglang, false, ds));
}

TEST(Exclusion, EachRuntimesOwnWaysOfReachingTheLayer) {
  for (const Runtime r : {Runtime::Vllm, Runtime::Sglang}) {
    EXPECT_TRUE(excluded(r, true, {"experts"}));                          // a part (SGLang), a substring (vLLM)
    EXPECT_TRUE(excluded(r, false, {"model.layers.1.mlp.experts"}));      // the layer itself
    EXPECT_TRUE(excluded(r, false, {"model.layers.*.mlp*"}));             // a pattern
  }
  EXPECT_TRUE(excluded(Runtime::Sglang, true, {"mlp"}));  // SGLang's K3 mapper: block_sparse_moe -> mlp
  // vLLM: an entry naming inside the layer (one expert) takes the layer.
  EXPECT_TRUE(excluded(Runtime::Vllm, false, {"model.layers.1.mlp.experts.0.gate_proj"}));
  // vLLM: a substring; SGLang: only whole parts.
  EXPECT_TRUE(excluded(Runtime::Vllm, false, {"layers.1.ml"}));
  EXPECT_FALSE(excluded(Runtime::Sglang, false, {"layers.1.ml"}));
  // SGLang cannot compile it as a regular expression: not judged RUN.
  EXPECT_TRUE(excluded(Runtime::Sglang, false, {"model.layers.(1"}));
}

}  // namespace
}  // namespace mx2nv

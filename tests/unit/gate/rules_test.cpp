// gate/rules: the model-class rule, what one rank holds, and the Humming
// rules (vLLM 0.34.0 on sm90 with
// humming-kernels 0.1.19): block scales never block, the global's range
// depends on whether a layer's gate and up globals agree (one FP32 multiplier
// per expert) or not (per channel in the activation dtype).
#include "gate/rules.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace mx2nv {
namespace {

const RuntimeBackend& humming() {
  for (const auto& b : runtime_backends()) {
    if (b.backend == Backend::Humming) return b;
  }
  throw std::logic_error("no humming backend");
}

std::vector<SchemeFacts> nvfp4a16() {
  SchemeFacts s;
  s.compressed_tensors = true;
  s.format = "nvfp4-pack-quantized";
  s.num_bits = 4;
  s.group_size = 16;
  s.type = "float";
  s.strategy = "tensor_group";
  s.symmetric = true;
  s.input_activations_null = true;
  return {s};
}

const MoeDims kDims{256, 128, 4, 2};

// A ModelOpt config as mx2nv writes it: W4A16_NVFP4, the shared experts named.
ModelOptScheme modelopt_w4a16() {
  ModelOptScheme m;
  m.selected = true;
  m.exclude = {"lm_head", "model.layers.0.mlp.shared_experts.gate_proj",
               "language_model.model.layers.0.block_sparse_moe.shared_experts.w1"};
  return m;
}
constexpr std::string_view kK3 = "KimiK3ForConditionalGeneration";

const RuntimeBackend& backend(std::string_view runtime, std::string_view name) {
  for (const auto& b : runtime_backends()) {
    if (choice_name(b.runtime) == runtime && choice_name(b.backend) == name) return b;
  }
  throw std::logic_error("no such backend");
}

ScaleFacts powers_of_two(int lo, int hi) {
  ScaleFacts s;
  s.min_multiplier = std::ldexp(1.0, lo);
  s.max_multiplier = std::ldexp(1.0, hi);
  return s;
}

Verdict::Kind kind(ActivationDtype d, const ScaleFacts& s) {
  return judge_backend(humming(), d, {1, 1}, kK3, nvfp4a16(), kDims, s).kind;
}

TEST(HummingRules, VerifiedAndSmallOrNegativeBlockScalesDoNotBlock) {
  EXPECT_TRUE(humming().verified);
  ScaleFacts s = powers_of_two(-30, 4);  // quiet experts: no fp16 global in Marlin
  s.active_below_fp16 = s.active_below_bf16 = 12;
  s.negative_scales = 3;
  EXPECT_EQ(kind(ActivationDtype::Fp16, s), Verdict::Run);
  EXPECT_EQ(kind(ActivationDtype::Bf16, s), Verdict::Run);
}

TEST(HummingRules, PerExpertGlobalMustBeANormalFp32AfterTimesFour) {
  EXPECT_EQ(kind(ActivationDtype::Fp16, powers_of_two(-126, 125)), Verdict::Run);
  EXPECT_EQ(kind(ActivationDtype::Bf16, powers_of_two(-127, 0)), Verdict::Blocked);
  EXPECT_EQ(kind(ActivationDtype::Bf16, powers_of_two(0, 126)), Verdict::Blocked);
}

TEST(HummingRules, PerChannelGlobalsMustBeExactNormalsOfTheDtype) {
  ScaleFacts s = powers_of_two(-30, 15);  // w2 of quiet experts: FP32, fine
  s.gate_up_differ = 1;
  s.gate_up_differ_first = {"layers.0.experts.1"};
  s.channel_min_multiplier = std::ldexp(1.0, -14);
  s.channel_max_multiplier = std::ldexp(1.0, 15);
  EXPECT_EQ(kind(ActivationDtype::Fp16, s), Verdict::Run);
  s.channel_min_multiplier = std::ldexp(1.0, -15);  // subnormal fp16, normal bf16
  EXPECT_EQ(kind(ActivationDtype::Fp16, s), Verdict::Blocked);
  EXPECT_EQ(kind(ActivationDtype::Bf16, s), Verdict::Run);
  s.channel_max_multiplier = 65536.0;  // overflows fp16 only
  const Verdict v = judge_backend(humming(), ActivationDtype::Fp16, {1, 1}, kK3, nvfp4a16(), kDims, s);
  EXPECT_EQ(v.reasons.size(), 2u);
  s.channel_not_pow2 = 1;  // a rounded multiplier: wrong in both
  s.channel_not_pow2_example = "layers.0.experts.1.w3";
  EXPECT_EQ(kind(ActivationDtype::Bf16, s), Verdict::Blocked);
  s.channel_not_pow2 = 0;
  s.modules_not_pow2 = 5;  // elsewhere (w2, or layers whose pairs agree): FP32, fine
  EXPECT_EQ(kind(ActivationDtype::Bf16, s), Verdict::Run);
}

}  // namespace
}  // namespace mx2nv

namespace mx2nv {
namespace {

Verdict judge(std::string_view runtime, std::string_view name, std::string_view architecture, Deployment d = {}) {
  return judge_backend(backend(runtime, name), ActivationDtype::Bf16, d, architecture, nvfp4a16(), kDims,
                       powers_of_two(-4, 4));
}

TEST(ModelClassRules, SglangK3LoaderSkipsPackedExperts) {
  const Verdict v = judge("sglang", "marlin", kK3);
  EXPECT_EQ(v.kind, Verdict::Blocked);
  EXPECT_EQ(v.model_class, "KimiK3ForConditionalGeneration");
  ASSERT_FALSE(v.reasons.empty());
  EXPECT_NE(v.reasons.front().find("kimi_k3.py:3207-3210"), std::string::npos);
  EXPECT_EQ(judge("sglang", "marlin", "KimiK3LinearForCausalLM").kind, Verdict::Blocked);
}

TEST(ModelClassRules, CheckedLoadersRun) {
  EXPECT_EQ(judge("vllm", "marlin", kK3).kind, Verdict::Run);
  EXPECT_EQ(judge("vllm", "marlin", "KimiK31ForConditionalGeneration").kind, Verdict::Run);
  EXPECT_EQ(judge("vllm", "marlin", "DeepseekV3ForCausalLM").kind, Verdict::Run);
  EXPECT_EQ(judge("sglang", "marlin", "DeepseekV3ForCausalLM").kind, Verdict::Run);
}

TEST(ModelClassRules, UncheckedOrMissingArchitecturesAreUnknownNeverRun) {
  for (const std::string_view arch : {"", "Qwen3MoeForCausalLM", "KimiK3ForCausalLM", "DeepseekV4ForCausalLM"}) {
    for (const auto& b : runtime_backends()) {
      const Verdict v = judge_backend(b, ActivationDtype::Fp16, {}, arch, nvfp4a16(), kDims, powers_of_two(-4, 4),
                                      modelopt_w4a16());
      EXPECT_EQ(v.kind, Verdict::Unknown) << arch << " " << choice_name(b.runtime) << " " << choice_name(b.backend)
                                          << " " << choice_name(b.format);
      EXPECT_TRUE(v.model_class.empty());
    }
  }
  // A block found elsewhere still wins over unknown.
  ScaleFacts s = powers_of_two(-4, 4);
  s.gate_up_differ = 1;
  s.gate_up_differ_first = {"layers.0.experts.0"};
  EXPECT_EQ(judge_backend(backend("sglang", "marlin"), ActivationDtype::Fp16, {}, "Qwen3MoeForCausalLM", nvfp4a16(),
                          kDims, s).kind,
            Verdict::Blocked);
}

const RuntimeBackend& modelopt_backend(Runtime runtime, Backend name) {
  for (const RuntimeBackend* b : runtime_backends(TargetFormat::ModelOpt)) {
    if (b->runtime == runtime && b->backend == name) return *b;
  }
  throw std::logic_error("no such ModelOpt backend");
}

const std::vector<std::string> kK3Layers = {"language_model.model.layers.0.block_sparse_moe.experts"};
const std::vector<std::string> kDsLayers = {"model.layers.0.mlp.experts"};

Verdict judge_modelopt(Runtime r, Backend b, std::string_view arch, const ModelOptScheme& m = modelopt_w4a16(),
                       const ScaleFacts& s = powers_of_two(-4, 4)) {
  const bool k3 = arch.starts_with("KimiK3");
  return judge_backend(modelopt_backend(r, b), ActivationDtype::Bf16, {}, arch, {}, kDims, s, m,
                       k3 ? kK3Layers : kDsLayers);
}

TEST(ModelOptRules, TheK3LoadersThatReadModelOptNamesRun) {
  EXPECT_EQ(judge_modelopt(Runtime::Sglang, Backend::Marlin, kK3).kind, Verdict::Run);
  EXPECT_EQ(judge_modelopt(Runtime::Vllm, Backend::Marlin, kK3).kind, Verdict::Run);
  EXPECT_EQ(judge_modelopt(Runtime::Vllm, Backend::Marlin, "DeepseekV3ForCausalLM").kind, Verdict::Run);
  EXPECT_EQ(judge_modelopt(Runtime::Sglang, Backend::Marlin, "DeepseekV3ForCausalLM").kind, Verdict::Run);
  // No block_sparse_moe mapper in SGLang's K3 linear class: its experts are skipped.
  EXPECT_EQ(judge_modelopt(Runtime::Sglang, Backend::Marlin, "KimiK3LinearForCausalLM").kind, Verdict::Blocked);
  // Kernels no conformance test runs are never RUN.
  EXPECT_EQ(judge_modelopt(Runtime::Sglang, Backend::CuteDsl, kK3).kind, Verdict::Unverified);
  EXPECT_EQ(judge_modelopt(Runtime::Vllm, Backend::Humming, kK3).kind, Verdict::Unverified);
}

TEST(ModelOptRules, WhatTheConfigAndTheExcludeListMustSay) {
  ModelOptScheme m = modelopt_w4a16();
  m.selected = false;
  m.why_not = "quant_algo is \"NVFP4\", not W4A16_NVFP4";
  EXPECT_EQ(judge_modelopt(Runtime::Vllm, Backend::Marlin, kK3, m).kind, Verdict::Blocked);
  ModelOptScheme wide = modelopt_w4a16();
  wide.exclude.push_back("experts");
  for (const Runtime r : {Runtime::Vllm, Runtime::Sglang}) {
    const Verdict v = judge_modelopt(r, Backend::Marlin, kK3, wide);
    EXPECT_EQ(v.kind, Verdict::Blocked);
    ASSERT_FALSE(v.reasons.empty());
    EXPECT_NE(v.reasons.back().find("\"experts\""), std::string::npos) << v.reasons.back();
  }
  // SGLang's DeepSeek class fuses BF16 shared experts into the FP4 MoE unless they are excluded by name.
  ModelOptScheme unnamed = modelopt_w4a16();
  unnamed.exclude = {"lm_head"};
  EXPECT_EQ(judge_modelopt(Runtime::Sglang, Backend::Marlin, "DeepseekV3ForCausalLM", unnamed).kind, Verdict::Blocked);
  EXPECT_EQ(judge_modelopt(Runtime::Vllm, Backend::Marlin, "DeepseekV3ForCausalLM", unnamed).kind, Verdict::Run);
}

TEST(ModelOptRules, GateAndUpMustShareWeightScale2WhereOneHalfsIsUsedForBoth) {
  ScaleFacts s = powers_of_two(-4, 4);
  s.gate_up_differ = 1;
  s.gate_up_differ_first = {"layers.0.experts.0"};
  for (const auto& [r, b] : {std::pair{Runtime::Vllm, Backend::Marlin}, std::pair{Runtime::Sglang, Backend::Marlin},
                             std::pair{Runtime::Sglang, Backend::CuteDsl}}) {
    const Verdict v = judge_modelopt(r, b, kK3, modelopt_w4a16(), s);
    EXPECT_EQ(v.kind, Verdict::Blocked) << choice_name(r) << " " << choice_name(b);
  }
}

TEST(RankShare, VllmK3PadsSmallPerRankInnerDimensionTo256) {
  const MoeDims k3{7168, 3072, 896, 60};
  const RankShare at8 = rank_share(backend("vllm", "marlin"), kK3, k3, {8, 1});
  EXPECT_EQ(at8.intermediate, 384u);
  EXPECT_EQ(at8.padded_intermediate, 384u);
  const RankShare at16 = rank_share(backend("vllm", "marlin"), kK3, k3, {16, 1});
  EXPECT_EQ(at16.intermediate, 192u);
  EXPECT_EQ(at16.padded_intermediate, 256u);
  EXPECT_FALSE(at16.problem);
  // Not the K3 class, or under expert parallelism: no padding.
  EXPECT_EQ(rank_share(backend("vllm", "marlin"), "DeepseekV3ForCausalLM", k3, {16, 1}).padded_intermediate, 192u);
  const RankShare ep = rank_share(backend("vllm", "marlin"), kK3, k3, {16, 16});
  EXPECT_EQ(ep.intermediate, 3072u);
  EXPECT_EQ(ep.experts, 56u);
  // Bytes a rank loads: 3 matrices of n x hidden at 4.5 bits, 3 globals, per expert and layer.
  EXPECT_DOUBLE_EQ(at8.bytes, (3.0 * 384 * 7168 * 9 / 16 + 12) * 896 * 60);
}

TEST(RankShare, ExpertParallelDivisibility) {
  const MoeDims dims{7168, 3072, 10, 2};
  // SGLang asserts an even split of the experts, and MoE TP = TP / EP.
  EXPECT_TRUE(rank_share(backend("sglang", "marlin"), kK3, dims, {8, 4}).problem);
  EXPECT_TRUE(rank_share(backend("sglang", "marlin"), kK3, dims, {8, 3}).problem);
  const RankShare even = rank_share(backend("sglang", "marlin"), kK3, dims, {4, 2});
  EXPECT_FALSE(even.problem);
  EXPECT_EQ(even.experts, 5u);
  EXPECT_EQ(even.intermediate, 1536u);
  // vLLM spreads an uneven split: ranks hold 3 or 2 experts, a note.
  const RankShare uneven = rank_share(backend("vllm", "marlin"), kK3, dims, {4, 4});
  EXPECT_FALSE(uneven.problem);
  EXPECT_EQ(uneven.experts, 3u);
  // The per-rank rule of a backend follows the split: SGLang needs n % 64.
  const Verdict v = judge_backend(backend("sglang", "marlin"), ActivationDtype::Fp16, {64, 1}, "DeepseekV3ForCausalLM",
                                  nvfp4a16(), dims, powers_of_two(-4, 4));
  EXPECT_EQ(v.kind, Verdict::Blocked);
}

}  // namespace
}  // namespace mx2nv

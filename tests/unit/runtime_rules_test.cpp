// The Humming rules of core/runtime_rules (vLLM 0.33.0 on sm90 with
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
    if (b.backend == "humming") return b;
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

ScaleFacts powers_of_two(int lo, int hi) {
  ScaleFacts s;
  s.min_multiplier = std::ldexp(1.0, lo);
  s.max_multiplier = std::ldexp(1.0, hi);
  return s;
}

Verdict::Kind kind(ActivationDtype d, const ScaleFacts& s) {
  return judge_backend(humming(), d, 1, nvfp4a16(), kDims, s).kind;
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
  const Verdict v = judge_backend(humming(), ActivationDtype::Fp16, 1, nvfp4a16(), kDims, s);
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

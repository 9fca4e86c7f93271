#include "gate/model_class.hpp"

#include <algorithm>

namespace mx2nv {
namespace {

// Paths are inside the released wheels (vllm 0.34.0, sglang 0.5.23).
constexpr std::string_view kVllmK3Loader =
    "vllm/models/kimi_k3/nvidia/model.py:1401-1415: `.weight_packed` is renamed only when no parameter ends in "
    "`w13_weight_packed` (the MXFP4 path), so the NVFP4 experts' names resolve; an unknown name raises";
constexpr std::string_view kVllmDeepseekLoader =
    "vllm/model_executor/models/deepseek_v2.py:1594 (DeepseekV2Model.load_weights): checkpoint names map onto "
    "the NVFP4 MoE method's `w13_weight_packed` / `w2_weight_packed`";
constexpr std::string_view kSglangK3Loader =
    "sglang/srt/models/kimi_k3.py:3207-3210 renames every `weight_packed` to `weight` (meant for MXFP4), but the "
    "NVFP4 MoE's parameters are `w13_weight_packed` / `w2_weight_packed`, so :3288 skips the packed codes without "
    "a word";
constexpr std::string_view kSglangK3Unblock =
    "an SGLang that renames only when no `w13_weight_packed` parameter exists (as vLLM 0.34.0 does, "
    "vllm/models/kimi_k3/nvidia/model.py:1401-1415), or a layout this loader reads (ModelOpt W4A16_NVFP4)";
constexpr std::string_view kSglangDeepseekLoader =
    "sglang/srt/models/deepseek_v2.py:3436 (load_weights): no `weight_packed` rename off NPU, so the names "
    "map onto `w13_weight_packed` / `w2_weight_packed`";

// The ModelOpt layout's names (`weight`, `weight_scale`, `weight_scale_2`).
constexpr std::string_view kVllmK3ModelOpt =
    "vllm/models/kimi_k3/nvidia/model.py:1387-1396 (expert mapping `experts.E.wN.` -> `experts.routed_experts."
    "w13_|w2_`, fused_moe/routed_experts.py:1249-1255): `weight`, `weight_scale`, `weight_scale_2` land on "
    "ModelOptNvFp4FusedMoE's parameters (model_executor/layers/quantization/modelopt.py:964-1035)";
constexpr std::string_view kVllmDeepseekModelOpt =
    "vllm/model_executor/models/deepseek_v2.py:1627-1636: `gate_proj`/`up_proj`/`down_proj` names map onto "
    "`w13_weight`, `w13_weight_scale`, `w13_weight_scale_2`, `w2_*` (modelopt.py:964-1035)";
constexpr std::string_view kSglangK3ModelOpt =
    "sglang/srt/models/kimi_k3.py:3476-3483 (block_sparse_moe -> mlp), :3169-3174 (expert mapping): `weight`, "
    "`weight_scale`, `weight_scale_2` land on ModelOptNvFp4FusedMoEMethod's parameters "
    "(layers/quantization/modelopt_quant.py:2520-2607); the `weight_packed` rename at :3207-3210 touches none";
constexpr std::string_view kSglangK3LinearModelOpt =
    "sglang/srt/models/kimi_k3.py:3876 registers KimiK3LinearForCausalLM with no name mapper, so experts under "
    "`block_sparse_moe` become `block_sparse_moe.experts.w13_*`, which are no parameters, and :3288 skips them "
    "without a word";
constexpr std::string_view kSglangK3LinearUnblock =
    "the architecture KimiK3ForConditionalGeneration (whose mapper renames block_sparse_moe to mlp)";
constexpr std::string_view kSglangDeepseekModelOpt =
    "sglang/srt/models/deepseek_common/deepseek_weight_loader.py:264-270, :401-409: `gate_proj`/`up_proj`/"
    "`down_proj` names map onto ModelOptNvFp4FusedMoEMethod's `w13_*`/`w2_*` parameters";

const std::vector<ModelClassRule>& rules() {
  constexpr TargetFormat ct = TargetFormat::CompressedTensors, mo = TargetFormat::ModelOpt;
  static const std::vector<ModelClassRule> all = {
      {Runtime::Vllm, ct, "KimiK3ForConditionalGeneration", "KimiK3ForConditionalGeneration",
       "vllm/model_executor/models/registry.py:489-492", true, kVllmK3Loader, ""},
      {Runtime::Vllm, ct, "KimiK31ForConditionalGeneration", "KimiK3ForConditionalGeneration",
       "vllm/model_executor/models/registry.py:493-496", true, kVllmK3Loader, ""},
      {Runtime::Vllm, ct, "DeepseekV3ForCausalLM", "DeepseekV3ForCausalLM", "vllm/model_executor/models/registry.py:94", true,
       kVllmDeepseekLoader, ""},
      {Runtime::Sglang, ct, "KimiK3ForConditionalGeneration", "KimiK3ForConditionalGeneration",
       "EntryClass, sglang/srt/models/kimi_k3.py:3876", false, kSglangK3Loader, kSglangK3Unblock},
      {Runtime::Sglang, ct, "KimiK3LinearForCausalLM", "KimiK3LinearForCausalLM",
       "EntryClass, sglang/srt/models/kimi_k3.py:3876", false, kSglangK3Loader, kSglangK3Unblock},
      {Runtime::Sglang, ct, "DeepseekV3ForCausalLM", "DeepseekV3ForCausalLM",
       "EntryClass, sglang/srt/models/deepseek_v2.py:3595", true, kSglangDeepseekLoader, ""},
      {Runtime::Vllm, mo, "KimiK3ForConditionalGeneration", "KimiK3ForConditionalGeneration",
       "vllm/model_executor/models/registry.py:489-492", true, kVllmK3ModelOpt, ""},
      {Runtime::Vllm, mo, "KimiK31ForConditionalGeneration", "KimiK3ForConditionalGeneration",
       "vllm/model_executor/models/registry.py:493-496", true, kVllmK3ModelOpt, ""},
      {Runtime::Vllm, mo, "DeepseekV3ForCausalLM", "DeepseekV3ForCausalLM", "vllm/model_executor/models/registry.py:94",
       true, kVllmDeepseekModelOpt, ""},
      {Runtime::Sglang, mo, "KimiK3ForConditionalGeneration", "KimiK3ForConditionalGeneration",
       "EntryClass, sglang/srt/models/kimi_k3.py:3876", true, kSglangK3ModelOpt, ""},
      {Runtime::Sglang, mo, "KimiK3LinearForCausalLM", "KimiK3LinearForCausalLM",
       "EntryClass, sglang/srt/models/kimi_k3.py:3876", false, kSglangK3LinearModelOpt, kSglangK3LinearUnblock},
      {Runtime::Sglang, mo, "DeepseekV3ForCausalLM", "DeepseekV3ForCausalLM",
       "EntryClass, sglang/srt/models/deepseek_v2.py:3595", true, kSglangDeepseekModelOpt, ""},
  };
  return all;
}

}  // namespace

const std::vector<ModelClassRule>& model_class_rules() { return rules(); }

const ModelClassRule* model_class_rule(Runtime runtime, std::string_view architecture, TargetFormat format) {
  const auto& all = rules();
  const auto it = std::find_if(all.begin(), all.end(), [&](const ModelClassRule& r) {
    return r.runtime == runtime && r.architecture == architecture && r.format == format;
  });
  return it == all.end() ? nullptr : &*it;
}

}  // namespace mx2nv

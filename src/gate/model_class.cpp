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

const std::vector<ModelClassRule>& rules() {
  static const std::vector<ModelClassRule> all = {
      {Runtime::Vllm, "KimiK3ForConditionalGeneration", "KimiK3ForConditionalGeneration",
       "vllm/model_executor/models/registry.py:489-492", true, kVllmK3Loader, ""},
      {Runtime::Vllm, "KimiK31ForConditionalGeneration", "KimiK3ForConditionalGeneration",
       "vllm/model_executor/models/registry.py:493-496", true, kVllmK3Loader, ""},
      {Runtime::Vllm, "DeepseekV3ForCausalLM", "DeepseekV3ForCausalLM", "vllm/model_executor/models/registry.py:94", true,
       kVllmDeepseekLoader, ""},
      {Runtime::Sglang, "KimiK3ForConditionalGeneration", "KimiK3ForConditionalGeneration",
       "EntryClass, sglang/srt/models/kimi_k3.py:3876", false, kSglangK3Loader, kSglangK3Unblock},
      {Runtime::Sglang, "KimiK3LinearForCausalLM", "KimiK3LinearForCausalLM",
       "EntryClass, sglang/srt/models/kimi_k3.py:3876", false, kSglangK3Loader, kSglangK3Unblock},
      {Runtime::Sglang, "DeepseekV3ForCausalLM", "DeepseekV3ForCausalLM",
       "EntryClass, sglang/srt/models/deepseek_v2.py:3595", true, kSglangDeepseekLoader, ""},
  };
  return all;
}

}  // namespace

const std::vector<ModelClassRule>& model_class_rules() { return rules(); }

const ModelClassRule* model_class_rule(Runtime runtime, std::string_view architecture) {
  const auto& all = rules();
  const auto it = std::find_if(all.begin(), all.end(), [&](const ModelClassRule& r) {
    return r.runtime == runtime && r.architecture == architecture;
  });
  return it == all.end() ? nullptr : &*it;
}

}  // namespace mx2nv

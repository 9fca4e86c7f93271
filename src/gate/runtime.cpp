#include "gate/runtime.hpp"

namespace mx2nv {
namespace {

constexpr Choice<Runtime> kRuntimes[] = {
    {Runtime::Vllm, "vllm", "vLLM (the pinned release, gate/rules.cpp)"},
    {Runtime::Sglang, "sglang", "SGLang (the pinned release, gate/rules.cpp)"},
};
constexpr Choice<Backend> kBackends[] = {
    {Backend::Marlin, "marlin", "the FP4 Marlin MoE kernel"},
    {Backend::Humming, "humming", "humming-kernels' NVFP4 MoE kernel (vLLM on sm90)"},
    {Backend::CuteDsl, "flashinfer-cutedsl",
     "FlashInfer's CuTe-DSL W4A16 MoE kernel (SGLang, ModelOpt layout, Blackwell, opt-in)"},
};
constexpr Choice<ActivationDtype> kDtypes[] = {
    {ActivationDtype::Fp16, "fp16", "float16 activations"},
    {ActivationDtype::Bf16, "bf16", "bfloat16 activations"},
};

}  // namespace

template <>
std::span<const Choice<Runtime>> choices<Runtime>() {
  return kRuntimes;
}
template <>
std::span<const Choice<Backend>> choices<Backend>() {
  return kBackends;
}
template <>
std::span<const Choice<ActivationDtype>> choices<ActivationDtype>() {
  return kDtypes;
}

}  // namespace mx2nv

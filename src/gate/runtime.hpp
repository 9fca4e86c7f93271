// The names gate judges by: the runtimes, their MoE backends and the
// activation dtypes, each an enum with its choice table (common/choice.hpp):
// the CLI's --runtime/--dtype, the Python validators, the probe protocol and
// the JSON all spell them from here.
#pragma once

#include "common/choice.hpp"

namespace mx2nv {

enum class Runtime { Vllm, Sglang };
template <>
std::span<const Choice<Runtime>> choices<Runtime>();

enum class Backend { Marlin, Humming, CuteDsl };
template <>
std::span<const Choice<Backend>> choices<Backend>();

enum class ActivationDtype { Fp16, Bf16 };
template <>
std::span<const Choice<ActivationDtype>> choices<ActivationDtype>();

// The word that selects every value of a gate option (--runtime all, --dtype both).
inline constexpr std::string_view kEveryRuntime = "all";
inline constexpr std::string_view kEveryDtype = "both";

}  // namespace mx2nv

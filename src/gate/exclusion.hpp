// Whether a ModelOpt checkpoint's exclude list leaves a routed-expert layer
// unquantized in a runtime: the runtime then builds an unquantized (BF16) MoE
// for it and its U8 packed weights fail to load or load as garbage, so gate
// blocks it. The predicates are the pinned releases' own
// (docs/reference/modelopt-output.md §Exclusion):
//   vLLM 0.34.0 (model_executor/layers/quantization/modelopt.py:198-233,
//     utils/quant_utils.py:634-708): the entries, for a model class with a
//     name mapper (K3), first split `x*` into `x` and `x.*` and renamed
//     (modelopt.py:270-289); the layer P is excluded when an entry equals P,
//     holds "experts" and P as a substring, is a substring of P (or of P
//     without `language_model.`), or fnmatch-es P.
//   SGLang 0.5.23 (layers/quantization/modelopt_quant.py:308-313, :363-424):
//     the entries, for K3's ForConditionalGeneration class, renamed through
//     its mapper and repeated without `language_model.`; P (the runtime's
//     name, `model.layers.L.mlp.experts`) is excluded when an entry, read as
//     a regular expression with `.` literal and `*` as `.*`, matches all of P
//     or one of its dotted parts.
#pragma once

#include "gate/runtime.hpp"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mx2nv {

// The first entry of `exclude` that makes `runtime` treat one of `layers`
// (routed-expert layer prefixes as the checkpoint spells them) as
// unquantized, said in words; nullopt when none does. `k3_mapper`: the model
// class renames checkpoint names (Kimi K3's ForConditionalGeneration).
std::optional<std::string> excluded_expert_layer(Runtime runtime, bool k3_mapper,
                                                 const std::vector<std::string>& exclude,
                                                 const std::vector<std::string>& layers);

}  // namespace mx2nv

// The config of a ModelOpt-layout DST (`convert --format modelopt`): ModelOpt's
// `W4A16_NVFP4` (NVFP4 weights, 16-value E4M3 block scales, an FP32
// weight_scale_2 multiplier, activations unquantized), in the flat form
// ModelOpt's exporter writes into config.json and SGLang 0.5.23's and vLLM
// 0.34.0's ModelOpt parsers read (docs/reference/modelopt-output.md cites each
// key):
//   - config.json's quantization_config: quant_method "modelopt", quant_algo
//     "W4A16_NVFP4", group_size 16, config_groups (weights only), producer,
//     and the modules left unquantized under `ignore` (what both runtimes
//     read) and `exclude_modules`. At the top level, and where SRC keeps its
//     own when that is deeper (Kimi K3's text_config): vLLM reads the top
//     level first and, without one, hf_quant_config.json; SGLang reads
//     text_config first to choose K3's MoE kernel.
//   - hf_quant_config.json beside it: {"producer", "quantization": {quant_algo,
//     kv_cache_quant_algo null, group_size, exclude_modules}}, as ModelOpt
//     writes it (for tools that read only that file).
// The producer is mx2nv. Each unquantized module is named in full, as SRC
// spells it: no wildcard, so no entry can reach a quantized layer by accident.
#pragma once

#include "json/strict_json.hpp"
#include "model/quant_config.hpp"

#include <string>
#include <string_view>
#include <vector>

namespace mx2nv {

inline constexpr std::string_view kModelOptQuantAlgo = "W4A16_NVFP4";
inline constexpr std::string_view kModelOptQuantMethod = "modelopt";

// The exclude entries for `unquantized` module names (any order, repeats
// allowed): each name, sorted, once. Throws
// Error(InvalidInput) for a name no entry can name exactly (one holding a
// wildcard character of the runtimes' matchers, `*?[]`), or one whose entry
// would also exclude a quantized layer: `quantized_layers` are the layers the
// runtimes build from the quantized modules (moe_layer_of: an expert's MoE
// layer, any other module itself), and vLLM excludes a layer whose name holds
// an entry as a substring, SGLang one with an entry as a dotted part.
// `bf16_modules` (--overspan bf16) are named with their MoE layer
// (moe_layer_of): SGLang judges a fused MoE layer by the layer's own name.
std::vector<std::string> modelopt_exclude_entries(std::vector<std::string> unquantized,
                                                  const std::vector<std::string>& bf16_modules,
                                                  const std::vector<std::string>& quantized_layers);

// config.json's quantization_config, and hf_quant_config.json's document.
// `requantized_modules` (convert --overspan requantize): the lossy modules,
// listed under kRequantizedModulesKey as in the compressed-tensors layout
// (the runtimes' ModelOpt parsers read named keys only).
Json modelopt_quant_config(const std::vector<std::string>& exclude, std::string_view producer_version,
                           const std::vector<std::string>& requantized_modules = {});
Json modelopt_hf_quant_config(const std::vector<std::string>& exclude, std::string_view producer_version);

// config.json's text with SRC's quantization_config replaced by ModelOpt's
// (every other byte kept), and hf_quant_config.json's text.
std::string modelopt_config_text(std::string_view config_text, const SourceQuantConfig& source,
                                 const std::vector<std::string>& exclude, std::string_view producer_version,
                                 const std::vector<std::string>& requantized_modules = {});
std::string modelopt_hf_quant_config_text(const std::vector<std::string>& exclude, std::string_view producer_version);

}  // namespace mx2nv

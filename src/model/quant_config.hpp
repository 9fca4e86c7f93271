// The compressed-tensors quantization_config of config.json: recognising an
// MXFP4 source, and writing its NVFP4A16 counterpart. Only keys that
// compressed-tensors' pydantic models know are ever emitted (they forbid
// extras, and vLLM validates through them).
#pragma once

#include "json/strict_json.hpp"

#include <string>
#include <vector>
#include <string_view>

namespace mx2nv {

inline constexpr std::string_view kSourceFormat = "mxfp4-pack-quantized";
inline constexpr std::string_view kTargetFormat = "nvfp4-pack-quantized";
inline constexpr std::string_view kTargetScaleDtype = "torch.float8_e4m3fn";

struct SourceQuantConfig {
  Json config;         // all of config.json
  std::string parent;  // "" when quantization_config is top-level, else e.g. "text_config"
  Json quant_config;   // the quantization_config object
};

// Finds quantization_config at the top level or one level down and checks it
// describes compressed-tensors MXFP4 weight-only quantisation. Throws
// Error(InvalidInput) with the reason otherwise.
SourceQuantConfig read_source_quant_config(std::string_view config_text);

// The NVFP4A16 quantization_config for a validated MXFP4 one: formats become
// nvfp4-pack-quantized; weights become strategy tensor_group, group_size 16,
// scale_dtype torch.float8_e4m3fn, zp_dtype null; everything else unchanged.
// `bf16_modules` (convert --overspan bf16): module names written as BF16,
// appended to quantization_config.ignore so loaders take the unquantized path.
// `requantized_modules` (--overspan requantize): the lossy modules, listed
// under kRequantizedModulesKey (compressed-tensors' QuantizationConfig and
// the runtimes' loaders ignore keys they do not know).
inline constexpr std::string_view kRequantizedModulesKey = "mx2nv_requantized_modules";
Json nvfp4_quant_config(const Json& source_quant_config, const std::vector<std::string>& bf16_modules = {},
                        const std::vector<std::string>& requantized_modules = {});

// config.json text with only the quantization_config value replaced: every
// other byte of the file is kept, so a diff shows exactly what changed.
std::string rewrite_config_text(std::string_view config_text, const SourceQuantConfig& source,
                                const std::vector<std::string>& bf16_modules = {},
                                const std::vector<std::string>& requantized_modules = {});

// Keys compressed-tensors' QuantizationArgs and QuantizationScheme accept.
bool is_known_quantization_args_key(std::string_view key);
bool is_known_scheme_key(std::string_view key);

}  // namespace mx2nv

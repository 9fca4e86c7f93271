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

// config.json text with the quantization_config value (where SRC has it)
// replaced by `target`, indented like the file; every other byte is kept.
std::string splice_quant_config(std::string_view config_text, const SourceQuantConfig& source, const Json& target);

// Keys compressed-tensors' QuantizationArgs and QuantizationScheme accept.
bool is_known_quantization_args_key(std::string_view key);
bool is_known_scheme_key(std::string_view key);

}  // namespace mx2nv

namespace mx2nv {

// What config.json (and ModelOpt's hf_quant_config.json beside it) says a
// checkpoint holds, read leniently: it only picks the plain-words message a
// wrong input gets before the strict checks above run. Malformed or
// ambiguous text is Unknown (the strict reader then names the problem).
enum class QuantizationKind {
  Unknown,          // unreadable, or several quantization_config objects
  Unquantized,      // no quantization_config anywhere, no hf_quant_config.json
  CompressedMxfp4,  // compressed-tensors mxfp4-pack-quantized: what mx2nv converts
  CompressedNvfp4,  // compressed-tensors nvfp4-pack-quantized (an mx2nv output, llm-compressor's NVFP4)
  ModelOptNvfp4,    // ModelOpt's NVFP4 export (quant_method modelopt*, or hf_quant_config.json)
  GptOssMxfp4,      // transformers' quant_method "mxfp4" (gpt-oss): stacked 3-D expert blocks/scales
  Other,            // some other quantization (fp8, gptq, awq, another compressed-tensors format ...)
};
struct QuantizationLook {
  QuantizationKind kind = QuantizationKind::Unknown;
  std::string where;   // "quantization_config" or "text_config.quantization_config" ("" if none)
  std::string method;  // quant_method as written ("" if none)
  std::string format;  // the format / quant_algo that decided the kind ("" if none)
};
// `hf_quant_config_text` is empty when the file is absent.
QuantizationLook look_at_quantization(std::string_view config_text, std::string_view hf_quant_config_text = {});

}  // namespace mx2nv

// verify's check of a ModelOpt-layout DST's config (convert --format modelopt):
// config.json's quantization_config, at the top level and where SRC keeps its
// own, is ModelOpt's W4A16_NVFP4 (model/modelopt_config.hpp) field by field;
// its `ignore` and `exclude_modules` name exactly SRC's unquantized modules
// (and the BF16 ones), no entry reaching a quantized layer; the requantized
// modules (--overspan requantize) are listed as convert lists them; hf_quant_config.json
// says the same; everything else in config.json equals SRC's. DST is untrusted:
// any JSON yields differences, never an exception.
#pragma once

#include "model/quant_config.hpp"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mx2nv {

// `unquantized`: SRC's modules that stay unquantized (each `M.weight` that is
// no quantized module's, and the BF16 modules); `quantized_layers`: the
// layers of the quantized modules (moe_layer_of). `hf_quant_config_text`:
// nullopt when DST has no hf_quant_config.json.
std::vector<std::string> check_modelopt_config(const SourceQuantConfig& source, std::string_view target_config_text,
                                               const std::optional<std::string>& hf_quant_config_text,
                                               std::vector<std::string> unquantized,
                                               const std::vector<std::string>& bf16_modules,
                                               const std::vector<std::string>& quantized_layers,
                                               const std::vector<std::string>& requantized_modules = {});

}  // namespace mx2nv

// verify's check of DST's config.json: the quantization_config is checked field
// by field against what compressed-tensors' NVFP4A16 scheme needs (not against
// convert's output), and everything outside it must equal the source's. DST is
// untrusted like SRC: any shape of JSON yields differences, never an exception.
#pragma once

#include "model/quant_config.hpp"

#include <string>
#include <string_view>
#include <vector>

namespace mx2nv {

// Every difference found (empty when the config is exactly what it must be).
// `bf16_modules`: the modules written as BF16 (convert --overspan bf16), which
// quantization_config.ignore must list after the source's entries.
std::vector<std::string> check_target_config(const SourceQuantConfig& source, std::string_view target_config_text,
                                             const std::vector<std::string>& bf16_modules = {},
                                             const std::vector<std::string>& requantized_modules = {});

}  // namespace mx2nv

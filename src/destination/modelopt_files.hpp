// What a ModelOpt-layout DST (`convert --format modelopt`) holds besides its
// shards and index: config.json with ModelOpt's quantization_config, and
// hf_quant_config.json (model/modelopt_config.hpp). Their exclude list names
// every module of SRC that stays unquantized: each `M.weight` that is no
// quantized module's, and the modules --overspan bf16 writes as BF16.
#pragma once

#include "checkpoint/reader.hpp"
#include "plan/plan.hpp"

#include <span>
#include <string>
#include <vector>

namespace mx2nv {

struct ModelOptFiles {
  std::vector<std::string> exclude;  // the entries, sorted
  std::string config;                // config.json's text
  std::string hf_quant_config;       // hf_quant_config.json's text
};

// `plan` is parallel to the modules. Throws Error(InvalidInput) for a module
// no exclude entry can name without also naming a quantized layer, and for a
// tensor `M.weight` of a quantized module M (the name its packed codes take).
// `requantized_modules`: as modelopt_quant_config lists them.
ModelOptFiles modelopt_files(const SourceCheckpoint& source, std::span<const ModulePlan> plan,
                             const std::vector<std::string>& requantized_modules = {});

}  // namespace mx2nv

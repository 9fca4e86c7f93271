// mx2nv gate: will the pinned runtimes run this compressed-tensors NVFP4A16
// MoE checkpoint exactly? Works on any such checkpoint, not only mx2nv's:
// reads config.json, every expert module's global scale and block scales, and
// the packed bytes of the blocks whose scale a runtime would zero or misread
// (to tell active blocks from all-zero ones). Rules: core/runtime_rules.hpp.
#pragma once

#include "core/runtime_rules.hpp"
#include "io/file.hpp"

#include <string>
#include <vector>

namespace mx2nv {

struct GateOptions {
  fs::path checkpoint;
  std::string runtime = "all";             // vllm | sglang | all
  unsigned tp = 1;
  std::vector<ActivationDtype> dtypes = {ActivationDtype::Fp16, ActivationDtype::Bf16};
  unsigned threads = 1;
};

struct GateResult {
  std::string checkpoint;
  MoeDims dims;
  ScaleFacts scales;
  std::vector<Verdict> verdicts;
  bool blocked() const;  // any verdict BLOCKED
};

// Throws Error(InvalidInput) for a checkpoint that is not NVFP4 at all
// (no quantization_config, malformed expert tensors).
GateResult run_gate(const GateOptions& options);
Json gate_to_json(const GateResult& result);

}  // namespace mx2nv

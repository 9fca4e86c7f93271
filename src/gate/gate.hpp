// mx2nv gate: will the pinned runtimes run this compressed-tensors NVFP4A16
// MoE checkpoint exactly? Works on any such checkpoint, not only mx2nv's:
// reads config.json, every expert module's global scale and block scales, and
// the packed bytes of the blocks whose scale a runtime would zero or misread
// (to tell active blocks from all-zero ones); with `quick`, no block scale or
// packed byte. Rules: gate/rules.hpp.
#pragma once

#include "gate/ask.hpp"
#include "gate/opinion.hpp"
#include "gate/rules.hpp"
#include "sys/file.hpp"

#include <optional>
#include <string>
#include <vector>

namespace mx2nv {

struct GateOptions {
  fs::path checkpoint;
  std::optional<Runtime> runtime;  // nullopt: every runtime
  unsigned tp = 1;
  unsigned ep = 1;  // expert-parallel degree (1: none)
  std::vector<ActivationDtype> dtypes = {ActivationDtype::Fp16, ActivationDtype::Bf16};
  unsigned threads = 1;
  // Config and headers only (dims, dtypes, shapes) and the globals (4 bytes a
  // module): no block scale is read, and the rules over them are reported as
  // not checked (docs/gate.md, "gate --quick").
  bool quick = false;
  AskOptions ask;  // also ask the installed runtimes' own selectors (gate/ask.hpp)
};

// One runtime's own selection next to gate's scheme rule for it.
struct RuntimeCheck {
  RuntimeOpinion opinion;
  bool gate_selects = false;  // gate's scheme rule chose the NVFP4A16 MoE method
  Agreement agreement = Agreement::NoOpinion;
};

struct GateResult {
  std::string checkpoint;
  TargetFormat format = TargetFormat::CompressedTensors;  // the layout the checkpoint is in (its config says)
  std::string architecture;  // config.json "architectures"[0]; "" when none
  MoeDims dims;
  ScaleFacts scales;
  std::vector<Verdict> verdicts;
  // The runtimes' own selectors, when asked: the interpreter, why not asked.
  AskResult asked;
  std::string not_asked;  // "" when asked
  std::string expert_layer;  // the layer the runtimes were asked about
  std::vector<RuntimeCheck> checks;
  bool blocked() const;     // any verdict BLOCKED
  // BLOCKED when any verdict is; RUN when every one is; else UNKNOWN when a
  // model class is unknown, else UNVERIFIED.
  std::string_view result() const;
  bool disagreed() const;   // a runtime's own selector disagrees with gate's scheme rule
  int exit_code() const;    // 1 when blocked or disagreed, else 0
};

// Throws Error(InvalidInput) for a checkpoint that is not NVFP4 at all
// (no quantization_config, malformed expert tensors). Asking the runtimes
// never throws (a failure is a "could not ask" opinion) except on Ctrl-C.
GateResult run_gate(const GateOptions& options);
Json gate_to_json(const GateResult& result);

}  // namespace mx2nv

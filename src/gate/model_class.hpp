// Which model class each pinned runtime release builds for a checkpoint's
// `architectures`, and whether that class's own `load_weights` fills every
// routed-expert parameter of a compressed-tensors NVFP4A16 checkpoint, and of
// a ModelOpt W4A16_NVFP4 one (tests/conformance/test_modelopt_loaders.py).
//
// A scheme rule and a kernel rule say nothing about the loader: SGLang
// 0.5.23's Kimi K3 class renames `weight_packed` for MXFP4 and then skips the
// NVFP4 experts' packed codes without a word. So a verdict starts here. Only
// the classes whose loader chain tests/conformance/test_model_loaders.py runs
// from the released wheel are listed; every other architecture is UNKNOWN,
// never RUN.
#pragma once

#include "gate/runtime.hpp"
#include "model/target_format.hpp"

#include <string_view>
#include <vector>

namespace mx2nv {

struct ModelClassRule {
  Runtime runtime;
  TargetFormat format;            // the layout whose expert names the loader is judged for
  std::string_view architecture;  // config.json "architectures"[0]
  std::string_view model_class;   // the class the release's registry builds
  std::string_view registry;      // where the release maps the architecture to it (file:line in the wheel)
  bool loads_experts;             // its load_weights fills every routed-expert tensor
  std::string_view loader;        // the loader's lines that decide it
  std::string_view unblock;       // when !loads_experts: what would make it load them
};

// The rule for (runtime, architecture, layout); nullptr when gate has none.
const ModelClassRule* model_class_rule(Runtime runtime, std::string_view architecture,
                                       TargetFormat format = TargetFormat::CompressedTensors);
const std::vector<ModelClassRule>& model_class_rules();

}  // namespace mx2nv

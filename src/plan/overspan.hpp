// What convert does with scale groups the window refuses (`--overspan`).
//   fail        refuse the checkpoint (the default; nothing is written)
//   bf16        lossless at a size cost: every module of an MoE layer that holds
//               a refused scale group is written dequantized as a BF16 `weight`
//               (vLLM needs one quantization scheme per MoE layer) and listed
//               in the config's `ignore`
//   requantize  lossy: only the refused scale groups (a gate/up pair together)
//               are requantized from their decoded values exactly as
//               compressed-tensors would (numerics/nvfp4_quantizer.hpp)
// Pure logic over the plan; reading values happens in the callers.
#pragma once

#include "model/module_names.hpp"  // moe_layer_of: the layers bf16 writes whole
#include "model/modules.hpp"
#include "plan/plan.hpp"

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mx2nv {

// Scale groups the plan refuses, by index: a member over the span, or no
// global for the group (plan.bad_globals). Ascending.
std::vector<std::size_t> refused_scale_groups(const ModuleSet& set, const Plan& plan);

// Resolves a refused plan with `choice` (not Fail): marks the modules it
// rewrites (ModulePlan::treatment), moves the refusals into plan.resolved and
// clears them. For requantize, `requantized_global(scale_group)` is the
// second-level F32 the plan's layout's quantizer gives that group
// (ModulePlan::divisor); a group whose value is no normal float, or whose
// multiplier is outside the window's global range, stays refused.
void resolve_over_span(const ModuleSet& set, Plan& plan, OverSpanChoice choice,
                       const std::function<float(std::size_t scale_group)>& requantized_global);

// What a finished DST records it holds (finished.json "window", the
// conversion identity): a conversion under a window, with the --overspan
// choice some module was rewritten with, or `mx2nv requantize`'s output.
// Read and written only by mode_name/parse_mode; on disk "<window>",
// "<window>+requantize", "<window>+bf16" or "requantize", followed by
// "@modelopt" for a ModelOpt-layout DST (the compressed-tensors layout, the
// default, has no suffix, so its records read as they always have).
struct ConversionMode {
  PlanKind kind = PlanKind::Convert;
  Window window = Window::Marlin;                    // a conversion's window
  OverSpanChoice rewritten = OverSpanChoice::Fail;   // a conversion's rewrites (Fail: none)
  TargetFormat format = TargetFormat::CompressedTensors;
  bool operator==(const ConversionMode&) const = default;
};
std::string mode_name(const ConversionMode& mode);
// nullopt for text no mx2nv writes (the record is input).
std::optional<ConversionMode> parse_mode(std::string_view text);
// The mode of a plan's output.
ConversionMode plan_mode(const Plan& plan);
// Whether a conversion under (window, choice, format) may have written `recorded`.
bool mode_matches(const ConversionMode& recorded, Window window, OverSpanChoice choice, TargetFormat format);

// The BF16 layers of a plan with why: every MoE layer with a Bf16 module, the
// refused modules in it, and the size change (bytes of BF16 weights minus the
// NVFP4 tensors they replace).
struct Bf16Layer {
  std::string layer;
  std::vector<std::string> modules;     // every module written as BF16
  std::vector<std::string> refused;     // why: the members of refused scale groups
  std::uint64_t bf16_bytes = 0;         // the BF16 weights written
  std::uint64_t nvfp4_bytes = 0;        // the packed, scale and global bytes they replace
};
std::vector<Bf16Layer> bf16_layers(const ModuleSet& set, const Plan& plan);

// Bytes of a module written as BF16 `weight` [N, K], and as NVFP4 (packed,
// block scales, global).
std::uint64_t bf16_weight_bytes(const QuantModule& m);
std::uint64_t nvfp4_module_bytes(const QuantModule& m);

}  // namespace mx2nv

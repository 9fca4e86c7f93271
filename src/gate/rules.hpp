// Whether the pinned runtimes will run a compressed-tensors NVFP4A16 MoE
// checkpoint exactly: the go/no-go behind `mx2nv gate` and inspect's TP table.
// Pure logic over facts gathered elsewhere (src/gate/gate.cpp reads them).
//
// Every rule names the runtime code it comes from (vLLM 0.34.0 and SGLang
// 0.5.23 wheels, the kernels' sources); docs/gate.md lists them. A verdict
// covers the whole path: the model class the checkpoint's architecture
// selects and its loader (gate/model_class.hpp), the scheme, the dimensions
// per rank, the post-load scale processing and the kernel's decode.
#pragma once

#include "gate/runtime.hpp"
#include "json/strict_json.hpp"
#include "model/target_format.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mx2nv {


struct RuntimeBackend {
  Runtime runtime;
  std::string_view version;  // the pinned release the rules were read from
  Backend backend;
  std::string_view gpus;     // where it is selected
  // Value-exact rules established (judged by tests/conformance); a backend
  // whose kernel mx2nv could not read is never RUN, at best UNVERIFIED.
  bool verified;
  TargetFormat format = TargetFormat::CompressedTensors;  // the layout this path reads
};
// Every path: for compressed-tensors vllm/marlin, vllm/humming, sglang/marlin;
// for ModelOpt also sglang/flashinfer-cutedsl.
const std::vector<RuntimeBackend>& runtime_backends();
// Those that read `format`.
std::vector<const RuntimeBackend*> runtime_backends(TargetFormat format);

// What gate reads of a ModelOpt quantization_config (config.json's flat form).
struct ModelOptScheme {
  bool selected = false;                // W4A16_NVFP4 weights, groups of 16, nothing else quantized
  std::string why_not;                  // when not selected
  std::vector<std::string> exclude;     // `ignore` (else modules_to_not_convert, exclude_modules)
};
ModelOptScheme modelopt_scheme(const Json& config);

// What the scheme selectors read from quantization_config (per config group).
struct SchemeFacts {
  bool compressed_tensors = false;
  std::string format;  // the group's, else the global one
  std::optional<int> num_bits, group_size;
  std::string type, strategy;
  bool symmetric = false;
  bool input_activations_null = false;
};
// config.json's quantization_config: the top-level one, else that of the last
// nested object (in key order) holding one (e.g. text_config); nullptr when
// none. runtime_probe.py's find_quantization_config is the same rule.
const Json* quantization_config_of(const Json& config);
// Throws Error(InvalidInput) when config.json has no quantization_config.
std::vector<SchemeFacts> scheme_facts(const Json& config);

// The MoE layer shape: the same for every layer a checkpoint has.
struct MoeDims {
  std::uint64_t hidden = 0;        // K of w1/w3
  std::uint64_t intermediate = 0;  // N of w1/w3 (full, before TP)
  std::uint64_t experts = 0;       // per layer
  std::uint64_t layers = 0;
};

// Scale and global facts of the checkpoint (gate/gate.cpp).
struct ScaleFacts {
  std::uint64_t gate_up_differ = 0;  // experts whose w1 and w3 globals are not bit-equal
  std::vector<std::string> gate_up_differ_first;  // the first few of them (layer by prefix, expert by number)
  // The w1/w3 multipliers of layers holding such an expert (Humming moves
  // every one of them into a per-channel scale of the activation dtype).
  double channel_min_multiplier = 0, channel_max_multiplier = 0;
  std::uint64_t channel_not_pow2 = 0;
  std::string channel_not_pow2_example;
  // Global multipliers g = 1 / weight_global_scale, over every expert module.
  double min_multiplier = 0, max_multiplier = 0;
  std::vector<std::string> multipliers_not_pow2;  // first few modules whose g is no power of two
  std::uint64_t modules_not_pow2 = 0;
  // Active 16-blocks whose block scale Marlin zeroes (vLLM) or bf16 misreads (SGLang).
  std::uint64_t active_below_fp16 = 0;  // 0 < scale < 2^-6
  std::uint64_t active_below_bf16 = 0;  // 0 < scale x sf < 2^-6, sf per layer bank (vLLM bf16 rescale)
  std::uint64_t negative_scales = 0;
  // false for gate --quick: the block scales were not read, so the three
  // counts above are unknown (not zero) and the rules over them not checked.
  bool block_scales_read = true;
};

// The deployment gate judges: TP degree, and EP degree (1: experts not
// distributed by expert parallelism).
struct Deployment {
  unsigned tp = 1;
  unsigned ep = 1;
};

// What one rank holds of the routed experts under `deployment` on backend
// `b`'s runtime: experts per rank (the largest rank's), the inner dimension
// per rank as the runtime pads it, and the routed experts' checkpoint bytes
// that rank loads (padding not counted). nullopt problem: the runtime accepts
// the split.
struct RankShare {
  std::uint64_t experts = 0;            // per rank, the most any rank holds
  std::uint64_t intermediate = 0;       // per rank, before padding
  std::uint64_t padded_intermediate = 0;  // as the runtime allocates it
  std::string padding_rule;              // where the padding comes from ("" when none)
  double bytes = 0;                      // routed-expert checkpoint bytes one rank loads (the largest rank)
  std::optional<std::string> problem;    // why the runtime refuses this split
  std::vector<std::string> notes;
};
struct Verdict {
  const RuntimeBackend* backend = nullptr;
  ActivationDtype dtype = ActivationDtype::Bf16;
  unsigned tp = 1;
  unsigned ep = 1;
  RankShare share;  // what one rank holds under this deployment
  // UNKNOWN: gate has no rule for the model class the architecture selects,
  // so whether its loader reads every expert tensor is not known.
  enum Kind { Run, Blocked, Unverified, Unknown } kind = Run;
  std::string architecture;  // config.json "architectures"[0]; "" when none
  std::string model_class;   // what the release builds for it; "" when gate has no rule
  bool scheme_selected = false;      // the scheme rule chose the NVFP4A16 MoE method
  std::vector<std::string> reasons;  // why BLOCKED (every one) or why UNVERIFIED
  std::vector<std::string> notes;    // facts that do not block
};
std::string_view verdict_name(Verdict::Kind k);

// The layer-dimension rule of one backend at one TP degree: nullopt when it
// runs, else why not.
std::optional<std::string> dims_problem(const RuntimeBackend& b, const MoeDims& dims, unsigned tp);

RankShare rank_share(const RuntimeBackend& b, std::string_view architecture, const MoeDims& dims,
                     const Deployment& deployment);

// A ModelOpt path (b.format) reads `modelopt` and checks its exclude list
// against `expert_layers` (the routed-expert layers' prefixes) instead of the
// compressed-tensors `schemes`.
Verdict judge_backend(const RuntimeBackend& b, ActivationDtype dtype, const Deployment& deployment,
                      std::string_view architecture, const std::vector<SchemeFacts>& schemes, const MoeDims& dims,
                      const ScaleFacts& scales, const ModelOptScheme& modelopt = {},
                      const std::vector<std::string>& expert_layers = {});

// config.json's "architectures"[0] ("" when absent or not a string array).
std::string architecture_of(const Json& config);

// MoE dimensions from modules' (name, rows, K) — the first gate projection's
// shape; nullopt when there is no routed expert (parse_expert_module,
// model/module_names.hpp).
struct ModuleShape {
  std::string_view name;
  std::uint64_t rows = 0, k = 0;
};
std::optional<MoeDims> moe_dims_of(const std::vector<ModuleShape>& modules);

// TP degrees for the feasibility table: 1, 2, 4, ..., 64.
std::vector<unsigned> tp_degrees();
// The backends of `format`, keyed "<runtime>-<backend>".
Json tp_table_json(const MoeDims& dims, TargetFormat format = TargetFormat::CompressedTensors);

}  // namespace mx2nv

#include "gate/rules.hpp"

#include "common/error.hpp"
#include "gate/exclusion.hpp"
#include "gate/model_class.hpp"
#include "model/module_names.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace mx2nv {
namespace {

// Paths below are relative to the wheels' package roots (vllm/, sglang/) and
// to vLLM's source tree for the kernel (csrc/, commit c77aff2e).
constexpr std::string_view kVllmSelect =
    "vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py:420-437 (_is_nvfp4_format), "
    "compressed_tensors_moe/compressed_tensors_moe.py:145-160 (CompressedTensorsW4A4Nvfp4MoEMethod, use_a16)";
constexpr std::string_view kSglangSelect =
    "sglang/srt/layers/quantization/compressed_tensors/compressed_tensors.py:618-630 (_is_fp4a16_nvfp4), "
    ":959-961 (CompressedTensorsW4A16Nvfp4MoE)";

const RuntimeBackend kBackends[] = {
    {Runtime::Vllm, "0.34.0", Backend::Marlin, "GPUs from sm75 without a native FP4 A16 path, and sm100+ (W4A4 kernels reject A16); "
                                 "--moe-backend marlin anywhere", true},
    {Runtime::Vllm, "0.34.0", Backend::Humming, "sm90 (H100/H200): utils/humming/priority.py:11 puts it ahead of Marlin "
                                  "(humming-kernels 0.1.19)", true},
    {Runtime::Sglang, "0.5.23", Backend::Marlin, "sm80+ (compressed_tensors_w4a16_nvfp4_moe.py:52-55)", true},
    // ModelOpt W4A16_NVFP4 (docs/reference/modelopt-output.md). vLLM asks its backend oracle exactly what it
    // asks for compressed-tensors A16 (modelopt.py:887-910), and Marlin's preparation is the same function
    // with weight_scale_2 passed as is (marlin_utils_fp4.py:289-400).
    {Runtime::Vllm, "0.34.0", Backend::Marlin, "GPUs from sm75 without a native FP4 A16 path, and sm100+ (W4A4 kernels "
                                 "reject A16); --moe-backend marlin anywhere (modelopt.py:887-910)", true,
     TargetFormat::ModelOpt},
    {Runtime::Vllm, "0.34.0", Backend::Humming, "sm90 (H100/H200): utils/humming/priority.py:11; humming's ModelOpt "
                                  "schema (humming schema/modelopt.py:39-142)", false, TargetFormat::ModelOpt},
    {Runtime::Sglang, "0.5.23", Backend::Marlin, "sm80+ with --moe-runner-backend marlin (the default only on sm80-"
                                 "sm9x; on Blackwell `auto` selects W4A4 kernels, modelopt_quant.py:3111-3125)", true,
     TargetFormat::ModelOpt},
    {Runtime::Sglang, "0.5.23", Backend::CuteDsl, "Blackwell (SM100/103) with --moe-runner-backend flashinfer_cutedsl "
                                  "and SGLANG_FLASHINFER_CUTEDSL_NVFP4_W4A16=1 (modelopt_quant.py:2812-2814)", false,
     TargetFormat::ModelOpt},
};

bool is_nvfp4a16(const SchemeFacts& s) {
  // Both runtimes: strategy tensor_group, float, 4 bits, group 16, symmetric,
  // no input quantization; the NVFP4 compressor needs the nvfp4 format.
  return s.compressed_tensors && s.format == "nvfp4-pack-quantized" && s.strategy == "tensor_group" &&
         s.type == "float" && s.num_bits == 4 && s.group_size == 16 && s.symmetric && s.input_activations_null;
}

// vLLM 0.34.0 hands NVFP4 MoE layers on sm90 to humming-kernels 0.1.19
// (fused_moe/oracle/nvfp4.py:413-439); paths below are inside that wheel.
// Block scales are converted by the hardware (cvt.rn.f16x2.e4m3x2,
// include/humming/datatype/dequant_native.cuh:92; bf16 through fp16,
// datatype/dequant.cuh:141-149): every E4M3 value exact, so no block-scale
// rule. What matters is the second-level scale g = 1/weight_global_scale,
// computed in FP32 (schema/compressed_tensors.py:248):
//  * every expert of a layer has equal gate and up globals: one FP32 g per
//    expert (schema/base.py:173-174), times 2^2 in FP32 and applied to the
//    FP32 accumulator (arith/epilogue_arith.cuh:119-122, :146-149);
//  * else every w13 global of the layer goes per channel, cast to the
//    activation dtype (schema/compressed_tensors.py:259-261) and applied
//    after the accumulator is narrowed to it (epilogue_arith.cuh:217-220).
void judge_humming(Verdict& v, bool fp16, const ScaleFacts& s) {
  const auto block = [&](std::string reason) {
    v.kind = Verdict::Blocked;
    v.reasons.push_back(std::move(reason));
  };
  const std::string_view dt = choice_name(fp16 ? ActivationDtype::Fp16 : ActivationDtype::Bf16);
  v.notes.push_back("assumes vLLM's default VLLM_HUMMING_USE_F16_ACCUM=0 (envs.py:1651-1652): with 1 the global "
                    "is applied in the activation dtype (humming arith/epilogue_arith.cuh:155-161), not judged");
  v.notes.push_back("block scales: converted by the hardware (humming datatype/dequant_native.cuh:92, dequant.cuh:"
                    "141-149): every E4M3 value exact, below 2^-6 and negative ones too");
  if (s.max_multiplier <= 0) return;
  // w2, and w1/w3 of layers whose pairs agree: one FP32 multiplier per expert.
  v.notes.push_back("globals: one FP32 multiplier per expert on the FP32 accumulator where a layer's gate and up "
                    "globals agree, and always for w2 (humming schema/base.py:173-174, arith/epilogue_arith.cuh:"
                    "119-122, :146-149)");
  if (s.min_multiplier < std::ldexp(1.0, -126)) {
    block(fmt::format("a global multiplier 1/weight_global_scale = {:g} is no normal FP32 (humming schema/"
                      "compressed_tensors.py:248 computes it in FP32)", s.min_multiplier));
  }
  if (s.max_multiplier >= std::ldexp(1.0, 126)) {
    block(fmt::format("a global multiplier {:g} overflows FP32 after x 2^2 (humming arith/epilogue_arith.cuh:122)",
                      s.max_multiplier));
  }
  if (s.gate_up_differ == 0) return;
  v.notes.push_back(fmt::format("gate/up globals differ for {} experts (first: {}): Humming keeps one per half, so "
                                "every w13 global of such a layer goes per channel in {} (humming schema/"
                                "compressed_tensors.py:259-261, schema/base.py:173-199)",
                                s.gate_up_differ, s.gate_up_differ_first.front(), dt));
  const double tiny = fp16 ? std::ldexp(1.0, -14) : std::ldexp(1.0, -126);
  const double max = fp16 ? 65504.0 : std::ldexp(2.0 - 1.0 / 128, 127);
  if (s.channel_min_multiplier < tiny) {
    block(fmt::format("a w1/w3 global multiplier {:g} of such a layer is below {:g}: as a per-channel {} scale it is "
                      "no normal number and drops bits of every output it multiplies (humming arith/"
                      "epilogue_arith.cuh:217-220)", s.channel_min_multiplier, tiny, dt));
  }
  if (s.channel_max_multiplier > max) {
    block(fmt::format("a w1/w3 global multiplier {:g} of such a layer overflows {} (humming schema/"
                      "compressed_tensors.py:261)", s.channel_max_multiplier, dt));
  }
  if (s.channel_not_pow2) {
    block(fmt::format("{} w1/w3 globals of such layers are not powers of two (first: {}): cast to {} per channel they "
                      "are rounded to {} significant bits (humming schema/compressed_tensors.py:261)",
                      s.channel_not_pow2, s.channel_not_pow2_example, dt, fp16 ? 11 : 8));
  }
  if (fp16) {
    v.notes.push_back("per-channel globals act after the FP32 accumulator is narrowed to fp16 (humming arith/"
                      "epilogue_arith.cuh:198-220): a w13 output above 4 x 65504 x g overflows");
  }
}

// SGLang's FlashInfer CuTe-DSL W4A16 MoE (ModelOpt layout): the E4M3 block
// scale bytes reach the kernel unchanged and weight_scale_2 is its FP32
// alpha (sglang/srt/layers/quantization/modelopt_quant.py:2976-3097,
// moe_runner/flashinfer_cutedsl.py:123-136). FlashInfer's kernel is not in
// the wheel, so how it decodes subnormal and negative scales is not known:
// negative ones block, small active ones are named (the backend is
// UNVERIFIED at best, settle()).
void judge_cutedsl(Verdict& v, const ScaleFacts& s) {
  const auto block = [&](std::string reason) {
    v.kind = Verdict::Blocked;
    v.reasons.push_back(std::move(reason));
  };
  v.notes.push_back("block scales: the E4M3 bytes reach FlashInfer's kernel unchanged (modelopt_quant.py:2976-3097); "
                    "weight_scale_2 is its FP32 alpha (flashinfer_cutedsl.py:123-136)");
  if (s.negative_scales) block(fmt::format("{} negative block scales: how FlashInfer's kernel reads them is not known",
                                           s.negative_scales));
  if (s.active_below_fp16) {
    v.reasons.push_back(fmt::format("{} active blocks have block scales below 2^-6: whether FlashInfer's kernel "
                                    "decodes E4M3 subnormals exactly is not known", s.active_below_fp16));
  }
  if (s.max_multiplier > 0 && (s.min_multiplier < std::ldexp(1.0, -126) || s.max_multiplier >= std::ldexp(1.0, 128))) {
    block(fmt::format("weight_scale_2 from {:g} to {:g}: not every one is a normal FP32 alpha", s.min_multiplier,
                      s.max_multiplier));
  }
}

// The model class the architecture selects on this runtime, and whether its
// loader reads every routed-expert tensor (gate/model_class.hpp). Unknown
// is recorded in the verdict and settled last: a block found elsewhere
// still wins, but nothing unknown is ever RUN.
bool unknown_class(const Verdict& v) { return v.model_class.empty(); }

void judge_model_class(Verdict& v, const RuntimeBackend& b, std::string_view architecture) {
  const std::string_view layout = choice_name(b.format);
  if (architecture.empty()) {
    v.reasons.push_back("config.json names no architectures: which model class the runtime builds, and whether "
                        "its loader reads every expert tensor, is unknown");
    return;
  }
  const ModelClassRule* rule = model_class_rule(b.runtime, architecture, b.format);
  if (rule == nullptr) {
    v.reasons.push_back(fmt::format("architecture {}: mx2nv has not run {} {}'s loader for it, so whether its "
                                    "model class loads every routed-expert tensor of the {} layout is unknown",
                                    architecture, choice_name(b.runtime), b.version, layout));
    return;
  }
  v.model_class = std::string(rule->model_class);
  if (rule->loads_experts) {
    v.notes.push_back(fmt::format("model class {} ({}): its load_weights reads every routed-expert tensor ({})",
                                  rule->model_class, rule->registry, rule->loader));
    return;
  }
  v.kind = Verdict::Blocked;
  v.reasons.push_back(fmt::format("model class {} ({}) never loads the packed experts: {}; runs with {}",
                                  rule->model_class, rule->registry, rule->loader, rule->unblock));
}

// The ModelOpt scheme: the config selects W4A16 NVFP4 for the routed
// experts, no exclude entry reaches one of their layers, and (SGLang's
// DeepSeek class) the BF16 shared experts are kept out of the FP4 MoE.
void judge_modelopt_scheme(Verdict& v, const RuntimeBackend& b, const ModelOptScheme& m,
                           const std::vector<std::string>& expert_layers) {
  const bool vllm = b.runtime == Runtime::Vllm;
  if (!m.selected) {
    v.kind = Verdict::Blocked;
    v.reasons.push_back(fmt::format("scheme: {}; {} runs ModelOpt's weight-only NVFP4 MoE only for quant_method "
                                    "modelopt* with quant_algo W4A16_NVFP4 and groups of 16 ({})",
                                    m.why_not, choice_name(b.runtime),
                                    vllm ? "vllm/model_executor/layers/quantization/modelopt.py:292-309, :798-866"
                                         : "sglang/srt/layers/quantization/modelopt_quant.py:1595-1702"));
    return;
  }
  v.scheme_selected = true;
  v.notes.push_back(fmt::format("scheme: {}",
                                vllm ? "ModelOptNvFp4FusedMoE, use_a16 (vllm/model_executor/layers/quantization/"
                                       "modelopt.py:869-910)"
                                     : "ModelOptNvFp4FusedMoEMethod (sglang/srt/layers/quantization/"
                                       "modelopt_quant.py:1704-1728, is_w4a16 :1701)"));
  const bool k3_mapper = v.model_class == "KimiK3ForConditionalGeneration";
  if (const auto why = excluded_expert_layer(b.runtime, k3_mapper, m.exclude, expert_layers)) {
    v.kind = Verdict::Blocked;
    v.reasons.push_back(*why);
  }
  const bool shared_named = std::any_of(m.exclude.begin(), m.exclude.end(), [](const std::string& e) {
    return e.find("shared_expert") != std::string::npos && e.find("shared_expert_gate") == std::string::npos;
  });
  if (!vllm && b.backend == Backend::Marlin && v.model_class == "DeepseekV3ForCausalLM" && !shared_named) {
    v.kind = Verdict::Blocked;
    v.reasons.push_back("no exclude entry names the shared experts: SGLang fuses the BF16 shared expert into the FP4 "
                        "MoE (sglang/srt/models/deepseek_v2.py:3334-3339, layers/quantization/modelopt_quant.py:"
                        "1552-1559)");
  }
}

// The final kind: BLOCKED wins; then UNKNOWN (no loader rule), then
// UNVERIFIED (a rule not checked), then RUN.
Verdict& settle(Verdict& v) {
  if (v.kind == Verdict::Blocked) return v;
  if (unknown_class(v)) {
    v.kind = Verdict::Unknown;
  } else if (!v.backend->verified) {
    v.kind = Verdict::Unverified;
    v.reasons.push_back(fmt::format("{} {} on the {} layout: its kernel's decode is not established here (no "
                                    "conformance test runs it), so exactness is not claimed",
                                    choice_name(v.backend->runtime), choice_name(v.backend->backend),
                                    choice_name(v.backend->format)));
  }
  return v;
}

std::string describe(const SchemeFacts& s) {
  return fmt::format("format {}, weights {{num_bits {}, type {}, strategy {}, group_size {}, symmetric {}}}, "
                     "input_activations {}",
                     s.format.empty() ? "none" : s.format, s.num_bits ? std::to_string(*s.num_bits) : "none",
                     s.type.empty() ? "none" : s.type, s.strategy.empty() ? "none" : s.strategy,
                     s.group_size ? std::to_string(*s.group_size) : "none", s.symmetric,
                     s.input_activations_null ? "null" : "quantized");
}

}  // namespace

std::string_view verdict_name(Verdict::Kind k) {
  switch (k) {
    case Verdict::Run: return "RUN";
    case Verdict::Blocked: return "BLOCKED";
    case Verdict::Unverified: return "UNVERIFIED";
    case Verdict::Unknown: return "UNKNOWN";
  }
  return "BLOCKED";
}

const std::vector<RuntimeBackend>& runtime_backends() {
  static const std::vector<RuntimeBackend> all(std::begin(kBackends), std::end(kBackends));
  return all;
}

std::vector<const RuntimeBackend*> runtime_backends(TargetFormat format) {
  std::vector<const RuntimeBackend*> out;
  for (const RuntimeBackend& b : runtime_backends()) {
    if (b.format == format) out.push_back(&b);
  }
  return out;
}

ModelOptScheme modelopt_scheme(const Json& config) {
  ModelOptScheme m;
  const Json* qc = quantization_config_of(config);
  if (qc == nullptr || !qc->is_object()) {
    m.why_not = "config.json has no quantization_config";
    return m;
  }
  const auto text = [&](const char* key) {
    const auto it = qc->find(key);
    return it != qc->end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  // The exclude list: the first of these members present is the one both runtimes read
  // (sglang modelopt_quant.py:1652-1655, vllm modelopt.py:380-384), and it must be a list of names.
  std::string list_problem;
  for (const char* key : {"ignore", "modules_to_not_convert", "exclude_modules"}) {
    const auto it = qc->find(key);
    if (it == qc->end()) continue;
    const bool names = it->is_array() && std::all_of(it->begin(), it->end(), [](const Json& e) { return e.is_string(); });
    if (!names) {
      list_problem = fmt::format("{} is {}, not a list of module names (vLLM raises, modelopt.py:380-384)", key,
                                 it->type_name());
    } else {
      for (const Json& e : *it) m.exclude.push_back(e.get<std::string>());
    }
    break;
  }
  // Groups of 16, as an integer (SGLang sizes its parameters with hidden // group_size, modelopt_quant.py:2541):
  // the top level's, else each config group's (:1640-1650).
  std::string group_problem;
  const auto check_group_size = [&](const Json& holder, const std::string& where) {
    const auto it = holder.find("group_size");
    if (it != holder.end() && (!it->is_number_integer() || *it != 16)) {
      group_problem = fmt::format("{}group_size is {}, not 16 (Marlin reads groups of 16)", where, it->dump());
    }
  };
  check_group_size(*qc, "");
  if (!qc->contains("group_size") && qc->contains("config_groups") && (*qc)["config_groups"].is_object()) {
    for (const auto& [name, group] : (*qc)["config_groups"].items()) {
      if (group.is_object() && group.contains("weights") && group["weights"].is_object()) {
        check_group_size(group["weights"], "config_groups." + name + ".weights.");
      }
    }
  }
  if (!text("quant_method").starts_with("modelopt")) {
    m.why_not = fmt::format("quant_method is \"{}\", not modelopt", text("quant_method"));
  } else if (qc->contains("quantization")) {
    m.why_not = "a nested `quantization` member (vLLM refuses W4A16_NVFP4 in that form, "
                "transformers_utils/model_arch_config_convertor.py:248-266)";
  } else if (qc->contains("producer") && !(*qc)["producer"].is_object()) {
    m.why_not = "producer is no object (vLLM reads producer.name, model_arch_config_convertor.py:249)";
  } else if (qc->contains("weight_scale_encoding")) {
    m.why_not = "a weight_scale_encoding, which gate has no rule for (modelopt.py:757-764)";
  } else if (text("quant_algo") != "W4A16_NVFP4") {
    m.why_not = fmt::format("quant_algo is \"{}\", not W4A16_NVFP4", text("quant_algo"));
  } else if (!group_problem.empty()) {
    m.why_not = group_problem;
  } else if (!list_problem.empty()) {
    m.why_not = list_problem;
  } else {
    m.selected = true;
  }
  return m;
}

const Json* quantization_config_of(const Json& config) {
  const Json* qc = nullptr;
  if (config.is_object() && config.contains("quantization_config")) qc = &config["quantization_config"];
  if (qc == nullptr && config.is_object()) {
    for (const auto& [key, value] : config.items()) {
      if (value.is_object() && value.contains("quantization_config")) qc = &value["quantization_config"];
    }
  }
  return qc;
}

std::vector<SchemeFacts> scheme_facts(const Json& config) {
  const Json* qc = quantization_config_of(config);
  if (qc == nullptr || !qc->is_object()) fail_input("config.json: no quantization_config");
  std::vector<SchemeFacts> out;
  const bool ct = qc->value("quant_method", Json()) == "compressed-tensors";
  const std::string global_format = (*qc).value("format", Json("")).is_string() ? (*qc).value("format", "") : "";
  if (!qc->contains("config_groups") || !(*qc)["config_groups"].is_object() || (*qc)["config_groups"].empty()) {
    out.push_back({ct, global_format, {}, {}, {}, {}, false, false});
    return out;
  }
  for (const auto& [name, group] : (*qc)["config_groups"].items()) {
    SchemeFacts s;
    s.compressed_tensors = ct;
    s.format = global_format;
    if (!group.is_object()) {
      out.push_back(s);
      continue;
    }
    if (group.contains("format") && group["format"].is_string()) s.format = group["format"];
    s.input_activations_null = !group.contains("input_activations") || group["input_activations"].is_null();
    if (group.contains("weights") && group["weights"].is_object()) {
      const Json& w = group["weights"];
      if (w.contains("num_bits") && w["num_bits"].is_number_integer()) s.num_bits = w["num_bits"].get<int>();
      if (w.contains("group_size") && w["group_size"].is_number_integer()) s.group_size = w["group_size"].get<int>();
      if (w.contains("type") && w["type"].is_string()) s.type = w["type"];
      if (w.contains("strategy") && w["strategy"].is_string()) s.strategy = w["strategy"];
      s.symmetric = w.value("symmetric", Json(true)) == Json(true);
    }
    out.push_back(s);
  }
  return out;
}

std::optional<std::string> dims_problem(const RuntimeBackend& b, const MoeDims& d, unsigned tp) {
  if (tp == 0 || d.intermediate % tp != 0) {
    // vLLM: fused_moe/config.py:1397 asserts it; SGLang shards the same way.
    return fmt::format("intermediate size {} is not divisible by TP {}", d.intermediate, tp);
  }
  const std::uint64_t n = d.intermediate / tp;
  if (b.backend == Backend::CuteDsl) {
    // sglang/srt/layers/moe/moe_runner/flashinfer_cutedsl.py:56-64 (interleave_w13_halves raises)
    if (n % 64 != 0) return fmt::format("intermediate per partition {} % 64 != 0 (flashinfer_cutedsl.py:56-64)", n);
    return std::nullopt;
  }
  if (b.runtime == Runtime::Sglang && b.format == TargetFormat::ModelOpt) {
    // No Python check on this path: the kernel's own need (layers/quantization/marlin_utils.py:250-256).
    if (d.hidden % 128 != 0) return fmt::format("hidden size {} % 128 != 0 (marlin_utils.py:250-256)", d.hidden);
    if (n % 64 != 0) return fmt::format("intermediate per partition {} % 64 != 0 (marlin_utils.py:250-256)", n);
    return std::nullopt;
  }
  if (b.runtime == Runtime::Sglang) {
    // compressed_tensors_w4a16_nvfp4_moe.py:220-229
    if (d.hidden % 128 != 0) return fmt::format("hidden size {} % 128 != 0 (scheme :220-224)", d.hidden);
    if (n % 64 != 0) return fmt::format("intermediate per partition {} % 64 != 0 (scheme :225-229)", n);
    return std::nullopt;
  }
  if (b.backend == Backend::Marlin) {
    // marlin_utils_fp4.py:317-322: K must fit Marlin's tiles; N is padded.
    if (d.hidden % 64 != 0) return fmt::format("hidden size {} % 64 != 0 (marlin_utils_fp4.py:320)", d.hidden);
  }
  // w2's block scales per rank: intermediate_size_per_partition // 16 columns
  // (compressed_tensors_moe_w4a4_nvfp4.py:152-160) must be the rank's slice.
  if (n % 16 != 0) return fmt::format("intermediate per partition {} % 16 != 0 (NVFP4 groups of 16)", n);
  return std::nullopt;
}

std::string architecture_of(const Json& config) {
  if (!config.is_object() || !config.contains("architectures")) return "";
  const Json& a = config["architectures"];
  if (!a.is_array() || a.empty() || !a[0].is_string()) return "";
  return a[0].get<std::string>();
}

RankShare rank_share(const RuntimeBackend& b, std::string_view architecture, const MoeDims& d,
                     const Deployment& dep) {
  RankShare r;
  const unsigned tp = dep.tp, ep = dep.ep;
  if (tp == 0 || ep == 0) {
    r.problem = "TP and EP must be at least 1";
    return r;
  }
  // How far the experts' inner dimension is split across ranks.
  unsigned split = tp;
  if (ep > 1 && b.runtime == Runtime::Sglang) {
    // MoE TP size = TP / EP (sglang/srt/distributed/parallel_state.py:2860-2923); every rank holds an equal
    // share of the routed experts (srt/layers/moe/fused_moe_triton/layer.py:413, an assert).
    if (tp % ep != 0) {
      r.problem = fmt::format("EP {} does not divide TP {}: SGLang's MoE TP size is TP / EP", ep, tp);
      return r;
    }
    if (d.experts % ep != 0) {
      r.problem = fmt::format("{} experts per layer are not divisible by EP {} (sglang/srt/layers/moe/"
                              "fused_moe_triton/layer.py:413 asserts it)", d.experts, ep);
      return r;
    }
    split = tp / ep;
  } else if (ep > 1) {
    // vLLM: --enable-expert-parallel, EP size = TP x DP; experts are whole on
    // their rank, spread as evenly as possible (fused_moe/expert_map_manager.py:66-69; an even split only
    // with EPLB, fused_moe/layer.py:278-283).
    split = 1;
    if (d.experts % ep != 0) {
      r.notes.push_back(fmt::format("EP {}: {} experts per layer are not divisible, so ranks hold {} or {} experts "
                                    "(vllm/model_executor/layers/fused_moe/expert_map_manager.py:66-69; EPLB "
                                    "refuses an uneven split, fused_moe/layer.py:278-283)",
                                    ep, d.experts, d.experts / ep + 1, d.experts / ep));
    }
  }
  r.experts = ep > 1 ? (d.experts + ep - 1) / ep : d.experts;
  if (d.intermediate % split != 0) {
    // vLLM: fused_moe/config.py asserts it; SGLang shards the same way.
    r.problem = fmt::format("intermediate size {} is not divisible by the MoE TP size {}", d.intermediate, split);
    return r;
  }
  r.intermediate = d.intermediate / split;
  r.padded_intermediate = r.intermediate;
  const ModelClassRule* rule = model_class_rule(b.runtime, architecture, b.format);
  const bool vllm_k3 = b.runtime == Runtime::Vllm && rule != nullptr && rule->model_class == "KimiK3ForConditionalGeneration";
  if (vllm_k3 && ep == 1 && tp > 1 && r.intermediate < 256) {
    // Padded with zeros, so the values are unchanged (model.py:579-590).
    r.padded_intermediate = 256;
    r.padding_rule = "vllm/models/kimi_k3/nvidia/model.py:422-430 (min_moe_intermediate_per_partition, default 256)";
    r.notes.push_back(fmt::format("TP {}: vLLM's K3 pads each rank's expert inner dimension from {} to 256 with "
                                  "zeros ({}; zeroed at :579-590), values unchanged",
                                  tp, r.intermediate, r.padding_rule));
  }
  // Routed-expert bytes per rank as in the checkpoint: per expert, w1 and w3
  // [n, hidden] and w2 [hidden, n] at 4 bits plus one E4M3 byte per 16
  // values, and three 4-byte globals.
  const double per_expert = 3.0 * static_cast<double>(r.intermediate) * static_cast<double>(d.hidden) * 9.0 / 16.0 + 12;
  r.notes.push_back(fmt::format("routed experts per rank: {} of {} per layer, inner dimension {} ({} MoE layers): "
                                "{:.4g} GB of checkpoint bytes per GPU",
                                r.experts, d.experts, r.intermediate, d.layers,
                                per_expert * static_cast<double>(r.experts) * static_cast<double>(d.layers) / 1e9));
  r.bytes = per_expert * static_cast<double>(r.experts) * static_cast<double>(d.layers);
  return r;
}

Verdict judge_backend(const RuntimeBackend& b, ActivationDtype dtype, const Deployment& deployment,
                      std::string_view architecture, const std::vector<SchemeFacts>& schemes, const MoeDims& dims,
                      const ScaleFacts& s, const ModelOptScheme& modelopt_scheme,
                      const std::vector<std::string>& expert_layers) {
  const unsigned tp = deployment.tp;
  Verdict v;
  v.backend = &b;
  v.dtype = dtype;
  v.tp = tp;
  v.ep = deployment.ep;
  v.architecture = std::string(architecture);
  const bool fp16 = dtype == ActivationDtype::Fp16;
  const auto block = [&](std::string reason) {
    v.kind = Verdict::Blocked;
    v.reasons.push_back(std::move(reason));
  };
  judge_model_class(v, b, architecture);

  const bool modelopt = b.format == TargetFormat::ModelOpt;
  if (modelopt) judge_modelopt_scheme(v, b, modelopt_scheme, expert_layers);
  bool selected = !modelopt && !schemes.empty();
  for (const auto& sc : modelopt ? std::vector<SchemeFacts>{} : schemes) {
    if (!is_nvfp4a16(sc)) {
      selected = false;
      block(fmt::format("scheme: quantization_config group is not NVFP4A16 ({}); {} selects the NVFP4 weight-only "
                        "MoE method only for tensor_group/float/4-bit/group 16/symmetric weights without input "
                        "quantization ({})",
                        describe(sc), choice_name(b.runtime), b.runtime == Runtime::Vllm ? kVllmSelect : kSglangSelect));
    }
  }
  if (!modelopt) v.scheme_selected = selected;
  if (selected) {
    v.notes.push_back(fmt::format("scheme: {} ({})",
                                  b.runtime == Runtime::Vllm ? "CompressedTensorsW4A4Nvfp4MoEMethod(use_a16=True)"
                                                      : "CompressedTensorsW4A16Nvfp4MoE",
                                  b.runtime == Runtime::Vllm ? kVllmSelect : kSglangSelect));
  }
  if (dims.layers == 0) block("no MoE expert modules (…experts.E.w1/w2/w3 or gate/up/down_proj) found");
  v.share = rank_share(b, architecture, dims, deployment);
  const RankShare& share = v.share;
  if (share.problem) block(*share.problem);
  for (const auto& note : share.notes) v.notes.push_back(note);
  if (!share.problem) {
    const MoeDims per_rank{dims.hidden, share.padded_intermediate, dims.experts, dims.layers};
    if (const auto p = dims_problem(b, per_rank, 1)) {
      block(fmt::format("dims per rank at TP {}{}: {}", tp, deployment.ep > 1 ? fmt::format(", EP {}", deployment.ep) : "",
                        *p));
    }
  }

  if (s.gate_up_differ != 0) {
    const std::string first = s.gate_up_differ_first.empty() ? std::string() : s.gate_up_differ_first.front();
    if (modelopt && b.backend != Backend::Humming) {
      block(fmt::format("gate/up weight_scale_2 differ for {} experts (first: {}): {} applies w1's to w3's half too "
                        "({}), so the up projection is wrong",
                        s.gate_up_differ, first, choice_name(b.runtime),
                        b.runtime == Runtime::Vllm ? "vllm/model_executor/layers/quantization/modelopt.py:1090-1098"
                        : b.backend == Backend::CuteDsl ? "sglang/srt/layers/moe/moe_runner/flashinfer_cutedsl.py:130-134"
                                                         : "sglang/srt/layers/quantization/modelopt_quant.py:2742-2763"));
    } else if (b.runtime == Runtime::Sglang) {
      block(fmt::format("gate/up globals differ for {} experts (first: {}): SGLang raises ValueError "
                        "(compressed_tensors_w4a16_nvfp4_moe.py:191-201)", s.gate_up_differ, first));
    } else if (b.backend == Backend::Marlin) {
      block(fmt::format("gate/up globals differ for {} experts (first: {}): vLLM applies w1's global to w3's "
                        "half too, so the up projection is wrong (compressed_tensors_moe_w4a4_nvfp4.py:232-240)",
                        s.gate_up_differ, first));
    }
  }

  if (b.backend == Backend::Humming) {
    judge_humming(v, fp16, s);
    return settle(v);
  }
  if (b.backend == Backend::CuteDsl) {
    judge_cutedsl(v, s);
    return settle(v);
  }

  if (!s.block_scales_read) {
    // gate --quick: the Marlin rules over block scales are not checked, so a
    // verdict that nothing else blocks is UNVERIFIED, never RUN.
    if (v.kind != Verdict::Blocked) v.kind = Verdict::Unverified;
    v.reasons.push_back("block scales not read (gate --quick): negative block scales (vLLM marlin_utils_fp4.py:83-89) "
                        "and active blocks below 2^-6 (vLLM marlin_utils_fp4.py:116-117, SGLang's bf16 decode) are not checked; run gate "
                        "without --quick to check them");
  }
  if (s.negative_scales) block(fmt::format("{} negative block scales: Marlin assumes scales >= 0 "
                                           "(marlin_utils_fp4.py:83-89)", s.negative_scales));
  const std::uint64_t small = fp16 ? s.active_below_fp16 : s.active_below_bf16;
  if (small) {
    if (b.runtime == Runtime::Vllm) {
      block(fmt::format("{} active blocks have block scales below 2^-6{}: vLLM's Marlin path sets them to zero "
                        "(marlin_utils_fp4.py:116-117{})", small, fp16 ? "" : " after the bf16 rescale",
                        fp16 ? "" : ", :36-55 and :375-377"));
    } else if (!fp16) {
      block(fmt::format("{} active blocks have block scales below 2^-6: SGLang passes them to the kernel, whose "
                        "bf16 scale decode reads E4M3 subnormals 2^-112 too small (marlin_utils_fp4.py:29-44; "
                        "sglang/kernels/jit/csrc/gemm/marlin/dequant.h:475-488)", s.active_below_fp16));
    }
  }
  // Globals as the kernel applies them: 2^7 x g in fp16, read in the
  // activation dtype and, for w2, folded into the fp16 routing weight.
  if (s.max_multiplier > 0) {
    const double lo = fp16 ? std::ldexp(1.0, -21) : std::ldexp(1.0, -245);
    const double hi = fp16 ? 65504.0 / 128.0 : std::ldexp(1.0, 8) * (2.0 - 1.0 / 128);
    if (s.min_multiplier < lo) {
      block(fmt::format("a global multiplier 1/weight_global_scale = {:g} is below {:g}: x 2^7 it is no normal {} "
                        "(vLLM marlin_utils_fp4.py:133-145, SGLang :47-59 after a cast at :519-520; the kernel folds w2's into the routing weight)",
                        s.min_multiplier, lo, choice_name(dtype)));
    }
    if (s.max_multiplier > hi) {
      block(fmt::format("a global multiplier {:g} overflows {} after x 2^{} (vLLM marlin_utils_fp4.py:133-145, SGLang :47-59)",
                        s.max_multiplier, choice_name(dtype), fp16 ? 7 : 119));
    }
  }
  if (s.modules_not_pow2) {
    v.notes.push_back(fmt::format("{} modules have globals that are not powers of two (first: {}): the kernel reads "
                                  "the global in {} (marlin_template.h global_scale_ptr is 16-bit{}), so it is "
                                  "rounded to {} significant bits",
                                  s.modules_not_pow2, s.multipliers_not_pow2.empty() ? "" : s.multipliers_not_pow2[0],
                                  choice_name(dtype),
                                  b.runtime == Runtime::Sglang ? "; SGLang casts it first, marlin_utils_fp4.py:519-520" : "",
                                  fp16 ? 11 : 8));
  }
  return settle(v);
}

std::optional<MoeDims> moe_dims_of(const std::vector<ModuleShape>& modules) {
  std::optional<MoeDims> dims;
  std::vector<std::string_view> layers;
  for (const auto& m : modules) {
    const auto e = parse_expert_module(m.name);
    if (!e || e->projection.projection != Projection::Gate) continue;
    if (!dims) dims = MoeDims{m.k, m.rows, 0, 0};
    if (std::find(layers.begin(), layers.end(), e->layer) == layers.end()) layers.push_back(e->layer);
    if (e->layer == layers.front()) ++dims->experts;
  }
  if (dims) dims->layers = layers.size();
  return dims;
}

std::vector<unsigned> tp_degrees() { return {1, 2, 4, 8, 16, 32, 64}; }

Json tp_table_json(const MoeDims& dims, TargetFormat format) {
  Json rows = Json::array();
  for (const unsigned tp : tp_degrees()) {
    Json row = {{"tp", tp}};
    for (const RuntimeBackend* b : runtime_backends(format)) {
      const auto p = dims_problem(*b, dims, tp);
      row[fmt::format("{}-{}", choice_name(b->runtime), choice_name(b->backend))] = p ? Json(*p) : Json("ok");
    }
    rows.push_back(row);
  }
  return rows;
}

}  // namespace mx2nv

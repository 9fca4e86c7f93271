#include "gate/rules.hpp"

#include "common/error.hpp"
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
    {"vllm", "0.33.0", "marlin", "GPUs from sm75 without a native FP4 A16 path, and sm100+ (W4A4 kernels reject A16); "
                                 "--moe-backend marlin anywhere", true},
    {"vllm", "0.33.0", "humming", "sm90 (H100/H200): utils/humming/priority.py:11 puts it ahead of Marlin "
                                  "(humming-kernels 0.1.19)", true},
    {"sglang", "0.5.23", "marlin", "sm80+ (compressed_tensors_w4a16_nvfp4_moe.py:52-55)", true},
};

bool is_nvfp4a16(const SchemeFacts& s) {
  // Both runtimes: strategy tensor_group, float, 4 bits, group 16, symmetric,
  // no input quantization; the NVFP4 compressor needs the nvfp4 format.
  return s.compressed_tensors && s.format == "nvfp4-pack-quantized" && s.strategy == "tensor_group" &&
         s.type == "float" && s.num_bits == 4 && s.group_size == 16 && s.symmetric && s.input_activations_null;
}

// vLLM 0.33.0 hands NVFP4 MoE layers on sm90 to humming-kernels 0.1.19
// (fused_moe/oracle/nvfp4.py:425-451); paths below are inside that wheel.
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
  const std::string_view dt = fp16 ? "fp16" : "bf16";
  v.notes.push_back("assumes vLLM's default VLLM_HUMMING_USE_F16_ACCUM=0 (envs.py:1573-1574): with 1 the global "
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

std::string describe(const SchemeFacts& s) {
  return fmt::format("format {}, weights {{num_bits {}, type {}, strategy {}, group_size {}, symmetric {}}}, "
                     "input_activations {}",
                     s.format.empty() ? "none" : s.format, s.num_bits ? std::to_string(*s.num_bits) : "none",
                     s.type.empty() ? "none" : s.type, s.strategy.empty() ? "none" : s.strategy,
                     s.group_size ? std::to_string(*s.group_size) : "none", s.symmetric,
                     s.input_activations_null ? "null" : "quantized");
}

}  // namespace

std::string_view activation_dtype_name(ActivationDtype d) { return d == ActivationDtype::Fp16 ? "fp16" : "bf16"; }

std::string_view verdict_name(Verdict::Kind k) {
  switch (k) {
    case Verdict::Run: return "RUN";
    case Verdict::Blocked: return "BLOCKED";
    case Verdict::Unverified: return "UNVERIFIED";
  }
  return "BLOCKED";
}

const std::vector<RuntimeBackend>& runtime_backends() {
  static const std::vector<RuntimeBackend> all(std::begin(kBackends), std::end(kBackends));
  return all;
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
    // vLLM: fused_moe/config.py:1352 asserts it; SGLang shards the same way.
    return fmt::format("intermediate size {} is not divisible by TP {}", d.intermediate, tp);
  }
  const std::uint64_t n = d.intermediate / tp;
  if (b.runtime == "sglang") {
    // compressed_tensors_w4a16_nvfp4_moe.py:220-229
    if (d.hidden % 128 != 0) return fmt::format("hidden size {} % 128 != 0 (scheme :220-224)", d.hidden);
    if (n % 64 != 0) return fmt::format("intermediate per partition {} % 64 != 0 (scheme :225-229)", n);
    return std::nullopt;
  }
  if (b.backend == "marlin") {
    // marlin_utils_fp4.py:360-365: K must fit Marlin's tiles; N is padded.
    if (d.hidden % 64 != 0) return fmt::format("hidden size {} % 64 != 0 (marlin_utils_fp4.py:363)", d.hidden);
  }
  // w2's block scales per rank: intermediate_size_per_partition // 16 columns
  // (compressed_tensors_moe_w4a4_nvfp4.py:133-141) must be the rank's slice.
  if (n % 16 != 0) return fmt::format("intermediate per partition {} % 16 != 0 (NVFP4 groups of 16)", n);
  return std::nullopt;
}

Verdict judge_backend(const RuntimeBackend& b, ActivationDtype dtype, unsigned tp,
                      const std::vector<SchemeFacts>& schemes, const MoeDims& dims, const ScaleFacts& s) {
  Verdict v{&b, dtype, tp, Verdict::Run, false, {}, {}};
  const bool fp16 = dtype == ActivationDtype::Fp16;
  const auto block = [&](std::string reason) {
    v.kind = Verdict::Blocked;
    v.reasons.push_back(std::move(reason));
  };

  bool selected = !schemes.empty();
  for (const auto& sc : schemes) {
    if (!is_nvfp4a16(sc)) {
      selected = false;
      block(fmt::format("scheme: quantization_config group is not NVFP4A16 ({}); {} selects the NVFP4 weight-only "
                        "MoE method only for tensor_group/float/4-bit/group 16/symmetric weights without input "
                        "quantization ({})",
                        describe(sc), b.runtime, b.runtime == "vllm" ? kVllmSelect : kSglangSelect));
    }
  }
  v.scheme_selected = selected;
  if (selected) {
    v.notes.push_back(fmt::format("scheme: {} ({})",
                                  b.runtime == "vllm" ? "CompressedTensorsW4A4Nvfp4MoEMethod(use_a16=True)"
                                                      : "CompressedTensorsW4A16Nvfp4MoE",
                                  b.runtime == "vllm" ? kVllmSelect : kSglangSelect));
  }
  if (dims.layers == 0) block("no MoE expert modules (…experts.E.w1/w2/w3 or gate/up/down_proj) found");
  if (const auto p = dims_problem(b, dims, tp)) block(fmt::format("dims at TP {}: {}", tp, *p));

  if (s.gate_up_differ != 0) {
    const std::string first = s.gate_up_differ_first.empty() ? std::string() : s.gate_up_differ_first.front();
    if (b.runtime == "sglang") {
      block(fmt::format("gate/up globals differ for {} experts (first: {}): SGLang raises ValueError "
                        "(compressed_tensors_w4a16_nvfp4_moe.py:191-201)", s.gate_up_differ, first));
    } else if (b.backend == "marlin") {
      block(fmt::format("gate/up globals differ for {} experts (first: {}): vLLM applies w1's global to w3's "
                        "half too, so the up projection is wrong (compressed_tensors_moe_w4a4_nvfp4.py:223-231)",
                        s.gate_up_differ, first));
    }
  }

  if (b.backend == "humming") {
    judge_humming(v, fp16, s);
    return v;
  }

  if (!s.block_scales_read) {
    // gate --quick: the Marlin rules over block scales are not checked, so a
    // verdict that nothing else blocks is UNVERIFIED, never RUN.
    if (v.kind != Verdict::Blocked) v.kind = Verdict::Unverified;
    v.reasons.push_back("block scales not read (gate --quick): negative block scales (marlin_utils_fp4.py:85-91) "
                        "and active blocks below 2^-6 (marlin_utils_fp4.py:118-119) are not checked; run gate "
                        "without --quick to check them");
  }
  if (s.negative_scales) block(fmt::format("{} negative block scales: Marlin assumes scales >= 0 "
                                           "(marlin_utils_fp4.py:85-91)", s.negative_scales));
  const std::uint64_t small = fp16 ? s.active_below_fp16 : s.active_below_bf16;
  if (small) {
    if (b.runtime == "vllm") {
      block(fmt::format("{} active blocks have block scales below 2^-6{}: vLLM's Marlin path sets them to zero "
                        "(marlin_utils_fp4.py:118-119{})", small, fp16 ? "" : " after the bf16 rescale",
                        fp16 ? "" : ", :50-56 and :419-421"));
    } else if (!fp16) {
      block(fmt::format("{} active blocks have block scales below 2^-6: SGLang passes them to the kernel, whose "
                        "bf16 scale decode misreads them (marlin_utils_fp4.py:29-44; csrc/quantization/marlin/"
                        "dequant.h dequant_fp8_scales)", s.active_below_fp16));
    }
  }
  // Globals as the kernel applies them: 2^7 x g in fp16, read in the
  // activation dtype and, for w2, folded into the fp16 routing weight.
  if (s.max_multiplier > 0) {
    const double lo = fp16 ? std::ldexp(1.0, -21) : std::ldexp(1.0, -245);
    const double hi = fp16 ? 65504.0 / 128.0 : std::ldexp(1.0, 8) * (2.0 - 1.0 / 128);
    if (s.min_multiplier < lo) {
      block(fmt::format("a global multiplier 1/weight_global_scale = {:g} is below {:g}: x 2^7 it is no normal {} "
                        "(marlin_utils_fp4.py:144-156; the kernel folds w2's into the routing weight)",
                        s.min_multiplier, lo, activation_dtype_name(dtype)));
    }
    if (s.max_multiplier > hi) {
      block(fmt::format("a global multiplier {:g} overflows {} after x 2^{} (marlin_utils_fp4.py:144-156)",
                        s.max_multiplier, activation_dtype_name(dtype), fp16 ? 7 : 119));
    }
  }
  if (s.modules_not_pow2) {
    v.notes.push_back(fmt::format("{} modules have globals that are not powers of two (first: {}): the kernel reads "
                                  "the global in {} (marlin_template.h global_scale_ptr is 16-bit{}), so it is "
                                  "rounded to {} significant bits",
                                  s.modules_not_pow2, s.multipliers_not_pow2.empty() ? "" : s.multipliers_not_pow2[0],
                                  activation_dtype_name(dtype),
                                  b.runtime == "sglang" ? "; SGLang casts it first, marlin_utils_fp4.py:519-520" : "",
                                  fp16 ? 11 : 8));
  }
  return v;
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

Json tp_table_json(const MoeDims& dims) {
  Json rows = Json::array();
  for (const unsigned tp : tp_degrees()) {
    Json row = {{"tp", tp}};
    for (const auto& b : runtime_backends()) {
      const auto p = dims_problem(b, dims, tp);
      row[fmt::format("{}-{}", b.runtime, b.backend)] = p ? Json(*p) : Json("ok");
    }
    rows.push_back(row);
  }
  return rows;
}

}  // namespace mx2nv

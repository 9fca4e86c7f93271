#include "model/target_format.hpp"

#include "common/error.hpp"
#include "json/strict_json.hpp"
#include "model/modules.hpp"

#include <cmath>

namespace mx2nv {
namespace {

constexpr Choice<TargetFormat> kFormats[] = {
    {TargetFormat::CompressedTensors, "compressed-tensors",
     "compressed-tensors nvfp4-pack-quantized: weight_packed, weight_scale, weight_global_scale (a divisor)"},
    {TargetFormat::ModelOpt, "modelopt",
     "ModelOpt W4A16_NVFP4: weight, weight_scale, weight_scale_2 (a multiplier), hf_quant_config.json; the same "
     "packed and block-scale bytes"},
};

}  // namespace

template <>
std::span<const Choice<TargetFormat>> choices<TargetFormat>() {
  return kFormats;
}

const FormatNames& format_names(TargetFormat format) {
  static const FormatNames compressed{kPackedSuffix, kScaleSuffix, kGlobalSuffix, {1}, true};
  static const FormatNames modelopt{kBf16WeightSuffix, kScaleSuffix, ".weight_scale_2", {}, false};
  return format == TargetFormat::ModelOpt ? modelopt : compressed;
}

Recipe recipe_of(TargetFormat format) {
  return format == TargetFormat::ModelOpt ? Recipe::ModelOpt : Recipe::CompressedTensors;
}

float stored_global(TargetFormat format, float divisor) {
  return format_names(format).global_is_divisor ? divisor : 1.0f / divisor;
}

double multiplier_of_stored(TargetFormat format, float stored) {
  const auto v = static_cast<double>(stored);
  return format_names(format).global_is_divisor ? 1.0 / v : v;
}

TargetFormat target_format_of(std::string_view config_text, bool has_hf_quant_config) {
  if (has_hf_quant_config) return TargetFormat::ModelOpt;
  Json config;
  try {
    config = parse_strict_json(config_text, "config.json").value;
  } catch (const Error&) {
    return TargetFormat::CompressedTensors;
  }
  const auto modelopt = [](const Json& holder) {
    if (!holder.is_object()) return false;
    const auto qc = holder.find("quantization_config");
    if (qc == holder.end() || !qc->is_object()) return false;
    const auto method = qc->find("quant_method");
    return method != qc->end() && method->is_string() && method->get<std::string>().starts_with("modelopt");
  };
  if (modelopt(config)) return TargetFormat::ModelOpt;
  if (config.is_object()) {
    for (const auto& [key, value] : config.items()) {
      if (modelopt(value)) return TargetFormat::ModelOpt;
    }
  }
  return TargetFormat::CompressedTensors;
}

std::optional<float> divisor_of_stored(TargetFormat format, float stored) {
  if (!std::isfinite(stored) || !(stored > 0.0f)) return std::nullopt;
  const float divisor = format_names(format).global_is_divisor ? stored : 1.0f / stored;
  if (!std::isfinite(divisor) || !(divisor > 0.0f)) return std::nullopt;
  return divisor;
}

}  // namespace mx2nv

#include "verify/config_check.hpp"

#include "common/error.hpp"

#include <fmt/format.h>

namespace mx2nv {
namespace {

Json without_quant_config(Json config, const std::string& parent) {
  if (!config.is_object()) return config;
  if (parent.empty()) {
    config.erase("quantization_config");
  } else if (config.contains(parent) && config[parent].is_object()) {
    config[parent].erase("quantization_config");
  }
  return config;
}

class Collector {
 public:
  template <typename... Args>
  void add(fmt::format_string<Args...> format, Args&&... args) {
    list.push_back(fmt::format(format, std::forward<Args>(args)...));
  }
  std::vector<std::string> list;
};

void check_weights(const std::string& group, const Json& source_weights, const Json& w, Collector& diff) {
  const Json expected = {{"num_bits", 4},
                         {"type", "float"},
                         {"strategy", "tensor_group"},
                         {"group_size", 16},
                         {"scale_dtype", kTargetScaleDtype},
                         {"zp_dtype", nullptr}};
  for (const auto& [key, value] : expected.items()) {
    if (!w.contains(key) || w[key] != value) {
      diff.add("config.json: group {}: weights.{} is {}, NVFP4A16 needs {}", group, key,
               w.contains(key) ? w[key].dump() : "absent", value.dump());
    }
  }
  for (const auto& [key, value] : w.items()) {
    if (!is_known_quantization_args_key(key)) diff.add("config.json: group {}: weights.{} unknown", group, key);
    if (!expected.contains(key) && member_or_null(source_weights, key) != value) {
      diff.add("config.json: group {}: weights.{} changed", group, key);
    }
  }
  for (const auto& [key, value] : source_weights.items()) {
    if (!expected.contains(key) && !w.contains(key)) diff.add("config.json: group {}: weights.{} removed", group, key);
  }
}

void check_group(const std::string& name, const Json& scheme, const Json& d, const Json& qc, Collector& diff) {
  if (!d.is_object()) {
    diff.add("config.json: config group {} is {}, not an object", name, d.dump());
    return;
  }
  for (const auto& [key, value] : d.items()) {
    if (!is_known_scheme_key(key)) diff.add("config.json: group {}: key {} unknown to compressed-tensors", name, key);
  }
  const Json& format = d.contains("format") ? d["format"] : member_or_null(qc, "format");
  if (format != kTargetFormat) diff.add("config.json: group {}: format {}", name, format.dump());
  for (const char* key : {"targets", "input_activations", "output_activations"}) {
    if (member_or_null(scheme, key) != member_or_null(d, key)) diff.add("config.json: group {}: {} changed", name, key);
  }
  if (!member_or_null(d, "weights").is_object()) {
    diff.add("config.json: group {}: no weights", name);
    return;
  }
  check_weights(name, member_or_null(scheme, "weights"), d["weights"], diff);
}

}  // namespace

std::vector<std::string> check_target_config(const SourceQuantConfig& src, std::string_view dst_text,
                                             const std::vector<std::string>& bf16_modules,
                                             const std::vector<std::string>& requantized_modules) {
  Collector diff;
  Json dst;
  try {
    dst = parse_strict_json(dst_text, "config.json").value;
  } catch (const Error& e) {
    diff.add("DST {}", e.what());
    return diff.list;
  }
  if (!dst.is_object()) {
    diff.add("config.json: DST's config is not a JSON object");
    return diff.list;
  }
  if (without_quant_config(src.config, src.parent) != without_quant_config(dst, src.parent)) {
    diff.add("config.json: differs outside quantization_config");
  }
  const Json& qc = src.parent.empty() ? member_or_null(dst, "quantization_config")
                                      : member_or_null(member_or_null(dst, src.parent), "quantization_config");
  if (!qc.is_object()) {
    diff.add("config.json: quantization_config missing where the source has it");
    return diff.list;
  }
  // The source's, with the BF16 modules appended to ignore (as convert writes it).
  Json expected_qc = src.quant_config;
  if (!bf16_modules.empty()) {
    Json& ignore = expected_qc["ignore"];
    if (!ignore.is_array()) ignore = Json::array();
    for (const auto& m : bf16_modules) ignore.push_back(m);
  }
  if (!requantized_modules.empty()) expected_qc[std::string(kRequantizedModulesKey)] = requantized_modules;
  const Json& s = expected_qc;
  for (const auto& [key, value] : s.items()) {
    if (key == "format" || key == "config_groups") continue;
    if (!qc.contains(key) || qc[key] != value) diff.add("config.json: quantization_config.{} changed", key);
  }
  for (const auto& [key, value] : qc.items()) {
    if (!s.contains(key)) diff.add("config.json: quantization_config.{} added", key);
  }
  if (qc.contains("format") && qc["format"] != kTargetFormat) {
    diff.add("config.json: quantization_config.format is {}", qc["format"].dump());
  }
  const Json& groups = member_or_null(qc, "config_groups");
  if (!groups.is_object() || groups.size() != s["config_groups"].size()) {
    diff.add("config.json: config_groups differ in number");
    return diff.list;
  }
  for (const auto& [name, scheme] : s["config_groups"].items()) {
    if (!groups.contains(name)) {
      diff.add("config.json: config group {} missing", name);
      continue;
    }
    check_group(name, scheme, groups[name], qc, diff);
  }
  return diff.list;
}

}  // namespace mx2nv

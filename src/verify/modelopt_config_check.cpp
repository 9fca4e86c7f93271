#include "verify/modelopt_config_check.hpp"

#include "common/error.hpp"
#include "model/modelopt_config.hpp"
#include "safetensors/file_names.hpp"

#include <fmt/format.h>

namespace mx2nv {
namespace {

// What mx2nv writes, member by member: the same members, each of the same
// JSON type and value (16 is not 16.0: a runtime computes sizes with it).
// `producer` only needs to be an object naming a producer and a version.
void check_members(const Json& got, const Json& wanted, const std::string& where, std::vector<std::string>& diff) {
  if (!got.is_object()) {
    diff.push_back(fmt::format("{} is missing or not an object", where));
    return;
  }
  for (const auto& [key, value] : got.items()) {
    if (!wanted.contains(key)) diff.push_back(fmt::format("{}.{} is set: mx2nv writes no such member", where, key));
  }
  for (const auto& [key, value] : wanted.items()) {
    const Json& v = member_or_null(got, key);
    if (key == "producer") {
      if (!v.is_object() || !member_or_null(v, "name").is_string() || !member_or_null(v, "version").is_string()) {
        diff.push_back(fmt::format("{}.producer is {}: an object with a name and a version", where,
                                   got.contains(key) ? v.dump() : "absent"));
      }
    } else if (value.is_object() && v.is_object()) {
      check_members(v, value, where + "." + key, diff);
    } else if (!got.contains(key) || v.dump() != value.dump()) {
      const bool list = key == "ignore" || key == "exclude_modules";
      diff.push_back(fmt::format("{}.{} is {}, ModelOpt W4A16_NVFP4 as mx2nv writes it has {}", where, key,
                                 !got.contains(key) ? "absent" : list ? "another list" : v.dump(),
                                 list ? "exactly SRC's unquantized modules" : value.dump()));
    }
  }
}

Json without_quant_configs(Json config, const std::string& parent) {
  if (!config.is_object()) return config;
  config.erase("quantization_config");
  if (!parent.empty() && config.contains(parent) && config[parent].is_object()) config[parent].erase("quantization_config");
  return config;
}

}  // namespace

std::vector<std::string> check_modelopt_config(const SourceQuantConfig& source, std::string_view target_config_text,
                                               const std::optional<std::string>& hf_quant_config_text,
                                               std::vector<std::string> unquantized,
                                               const std::vector<std::string>& bf16_modules,
                                               const std::vector<std::string>& quantized_layers,
                                               const std::vector<std::string>& requantized_modules) {
  std::vector<std::string> diff;
  std::vector<std::string> entries;
  try {
    entries = modelopt_exclude_entries(std::move(unquantized), bf16_modules, quantized_layers);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::InvalidInput) throw;
    diff.push_back(fmt::format("no ModelOpt exclude list serves SRC: {}", e.what()));
    return diff;
  }
  Json dst;
  try {
    dst = parse_strict_json(target_config_text, "config.json").value;
  } catch (const Error& e) {
    diff.push_back(fmt::format("DST {}", e.what()));
    return diff;
  }
  if (!dst.is_object()) {
    diff.push_back("config.json: DST's config is not a JSON object");
    return diff;
  }
  if (without_quant_configs(source.config, source.parent) != without_quant_configs(dst, source.parent)) {
    diff.push_back("config.json: differs outside quantization_config");
  }
  check_members(member_or_null(dst, "quantization_config"), modelopt_quant_config(entries, "", requantized_modules),
                fmt::format("{}: quantization_config", kConfigFileName), diff);
  const Json& nested = member_or_null(member_or_null(dst, source.parent), "quantization_config");
  if (!source.parent.empty() && nested.dump() != member_or_null(dst, "quantization_config").dump()) {
    diff.push_back(fmt::format("config.json: {}.quantization_config is not the top level's (the runtimes read either)",
                               source.parent));
  }
  if (!hf_quant_config_text) {
    diff.push_back(fmt::format("{}: missing from DST", kModelOptConfigFileName));
    return diff;
  }
  Json hf;
  try {
    hf = parse_strict_json(*hf_quant_config_text, kModelOptConfigFileName).value;
  } catch (const Error& e) {
    diff.push_back(fmt::format("DST {}", e.what()));
    return diff;
  }
  check_members(hf, modelopt_hf_quant_config(entries, ""), std::string(kModelOptConfigFileName), diff);
  return diff;
}

}  // namespace mx2nv

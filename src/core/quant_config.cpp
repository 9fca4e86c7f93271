#include "core/quant_config.hpp"

#include "core/config_splice.hpp"
#include "core/error.hpp"

#include <array>

namespace mx2nv {
namespace {

constexpr std::array<std::string_view, 12> kQuantizationArgsKeys{
    "num_bits", "type",      "symmetric", "group_size", "strategy", "block_structure",
    "dynamic",  "actorder", "scale_dtype", "zp_dtype",  "observer", "observer_kwargs"};
constexpr std::array<std::string_view, 5> kSchemeKeys{"targets", "weights", "input_activations",
                                                      "output_activations", "format"};

bool is_null_or_absent(const Json& object, const char* key) {
  return !object.contains(key) || object[key].is_null();
}

void check_weights(const std::string& group, const Json& w) {
  if (!w.is_object()) fail_input("config.json: quantization group \"{}\" has no weights object", group);
  for (const auto& [key, _] : w.items()) {
    if (!is_known_quantization_args_key(key)) {
      fail_input("config.json: quantization group \"{}\": weights key \"{}\" is unknown to compressed-tensors", group,
                 key);
    }
  }
  const auto need = [&](const char* key, const Json& expected) {
    if (!w.contains(key) || w[key] != expected) {
      fail_input("config.json: quantization group \"{}\": weights.{} is {}, MXFP4 needs {}", group, key,
                 w.contains(key) ? w[key].dump() : "absent", expected.dump());
    }
  };
  need("num_bits", 4);
  need("type", "float");
  need("group_size", 32);
  if (w.contains("strategy") && w["strategy"] != "group") {
    fail_input("config.json: quantization group \"{}\": weights.strategy {} is not \"group\"", group,
               w["strategy"].dump());
  }
  if (w.contains("symmetric") && w["symmetric"] != true) {
    fail_input("config.json: quantization group \"{}\": asymmetric weights (zero points) are not MXFP4", group);
  }
  if (w.contains("dynamic") && w["dynamic"] != false) {
    fail_input("config.json: quantization group \"{}\": dynamic weight quantization is not a stored checkpoint",
               group);
  }
}

}  // namespace

bool is_known_quantization_args_key(std::string_view key) {
  for (const auto k : kQuantizationArgsKeys) {
    if (k == key) return true;
  }
  return false;
}

bool is_known_scheme_key(std::string_view key) {
  for (const auto k : kSchemeKeys) {
    if (k == key) return true;
  }
  return false;
}

SourceQuantConfig read_source_quant_config(std::string_view config_text) {
  SourceQuantConfig src;
  src.config = parse_strict_json(config_text, "config.json").value;
  if (!src.config.is_object()) fail_input("config.json: not a JSON object");

  // K3 nests the language model's config (and its quantization_config) under
  // text_config; most models keep it at the top level. Exactly one must exist.
  std::vector<std::string> found;
  if (src.config.contains("quantization_config")) found.emplace_back();
  for (const auto& [key, value] : src.config.items()) {
    if (value.is_object() && value.contains("quantization_config")) found.push_back(key);
  }
  if (found.empty()) fail_input("config.json: no quantization_config (top level or one level down)");
  if (found.size() > 1) {
    fail_input("config.json: {} quantization_config objects found (top level and/or under \"{}\"); expected one",
               found.size(), found[found.size() - 1]);
  }
  src.parent = found.front();
  src.quant_config = src.parent.empty() ? src.config["quantization_config"]
                                        : src.config[src.parent]["quantization_config"];
  const Json& qc = src.quant_config;
  const std::string where = src.parent.empty() ? "quantization_config" : src.parent + ".quantization_config";
  if (!qc.is_object()) fail_input("config.json: {} is not an object", where);
  if (qc.value("quant_method", "") != "compressed-tensors") {
    fail_input("config.json: {}.quant_method is {}, not \"compressed-tensors\"", where,
               qc.contains("quant_method") ? qc["quant_method"].dump() : "absent");
  }
  if (qc.contains("quantization_status") && qc["quantization_status"] != "compressed") {
    fail_input("config.json: {}.quantization_status is {}; only compressed checkpoints hold packed weights", where,
               qc["quantization_status"].dump());
  }
  if (qc.contains("format") && qc["format"] != kSourceFormat) {
    fail_input("config.json: {}.format is {}, not \"{}\"", where, qc["format"].dump(), kSourceFormat);
  }
  if (qc.contains("sparsity_config") && qc["sparsity_config"].is_object() && !qc["sparsity_config"].empty() &&
      qc["sparsity_config"].value("format", "dense") != "dense") {
    fail_input("config.json: {}.sparsity_config: sparse compression is not supported", where);
  }
  if (!qc.contains("config_groups") || !qc["config_groups"].is_object() || qc["config_groups"].empty()) {
    fail_input("config.json: {}.config_groups is missing or empty", where);
  }
  for (const auto& [name, scheme] : qc["config_groups"].items()) {
    if (!scheme.is_object()) {
      fail_input("config.json: quantization group \"{}\" is a preset shorthand; write out its scheme", name);
    }
    for (const auto& [key, _] : scheme.items()) {
      if (!is_known_scheme_key(key)) {
        fail_input("config.json: quantization group \"{}\": key \"{}\" is unknown to compressed-tensors", name, key);
      }
    }
    const std::string format = scheme.contains("format") && scheme["format"].is_string()
                                   ? scheme["format"].get<std::string>()
                                   : qc.value("format", "");
    if (format != kSourceFormat) {
      fail_input("config.json: quantization group \"{}\" has format \"{}\", not \"{}\"", name, format, kSourceFormat);
    }
    if (!is_null_or_absent(scheme, "input_activations")) {
      fail_input("config.json: quantization group \"{}\" quantizes input activations; only weight-only (A16) "
                 "sources are supported",
                 name);
    }
    if (!is_null_or_absent(scheme, "output_activations")) {
      fail_input("config.json: quantization group \"{}\" quantizes output activations; not supported", name);
    }
    check_weights(name, scheme.contains("weights") ? scheme["weights"] : Json());
  }
  return src;
}

Json nvfp4_quant_config(const Json& source_quant_config) {
  Json qc = source_quant_config;
  if (qc.contains("format")) qc["format"] = kTargetFormat;
  for (auto& [name, scheme] : qc["config_groups"].items()) {
    if (scheme.contains("format") || !qc.contains("format")) scheme["format"] = kTargetFormat;
    Json& w = scheme["weights"];
    w["strategy"] = "tensor_group";
    w["group_size"] = 16;
    w["scale_dtype"] = kTargetScaleDtype;
    w["zp_dtype"] = nullptr;  // compressed-tensors serialises it as null when symmetric
  }
  return qc;
}

std::string rewrite_config_text(std::string_view text, const SourceQuantConfig& source) {
  std::size_t object_begin = 0;
  if (!source.parent.empty()) {
    const auto parent = find_member_value(text, 0, source.parent);
    if (!parent) fail_input("config.json: cannot locate \"{}\" in the text", source.parent);
    object_begin = parent->begin;
  }
  const auto span = find_member_value(text, object_begin, "quantization_config");
  if (!span) fail_input("config.json: cannot locate quantization_config in the text");

  const Json target = nvfp4_quant_config(source.quant_config);
  const std::string_view old_value = text.substr(span->begin, span->end - span->begin);
  std::string replacement;
  if (old_value.find('\n') == std::string_view::npos) {
    replacement = target.dump();
  } else {
    // Indent like the surrounding file: nested lines get the key's indentation.
    const std::size_t line_start = text.rfind('\n', span->begin);
    std::size_t key_indent = 0;
    if (line_start != std::string_view::npos) {
      while (text[line_start + 1 + key_indent] == ' ') ++key_indent;
    }
    const std::string dumped = target.dump(2);
    for (const char c : dumped) {
      replacement += c;
      if (c == '\n') replacement.append(key_indent, ' ');
    }
  }
  std::string out(text.substr(0, span->begin));
  out += replacement;
  out += text.substr(span->end);
  return out;
}

}  // namespace mx2nv

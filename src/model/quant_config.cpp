#include "model/quant_config.hpp"

#include "common/error.hpp"
#include "json/config_splice.hpp"

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

std::string_view json_type_name(const Json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

// compressed-tensors' pydantic models type every field; a checkpoint whose
// config they would reject (or whose fields we would have to guess about) is
// refused here, with the key named, before any other check reads it.
enum class JsonType { Null, Boolean, Number, String, Array, Object };
bool has_type(const Json& v, JsonType t) {
  switch (t) {
    case JsonType::Null: return v.is_null();
    case JsonType::Boolean: return v.is_boolean();
    case JsonType::Number: return v.is_number();
    case JsonType::String: return v.is_string();
    case JsonType::Array: return v.is_array();
    case JsonType::Object: return v.is_object();
  }
  return false;
}

void require_types(const Json& object, const std::string& where, const char* key,
                   std::initializer_list<JsonType> allowed, std::string_view expected) {
  if (!object.contains(key)) return;
  const Json& v = object[key];
  for (const JsonType t : allowed) {
    if (has_type(v, t)) return;
  }
  fail_input("config.json: {}.{} is {}; compressed-tensors expects {}", where, key, json_type_name(v), expected);
}

void require_string_list(const Json& object, const std::string& where, const char* key) {
  if (!object.contains(key) || object[key].is_null()) return;
  const Json& v = object[key];
  if (!v.is_array()) fail_input("config.json: {}.{} is {}; compressed-tensors expects a list of strings", where, key, json_type_name(v));
  for (const Json& e : v) {
    if (!e.is_string()) {
      fail_input("config.json: {}.{} holds {}; compressed-tensors expects a list of strings", where, key,
                 json_type_name(e));
    }
  }
}

// QuantizationArgs fields: the types compressed-tensors 0.20's model accepts.
void check_args_types(const Json& w, const std::string& where) {
  using T = JsonType;
  require_types(w, where, "num_bits", {T::Number}, "an integer");
  require_types(w, where, "type", {T::String}, "a string");
  require_types(w, where, "symmetric", {T::Boolean}, "a boolean");
  require_types(w, where, "group_size", {T::Number, T::Null}, "an integer or null");
  require_types(w, where, "strategy", {T::String, T::Null}, "a string or null");
  require_types(w, where, "block_structure", {T::Array, T::Null}, "a list or null");
  require_types(w, where, "dynamic", {T::Boolean, T::String}, "a boolean or \"local\"");
  require_types(w, where, "actorder", {T::String, T::Boolean, T::Null}, "a string, boolean or null");
  require_types(w, where, "scale_dtype", {T::String, T::Null}, "a string or null");
  require_types(w, where, "zp_dtype", {T::String, T::Null}, "a string or null");
  require_types(w, where, "observer", {T::String, T::Null}, "a string or null");
  require_types(w, where, "observer_kwargs", {T::Object, T::Null}, "an object or null");
}

void check_weights(const std::string& group, const Json& w) {
  if (!w.is_object()) fail_input("config.json: quantization group \"{}\" has no weights object", group);
  for (const auto& [key, _] : w.items()) {
    if (!is_known_quantization_args_key(key)) {
      fail_input("config.json: quantization group \"{}\": weights key \"{}\" is unknown to compressed-tensors", group,
                 key);
    }
  }
  check_args_types(w, "config_groups." + group + ".weights");
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

// K3 nests the language model's config (and its quantization_config) under
// text_config; most models keep it at the top level. Exactly one must exist:
// "" for the top level, else the key holding it.
std::string quant_config_parent(const Json& config) {
  std::vector<std::string> found;
  if (config.contains("quantization_config")) found.emplace_back();
  for (const auto& [key, value] : config.items()) {
    if (value.is_object() && value.contains("quantization_config")) found.push_back(key);
  }
  if (found.empty()) fail_input("config.json: no quantization_config (top level or one level down)");
  if (found.size() > 1) {
    fail_input("config.json: {} quantization_config objects found (top level and/or under \"{}\"); expected one",
               found.size(), found[found.size() - 1]);
  }
  return found.front();
}

// The JSON types of quantization_config's fields, as compressed-tensors
// declares them.
void check_quant_config_types(const Json& qc, const std::string& where) {
  using T = JsonType;
  require_types(qc, where, "quant_method", {T::String}, "a string");
  require_types(qc, where, "format", {T::String, T::Null}, "a string or null");
  require_types(qc, where, "quantization_status", {T::String, T::Null}, "a string or null");
  require_types(qc, where, "config_groups", {T::Object}, "an object");
  require_types(qc, where, "sparsity_config", {T::Object, T::Null}, "an object or null");
  require_types(qc, where, "transform_config", {T::Object, T::Null}, "an object or null");
  require_types(qc, where, "kv_cache_scheme", {T::Object, T::Null}, "an object or null");
  require_types(qc, where, "global_compression_ratio", {T::Number, T::Null}, "a number or null");
  require_types(qc, where, "version", {T::String, T::Null}, "a string or null");
  require_string_list(qc, where, "ignore");
  if (qc.contains("sparsity_config") && qc["sparsity_config"].is_object()) {
    const Json& sc = qc["sparsity_config"];
    const std::string sc_where = where + ".sparsity_config";
    require_types(sc, sc_where, "format", {T::String}, "a string");
    require_types(sc, sc_where, "global_sparsity", {T::Number}, "a number");
    require_types(sc, sc_where, "sparsity_structure", {T::String}, "a string");
    require_string_list(sc, sc_where, "targets");
    require_string_list(sc, sc_where, "ignore");
  }
}

// An MXFP4 compressed-tensors checkpoint, stored compressed and dense, with
// config groups.
void check_quant_config_values(const Json& qc, const std::string& where) {
  if (!qc.contains("quant_method") || qc["quant_method"] != "compressed-tensors") {
    fail_input("config.json: {}.quant_method is {}, not \"compressed-tensors\"", where,
               qc.contains("quant_method") ? qc["quant_method"].dump() : "absent");
  }
  if (qc.contains("quantization_status") && qc["quantization_status"] != "compressed") {
    fail_input("config.json: {}.quantization_status is {}; only compressed checkpoints hold packed weights", where,
               qc["quantization_status"].dump());
  }
  if (qc.contains("format") && !qc["format"].is_null() && qc["format"] != kSourceFormat) {
    fail_input("config.json: {}.format is {}, not \"{}\"", where, qc["format"].dump(), kSourceFormat);
  }
  if (qc.contains("sparsity_config") && qc["sparsity_config"].is_object() &&
      qc["sparsity_config"].contains("format") && qc["sparsity_config"]["format"] != "dense") {
    fail_input("config.json: {}.sparsity_config: sparse compression is not supported", where);
  }
  if (!qc.contains("config_groups") || !qc["config_groups"].is_object() || qc["config_groups"].empty()) {
    fail_input("config.json: {}.config_groups is missing or empty", where);
  }
}

// One config group: known keys and types, MXFP4 weights only.
void check_config_group(const std::string& name, const Json& scheme, const Json& qc) {
  using T = JsonType;
  if (!scheme.is_object()) {
    fail_input("config.json: quantization group \"{}\" is a preset shorthand; write out its scheme", name);
  }
  for (const auto& [key, _] : scheme.items()) {
    if (!is_known_scheme_key(key)) {
      fail_input("config.json: quantization group \"{}\": key \"{}\" is unknown to compressed-tensors", name, key);
    }
  }
  const std::string group_where = "config_groups." + name;
  require_types(scheme, group_where, "format", {T::String, T::Null}, "a string or null");
  require_types(scheme, group_where, "weights", {T::Object, T::Null}, "an object or null");
  require_types(scheme, group_where, "input_activations", {T::Object, T::Null}, "an object or null");
  require_types(scheme, group_where, "output_activations", {T::Object, T::Null}, "an object or null");
  require_string_list(scheme, group_where, "targets");
  const Json* format_value = scheme.contains("format") && scheme["format"].is_string() ? &scheme["format"]
                             : qc.contains("format") && qc["format"].is_string()     ? &qc["format"]
                                                                                      : nullptr;
  const std::string format = format_value ? format_value->get<std::string>() : "";
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
  src.parent = quant_config_parent(src.config);
  src.quant_config = src.parent.empty() ? src.config["quantization_config"]
                                        : src.config[src.parent]["quantization_config"];
  const Json& qc = src.quant_config;
  const std::string where = src.parent.empty() ? "quantization_config" : src.parent + ".quantization_config";
  if (!qc.is_object()) fail_input("config.json: {} is not an object", where);
  check_quant_config_types(qc, where);
  check_quant_config_values(qc, where);
  for (const auto& [name, scheme] : qc["config_groups"].items()) check_config_group(name, scheme, qc);
  return src;
}

Json nvfp4_quant_config(const Json& source_quant_config, const std::vector<std::string>& bf16_modules,
                        const std::vector<std::string>& requantized_modules) {
  Json qc = source_quant_config;
  if (!requantized_modules.empty()) qc[std::string(kRequantizedModulesKey)] = requantized_modules;
  if (!bf16_modules.empty()) {
    Json& ignore = qc["ignore"];
    if (!ignore.is_array()) ignore = Json::array();
    for (const auto& m : bf16_modules) ignore.push_back(m);
  }
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

std::string rewrite_config_text(std::string_view text, const SourceQuantConfig& source,
                                const std::vector<std::string>& bf16_modules,
                                const std::vector<std::string>& requantized_modules) {
  return splice_quant_config(text, source, nvfp4_quant_config(source.quant_config, bf16_modules, requantized_modules));
}

std::string splice_quant_config(std::string_view text, const SourceQuantConfig& source, const Json& target) {
  std::size_t object_begin = 0;
  if (!source.parent.empty()) {
    const auto parent = find_member_value(text, 0, source.parent);
    if (!parent) fail_input("config.json: cannot locate \"{}\" in the text", source.parent);
    object_begin = parent->begin;
  }
  const auto span = find_member_value(text, object_begin, "quantization_config");
  if (!span) fail_input("config.json: cannot locate quantization_config in the text");
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

namespace mx2nv {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

std::string string_member(const Json& object, const char* key) {
  if (!object.is_object()) return {};
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// compressed-tensors: each group's format (its own, else the top-level
// one); a group with neither whose weights are 4-bit floats in groups of 16
// is NVFP4 (compressed-tensors infers the format from the scheme). Any NVFP4
// group makes the checkpoint NVFP4.
QuantizationKind compressed_tensors_kind(const Json& qc, std::string& format) {
  const std::string top = string_member(qc, "format");
  std::vector<std::string> formats;
  if (const auto groups = qc.find("config_groups"); groups != qc.end() && groups->is_object()) {
    for (const auto& [name, scheme] : groups->items()) {
      std::string f = string_member(scheme, "format");
      if (f.empty()) f = top;
      if (f.empty() && scheme.is_object() && scheme.contains("weights") && scheme["weights"].is_object()) {
        const Json& w = scheme["weights"];
        if (w.value("num_bits", Json()) == 4 && w.value("type", Json()) == "float" && w.value("group_size", Json()) == 16) {
          f = std::string(kTargetFormat);
        }
      }
      if (!f.empty()) formats.push_back(f);
    }
  }
  if (formats.empty() && !top.empty()) formats.push_back(top);
  for (const auto& f : formats) {
    if (lower(f) == kTargetFormat) {
      format = f;
      return QuantizationKind::CompressedNvfp4;
    }
  }
  for (const auto& f : formats) {
    if (f != kSourceFormat) {
      format = f;
      return QuantizationKind::Other;
    }
  }
  format = std::string(kSourceFormat);
  return QuantizationKind::CompressedMxfp4;
}

bool names_nvfp4(std::string_view algo) { return lower(algo).find("nvfp4") != std::string::npos; }

// ModelOpt's hf_quant_config.json: {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": ...}};
// MIXED_PRECISION lists each layer's algorithm under quantized_layers.
std::string modelopt_algo(const Json& hf) {
  if (!hf.is_object()) return {};
  const auto q = hf.find("quantization");
  const Json& quant = q != hf.end() && q->is_object() ? *q : hf;
  const std::string algo = string_member(quant, "quant_algo");
  if (names_nvfp4(algo)) return algo;
  if (const auto layers = quant.find("quantized_layers"); layers != quant.end() && layers->is_object()) {
    for (const auto& [name, layer] : layers->items()) {
      if (const std::string a = string_member(layer, "quant_algo"); names_nvfp4(a)) return a;
    }
  }
  return algo;
}

}  // namespace

QuantizationLook look_at_quantization(std::string_view config_text, std::string_view hf_quant_config_text) {
  QuantizationLook look;
  Json config;
  try {
    config = parse_strict_json(config_text, "config.json").value;
  } catch (const Error&) {
    return look;
  }
  if (!config.is_object()) return look;
  std::vector<std::pair<std::string, const Json*>> found;
  if (config.contains("quantization_config")) found.emplace_back("quantization_config", &config["quantization_config"]);
  for (const auto& [key, value] : config.items()) {
    if (value.is_object() && value.contains("quantization_config")) {
      found.emplace_back(key + ".quantization_config", &value["quantization_config"]);
    }
  }
  // Several: ambiguous, unless each is the same object (a ModelOpt-layout
  // mx2nv DST keeps one at the top level and one where its source had it).
  for (const auto& f : found) {
    if (*f.second != *found.front().second) return look;
  }
  Json hf;
  if (!hf_quant_config_text.empty()) {
    try {
      hf = parse_strict_json(hf_quant_config_text, "hf_quant_config.json").value;
    } catch (const Error&) {
    }
  }
  if (found.empty()) {
    const std::string algo = modelopt_algo(hf);
    if (names_nvfp4(algo)) {
      look.kind = QuantizationKind::ModelOptNvfp4;
      look.where = "hf_quant_config.json";
      look.format = algo;
    } else {
      look.kind = algo.empty() ? QuantizationKind::Unquantized : QuantizationKind::Other;
      look.format = algo;
    }
    return look;
  }
  look.where = found.front().first;
  const Json& qc = *found.front().second;
  look.method = string_member(qc, "quant_method");
  const std::string method = lower(look.method);
  if (!qc.is_object()) return look;
  if (method == "mxfp4") {
    look.kind = QuantizationKind::GptOssMxfp4;
  } else if (method == "compressed-tensors") {
    look.kind = compressed_tensors_kind(qc, look.format);
  } else if (method.starts_with("modelopt")) {
    std::string algo = string_member(qc, "quant_algo");
    if (!names_nvfp4(algo)) algo = modelopt_algo(hf);
    look.format = algo;
    look.kind = names_nvfp4(algo) || method.find("fp4") != std::string::npos ? QuantizationKind::ModelOptNvfp4
                                                                              : QuantizationKind::Other;
  } else {
    look.kind = QuantizationKind::Other;
  }
  return look;
}

}  // namespace mx2nv

#include "model/modelopt_config.hpp"

#include "common/error.hpp"
#include "common/printable.hpp"
#include "json/config_splice.hpp"
#include "model/module_names.hpp"

#include <algorithm>

namespace mx2nv {
namespace {

constexpr std::string_view kLanguageModelModel = "language_model.model.";
constexpr std::string_view kLanguageModel = "language_model.";
constexpr std::string_view kBlockSparseMoe = "block_sparse_moe";
// Special to fnmatch (vLLM) or to Python's re (SGLang) beyond `.`.
constexpr std::string_view kPatternCharacters = "*?[]()+|^${}\\";

// The names a runtime may match a module under: as written; with K3's
// `block_sparse_moe` as SGLang's and vLLM's K3 classes call it (`mlp`); and,
// for a name under `language_model.model.`, with that prefix as `model.` and
// dropped (the language model's own prefixes in the runtimes' K3 classes).
// ModelOpt's own K3 exporter lists its exclusions under the same aliases.
void add_aliases(std::string_view name, std::vector<std::string>& out) {
  std::vector<std::string> names{std::string(name)};
  if (const auto at = name.find(kBlockSparseMoe); at != std::string_view::npos) {
    names.push_back(std::string(name.substr(0, at)) + "mlp" + std::string(name.substr(at + kBlockSparseMoe.size())));
  }
  for (const std::string& n : names) {
    out.push_back(n);
    if (n.starts_with(kLanguageModelModel)) {
      const std::string rest = n.substr(kLanguageModelModel.size());
      out.push_back("model." + rest);
      out.push_back(rest);
    } else if (n.starts_with(kLanguageModel)) {
      out.push_back(n.substr(kLanguageModel.size()));
    }
  }
}

Json weights_only_group() {
  return {{"targets", Json::array({"Linear"})},
          {"weights", {{"dynamic", false}, {"group_size", 16}, {"num_bits", 4}, {"type", "float"}}}};
}

}  // namespace

std::vector<std::string> modelopt_exclude_entries(std::vector<std::string> unquantized,
                                                  const std::vector<std::string>& bf16_modules,
                                                  const std::vector<std::string>& quantized_layers) {
  for (const std::string& m : bf16_modules) {
    unquantized.push_back(m);
    unquantized.emplace_back(moe_layer_of(m));
  }
  std::sort(unquantized.begin(), unquantized.end());
  unquantized.erase(std::unique(unquantized.begin(), unquantized.end()), unquantized.end());
  std::vector<std::string> layers;
  for (const std::string& l : quantized_layers) add_aliases(l, layers);
  std::sort(layers.begin(), layers.end());
  layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
  std::vector<std::string> aliases;
  for (const std::string& name : unquantized) {
    // vLLM matches entries with fnmatch, SGLang as regular expressions in
    // which only `.` and `*` are rewritten: a name holding any other special
    // character of either would be a pattern, not a name.
    if (name.find_first_of(kPatternCharacters) != std::string::npos) {
      fail_input("module \"{}\" stays unquantized, but its name holds a pattern character of the runtimes' exclude "
                 "matching ({}), so no exclude_modules entry names it alone (--format modelopt)",
                 printable(name), kPatternCharacters);
    }
    // The entry is the name as SRC spells it (SGLang maps it through its
    // model's renames and adds it without `language_model.`; vLLM matches
    // with and without that prefix), but it must stay clear of every
    // quantized layer under every spelling: vLLM excludes a layer whose name
    // holds an entry (or an expert layer named inside an entry), SGLang one
    // with an entry as a dotted part. Either would leave quantized weights
    // unread.
    aliases.clear();
    add_aliases(name, aliases);
    for (const std::string& a : aliases) {
      for (const std::string& l : layers) {
        if (l.find(a) != std::string::npos || a.find(l) != std::string::npos) {
          fail_input("module \"{}\" stays unquantized, but ModelOpt's runtimes would match its exclude entry \"{}\" "
                     "against the quantized layer \"{}\" too (--format modelopt)",
                     printable(name), printable(a), printable(l));
        }
      }
    }
  }
  return unquantized;
}

Json modelopt_quant_config(const std::vector<std::string>& exclude, std::string_view producer_version,
                           const std::vector<std::string>& requantized_modules) {
  Json qc = {{"config_groups", {{"group_0", weights_only_group()}}},
             {"exclude_modules", exclude},
             {"group_size", 16},
             {"ignore", exclude},
             {"producer", {{"name", "mx2nv"}, {"version", producer_version}}},
             {"quant_algo", kModelOptQuantAlgo},
             {"quant_method", kModelOptQuantMethod}};
  if (!requantized_modules.empty()) qc[std::string(kRequantizedModulesKey)] = requantized_modules;
  return qc;
}

Json modelopt_hf_quant_config(const std::vector<std::string>& exclude, std::string_view producer_version) {
  return {{"producer", {{"name", "mx2nv"}, {"version", producer_version}}},
          {"quantization",
           {{"exclude_modules", exclude},
            {"group_size", 16},
            {"kv_cache_quant_algo", nullptr},
            {"quant_algo", kModelOptQuantAlgo}}}};
}

std::string modelopt_config_text(std::string_view config_text, const SourceQuantConfig& source,
                                 const std::vector<std::string>& exclude, std::string_view producer_version,
                                 const std::vector<std::string>& requantized_modules) {
  const Json qc = modelopt_quant_config(exclude, producer_version, requantized_modules);
  const std::string spliced = splice_quant_config(config_text, source, qc);
  if (source.parent.empty()) return spliced;
  return insert_top_level_member(spliced, "quantization_config", qc);
}

std::string modelopt_hf_quant_config_text(const std::vector<std::string>& exclude, std::string_view producer_version) {
  return modelopt_hf_quant_config(exclude, producer_version).dump(2) + "\n";
}

}  // namespace mx2nv

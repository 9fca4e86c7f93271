#include "gate/exclusion.hpp"

#include "common/printable.hpp"

#include <fmt/format.h>
#include <fnmatch.h>
#include <re2/re2.h>

#include <utility>

namespace mx2nv {
namespace {

constexpr std::string_view kLanguageModel = "language_model.";

std::string without_language_model(std::string_view name) {
  return std::string(name.starts_with(kLanguageModel) ? name.substr(kLanguageModel.size()) : name);
}

std::string replace_first(std::string text, std::string_view from, std::string_view to) {
  if (const auto at = text.find(from); at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

std::string renamed_prefix(std::string text) {
  if (text.starts_with("language_model.layers.")) text.replace(0, 22, "language_model.model.layers.");
  return text;
}

// vLLM's apply_vllm_mapper (modelopt.py:270-289) for a class with a mapper:
// each entry as read, beside the entry as written.
std::vector<std::pair<std::string, std::string>> vllm_entries(const std::vector<std::string>& exclude, bool mapper) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& e : exclude) {
    if (mapper && e.ends_with('*') && !e.ends_with(".*")) {
      const std::string stem = e.substr(0, e.size() - 1);
      out.emplace_back(renamed_prefix(stem), e);
      out.emplace_back(renamed_prefix(stem + ".*"), e);
    } else {
      out.emplace_back(mapper ? renamed_prefix(e) : e, e);
    }
  }
  return out;
}

std::string entry_words(const std::string& read, const std::string& written) {
  return read == written ? fmt::format("\"{}\"", printable(written))
                         : fmt::format("\"{}\" (read as \"{}\")", printable(written), printable(read));
}

std::optional<std::string> vllm_excludes(const std::string& e, const std::string& p) {
  if (e == p) return "names it";
  if (e.find("experts") != std::string::npos && e.find(p) != std::string::npos) {
    return "names something inside it (utils/quant_utils.py:699-703 then skips the whole layer)";
  }
  if (p.find(e) != std::string::npos || without_language_model(p).find(e) != std::string::npos) {
    return "is part of its name (modelopt.py:217-226)";
  }
  if (::fnmatch(e.c_str(), p.c_str(), FNM_NOESCAPE) == 0) return "matches it as a pattern (modelopt.py:229-231)";
  return std::nullopt;
}

// SGLang's entry -> regex (modelopt_quant.py:308-313).
std::string sglang_pattern(std::string_view e) {
  std::string out;
  for (const char c : e) {
    if (c == '.') {
      out += "\\.";
    } else if (c == '*') {
      out += ".*";
    } else {
      out += c;
    }
  }
  return out;
}

std::vector<std::string> dotted_parts(const std::string& p) {
  std::vector<std::string> parts;
  std::size_t begin = 0;
  while (true) {
    const auto dot = p.find('.', begin);
    parts.push_back(p.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin));
    if (dot == std::string::npos) return parts;
    begin = dot + 1;
  }
}

}  // namespace

std::optional<std::string> excluded_expert_layer(Runtime runtime, bool k3_mapper,
                                                 const std::vector<std::string>& exclude,
                                                 const std::vector<std::string>& layers) {
  if (runtime == Runtime::Vllm) {
    for (const std::string& p : layers) {
      for (const auto& [read, written] : vllm_entries(exclude, k3_mapper)) {
        if (const auto why = vllm_excludes(read, p)) {
          return fmt::format("exclude entry {} {} (the routed-expert layer \"{}\"): vLLM builds it unquantized",
                             entry_words(read, written), *why, printable(p));
        }
      }
    }
    return std::nullopt;
  }
  std::vector<std::pair<std::string, std::string>> entries;  // as read, as written
  for (const std::string& e : exclude) {
    const std::string mapped = k3_mapper ? replace_first(renamed_prefix(e), "block_sparse_moe", "mlp") : e;
    entries.emplace_back(mapped, e);
    if (mapped.starts_with(kLanguageModel)) entries.emplace_back(without_language_model(mapped), e);
  }
  for (const std::string& layer : layers) {
    // The runtime's name for the layer: K3's classes call it model.layers.L.mlp.experts.
    const std::string p = replace_first(without_language_model(layer), "block_sparse_moe", "mlp");
    std::vector<std::string> candidates = dotted_parts(p);
    candidates.push_back(p);
    for (const auto& [e, written] : entries) {
      const RE2 pattern(sglang_pattern(e), RE2::Quiet);
      if (!pattern.ok()) {
        return fmt::format("exclude entry {} is no pattern gate can evaluate as SGLang reads it (a regular "
                           "expression, modelopt_quant.py:308-313): whether it excludes a routed-expert layer is "
                           "not known", entry_words(e, written));
      }
      for (const std::string& c : candidates) {
        if (RE2::FullMatch(c, pattern)) {
          return fmt::format("exclude entry {} matches \"{}\" of the routed-expert layer \"{}\" "
                             "(modelopt_quant.py:379-412): SGLang builds it unquantized",
                             entry_words(e, written), printable(c), printable(p));
        }
      }
    }
  }
  return std::nullopt;
}

}  // namespace mx2nv

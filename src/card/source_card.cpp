#include "card/source_card.hpp"

#include "card/card_text.hpp"
#include "card/front_matter.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <initializer_list>
#include <map>
#include <set>
#include <stdexcept>

namespace mx2nv {
namespace {

constexpr std::size_t kMaxFrontMatter = 1 << 20;
constexpr std::size_t kMaxValueChars = 1024;

// The problem as the card names it (one of the phrases of §3.4, then details).
[[noreturn]] void unusable(const std::string& problem) { throw FrontMatterUnusable(problem); }

// huggingface_hub's front-matter regex (repocard.py:32-34, 2.4.0):
// ^(\s*---(?:\r\n|\r|\n))([\S\s]*?)((?:\r\n|\r|\n)---[ \t]*(\r\n|\n|$)).
// Leading whitespace is read as ASCII only: a text that starts with another
// Unicode space is said to have no front matter (nothing inherited).
std::optional<std::string_view> front_matter(std::string_view t) {
  std::size_t i = 0;
  while (i < t.size() && std::string_view(" \t\n\r\f\v").find(t[i]) != std::string_view::npos) ++i;
  if (t.substr(i, 3) != "---") return std::nullopt;
  i += 3;
  if (t.substr(i, 2) == "\r\n") {
    i += 2;
  } else if (i < t.size() && (t[i] == '\r' || t[i] == '\n')) {
    ++i;
  } else {
    return std::nullopt;
  }
  for (std::size_t p = i; p < t.size(); ++p) {
    if (t[p] != '\r' && t[p] != '\n') continue;
    std::size_t q = p + (t.substr(p, 2) == "\r\n" ? 2 : 1);
    if (t.substr(q, 3) != "---") continue;
    q += 3;
    while (q < t.size() && (t[q] == ' ' || t[q] == '\t')) ++q;
    if (q == t.size() || t[q] == '\n' || t.substr(q, 2) == "\r\n") return t.substr(i, p - i);
  }
  return std::nullopt;
}

bool reader_printable(char32_t c) {  // PyYAML reader.py NON_PRINTABLE, 6.0.4
  return c == 0x09 || c == 0x0A || c == 0x0D || (c >= 0x20 && c <= 0x7E) || c == 0x85 ||
         (c >= 0xA0 && c <= 0xD7FF) || (c >= 0xE000 && c <= 0xFFFD) || (c >= 0x10000 && c <= 0x10FFFF);
}

bool usable_char(char32_t c) {  // §3.3
  return !(c < 0x20 || c == 0x7F || (c >= 0x80 && c <= 0x9F) || c == 0x2028 || c == 0x2029 || c == 0xFEFF);
}

[[noreturn]] void refused_by_hub(const std::string& why) {
  unusable(fmt::format("front matter is not valid YAML for huggingface_hub ({})", why));
}

const YamlNode* member(const YamlNode& map, std::string_view key) {
  const YamlNode* found = nullptr;
  for (const auto& [k, v] : map.entries) {
    if (k == key) found = &v;  // the last of repeated keys, as PyYAML
  }
  return found;
}

// Python's truth value where mx2nv knows it; a bool or number (Other) or a
// block scalar is not read here: nullopt.
std::optional<bool> truthy(const YamlNode& v) {
  switch (v.kind) {
    case YamlNode::Kind::Null: return false;
    case YamlNode::Kind::Str: return v.text ? std::optional<bool>(!v.text->empty()) : std::nullopt;
    case YamlNode::Kind::Seq: return !v.items.empty();
    case YamlNode::Kind::Map: return !v.entries.empty();
    case YamlNode::Kind::Other: return std::nullopt;
  }
  return std::nullopt;
}

// huggingface_hub's model_index_to_eval_results (repocard_data.py:561-666,
// 2.4.0) without ignore_metadata_errors: what it subscripts must be there,
// what it iterates a list, EvalResult's own check (a source name needs a
// url), and eval results need a model name. Returns whether it gives eval
// results; refuses (the whole front matter unusable) where it raises.
bool check_model_index(const YamlNode& index) {
  const auto map_with = [](const YamlNode* v, std::initializer_list<const char*> keys, const char* what) {
    if (v == nullptr || v->kind != YamlNode::Kind::Map) refused_by_hub(fmt::format("model-index: {} is not a mapping", what));
    for (const char* k : keys) {
      if (member(*v, k) == nullptr) refused_by_hub(fmt::format("model-index: {} has no {}", what, k));
    }
  };
  const auto list = [](const YamlNode* v, const char* what) {
    if (v == nullptr || v->kind != YamlNode::Kind::Seq) refused_by_hub(fmt::format("model-index: {} is not a list", what));
    return v;
  };
  list(&index, "model-index");
  bool results = false;
  const YamlNode* name = nullptr;
  for (const YamlNode& elem : index.items) {
    map_with(&elem, {"name", "results"}, "an entry");
    name = member(elem, "name");
    for (const YamlNode& result : list(member(elem, "results"), "results")->items) {
      map_with(&result, {"task", "dataset", "metrics"}, "a result");
      map_with(member(result, "task"), {"type"}, "a task");
      map_with(member(result, "dataset"), {"type", "name"}, "a dataset");
      if (const YamlNode* source = member(result, "source")) {
        const auto t = truthy(*source);
        if (!t) refused_by_hub("model-index: a source mx2nv does not read");
        if (*t) {
          if (source->kind != YamlNode::Kind::Map) refused_by_hub("model-index: a source is not a mapping");
          const YamlNode* sname = member(*source, "name");
          const YamlNode* url = member(*source, "url");
          if (sname && sname->kind != YamlNode::Kind::Null && (!url || url->kind == YamlNode::Kind::Null)) {
            refused_by_hub("model-index: a source name without a url");
          }
        }
      }
      for (const YamlNode& metric : list(member(result, "metrics"), "metrics")->items) {
        map_with(&metric, {"type", "value"}, "a metric");
        results = true;
      }
    }
  }
  if (results && name->kind == YamlNode::Kind::Null) refused_by_hub("model-index: eval results without a model name");
  return results;
}

// What huggingface_hub 2.4.0 does with the mapping after safe_load
// (repocard.py:95-109, ModelCardData(**data); repocard_data.py:335-391): the
// keys it refuses or parses further.
void check_as_huggingface_hub(const std::vector<std::pair<std::string, YamlNode>>& top) {
  YamlNode all;
  all.kind = YamlNode::Kind::Map;
  all.entries = top;
  for (const auto& [key, value] : top) {
    if (key == "self" || key == "ignore_metadata_errors") refused_by_hub(fmt::format("the key {}", key));
  }
  // ModelCardData(tags=...) iterates them (_to_unique_list).
  if (const YamlNode* tags = member(all, "tags"); tags && tags->kind == YamlNode::Kind::Other) {
    refused_by_hub("tags is not a list");
  }
  bool replaced = false;
  if (const YamlNode* index = member(all, "model-index")) {
    const auto t = truthy(*index);
    if (!t) refused_by_hub("a model-index mx2nv does not read");
    if (*t) {
      check_model_index(*index);
      replaced = true;  // eval_results is the model-index's from here on
    }
  }
  // eval_results given as YAML is never a list of EvalResult objects.
  if (const YamlNode* given = member(all, "eval_results"); given && !replaced) {
    const auto t = truthy(*given);
    if (!t || *t) refused_by_hub("eval_results");
  }
}

// The value of an inheritable key, when it is a str (or, for a list key, a
// list of str) read exactly that passes §3.3.
std::optional<CardValue> value_of(const YamlNode& v, bool list_allowed) {
  auto usable = [](const std::string& s) {
    const auto cps = decode_utf8(s);
    return cps && !cps->empty() && cps->size() <= kMaxValueChars && std::all_of(cps->begin(), cps->end(), usable_char);
  };
  if (v.kind == YamlNode::Kind::Str) {
    if (!v.text || !usable(*v.text)) return std::nullopt;
    return CardValue(*v.text);
  }
  if (v.kind != YamlNode::Kind::Seq || !list_allowed || v.items.empty()) return std::nullopt;
  std::vector<std::string> items;
  for (const YamlNode& item : v.items) {
    if (item.kind != YamlNode::Kind::Str || !item.text || !usable(*item.text)) return std::nullopt;
    items.push_back(*item.text);
  }
  return CardValue(std::move(items));
}

}  // namespace

const std::vector<std::string>& inheritable_card_keys() {
  static const std::vector<std::string> kKeys = {"license",      "license_name", "license_link", "library_name",
                                                 "pipeline_tag", "language",     "datasets"};
  return kKeys;
}

SourceCard read_source_card(std::string_view bytes) {
  const std::string_view full = bytes;
  SourceCard card;
  card.present = true;
  if (bytes.substr(0, 3) == "\xEF\xBB\xBF") bytes.remove_prefix(3);  // utf-8-sig
  if (const std::size_t at = first_invalid_utf8(bytes); at != std::string_view::npos) {
    card.problem = fmt::format("README.md is not UTF-8 (byte {})", at + (bytes.data() != full.data() ? 3 : 0));
    return card;
  }
  const auto fm = front_matter(bytes);
  if (!fm) {
    card.problem = "no front matter";
    return card;
  }
  if (fm->size() > kMaxFrontMatter) {
    card.problem = "front matter larger than 1 MiB";
    return card;
  }
  const std::vector<char32_t> fm_chars = *decode_utf8(*fm);  // valid: the whole text is
  for (const char32_t c : fm_chars) {
    if (!reader_printable(c)) {
      card.problem = fmt::format("front matter is not valid YAML (the control character U+{:04X})", static_cast<unsigned>(c));
      return card;
    }
    if (c == 0x85 || c == 0x2028 || c == 0x2029) {
      card.problem = "front matter is not valid YAML (a Unicode line break: NEL, U+2028 or U+2029, which mx2nv does not read)";
      return card;
    }
  }
  std::map<std::string, CardValue> values;
  std::set<std::string> keys, unusable_keys;
  try {
    const auto top = read_front_matter(*fm);
    check_as_huggingface_hub(top);
    const auto& wanted = inheritable_card_keys();
    for (const auto& [key, value] : top) {
      keys.insert(key);
      if (std::find(wanted.begin(), wanted.end(), key) == wanted.end()) continue;
      const auto v = value_of(value, key == "language" || key == "datasets");
      values.erase(key);
      unusable_keys.erase(key);
      if (v) {
        values.emplace(key, *v);
      } else {
        unusable_keys.insert(key);
      }
    }
  } catch (const FrontMatterUnusable& u) {
    card.problem = u.what();
    return card;
  }
  for (const auto& k : inheritable_card_keys()) {
    if (values.count(k)) card.inherited.emplace_back(k, values.at(k));
    if (unusable_keys.count(k)) card.not_inherited.push_back(k);
  }
  for (const auto& k : keys) {
    if (!values.count(k) && !unusable_keys.count(k)) card.dropped.push_back(k);
    if (k == "gated" || k.rfind("extra_gated_", 0) == 0) card.gating.push_back(k);
  }
  return card;
}

}  // namespace mx2nv

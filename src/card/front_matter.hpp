// mx2nv's reader of a source card's YAML front matter: a strict subset of
// YAML 1.1 as PyYAML 6.0.4's SafeLoader reads it (docs/card.md "Hostile
// source cards"). Every construct it accepts it reads exactly as SafeLoader
// does; everything else (what YAML rejects, and what this reader does not
// implement) makes the whole front matter unusable: the card then inherits
// nothing, never something different.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mx2nv {

// Why a front matter is unusable: one of the phrases of
// docs/reference/model-card.md §3.4, then details.
struct FrontMatterUnusable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct YamlNode {
  // Other: a bool, int or float (valid YAML, never inherited).
  enum class Kind { Null, Str, Other, Seq, Map };
  Kind kind = Kind::Null;
  std::optional<std::string> text;  // Str: its value, read exactly (nullopt for a block scalar, not read)
  std::vector<YamlNode> items;      // Seq
  std::vector<std::pair<std::string, YamlNode>> entries;  // Map: keys are str, in document order
};

// The top-level mapping of a front matter (the text between the `---`
// lines, valid UTF-8 of printable characters without NEL, U+2028, U+2029),
// in document order (a repeated key appears twice: the last one is the
// value). Throws FrontMatterUnusable.
std::vector<std::pair<std::string, YamlNode>> read_front_matter(std::string_view text);

}  // namespace mx2nv

// SRC's README.md as huggingface_hub 2.4.0 reads it (ModelCard.load), and
// what of its front matter the card inherits (docs/reference/model-card.md
// §3). mx2nv reads a conservative subset of YAML: whatever it cannot read
// exactly as PyYAML's SafeLoader would makes the whole front matter unusable
// ("when in doubt, inherit nothing, never something different").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace mx2nv {

// A value the card may inherit: one string, or (language, datasets) a list.
using CardValue = std::variant<std::string, std::vector<std::string>>;

struct SourceCard {
  bool present = false;  // SRC has README.md
  std::string problem;   // why nothing was inherited ("" when the front matter was read)
  std::vector<std::pair<std::string, CardValue>> inherited;  // in the card's key order (§2)
  std::vector<std::string> dropped;        // SRC keys not carried over, byte order
  std::vector<std::string> not_inherited;  // inheritable keys with unusable values, §2 order
  std::vector<std::string> gating;         // gated, extra_gated_*: byte order
};

// The keys a card inherits, in the card's order.
const std::vector<std::string>& inheritable_card_keys();

// Reads the text of a README.md (its bytes, at most the cap the caller
// enforces). Never throws for any content.
SourceCard read_source_card(std::string_view bytes);

}  // namespace mx2nv

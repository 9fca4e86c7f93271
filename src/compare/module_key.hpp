// How compare matches OTHER's module names to SRC's
// (docs/reference/nvfp4-checkpoint-formats.md section 7, docs/compare.md).
//
// A routed expert `[prefix]layers.L.<container>.experts.E.<proj>` keys on
// (L, E, gate|up|down) whatever the prefix (none, model., language_model.model.,
// model.language_model., language_model.), the container (block_sparse_moe,
// mlp, ffn) and the projection's spelling (w1 = gate_proj, w3 = up_proj,
// w2 = down_proj). Any other module keys on its name minus one leading prefix.
// The projection and its spellings are model/module_names'; the layer and
// expert components are compare's narrower rule (these prefixes and
// containers, numbers of any length that fit 64 bits, as the oracle reads).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace mx2nv {

struct RoutedExpert {
  std::uint64_t layer = 0;
  std::uint64_t expert = 0;
  std::string_view projection;  // "gate", "up" or "down" (static storage)
};

// nullopt when `name` is not a routed expert's module name.
std::optional<RoutedExpert> routed_expert(std::string_view name);

// The matching key, as a string that orders and compares like the key:
// routed experts and other modules never share a key.
std::string module_key(std::string_view name);

}  // namespace mx2nv

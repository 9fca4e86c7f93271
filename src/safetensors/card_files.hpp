// The temporary files of `mx2nv card` (card/card.cpp) in DST's root, known
// to the readers and the tidy of a finished DST.
#pragma once

#include "safetensors/file_names.hpp"

#include <string_view>

namespace mx2nv {

// `mx2nv card` writes ".mx2nv-tmp.card.<final name>" beside each file it
// replaces: README.md and README.source.md in DST's root, card.json in
// .mx2nv/. A card killed while writing leaves one; it is card's, never a file
// of the checkpoint: readers of DST skip it, and card and a finished DST's
// tidy remove it.
inline constexpr std::string_view kCardTempPrefix = ".mx2nv-tmp.card.";

constexpr bool is_card_temporary_in_root(std::string_view name) {
  if (!name.starts_with(kCardTempPrefix)) return false;
  name.remove_prefix(kCardTempPrefix.size());
  return name == kCardFileName || name == kSourceCardFileName;
}

}  // namespace mx2nv

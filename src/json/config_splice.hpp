// Locating one member's value inside JSON text by byte span, so config.json
// can be edited surgically instead of re-serialised (which would reorder keys
// and reformat numbers in parts of the file we promise not to touch).
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace mx2nv {

struct TextSpan {
  std::size_t begin = 0;
  std::size_t end = 0;  // exclusive
};

// `text` must already be valid JSON (callers parse it strictly first). Returns
// the span of the value of member `key` in the object starting at `object_begin`.
std::optional<TextSpan> find_member_value(std::string_view text, std::size_t object_begin, std::string_view key);

// First non-whitespace byte at or after `pos`.
std::size_t skip_json_whitespace(std::string_view text, std::size_t pos);

}  // namespace mx2nv

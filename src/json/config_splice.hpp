// Locating one member's value inside JSON text by byte span, so config.json
// can be edited surgically instead of re-serialised (which would reorder keys
// and reformat numbers in parts of the file we promise not to touch).
#pragma once

#include "json/strict_json.hpp"

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace mx2nv {

struct TextSpan {
  std::size_t begin = 0;
  std::size_t end = 0;  // exclusive
};

// `text` must already be valid JSON (callers parse it strictly first). Returns
// the span of the value of member `key` in the object starting at `object_begin`.
std::optional<TextSpan> find_member_value(std::string_view text, std::size_t object_begin, std::string_view key);

// `text` (a JSON object, already valid) with member `key`: `value` inserted
// before its first member, laid out like that member (indented when the file
// is). Every other byte is kept. The caller ensures `key` is not a member yet.
std::string insert_top_level_member(std::string_view text, std::string_view key, const Json& value);

// First non-whitespace byte at or after `pos`.
std::size_t skip_json_whitespace(std::string_view text, std::size_t pos);

}  // namespace mx2nv

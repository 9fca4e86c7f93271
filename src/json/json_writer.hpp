// Writing JSON text for documents with hundreds of thousands of names (a
// large checkpoint's index, shard headers), without building an nlohmann
// value per name just to dump it. These write the same bytes Json::dump()
// writes (compact, UTF-8 passed through, strict on invalid UTF-8), with a
// fast path for the common case of printable ASCII.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace mx2nv {

// Appends `head` followed by `tail` as one JSON string.
void append_json_string(std::string& out, std::string_view head, std::string_view tail = {});
// Appends `[a,b,...]`.
void append_json_uint_array(std::string& out, std::span<const std::uint64_t> values);

}  // namespace mx2nv

#include "core/json_text.hpp"

#include "core/strict_json.hpp"

#include <algorithm>
#include <charconv>

namespace mx2nv {
namespace {

// Bytes Json::dump() writes unchanged: printable ASCII except '"' and '\'.
bool needs_no_escape(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c < 0x7F && c != '"' && c != '\\'; });
}

}  // namespace

void append_json_string(std::string& out, std::string_view head, std::string_view tail) {
  if (needs_no_escape(head) && needs_no_escape(tail)) {
    out += '"';
    out += head;
    out += tail;
    out += '"';
    return;
  }
  // Escapes, control characters and non-ASCII: nlohmann's serializer, which
  // also refuses invalid UTF-8 (type_error 316) rather than writing it.
  std::string joined(head);
  joined += tail;
  out += Json(std::move(joined)).dump();
}

void append_json_uint_array(std::string& out, std::span<const std::uint64_t> values) {
  out += '[';
  char digits[24];
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i != 0) out += ',';
    const auto r = std::to_chars(digits, digits + sizeof digits, values[i]);
    out.append(digits, r.ptr);
  }
  out += ']';
}

}  // namespace mx2nv

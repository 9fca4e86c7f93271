#include "json/json_writer.hpp"

#include "json/strict_json.hpp"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstring>

namespace mx2nv {
namespace {

bool plain_byte(char c) { return c >= 0x20 && c < 0x7F && c != '"' && c != '\\'; }

// Eight bytes at once (names are tens of bytes, and an index holds hundreds
// of thousands): a byte of `word` is below 0x20, 0x7F or above, '"' or '\\'. The
// classic exact tests: (v - 0x01..) & ~v & 0x80.. flags a zero byte, and
// with n*0x01.. instead of 0x01.. a byte below n (n <= 0x80).
bool word_needs_escape(std::uint64_t word) {
  constexpr std::uint64_t ones = 0x0101010101010101ULL;
  constexpr std::uint64_t high = 0x8080808080808080ULL;
  const auto zero_byte = [&](std::uint64_t v) { return (v - ones) & ~v & high; };
  const std::uint64_t below_space = (word - ones * 0x20) & ~word & high;
  return (below_space | (word & high) | zero_byte(word ^ (ones * 0x22)) | zero_byte(word ^ (ones * 0x5C)) |
          zero_byte(word ^ (ones * 0x7F))) != 0;
}

// Bytes Json::dump() writes unchanged: printable ASCII except '"' and '\\'.
bool needs_no_escape(std::string_view s) {
  std::size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    std::uint64_t word;
    std::memcpy(&word, s.data() + i, 8);
    if (word_needs_escape(word)) return false;
  }
  return std::all_of(s.begin() + static_cast<std::ptrdiff_t>(i), s.end(), plain_byte);
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

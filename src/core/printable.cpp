#include "core/printable.hpp"

#include <fmt/format.h>

namespace mx2nv {
namespace {

// Length of the valid UTF-8 sequence starting at s[i], or 0 if invalid.
std::size_t utf8_length(std::string_view s, std::size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  std::size_t n = 0;
  if (b >= 0xC2 && b <= 0xDF) n = 2;
  else if (b >= 0xE0 && b <= 0xEF) n = 3;
  else if (b >= 0xF0 && b <= 0xF4) n = 4;
  else return 0;
  if (i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 0;
  }
  const auto b1 = static_cast<unsigned char>(s[i + 1]);
  if ((b == 0xE0 && b1 < 0xA0) || (b == 0xED && b1 > 0x9F) || (b == 0xF0 && b1 < 0x90) || (b == 0xF4 && b1 > 0x8F)) {
    return 0;  // overlong, surrogate, or beyond U+10FFFF
  }
  return n;
}

// Copies `text`, writing each byte that is not part of valid UTF-8 (and,
// with `controls`, each ASCII control byte and DEL) as \xNN.
std::string escaped(std::string_view text, bool controls) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b < 0x80 && (!controls || (b >= 0x20 && b < 0x7F))) {
      out += static_cast<char>(b);
      ++i;
    } else if (const std::size_t n = b >= 0x80 ? utf8_length(text, i) : 0; n > 0) {
      out.append(text.substr(i, n));
      i += n;
    } else {
      out += fmt::format("\\x{:02x}", b);
      ++i;
    }
  }
  return out;
}

}  // namespace

std::string printable(std::string_view text) { return escaped(text, true); }

std::string json_text(std::string_view text) { return escaped(text, false); }

std::string dump_json(const nlohmann::json& value, int indent) {
  // Every string we put into a document went through json_text() or came from
  // a UTF-8-validated parser; `replace` is the net under that rule, so a
  // report can never fail to serialise.
  return value.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string human_bytes(std::uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", n) : fmt::format("{:.2f} {}", v, units[u]);
}

}  // namespace mx2nv

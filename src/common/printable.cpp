#include "common/printable.hpp"

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

// The code point of the valid `n`-byte UTF-8 sequence at s[i].
char32_t decode(std::string_view s, std::size_t i, std::size_t n) {
  static constexpr unsigned char kLeadMask[] = {0, 0, 0x1F, 0x0F, 0x07};
  char32_t c = static_cast<unsigned char>(s[i]) & kLeadMask[n];
  for (std::size_t k = 1; k < n; ++k) c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return c;
}

void append_byte_escape(std::string& out, unsigned char b) { out += fmt::format("\\x{:02x}", b); }

void append_code_point_escape(std::string& out, char32_t c) {
  out += fmt::format("\\u{:04x}", static_cast<std::uint32_t>(c));
}

}  // namespace

bool terminal_unsafe_code_point(char32_t c) {
  return (c >= 0x80 && c <= 0x9F) ||                    // C1 controls
         c == 0x061C || c == 0x200E || c == 0x200F ||   // bidi marks (ALM, LRM, RLM)
         (c >= 0x202A && c <= 0x202E) ||                // bidi embeddings and overrides
         (c >= 0x2066 && c <= 0x2069) ||                // bidi isolates
         c == 0x2028 || c == 0x2029;                    // line and paragraph separators
}

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b >= 0x20 && b < 0x7F) {
      out += static_cast<char>(b);
      ++i;
    } else if (const std::size_t n = b >= 0x80 ? utf8_length(text, i) : 0; n > 0) {
      const char32_t c = decode(text, i, n);
      if (terminal_unsafe_code_point(c)) {
        append_code_point_escape(out, c);
      } else {
        out.append(text.substr(i, n));
      }
      i += n;
    } else {
      append_byte_escape(out, b);  // C0, DEL, or a byte that is not part of valid UTF-8
      ++i;
    }
  }
  return out;
}

std::string json_text(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b < 0x80) {
      out += static_cast<char>(b);  // JSON escapes the controls itself
      ++i;
    } else if (const std::size_t n = utf8_length(text, i); n > 0) {
      out.append(text.substr(i, n));
      i += n;
    } else {
      append_byte_escape(out, b);
      ++i;
    }
  }
  return out;
}

std::string dump_json(const nlohmann::json& value, int indent) {
  // Every string we put into a document went through json_text() or came from
  // a UTF-8-validated parser; `replace` is the net under that rule, so a
  // report can never fail to serialise.
  const std::string text = value.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
  // The dump is valid UTF-8 and every non-ASCII character and DEL in it is
  // inside a string, so a terminal-unsafe character can be replaced by its
  // JSON escape in place: a reader gets the same string.
  std::string out;
  out.reserve(text.size());
  std::size_t copied = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b == 0x7F) {  // DEL, which JSON leaves as it is
      out.append(text, copied, i - copied);
      append_code_point_escape(out, b);
      copied = i + 1;
      continue;
    }
    if (b != 0xC2 && b != 0xD8 && b != 0xE2) continue;  // the lead bytes of every unsafe code point
    const std::size_t n = utf8_length(text, i);
    if (n == 0 || !terminal_unsafe_code_point(decode(text, i, n))) continue;
    out.append(text, copied, i - copied);
    append_code_point_escape(out, decode(text, i, n));
    copied = i + n;
    i += n - 1;
  }
  if (copied == 0) return text;
  out.append(text, copied);
  return out;
}

std::string excerpt(std::string_view text, std::size_t max_bytes) {
  if (text.size() <= max_bytes) return printable(text);
  std::size_t cut = max_bytes;
  // Back to the start of a UTF-8 sequence (at most 3 continuation bytes).
  for (int k = 0; k < 3 && cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80; ++k) --cut;
  return fmt::format("{}... ({} bytes)", printable(text.substr(0, cut)), text.size());
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

#include "card/card_text.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <system_error>

namespace mx2nv {
namespace {

bool unsafe_in_body(char32_t c) {
  return c < 0x20 || c == 0x7F || (c >= 0x80 && c <= 0x9F) || c == 0x2028 || c == 0x2029 || c == 0xFEFF;
}

// The code points of `text`, an invalid byte as itself with `invalid` set.
struct Unit {
  char32_t c;
  bool invalid;
};

std::vector<Unit> units(std::string_view text) {
  std::vector<Unit> out;
  for (std::size_t i = 0; i < text.size();) {
    const auto b = static_cast<unsigned char>(text[i]);
    std::size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    char32_t c = n == 1 ? b : n == 2 ? (b & 0x1Fu) : n == 3 ? (b & 0x0Fu) : (b & 0x07u);
    bool ok = n > 0 && i + n <= text.size();
    for (std::size_t k = 1; ok && k < n; ++k) {
      const auto t = static_cast<unsigned char>(text[i + k]);
      ok = (t >> 6) == 2;
      c = (c << 6) | (t & 0x3Fu);
    }
    if (ok) {
      static constexpr char32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
      ok = c >= kMin[n] && c <= 0x10FFFF && !(c >= 0xD800 && c <= 0xDFFF);
    }
    if (!ok) {
      out.push_back({b, true});
      ++i;
    } else {
      out.push_back({c, false});
      i += n;
    }
  }
  return out;
}

}  // namespace

std::optional<std::vector<char32_t>> decode_utf8(std::string_view text) {
  std::vector<char32_t> out;
  for (const Unit& u : units(text)) {
    if (u.invalid) return std::nullopt;
    out.push_back(u.c);
  }
  return out;
}

std::size_t first_invalid_utf8(std::string_view text) {
  std::size_t at = 0;
  for (const Unit& u : units(text)) {
    if (u.invalid) return at;
    at += u.c < 0x80 ? 1 : u.c < 0x800 ? 2 : u.c < 0x10000 ? 3 : 4;
  }
  return std::string_view::npos;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

std::string yaml_quoted(std::string_view text) {
  std::string out = "\"";
  for (const Unit& u : units(text)) {
    const char32_t c = u.c;
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (!u.invalid && c >= 0x20 && c <= 0x7E) {
      out += static_cast<char>(c);
    } else if (c <= 0xFF) {
      out += fmt::format("\\x{:02X}", static_cast<unsigned>(c));
    } else if (c <= 0xFFFF) {
      out += fmt::format("\\u{:04X}", static_cast<unsigned>(c));
    } else {
      out += fmt::format("\\U{:08X}", static_cast<unsigned>(c));
    }
  }
  return out + "\"";
}

std::string code_span(std::string_view text, bool in_table) {
  std::string body;
  std::size_t run = 0, longest = 0;
  for (const Unit& u : units(text)) {
    run = u.c == '`' && !u.invalid ? run + 1 : 0;
    longest = std::max(longest, run);
    if (u.invalid) {
      body += fmt::format("\\x{:02X}", static_cast<unsigned>(u.c));
    } else if (unsafe_in_body(u.c)) {
      body += u.c <= 0xFF ? fmt::format("\\x{:02X}", static_cast<unsigned>(u.c))
                          : fmt::format("\\u{:04X}", static_cast<unsigned>(u.c));
    } else if (in_table && u.c == '|') {
      body += "\\|";
    } else {
      append_utf8(body, u.c);
    }
  }
  const std::string fence(longest + 1, '`');
  const bool pad = !body.empty() && (body.front() == '`' || body.front() == ' ' || body.back() == '`' ||
                                     body.back() == ' ');
  return fence + (pad ? " " : "") + body + (pad ? " " : "") + fence;
}

std::string escaped_text(std::string_view text) {
  std::string out;
  for (const Unit& u : units(text)) {
    if (u.invalid || unsafe_in_body(u.c)) {
      out += u.c <= 0xFF ? fmt::format("\\x{:02X}", static_cast<unsigned>(u.c))
                         : fmt::format("\\u{:04X}", static_cast<unsigned>(u.c));
    } else {
      append_utf8(out, u.c);
    }
  }
  return out;
}

std::string python_float(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (value == 0) return std::signbit(value) ? "-0.0" : "0.0";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific);
  const std::string sci(buf, r.ptr);  // [-]d[.ddd]e±XX, shortest round-trip digits
  const std::size_t e = sci.find('e');
  const bool negative = sci[0] == '-';
  std::string digits;
  for (std::size_t i = negative ? 1 : 0; i < e; ++i) {
    if (sci[i] != '.') digits += sci[i];
  }
  const int exp = std::atoi(sci.c_str() + e + 1);
  std::string out = negative ? "-" : "";
  const auto n = static_cast<int>(digits.size());
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(static_cast<std::size_t>(-exp - 1), '0') + digits;
    } else if (exp + 1 >= n) {
      out += digits + std::string(static_cast<std::size_t>(exp + 1 - n), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<std::size_t>(exp + 1)) + "." + digits.substr(static_cast<std::size_t>(exp + 1));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (n > 1) out += "." + digits.substr(1);
  return out + fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
}

}  // namespace mx2nv

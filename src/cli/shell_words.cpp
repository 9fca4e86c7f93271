#include "cli/shell_words.hpp"

#include "common/printable.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace mx2nv::cli {

std::string shell_word(std::string_view word) {
  const auto plain = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::string_view("_-./:=@%+,").find(c) != std::string_view::npos;
  };
  if (!word.empty() && std::all_of(word.begin(), word.end(), plain)) return std::string(word);
  std::string out;
  if (printable(word) == word) {
    out = "'";
    for (const char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
  }
  out = "$'";
  for (const char c : word) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\\' || c == '\'') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u >= 0x7f) {
      out += fmt::format("\\x{:02x}", u);
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string shell_path(std::string_view path) {
  if (!path.empty() && path.front() == '-') return shell_word(std::string("./") + std::string(path));
  return shell_word(path);
}

std::string shell_line(const std::vector<std::string>& words) {
  std::string out = "mx2nv";
  for (const auto& w : words) out += " " + shell_word(w);
  return out;
}

}  // namespace mx2nv::cli

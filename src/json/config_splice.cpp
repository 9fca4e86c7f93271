#include "json/config_splice.hpp"

#include "common/error.hpp"
#include "json/strict_json.hpp"

namespace mx2nv {
namespace {

// Index one past the closing quote of the string starting at `pos` (a quote).
std::size_t skip_string(std::string_view text, std::size_t pos) {
  for (std::size_t i = pos + 1; i < text.size(); ++i) {
    if (text[i] == '\\') {
      ++i;
    } else if (text[i] == '"') {
      return i + 1;
    }
  }
  fail_input("config.json: unterminated string");
}

std::size_t skip_value(std::string_view text, std::size_t pos) {
  const char c = text[pos];
  if (c == '"') return skip_string(text, pos);
  if (c == '{' || c == '[') {
    int depth = 0;
    for (std::size_t i = pos; i < text.size();) {
      const char d = text[i];
      if (d == '"') {
        i = skip_string(text, i);
        continue;
      }
      if (d == '{' || d == '[') ++depth;
      if (d == '}' || d == ']') {
        if (--depth == 0) return i + 1;
      }
      ++i;
    }
    fail_input("config.json: unterminated container");
  }
  std::size_t i = pos;
  while (i < text.size() && text[i] != ',' && text[i] != '}' && text[i] != ']' && text[i] != ' ' &&
         text[i] != '\n' && text[i] != '\r' && text[i] != '\t') {
    ++i;
  }
  return i;
}

}  // namespace

std::size_t skip_json_whitespace(std::string_view text, std::size_t pos) {
  while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\n' || text[pos] == '\r' || text[pos] == '\t')) {
    ++pos;
  }
  return pos;
}

std::optional<TextSpan> find_member_value(std::string_view text, std::size_t object_begin, std::string_view key) {
  std::size_t i = skip_json_whitespace(text, object_begin);
  if (i >= text.size() || text[i] != '{') return std::nullopt;
  i = skip_json_whitespace(text, i + 1);
  while (i < text.size() && text[i] == '"') {
    const std::size_t key_end = skip_string(text, i);
    // Decode the key properly: it may contain escapes.
    const std::string name = Json::parse(text.substr(i, key_end - i)).get<std::string>();
    i = skip_json_whitespace(text, key_end);
    i = skip_json_whitespace(text, i + 1);  // past ':'
    const std::size_t value_end = skip_value(text, i);
    if (name == key) return TextSpan{i, value_end};
    i = skip_json_whitespace(text, value_end);
    if (i < text.size() && text[i] == ',') i = skip_json_whitespace(text, i + 1);
  }
  return std::nullopt;
}

std::string insert_top_level_member(std::string_view text, std::string_view key, const Json& value) {
  const std::size_t open = skip_json_whitespace(text, 0);
  if (open >= text.size() || text[open] != '{') fail_input("config.json: not a JSON object");
  const std::size_t first = skip_json_whitespace(text, open + 1);
  if (first >= text.size() || text[first] != '"') fail_input("config.json: an empty object has no member to follow");
  const std::string_view gap = text.substr(open + 1, first - open - 1);
  std::string member = Json(std::string(key)).dump() + ": ";
  const std::size_t line = gap.rfind('\n');
  if (line == std::string_view::npos) {
    member += value.dump() + ", ";
  } else {
    // Laid out like the file: the member's key at the first member's indent,
    // nested lines under it.
    const std::string indent(gap.substr(line + 1));
    for (const char c : value.dump(2)) {
      member += c;
      if (c == '\n') member += indent;
    }
    member += ",\n" + indent;
  }
  std::string out(text.substr(0, first));
  out += member;
  out += text.substr(first);
  return out;
}

}  // namespace mx2nv

#include "card/source_card.hpp"

#include "card/card_text.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <stdexcept>

namespace mx2nv {
namespace {

constexpr std::size_t kMaxFrontMatter = 1 << 20;
constexpr std::size_t kMaxDepth = 64;
constexpr std::size_t kMaxValueChars = 1024;

// What mx2nv cannot read exactly: the whole front matter is unusable.
struct Unreadable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The problem as the card names it (one of the phrases of §3.4, then details).
[[noreturn]] void unusable(const std::string& problem) { throw Unreadable(problem); }
[[noreturn]] void unreadable(std::size_t line, const std::string& what) {
  unusable(fmt::format("front matter is not valid YAML (line {}: {})", line, what));
}

// huggingface_hub's front-matter regex (repocard.py:32-34, 2.4.0):
// ^(\s*---(?:\r\n|\r|\n))([\S\s]*?)((?:\r\n|\r|\n)---[ \t]*(\r\n|\n|$)).
// Leading whitespace is read as ASCII only: a text that starts with another
// Unicode space is said to have no front matter (nothing inherited).
std::optional<std::string_view> front_matter(std::string_view t) {
  std::size_t i = 0;
  while (i < t.size() && std::string_view(" \t\n\r\f\v").find(t[i]) != std::string_view::npos) ++i;
  if (t.substr(i, 3) != "---") return std::nullopt;
  i += 3;
  if (t.substr(i, 2) == "\r\n") {
    i += 2;
  } else if (i < t.size() && (t[i] == '\r' || t[i] == '\n')) {
    ++i;
  } else {
    return std::nullopt;
  }
  for (std::size_t p = i; p < t.size(); ++p) {
    if (t[p] != '\r' && t[p] != '\n') continue;
    std::size_t q = p + (t.substr(p, 2) == "\r\n" ? 2 : 1);
    if (t.substr(q, 3) != "---") continue;
    q += 3;
    while (q < t.size() && (t[q] == ' ' || t[q] == '\t')) ++q;
    if (q == t.size() || t[q] == '\n' || t.substr(q, 2) == "\r\n") return t.substr(i, p - i);
  }
  return std::nullopt;
}

bool reader_printable(char32_t c) {  // PyYAML reader.py NON_PRINTABLE, 6.0.4
  return c == 0x09 || c == 0x0A || c == 0x0D || (c >= 0x20 && c <= 0x7E) || c == 0x85 ||
         (c >= 0xA0 && c <= 0xD7FF) || (c >= 0xE000 && c <= 0xFFFD) || (c >= 0x10000 && c <= 0x10FFFF);
}

bool usable_char(char32_t c) {  // §3.3
  return !(c < 0x20 || c == 0x7F || (c >= 0x80 && c <= 0x9F) || c == 0x2028 || c == 0x2029 || c == 0xFEFF);
}

// A plain YAML 1.1 scalar that SafeLoader resolves to str and that mx2nv
// recognises as one: it starts with an ASCII letter and is not a bool or
// null word (resolver.py). Others (numbers, dates, .inf, signs) are not
// inherited.
bool plain_is_string(const std::string& s) {
  static const std::set<std::string> kWords = {"yes", "Yes", "YES", "no",   "No",   "NO",    "true",  "True",
                                               "TRUE", "false", "False", "FALSE", "on",  "On",   "ON",    "off",
                                               "Off", "OFF",   "null",  "Null",  "NULL"};
  if (s.empty() || kWords.count(s)) return false;
  // Every YAML 1.1 resolver but str's matches ASCII only: a first character
  // outside ASCII, or a sign before a letter, is a str too.
  const auto c = static_cast<unsigned char>(s[0]);
  if (std::isalpha(c) || c >= 0x80) return true;
  const auto next = s.size() > 1 ? static_cast<unsigned char>(s[1]) : 0;
  return (c == '-' || c == '+') && (std::isalpha(next) || next >= 0x80);
}

struct Scalar {
  enum Kind { Plain, Double, Single, Other } kind = Other;
  std::optional<std::string> text;  // the str value when mx2nv reads it exactly
  std::optional<std::vector<std::string>> items;  // a flow sequence of str, read exactly
};

std::optional<std::string> hex_escape(std::string_view s, std::size_t& i, std::size_t digits) {
  if (i + digits > s.size()) return std::nullopt;
  char32_t c = 0;
  for (std::size_t k = 0; k < digits; ++k) {
    const char h = s[i + k];
    if (!std::isxdigit(static_cast<unsigned char>(h))) return std::nullopt;
    c = c * 16 + static_cast<char32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
  }
  i += digits;
  if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return std::nullopt;
  std::string out;
  append_utf8(out, c);
  return out;
}

// A scalar that is the rest of a line (`key: <s>` or `- <s>`). Throws for
// what PyYAML rejects or mx2nv does not read; `rest_ok` is set when what
// follows the scalar on the line is empty or a comment.
Scalar line_scalar(std::string_view s, std::size_t line) {
  Scalar out;
  if (s.empty()) return out;
  const char c0 = s[0];
  if (c0 == '&' || c0 == '*') unusable("front matter uses YAML anchors or aliases");
  if (s.substr(0, 6) == "!!str ") {  // the standard str tag: the scalar as written, never resolved
    std::string_view rest = s.substr(6);
    while (!rest.empty() && rest[0] == ' ') rest.remove_prefix(1);
    if (rest.empty() || rest[0] == '!' || rest[0] == '[' || rest[0] == '{' || rest[0] == '|' || rest[0] == '>') {
      unreadable(line, "a !!str tag mx2nv does not read");
    }
    Scalar inner = line_scalar(rest, line);
    if (inner.kind == Scalar::Plain) {
      std::string v(rest);
      for (std::size_t i = 1; i < v.size(); ++i) {
        if (v[i] == '#' && v[i - 1] == ' ') {
          v.resize(i);
          break;
        }
      }
      while (!v.empty() && v.back() == ' ') v.pop_back();
      inner.text = v;
    }
    return inner;
  }
  if (c0 == '!') {
    // mx2nv reads no tag, not even the standard ones (a documented narrowing);
    // "!!" outside them has no SafeLoader constructor: a YAML error there.
    const std::string_view tag = s.substr(0, std::min(s.find(' '), std::size_t{64}));
    if (tag.substr(0, 2) == "!!") unreadable(line, fmt::format("the tag {} is not read", tag));
    unusable(fmt::format("front matter uses the YAML tag {}", tag));
  }
  if (c0 == '@' || c0 == '`' || c0 == '%') unreadable(line, "a plain scalar cannot start with '" + std::string(1, c0) + "'");
  if (c0 == '?') unreadable(line, "complex keys are not read");
  auto after = [&](std::size_t i) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
    if (i < s.size() && s[i] != '#') unreadable(line, "text after a quoted scalar");
  };
  if (c0 == '"') {
    std::string v;
    bool exact = true;
    std::size_t i = 1;
    for (; i < s.size() && s[i] != '"'; ++i) {
      if (s[i] != '\\') {
        v += s[i];
        continue;
      }
      if (++i >= s.size()) unreadable(line, "a double-quoted scalar continues on the next line");
      const char e = s[i];
      std::optional<std::string> x;
      if (e == '"' || e == '\\' || e == '/' || e == ' ') {
        x = std::string(1, e);
      } else if (e == 'x' || e == 'u' || e == 'U') {
        ++i;
        x = hex_escape(s, i, e == 'x' ? 2 : e == 'u' ? 4 : 8);
        if (!x) unreadable(line, "a bad escape in a double-quoted scalar");
        --i;
      } else if (std::string_view("0abtnvfreNL_P\t").find(e) != std::string_view::npos) {
        exact = false;  // a control or line break: never an inherited value anyway (§3.3)
        x = "";
      } else {
        unreadable(line, "an unknown escape in a double-quoted scalar");
      }
      v += *x;
    }
    if (i >= s.size()) unreadable(line, "a double-quoted scalar continues on the next line");
    after(i + 1);
    out.kind = Scalar::Double;
    if (exact) out.text = v;
    return out;
  }
  if (c0 == '\'') {
    std::string v;
    std::size_t i = 1;
    for (;; ++i) {
      if (i >= s.size()) unreadable(line, "a single-quoted scalar continues on the next line");
      if (s[i] == '\'') {
        if (i + 1 < s.size() && s[i + 1] == '\'') {
          v += '\'';
          ++i;
          continue;
        }
        break;
      }
      v += s[i];
    }
    after(i + 1);
    out.kind = Scalar::Single;
    out.text = v;
    return out;
  }
  if (c0 == '[') {  // a one-line flow sequence of plain words
    std::size_t depth = 0, deepest = 0;
    for (const char c : s) {
      depth += c == '[' ? 1 : 0;
      if (c == ']' && depth > 0) --depth;
      deepest = std::max(deepest, depth);
    }
    if (deepest + 1 > kMaxDepth) unusable(fmt::format("front matter nests deeper than {}", kMaxDepth));
    std::string_view inner = s.substr(1);
    const std::size_t close = inner.find(']');
    if (close == std::string_view::npos || inner.substr(0, close).find_first_of("[]{}\"'#:&*!|>") != std::string_view::npos) {
      unreadable(line, "a flow collection mx2nv does not read");
    }
    after(close + 2);
    out.items.emplace();
    std::string_view rest = inner.substr(0, close);
    while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
    while (!rest.empty()) {
      const std::size_t comma = rest.find(',');
      std::string item(rest.substr(0, comma));
      while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.pop_back();
      while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.erase(0, 1);
      if (item.empty()) unreadable(line, "an empty entry in a flow sequence");
      if (!plain_is_string(item)) out.items.reset();
      if (out.items) out.items->push_back(item);
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
    return out;
  }
  if (c0 == '{' || c0 == '|' || c0 == '>') {
    if (c0 == '{') unreadable(line, "flow mappings are not read");
    out.kind = Scalar::Other;  // block scalar: its lines are skipped by the caller
    return out;
  }
  // Plain: ends at " #"; ": " inside is a mapping PyYAML refuses here.
  std::string v(s);
  for (std::size_t i = 1; i < v.size(); ++i) {
    if (v[i] == '#' && (v[i - 1] == ' ' || v[i - 1] == '\t')) {
      v.resize(i);
      break;
    }
  }
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.pop_back();
  if (v.find(": ") != std::string::npos || v.find(":\t") != std::string::npos || (!v.empty() && v.back() == ':')) {
    unreadable(line, "a mapping where a scalar is expected");
  }
  out.kind = Scalar::Plain;
  if (plain_is_string(v)) out.text = v;
  return out;
}

struct Line {
  std::size_t number = 0, indent = 0;
  std::string text;  // without indentation and trailing blanks
};

// The content lines (not blank, not comments) of the front matter.
std::vector<Line> content_lines(std::string_view fm) {
  std::vector<Line> out;
  std::size_t number = 0;
  bool ended = false;
  for (std::size_t i = 0; i <= fm.size();) {
    std::size_t j = i;
    while (j < fm.size() && fm[j] != '\n' && fm[j] != '\r') ++j;
    std::string_view l = fm.substr(i, j - i);
    ++number;
    i = j + (fm.substr(j, 2) == "\r\n" ? 2 : 1);
    // PyYAML refuses a tab almost everywhere outside quotes and comments
    // (as indentation, around a plain scalar, as a separator); mx2nv reads
    // none, also not the few PyYAML accepts.
    if (l.find('\t') != std::string_view::npos) unreadable(number, "a tab");
    std::size_t ind = 0;
    while (ind < l.size() && l[ind] == ' ') ++ind;
    std::size_t end = l.size();
    while (end > ind && (l[end - 1] == ' ' || l[end - 1] == '\t')) --end;
    if (ind == end || l[ind] == '#') continue;
    if (ind == 0 && l.substr(0, 3) == "---") unreadable(number, "a document marker");
    if (ind == 0 && l.substr(0, 3) == "..." && (end == 3 || l[3] == ' ' || l[3] == '\t')) {
      ended = true;  // the end of the document: nothing may follow
      continue;
    }
    if (ended) unreadable(number, "text after the end of the document");
    std::string_view text = l.substr(ind, end - ind);
    while (text.substr(0, 2) == "- ") {
      text.remove_prefix(2);
      while (!text.empty() && text[0] == ' ') text.remove_prefix(1);
    }
    if (text.substr(0, 2) == "<<") unusable("front matter uses YAML merge keys");
    out.push_back({number, ind, std::string(l.substr(ind, end - ind))});
  }
  return out;
}

// `key:` or `key: value` with a plain key mx2nv reads as a str; nullopt when
// the text is not a mapping entry.
std::optional<std::pair<std::string, std::string>> entry(const std::string& t, std::size_t line) {
  if (t.empty() || std::string_view("[{|>&*!%@`").find(t[0]) != std::string_view::npos) return std::nullopt;
  if (t[0] == '"' || t[0] == '\'') {  // a quoted scalar, or a quoted key mx2nv does not read
    const std::size_t close = t.find(t[0], 1);
    if (close != std::string::npos && t.find(':', close) == close + 1) unreadable(line, "a quoted key");
    return std::nullopt;
  }
  const std::size_t colon = t.find(':');
  if (colon == std::string::npos || (colon + 1 < t.size() && t[colon + 1] != ' ' && t[colon + 1] != '\t')) {
    return std::nullopt;
  }
  const std::string key = t.substr(0, colon);
  if (key.empty() || key.front() == '"' || key.front() == '\'' || key.front() == '[' || key.front() == '{') {
    unreadable(line, "a quoted, empty or complex key");
  }
  for (const char c : key) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.') {
      unreadable(line, "a key mx2nv does not read as a string");
    }
  }
  if (key == "<<") unreadable(line, "a merge key");
  if (!plain_is_string(key) && key.front() != '_') unusable("front matter has a key that is not a string");
  std::size_t v = colon + 1;
  while (v < t.size() && (t[v] == ' ' || t[v] == '\t')) ++v;
  return std::make_pair(key, t.substr(v));
}

struct TopEntry {
  std::string key;
  Line first;                  // the key's line
  std::string inline_value;    // "" for a block value
  std::vector<Line> block;     // the lines below the key
};

// Checks the structure of every line as PyYAML's block parser would accept
// it (indentation levels, sequences, mappings, scalars on one line, block
// scalars skipped) and splits the top-level mapping into its entries.
class Structure {
 public:
  std::vector<TopEntry> read(const std::vector<Line>& lines) {
    if (lines.empty()) return {};
    if (lines[0].indent != 0 || !entry(lines[0].text, lines[0].number)) {
      unusable("front matter is not a mapping");
    }
    levels_ = {{0, 'M'}};
    std::vector<TopEntry> top;
    for (const Line& l : lines) {
      if (block_scalar_ && l.indent > *block_scalar_) {
        top.back().block.push_back(l);
        continue;
      }
      block_scalar_.reset();
      place(l);
      if (l.indent == 0 && levels_.size() == 1) {
        const auto e = entry(l.text, l.number);
        top.push_back({e->first, l, e->second, {}});
      } else {
        top.back().block.push_back(l);
      }
      content(l.text, l.indent, l.number, true);
    }
    return top;
  }

 private:
  static char kind_of(const std::string& t, std::size_t line) {
    if (t == "-" || t.rfind("- ", 0) == 0) return 'S';
    return entry(t, line) ? 'M' : 'X';
  }

  // Finds the level of a line from its indentation.
  void place(const Line& l) {
    const std::size_t i = l.indent;
    const char kind = kind_of(l.text, l.number);
    while (levels_.back().first > i) levels_.pop_back();
    // The entry after a sequence written at its key's indentation.
    if (kind == 'M' && levels_.back().second == 'S' && levels_.size() >= 2 && levels_[levels_.size() - 2].first == i) {
      levels_.pop_back();
    }
    if (levels_.back().first == i) {
      if (kind == 'S' && levels_.back().second == 'M' && open_ && open_col_ == i) {
        levels_.push_back({i, 'S'});  // a sequence at its key's indentation
      } else if (kind != levels_.back().second) {
        unreadable(l.number, "an entry that does not fit its level");
      }
    } else if (open_) {
      if (kind == 'X') unreadable(l.number, "a scalar where a block is expected");
      levels_.push_back({i, kind});
    } else if (continues_) {
      if (kind != 'X' || l.text.find(" #") != std::string::npos) unreadable(l.number, "bad indentation");
      open_ = false;
      return;  // the plain scalar above continues
    } else {
      unreadable(l.number, "bad indentation");
    }
    if (levels_.size() > kMaxDepth) unusable(fmt::format("front matter nests deeper than {}", kMaxDepth));
    open_ = continues_ = false;
  }

  // What a line's text (from column `col`) opens or ends with.
  void content(const std::string& t, std::size_t col, std::size_t line, bool placed) {
    if (!placed) {
      const char kind = kind_of(t, line);
      if (kind != 'X') levels_.push_back({col, kind});
      if (levels_.size() > kMaxDepth) unusable(fmt::format("front matter nests deeper than {}", kMaxDepth));
    }
    if (t == "-" || t.rfind("- ", 0) == 0) {
      std::size_t r = 1;
      while (r < t.size() && t[r] == ' ') ++r;
      if (r == t.size()) {
        open_ = true;
        open_col_ = col + 1;  // children must be indented further than the dash
        return;
      }
      content(t.substr(r), col + r, line, false);
      return;
    }
    if (const auto e = entry(t, line)) {
      if (e->second.empty() || e->second[0] == '#') {
        open_ = true;
        open_col_ = col;
        return;
      }
      scalar(e->second, col, line);
      return;
    }
    scalar(t, col, line);
  }

  void scalar(const std::string& t, std::size_t col, std::size_t line) {
    const Scalar s = line_scalar(t, line);
    if (t[0] == '|' || t[0] == '>') block_scalar_ = levels_.back().first < col ? levels_.back().first : col;
    continues_ = s.kind == Scalar::Plain;
  }

  std::vector<std::pair<std::size_t, char>> levels_;
  bool open_ = false, continues_ = false;
  std::size_t open_col_ = 0;
  std::optional<std::size_t> block_scalar_;
};

// The value of an inheritable key, when mx2nv reads it as a str (or list of
// str) that passes §3.3.
std::optional<CardValue> value_of(const TopEntry& e, bool list_allowed) {
  auto usable = [](const std::string& s) {
    const auto cps = decode_utf8(s);
    return cps && !cps->empty() && cps->size() <= kMaxValueChars && std::all_of(cps->begin(), cps->end(), usable_char);
  };
  if (!e.inline_value.empty() && e.inline_value[0] != '#') {
    if (!e.block.empty()) return std::nullopt;  // continued or block scalar
    const Scalar s = line_scalar(e.inline_value, e.first.number);
    if (s.items && list_allowed && !s.items->empty() && std::all_of(s.items->begin(), s.items->end(), usable)) {
      return CardValue(*s.items);
    }
    if (!s.text || !usable(*s.text)) return std::nullopt;
    return CardValue(*s.text);
  }
  if (!list_allowed || e.block.empty()) return std::nullopt;
  std::vector<std::string> items;
  for (const Line& l : e.block) {
    if (l.indent != e.block[0].indent || l.text.rfind("- ", 0) != 0) return std::nullopt;
    std::string_view rest = std::string_view(l.text).substr(2);
    while (!rest.empty() && rest[0] == ' ') rest.remove_prefix(1);
    const Scalar s = line_scalar(rest, l.number);
    if (!s.text || !usable(*s.text)) return std::nullopt;
    items.push_back(*s.text);
  }
  return CardValue(std::move(items));
}

}  // namespace

const std::vector<std::string>& inheritable_card_keys() {
  static const std::vector<std::string> kKeys = {"license",      "license_name", "license_link", "library_name",
                                                 "pipeline_tag", "language",     "datasets"};
  return kKeys;
}

SourceCard read_source_card(std::string_view bytes) {
  const std::string_view full = bytes;
  SourceCard card;
  card.present = true;
  if (bytes.substr(0, 3) == "\xEF\xBB\xBF") bytes.remove_prefix(3);  // utf-8-sig
  if (const std::size_t at = first_invalid_utf8(bytes); at != std::string_view::npos) {
    card.problem = fmt::format("README.md is not UTF-8 (byte {})", at + (bytes.data() != full.data() ? 3 : 0));
    return card;
  }
  const auto fm = front_matter(bytes);
  if (!fm) {
    card.problem = "no front matter";
    return card;
  }
  if (fm->size() > kMaxFrontMatter) {
    card.problem = "front matter larger than 1 MiB";
    return card;
  }
  const std::vector<char32_t> fm_chars = *decode_utf8(*fm);  // valid: the whole text is
  for (const char32_t c : fm_chars) {
    if (!reader_printable(c)) {
      card.problem = fmt::format("front matter is not valid YAML (the control character U+{:04X})", static_cast<unsigned>(c));
      return card;
    }
    if (c == 0x85 || c == 0x2028 || c == 0x2029) {
      card.problem = "front matter is not valid YAML (a Unicode line break: NEL, U+2028 or U+2029, which mx2nv does not read)";
      return card;
    }
  }
  std::vector<TopEntry> top;
  std::map<std::string, CardValue> values;
  std::set<std::string> keys, unusable;
  try {
    top = Structure().read(content_lines(*fm));
    const auto& wanted = inheritable_card_keys();
    for (const TopEntry& e : top) {
      keys.insert(e.key);
      if (std::find(wanted.begin(), wanted.end(), e.key) == wanted.end()) continue;
      const auto v = value_of(e, e.key == "language" || e.key == "datasets");
      values.erase(e.key);
      unusable.erase(e.key);
      if (v) {
        values.emplace(e.key, *v);
      } else {
        unusable.insert(e.key);
      }
    }
  } catch (const Unreadable& u) {
    card.problem = u.what();
    return card;
  }
  for (const auto& k : inheritable_card_keys()) {
    if (values.count(k)) card.inherited.emplace_back(k, values.at(k));
    if (unusable.count(k)) card.not_inherited.push_back(k);
  }
  for (const auto& k : keys) {
    if (!values.count(k) && !unusable.count(k)) card.dropped.push_back(k);
    if (k == "gated" || k.rfind("extra_gated_", 0) == 0) card.gating.push_back(k);
  }
  return card;
}

}  // namespace mx2nv

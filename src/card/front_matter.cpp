#include "card/front_matter.hpp"

#include "card/card_text.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cctype>

#include <re2/re2.h>

namespace mx2nv {
namespace {

constexpr std::size_t kMaxDepth = 64;

[[noreturn]] void unusable(const std::string& problem) { throw FrontMatterUnusable(problem); }
[[noreturn]] void unreadable(std::size_t line, const std::string& what) {
  unusable(fmt::format("front matter is not valid YAML (line {}: {})", line, what));
}

// --- Plain scalars: how SafeLoader resolves them (yaml/resolver.py, 6.0.4) --

enum class Resolved { Str, Other, Null, Refused };

// The implicit resolvers of YAML 1.1 as PyYAML writes them. A scalar none of
// them matches is a str. merge (`<<`) and value (`=`) have no SafeLoader
// constructor as values: YAML errors. Timestamps are refused (their
// constructor rejects impossible dates; mx2nv does not read dates), and so
// are ints with `_` (`0x_` passes the resolver and fails the constructor).
// A timestamp SafeLoader constructs: mx2nv reads only a date alone
// (YYYY-MM-DD, a day of the calendar; datetime.date refuses others), and
// refuses the forms with a time of day.
bool valid_date(const std::string& s) {
  if (s.size() != 10) return false;
  const int year = std::stoi(s.substr(0, 4)), month = std::stoi(s.substr(5, 2)), day = std::stoi(s.substr(8, 2));
  const bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
  static constexpr int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (year < 1 || month < 1 || month > 12 || day < 1) return false;
  return day <= kDays[month - 1] + (month == 2 && leap ? 1 : 0);
}

Resolved resolve_plain(const std::string& s) {
  static const RE2 kBool("yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF");
  static const RE2 kFloat(
      "[-+]?(?:[0-9][0-9_]*)\\.[0-9_]*(?:[eE][-+][0-9]+)?|\\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?|"
      "[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\\.[0-9_]*|[-+]?\\.(?:inf|Inf|INF)|\\.(?:nan|NaN|NAN)");
  static const RE2 kInt(
      "[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+|[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+");
  static const RE2 kNull("~|null|Null|NULL|");
  static const RE2 kTimestamp(
      "[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]|"
      "[0-9][0-9][0-9][0-9]-[0-9][0-9]?-[0-9][0-9]?(?:[Tt]|[ \\t]+)[0-9][0-9]?:[0-9][0-9]:[0-9][0-9](?:\\.[0-9]*)?"
      "(?:[ \\t]*(?:Z|[-+][0-9][0-9]?(?::[0-9][0-9])?))?");
  if (s == "<<" || s == "=") return Resolved::Refused;
  if (RE2::FullMatch(s, kNull)) return Resolved::Null;
  if (RE2::FullMatch(s, kBool) || RE2::FullMatch(s, kFloat)) return Resolved::Other;
  if (RE2::FullMatch(s, kInt)) return s.find('_') == std::string::npos ? Resolved::Other : Resolved::Refused;
  if (RE2::FullMatch(s, kTimestamp)) return valid_date(s) ? Resolved::Other : Resolved::Refused;
  return Resolved::Str;
}

YamlNode plain_node(const std::string& s, std::size_t line) {
  YamlNode n;
  switch (resolve_plain(s)) {
    case Resolved::Str:
      n.kind = YamlNode::Kind::Str;
      n.text = s;
      break;
    case Resolved::Other:
      n.kind = YamlNode::Kind::Other;
      break;
    case Resolved::Null:
      break;
    case Resolved::Refused:
      unreadable(line, fmt::format("the plain scalar {} is not read", s.size() > 40 ? s.substr(0, 40) + "…" : s));
  }
  return n;
}

bool blank(char c) { return c == ' '; }

// What may follow a scalar on its line: spaces, then nothing or a comment.
void only_comment_after(std::string_view rest, std::size_t line, const char* what) {
  std::size_t i = 0;
  while (i < rest.size() && blank(rest[i])) ++i;
  if (i == rest.size()) return;
  if (rest[i] == '#' && i > 0) return;
  unreadable(line, fmt::format("text after {}", what));
}

// --- Scalars on one line, one function per style ------------------------

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

// "…" closed on its line. An escape of a control or a line break gives a
// value that is never inherited (§3.3): read as not exact.
YamlNode double_quoted(std::string_view s, std::size_t line) {
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
    if (e == '"' || e == '\\' || e == '/' || e == ' ') {
      v += e;
    } else if (e == 'x' || e == 'u' || e == 'U') {
      ++i;
      const auto x = hex_escape(s, i, e == 'x' ? 2 : e == 'u' ? 4 : 8);
      if (!x) unreadable(line, "a bad escape in a double-quoted scalar");
      v += *x;
      --i;
    } else if (std::string_view("0abtnvfreNL_P\t").find(e) != std::string_view::npos) {
      exact = false;
    } else {
      unreadable(line, "an unknown escape in a double-quoted scalar");
    }
  }
  if (i >= s.size()) unreadable(line, "a double-quoted scalar continues on the next line");
  only_comment_after(s.substr(i + 1), line, "a quoted scalar");
  YamlNode n;
  n.kind = YamlNode::Kind::Str;
  if (exact) n.text = v;
  return n;
}

// '…' closed on its line ('' is one quote).
YamlNode single_quoted(std::string_view s, std::size_t line) {
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
  only_comment_after(s.substr(i + 1), line, "a quoted scalar");
  YamlNode n;
  n.kind = YamlNode::Kind::Str;
  n.text = v;
  return n;
}

// A plain scalar that is the rest of its line, in block context: ends at
// " #"; ": " inside, or a ':' at its end, is a mapping YAML refuses there.
std::string plain_text(std::string_view s, std::size_t line) {
  std::string v(s);
  for (std::size_t i = 1; i < v.size(); ++i) {
    if (v[i] == '#' && v[i - 1] == ' ') {
      v.resize(i);
      break;
    }
  }
  while (!v.empty() && v.back() == ' ') v.pop_back();
  if (v.find(": ") != std::string::npos || (!v.empty() && v.back() == ':')) {
    unreadable(line, "a mapping where a scalar is expected");
  }
  return v;
}

// [a, b] on one line, of plain words only.
YamlNode flow_sequence(std::string_view s, std::size_t line) {
  const std::size_t close = s.find(']');
  if (close == std::string_view::npos) unreadable(line, "a flow sequence continues on the next line");
  const std::string_view inner = s.substr(1, close - 1);
  if (inner.find_first_of("[]{}\"'#:&*!|>%@`?") != std::string_view::npos) {
    unreadable(line, "a flow collection mx2nv does not read");
  }
  only_comment_after(s.substr(close + 1), line, "a flow sequence");
  YamlNode n;
  n.kind = YamlNode::Kind::Seq;
  std::string_view rest = inner;
  if (rest.find_first_not_of(' ') == std::string_view::npos) return n;  // []
  while (true) {
    const std::size_t comma = rest.find(',');
    std::string item(rest.substr(0, comma));
    while (!item.empty() && item.back() == ' ') item.pop_back();
    while (!item.empty() && item.front() == ' ') item.erase(0, 1);
    if (item.empty()) unreadable(line, "an empty entry in a flow sequence");
    if (item[0] == '-' && (item.size() == 1 || item[1] == ' ')) unreadable(line, "a block entry in a flow sequence");
    n.items.push_back(plain_node(item, line));
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return n;
}

// --- Lines ---------------------------------------------------------------

struct Line {
  std::size_t number = 0;
  std::string text;  // without its line break
  std::size_t indent() const { return text.find_first_not_of(' ') == std::string::npos ? text.size() : text.find_first_not_of(' '); }
  bool ignorable() const {  // blank or a comment alone
    const std::size_t i = text.find_first_not_of(' ');
    return i == std::string::npos || text[i] == '#';
  }
};

bool is_dash(std::string_view t) { return t == "-" || t.substr(0, 2) == "- "; }

class Reader {
 public:
  explicit Reader(std::string_view fm) {
    std::size_t number = 0;
    bool ended = false;
    for (std::size_t i = 0; i <= fm.size();) {
      std::size_t j = i;
      while (j < fm.size() && fm[j] != '\n' && fm[j] != '\r') ++j;
      const std::string_view l = fm.substr(i, j - i);
      ++number;
      i = j + (fm.substr(j, 2) == "\r\n" ? 2 : 1);
      // PyYAML refuses a tab almost everywhere outside quotes, comments and
      // block scalars; mx2nv reads none.
      if (l.find('\t') != std::string_view::npos) unreadable(number, "a tab");
      const bool marker = l.size() == 3 || (l.size() > 3 && l[3] == ' ');
      if (l.substr(0, 3) == "---" && marker) unreadable(number, "a document marker");
      if (ended) {
        // After the end of the document only blank and comment lines.
        if (!Line{number, std::string(l)}.ignorable()) unreadable(number, "text after the end of the document");
        continue;
      }
      if (l.substr(0, 3) == "..." && marker) {
        if (!Line{number, "   " + std::string(l.substr(3))}.ignorable()) unreadable(number, "text after '...'");
        ended = true;
        continue;
      }
      if (!l.empty() && l[0] == '%') unreadable(number, "a directive");
      // A merge key anywhere is named as such, whatever else the reader
      // would refuse first.
      std::string_view key = l.substr(std::min(l.find_first_not_of(' '), l.size()));
      while (key.substr(0, 2) == "- ") key = key.substr(std::min(key.find_first_not_of(' ', 1), key.size()));
      if (key.substr(0, 3) == "<<:" && (key.size() == 3 || key[3] == ' ')) unusable("front matter uses YAML merge keys");
      lines_.push_back({number, std::string(l)});
    }
  }

  std::vector<std::pair<std::string, YamlNode>> read() {
    const std::size_t first = next_content();
    if (first == lines_.size()) return {};
    const Line& l = lines_[first];
    YamlNode root;
    if (l.indent() == 0 && entry_key(l.text.substr(0), l.number)) {
      root = mapping(0);
    } else {
      root = node(-1);
      if (root.kind != YamlNode::Kind::Map) {
        if (next_content() < lines_.size()) unreadable(lines_[next_content()].number, "bad indentation");
        unusable("front matter is not a mapping");
      }
    }
    if (next_content() < lines_.size()) unreadable(lines_[next_content()].number, "bad indentation");
    return root.entries;
  }

 private:
  std::size_t next_content() {
    while (at_ < lines_.size() && lines_[at_].ignorable()) ++at_;
    return at_;
  }

  void enter(std::size_t line) {
    if (++depth_ > kMaxDepth) unusable(fmt::format("front matter nests deeper than {}", kMaxDepth));
    (void)line;
  }

  // `key:` at the start of `t`: the key when `t` is a mapping entry, the
  // offset of what follows the colon in `value_at`.
  std::optional<std::string> entry_key(const std::string& t, std::size_t line, std::size_t* value_at = nullptr) {
    if (t.empty()) return std::nullopt;
    const char c0 = t[0];
    if (c0 == '?' && (t.size() == 1 || t[1] == ' ')) unreadable(line, "complex keys are not read");
    if (c0 == '"' || c0 == '\'') {  // a quoted scalar, or a quoted key (not read)
      const std::size_t close = t.find(c0, 1);
      if (close != std::string::npos && t.find(':', close) == close + 1) unreadable(line, "a quoted key");
      return std::nullopt;
    }
    std::size_t colon = std::string::npos;
    for (std::size_t i = 0; i < t.size(); ++i) {
      if (t[i] == '#' && i > 0 && t[i - 1] == ' ') break;  // a comment
      if (t[i] == ':' && (i + 1 == t.size() || t[i + 1] == ' ')) {
        colon = i;
        break;
      }
    }
    if (colon == std::string::npos) return std::nullopt;
    // Only a line that starts like a plain key is read as one.
    if (c0 == '&' || c0 == '*') unusable("front matter uses YAML anchors or aliases");
    if (c0 == '!') unreadable(line, "a tagged key");
    if (c0 == '-' && is_dash(t)) return std::nullopt;  // a sequence entry
    if (c0 == '[' || c0 == '{' || c0 == '|' || c0 == '>') return std::nullopt;  // a value; refused there
    const std::string key = t.substr(0, colon);
    if (key == "<<") unusable("front matter uses YAML merge keys");
    if (key.empty() || key.back() == ' ' || std::string_view(",]}#%@`:-").find(c0) != std::string_view::npos ||
        key.find_first_of("#:") != std::string::npos) {
      unreadable(line, "a key mx2nv does not read");
    }
    const Resolved r = resolve_plain(key);
    if (r == Resolved::Refused) unreadable(line, "a key mx2nv does not read");
    if (r != Resolved::Str) unusable("front matter has a key that is not a string");
    if (value_at) value_at[0] = colon + 1;
    return key;
  }

  // A node on the lines from at_, indented more than `parent` (a compact
  // sequence at `parent` itself when `compact`); Null when there is none.
  YamlNode node(long parent, bool compact = false) {
    const std::size_t i = next_content();
    if (i == lines_.size()) return {};
    const Line& l = lines_[i];
    const long ind = static_cast<long>(l.indent());
    const std::string t = l.text.substr(static_cast<std::size_t>(ind));
    if (compact && ind == parent && is_dash(t)) return sequence(static_cast<std::size_t>(ind), true);
    if (ind <= parent) return {};
    if (is_dash(t)) return sequence(static_cast<std::size_t>(ind), false);
    if (entry_key(t, l.number)) return mapping(static_cast<std::size_t>(ind));
    // A scalar on its own line.
    ++at_;
    YamlNode n = inline_value(t, l.number, parent);
    no_continuation(parent);
    return n;
  }

  // Lines after a value on one line may not be indented under it: a
  // multi-line plain scalar is not read, anything else YAML refuses.
  void no_continuation(long parent) {
    const std::size_t i = next_content();
    if (i < lines_.size() && static_cast<long>(lines_[i].indent()) > parent) {
      unreadable(lines_[i].number, "a value continued on the next line (not read)");
    }
  }

  YamlNode mapping(std::size_t indent) {
    enter(lines_[at_].number);
    YamlNode m;
    m.kind = YamlNode::Kind::Map;
    while (true) {
      const std::size_t i = next_content();
      if (i == lines_.size()) break;
      const Line& l = lines_[i];
      const std::size_t ind = l.indent();
      if (ind < indent) break;
      if (ind > indent) unreadable(l.number, "bad indentation");
      const std::string t = l.text.substr(ind);
      std::size_t value_at = 0;
      const auto key = entry_key(t, l.number, &value_at);
      if (!key) {
        if (is_dash(t)) break;  // a compact sequence's parent decides
        unreadable(l.number, "a scalar where a mapping entry is expected");
      }
      ++at_;
      std::string_view rest = std::string_view(t).substr(value_at);
      while (!rest.empty() && rest[0] == ' ') rest.remove_prefix(1);
      YamlNode value;
      const long parent = static_cast<long>(indent);
      if (rest.empty() || rest[0] == '#') {
        value = node(parent, true);
      } else {
        value = inline_value(rest, l.number, parent);
        no_continuation(parent);
      }
      m.entries.emplace_back(*key, std::move(value));
    }
    --depth_;
    return m;
  }

  YamlNode sequence(std::size_t indent, bool compact) {
    enter(lines_[at_].number);
    YamlNode s;
    s.kind = YamlNode::Kind::Seq;
    while (true) {
      const std::size_t i = next_content();
      if (i == lines_.size()) break;
      Line& l = lines_[i];
      const std::size_t ind = l.indent();
      if (ind < indent) break;
      if (ind > indent) unreadable(l.number, "bad indentation");
      if (!is_dash(std::string_view(l.text).substr(ind))) {
        if (compact) break;  // the mapping's next entry
        unreadable(l.number, "a sequence entry is expected");
      }
      // The entry's content is read as if the dash were a space: a node at
      // its own column, whose parent is the sequence.
      l.text[ind] = ' ';
      const std::size_t content = l.text.find_first_not_of(' ');
      if (content == std::string::npos || l.text[content] == '#') {
        ++at_;
        s.items.push_back(node(static_cast<long>(indent)));
        continue;
      }
      const std::string t = l.text.substr(content);
      if (is_dash(t) || entry_key(t, l.number)) {
        s.items.push_back(node(static_cast<long>(indent)));
        continue;
      }
      ++at_;
      s.items.push_back(inline_value(t, l.number, static_cast<long>(indent)));
      no_continuation(static_cast<long>(indent));
    }
    --depth_;
    return s;
  }

  // A value that starts on this line after `key: ` or `- `: one of the
  // scalar styles, a one-line flow sequence, or a block scalar's header.
  YamlNode inline_value(std::string_view s, std::size_t line, long parent) {
    const char c0 = s[0];
    const bool indicator_alone = s.size() == 1 || s[1] == ' ';
    if (c0 == '&' || c0 == '*') unusable("front matter uses YAML anchors or aliases");
    if (c0 == '!') return tagged(s, line, parent);
    if (c0 == '"') return double_quoted(s, line);
    if (c0 == '\'') return single_quoted(s, line);
    if (c0 == '[') {
      std::size_t open = 0, deepest = 0;
      for (const char c : s) {
        if (c == '[') deepest = std::max(deepest, ++open);
        if (c == ']' && open > 0) --open;
      }
      if (depth_ + deepest > kMaxDepth) unusable(fmt::format("front matter nests deeper than {}", kMaxDepth));
      enter(line);
      YamlNode n = flow_sequence(s, line);
      --depth_;
      return n;
    }
    if (c0 == '{') unreadable(line, "flow mappings are not read");
    if (c0 == '|' || c0 == '>') return block_scalar(s, line, parent);
    if (std::string_view(",]}#%@`").find(c0) != std::string_view::npos) {
      unreadable(line, fmt::format("a plain scalar cannot start with '{}'", c0));
    }
    if ((c0 == '-' || c0 == '?' || c0 == ':') && indicator_alone) {
      unreadable(line, fmt::format("'{}' where a value is expected", c0));
    }
    return plain_node(plain_text(s, line), line);
  }

  // `!!str` before a one-line quoted or plain scalar: the text as written,
  // never resolved. No other tag is read.
  YamlNode tagged(std::string_view s, std::size_t line, long parent) {
    const std::string_view tag = s.substr(0, std::min(s.find(' '), std::size_t{64}));
    if (tag != "!!str") {
      if (tag.substr(0, 2) == "!!") unreadable(line, fmt::format("the tag {} is not read", tag));
      unusable(fmt::format("front matter uses the YAML tag {}", tag));
    }
    std::string_view rest = s.substr(tag.size());
    while (!rest.empty() && rest[0] == ' ') rest.remove_prefix(1);
    if (rest.empty() || std::string_view("!&*[{|>#,]}%@`").find(rest[0]) != std::string_view::npos ||
        ((rest[0] == '-' || rest[0] == '?' || rest[0] == ':') && (rest.size() == 1 || rest[1] == ' '))) {
      unreadable(line, "a !!str tag mx2nv does not read");
    }
    (void)parent;
    if (rest[0] == '"') return double_quoted(rest, line);
    if (rest[0] == '\'') return single_quoted(rest, line);
    YamlNode n;
    n.kind = YamlNode::Kind::Str;
    n.text = plain_text(rest, line);
    return n;
  }

  // `|` or `>` with an optional chomping indicator (an indentation
  // indicator is not read), then the lines indented more than `parent`:
  // every one at least as far as the first. The value is not read (never
  // inherited); the lines are checked as YAML checks them.
  YamlNode block_scalar(std::string_view s, std::size_t line, long parent) {
    std::size_t i = 1;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
      unreadable(line, "a block scalar indentation indicator (not read)");
    }
    if (i < s.size() && s[i] != ' ') unreadable(line, "a bad block scalar header");
    only_comment_after(s.substr(i), line, "a block scalar header");
    std::size_t longest_blank = 0;
    std::optional<std::size_t> content;
    while (at_ < lines_.size()) {
      const Line& l = lines_[at_];
      const bool empty = l.text.find_first_not_of(' ') == std::string::npos;
      if (empty) {
        if (!content) longest_blank = std::max(longest_blank, l.text.size());
        ++at_;
        continue;
      }
      const std::size_t ind = l.indent();
      if (static_cast<long>(ind) <= parent) break;
      if (!content) {
        if (longest_blank > ind) unreadable(l.number, "a blank line indented more than the block scalar");
        content = ind;
      } else if (ind < *content) {
        unreadable(l.number, "a block scalar line indented less than its first line");
      }
      ++at_;
    }
    YamlNode n;
    n.kind = YamlNode::Kind::Str;
    return n;
  }

  std::vector<Line> lines_;
  std::size_t at_ = 0, depth_ = 0;
};

}  // namespace

std::vector<std::pair<std::string, YamlNode>> read_front_matter(std::string_view text) {
  return Reader(text).read();
}

}  // namespace mx2nv

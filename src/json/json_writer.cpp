#include "json/json_writer.hpp"

#include "common/printable.hpp"
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
    out.append(digits, static_cast<std::size_t>(r.ptr - digits));
  }
  out += ']';
}

void append_dumped_string(std::string& out, std::string_view s) {
  if (needs_no_escape(s)) {
    out += '"';
    out += s;
    out += '"';
    return;
  }
  // Escapes, non-ASCII, DEL: dump_json's rules, on the one string.
  out += dump_json(Json(std::string(s)), -1);
}

void JsonOut::newline(std::size_t depth) {
  buffer_ += '\n';
  buffer_.append(depth * static_cast<std::size_t>(indent_), ' ');
}

void JsonOut::before_value() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (stack_.empty()) return;
  Frame& f = stack_.back();
  if (f.has_items) buffer_ += ',';
  f.has_items = true;
  if (f.block) newline(stack_.size());
}

void JsonOut::key(std::string_view k) {
  before_value();
  append_dumped_string(buffer_, k);
  buffer_ += stack_.back().block ? ": " : ":";
  after_key_ = true;
}

void JsonOut::open(char bracket, bool block) {
  before_value();
  buffer_ += bracket;
  const bool parent_inline = !stack_.empty() && !stack_.back().block;
  stack_.push_back({block && indent_ >= 0 && !parent_inline, false});
}

void JsonOut::close(char bracket) {
  const Frame f = stack_.back();
  stack_.pop_back();
  if (f.block && f.has_items) newline(stack_.size());
  buffer_ += bracket;
  spill();
}

void JsonOut::string(std::string_view s) {
  before_value();
  append_dumped_string(buffer_, s);
  spill();
}

void JsonOut::uint(std::uint64_t v) {
  before_value();
  char digits[24];
  buffer_.append(digits, static_cast<std::size_t>(std::to_chars(digits, digits + sizeof digits, v).ptr - digits));
}

void JsonOut::int64(std::int64_t v) {
  before_value();
  char digits[24];
  buffer_.append(digits, static_cast<std::size_t>(std::to_chars(digits, digits + sizeof digits, v).ptr - digits));
}

void JsonOut::number(double v) {
  before_value();
  buffer_ += Json(v).dump();
}

void JsonOut::boolean(bool v) {
  before_value();
  buffer_ += v ? "true" : "false";
}

void JsonOut::null() {
  before_value();
  buffer_ += "null";
}

void JsonOut::value(const Json& v) {
  switch (v.type()) {
    case Json::value_t::object:
      begin_object();
      for (const auto& [k, item] : v.items()) {
        key(k);
        value(item);
      }
      return end_object();
    case Json::value_t::array:
      begin_array();
      for (const auto& item : v) value(item);
      return end_array();
    case Json::value_t::string: return string(v.get_ref<const std::string&>());
    case Json::value_t::number_unsigned: return uint(v.get<std::uint64_t>());
    case Json::value_t::number_integer: return int64(v.get<std::int64_t>());
    case Json::value_t::number_float: return number(v.get<double>());
    case Json::value_t::boolean: return boolean(v.get<bool>());
    default: return null();
  }
}

void JsonOut::literal(std::string_view json) {
  before_value();
  buffer_ += json;
  spill();
}

void JsonOut::raw(std::string_view text) {
  buffer_ += text;
  spill();
}

void JsonOut::spill() {
  if (buffer_.size() < kJsonOutChunk) return;
  sink_(buffer_);
  buffer_.clear();
}

void JsonOut::finish() {
  if (!buffer_.empty()) sink_(buffer_);
  buffer_.clear();
}

}  // namespace mx2nv

// Writing JSON text without building a DOM of it.
//
// append_json_string / append_json_uint_array: for documents with hundreds
// of thousands of names (a large checkpoint's index, shard headers): the
// same bytes Json::dump() writes (compact, UTF-8 passed through, strict on
// invalid UTF-8), with a fast path for the common case of printable ASCII.
//
// JsonOut: the one streaming writer of the documents mx2nv writes member by
// member (reports with a row per module, merged reports, plan files), so
// none is spelled by hand and none needs a DOM of its rows.
//
// Layout: a *block* container puts each item on its own line, indented by
// `indent` spaces per level, with ": " after a key, and closes on a line of
// its own; an *inline* one is compact ("," and ":"). An empty container is
// "[]" or "{}" either way. With every container block and indent 2 the text
// is dump_json()'s byte for byte (nlohmann's layout); with indent < 0 every
// container is inline (the compact text). A container opened inside an
// inline one is inline. Members are written in the order given: a caller
// that must match nlohmann's sorted keys writes them sorted.
//
// JsonOut writes strings and numbers exactly as dump_json() does
// (terminal-unsafe characters escaped, doubles in nlohmann's shortest form).
// Text goes to the sink in pieces of about kJsonOutChunk bytes; finish()
// hands over the rest.
#pragma once

#include "json/strict_json.hpp"

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mx2nv {

// Appends `head` followed by `tail` as one JSON string.
void append_json_string(std::string& out, std::string_view head, std::string_view tail = {});
// Appends `[a,b,...]`.
void append_json_uint_array(std::string& out, std::span<const std::uint64_t> values);

inline constexpr std::size_t kJsonOutChunk = 1 << 16;

class JsonOut {
 public:
  using Sink = std::function<void(std::string_view)>;
  explicit JsonOut(Sink sink, int indent = 2) : sink_(std::move(sink)), indent_(indent) {}

  void begin_object(bool block = true) { open('{', block); }
  void end_object() { close('}'); }
  void begin_array(bool block = true) { open('[', block); }
  void end_array() { close(']'); }
  // The key of the next value (in an object).
  void key(std::string_view k);

  void string(std::string_view s);
  void uint(std::uint64_t v);
  void int64(std::int64_t v);
  void number(double v);  // nlohmann's form; not finite: null, as nlohmann writes it
  void boolean(bool v);
  void null();
  // A value built as a Json, in this writer's layout (its containers block
  // where they may be).
  void value(const Json& v);

  // A value the caller wrote as compact JSON text, exactly as this writer
  // would inline (a row of a table written in one piece, the separator and
  // layout before it still this writer's); not checked.
  void literal(std::string_view json);
  // Text after the document (a final newline), then everything to the sink.
  void raw(std::string_view text);
  void finish();

 private:
  struct Frame {
    bool block = false;
    bool has_items = false;
  };
  void open(char bracket, bool block);
  void close(char bracket);
  void before_value();
  void newline(std::size_t depth);
  void spill();

  Sink sink_;
  int indent_;
  std::vector<Frame> stack_;
  bool after_key_ = false;
  std::string buffer_;
};

// One JSON string as dump_json writes it, appended to `out`.
void append_dumped_string(std::string& out, std::string_view s);

}  // namespace mx2nv

#include "core/json_fast.hpp"

#include "core/json_stream.hpp"

#include <simdjson.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <mutex>
#include <vector>

namespace mx2nv {
namespace {

// Permits to parse: at most kFastJsonParsers documents are in simdjson at
// once. The parser and the text live only for one document (simdjson's
// buffers are sized to it, ~14 bytes per input byte allocated, fewer
// touched), so nothing is held between documents while the rest of a run
// builds its tables.
std::array<std::mutex, kFastJsonParsers>& permits() {
  static std::array<std::mutex, kFastJsonParsers> pool;
  return pool;
}

bool fast_path_can_match(std::string_view text) {
  if (text.starts_with(kUtf8Bom) || text.find("-0") != std::string_view::npos) return false;
  return std::none_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == '\\'; });
}

// The events nlohmann's sax_parse emits for `e`, in document order. The
// recursion is bounded: simdjson refuses documents nested over 1024 deep and
// every handler throws past kMaxJsonDepth (StrictSax::enter).
bool feed(const simdjson::dom::element& e, StrictSax& sax) {
  using simdjson::dom::element_type;
  switch (e.type()) {
    case element_type::OBJECT: {
      const simdjson::dom::object object = e.get_object().value_unsafe();
      if (!sax.start_object(object.size())) return false;
      for (const auto field : object) {
        std::string key(field.key);
        if (!sax.key(key) || !feed(field.value, sax)) return false;
      }
      return sax.end_object();
    }
    case element_type::ARRAY: {
      const simdjson::dom::array array = e.get_array().value_unsafe();
      if (!sax.start_array(array.size())) return false;
      for (const auto item : array) {
        if (!feed(item, sax)) return false;
      }
      return sax.end_array();
    }
    case element_type::STRING: {
      std::string value(e.get_string().value_unsafe());
      return sax.string(value);
    }
    case element_type::INT64: {
      // Without "-0" in the text, a zero here was written "0": unsigned.
      const std::int64_t v = e.get_int64().value_unsafe();
      return v >= 0 ? sax.number_unsigned(static_cast<std::uint64_t>(v)) : sax.number_integer(v);
    }
    case element_type::UINT64: return sax.number_unsigned(e.get_uint64().value_unsafe());
    case element_type::DOUBLE: {
      std::string raw;  // handlers never read it; nlohmann passes the token
      return sax.number_float(e.get_double().value_unsafe(), raw);
    }
    case element_type::BOOL: return sax.boolean(e.get_bool().value_unsafe());
    case element_type::NULL_VALUE: return sax.null();
  }
  return false;
}

}  // namespace

bool parse_json_fast(const ByteSource& source, std::uint64_t offset, std::uint64_t length, StrictSax& handler) {
  if (length == 0 || length > kFastJsonMaxBytes) return false;
  for (std::mutex& permit : permits()) {
    std::unique_lock lock(permit, std::try_to_lock);
    if (!lock) continue;
    const auto n = static_cast<std::size_t>(length);
    std::vector<char> text(n + simdjson::SIMDJSON_PADDING, '\0');  // padding readable, as simdjson requires
    source.read_at(offset, std::as_writable_bytes(std::span(text.data(), n)));
    if (!fast_path_can_match(std::string_view(text.data(), n))) return false;
    simdjson::dom::parser parser(kFastJsonMaxBytes);
    simdjson::dom::element root;
    if (parser.parse(text.data(), n, false).get(root) != simdjson::SUCCESS) return false;
    feed(root, handler);
    return true;
  }
  return false;
}

}  // namespace mx2nv

#include "json/json_fast.hpp"

#include "json/json_stream.hpp"

#include <simdjson.h>

#if defined(__SSE2__) && defined(__x86_64__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
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
  // Control characters and backslashes, 16 bytes a step where SSE2 is there
  // (every x86-64): every header is scanned, each read more than once.
  std::size_t i = 0;
#if defined(__SSE2__) && defined(__x86_64__)
  const __m128i space = _mm_set1_epi8(0x20), backslash = _mm_set1_epi8('\\'), flip = _mm_set1_epi8(-128);
  int hits = 0;
  for (; i + 16 <= text.size(); i += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(text.data() + i));
    // Unsigned v < 0x20 as a signed compare after flipping the top bit.
    const __m128i control = _mm_cmplt_epi8(_mm_xor_si128(v, flip), _mm_xor_si128(space, flip));
    hits |= _mm_movemask_epi8(_mm_or_si128(control, _mm_cmpeq_epi8(v, backslash)));
  }
  if (hits != 0) return false;
#endif
  return std::none_of(text.begin() + static_cast<std::ptrdiff_t>(i), text.end(),
                      [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == '\\'; });
}

// The events nlohmann's sax_parse emits for `e`, in document order. The
// recursion is bounded: simdjson refuses documents nested over 1024 deep and
// every handler throws past kMaxJsonDepth (StrictSax::enter).
// `scratch` carries the strings handed to the handler (nlohmann's interface
// takes a mutable std::string): one buffer reused, not one allocation each.
bool feed(const simdjson::dom::element& e, StrictSax& sax, std::string& scratch) {
  using simdjson::dom::element_type;
  switch (e.type()) {
    case element_type::OBJECT: {
      const simdjson::dom::object object = e.get_object().value_unsafe();
      if (!sax.start_object(object.size())) return false;
      for (const auto field : object) {
        scratch.assign(field.key);
        if (!sax.key(scratch) || !feed(field.value, sax, scratch)) return false;
      }
      return sax.end_object();
    }
    case element_type::ARRAY: {
      const simdjson::dom::array array = e.get_array().value_unsafe();
      if (!sax.start_array(array.size())) return false;
      for (const auto item : array) {
        if (!feed(item, sax, scratch)) return false;
      }
      return sax.end_array();
    }
    case element_type::STRING: {
      scratch.assign(e.get_string().value_unsafe());
      return sax.string(scratch);
    }
    case element_type::INT64: {
      // Without "-0" in the text, a zero here was written "0": unsigned.
      const std::int64_t v = e.get_int64().value_unsafe();
      return v >= 0 ? sax.number_unsigned(static_cast<std::uint64_t>(v)) : sax.number_integer(v);
    }
    case element_type::UINT64: return sax.number_unsigned(e.get_uint64().value_unsafe());
    case element_type::DOUBLE: {
      scratch.clear();  // handlers never read it; nlohmann passes the token
      return sax.number_float(e.get_double().value_unsafe(), scratch);
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
    std::string scratch;
    feed(root, handler, scratch);
    return true;
  }
  return false;
}


namespace {

// Byte rules for the large path, checked in one pass 16 bytes a step: no
// backslash (escapes), no NUL (nlohmann refuses it anywhere), and a bound on
// the entries of simdjson's structural index (4 bytes each, resident as
// stage 1 writes them, valid document or not): every operator and quote,
// plus every byte that could start a scalar (a byte that is none of those nor
// whitespace, after one that is). That counts at least what simdjson marks:
// its operators, the opening quote of each string, and the start of each
// number, literal or stray run of other bytes; the bytes after an opening
// quote are counted too, so a string counts three.
struct LargeScan {
  bool clean = false;
  std::uint64_t structurals = 0;
};

constexpr bool is_operator(unsigned char c) {
  return c == ':' || c == ',' || c == '{' || c == '}' || c == '[' || c == ']';
}
constexpr bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
// A byte after which a scalar may start, and one that may start it.
constexpr bool is_boundary(unsigned char c) { return is_operator(c) || is_space(c) || c == '"'; }

// One byte's part of the scan, given the byte before it.
struct ByteCounts {
  unsigned bad = 0;
  std::uint64_t structurals = 0;
  void add(unsigned char before, unsigned char c) {
    bad |= static_cast<unsigned>(c == '\\') | static_cast<unsigned>(c == 0);
    structurals += static_cast<unsigned>(is_operator(c) || c == '"' || (!is_boundary(c) && is_boundary(before)));
  }
};

LargeScan scan_large(std::string_view text) {
  ByteCounts counts;
  if (text.empty()) return {false, 0};
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  counts.add(' ', byte(0));  // the document's start is a boundary
  std::size_t i = 1;
#if defined(__SSE2__) && defined(__x86_64__)
  // 16 bytes a step (SSE2 is in every x86-64), not byte by byte: the index
  // is the largest document read. Each byte's bytes-before come from a load
  // one byte earlier.
  int bad_mask = 0;
  const auto splat = [](char c) { return _mm_set1_epi8(c); };
  const __m128i quote = splat('"'), colon = splat(':'), comma = splat(','), open_brace = splat('{'),
                close_brace = splat('}'), open_bracket = splat('['), close_bracket = splat(']'), space = splat(' '),
                tab = splat('\t'), newline = splat('\n'), carriage = splat('\r'), backslash = splat('\\'),
                zero = _mm_setzero_si128();
  const auto operators = [&](__m128i v) {
    return _mm_or_si128(_mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, colon), _mm_cmpeq_epi8(v, comma)),
                                     _mm_or_si128(_mm_cmpeq_epi8(v, open_brace), _mm_cmpeq_epi8(v, close_brace))),
                        _mm_or_si128(_mm_cmpeq_epi8(v, open_bracket), _mm_cmpeq_epi8(v, close_bracket)));
  };
  const auto boundaries = [&](__m128i v, __m128i ops) {
    return _mm_or_si128(_mm_or_si128(ops, _mm_cmpeq_epi8(v, quote)),
                        _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, space), _mm_cmpeq_epi8(v, tab)),
                                     _mm_or_si128(_mm_cmpeq_epi8(v, newline), _mm_cmpeq_epi8(v, carriage))));
  };
  // Hits counted per byte lane (a hit is -1: subtracting it adds one), the
  // lanes summed every 255 steps before they could wrap (baseline x86-64
  // has no popcount instruction, and a library call per step is not free).
  __m128i lanes = zero;
  unsigned steps = 0;
  const auto add_lanes = [&] {
    const __m128i sums = _mm_sad_epu8(lanes, zero);
    counts.structurals += static_cast<std::uint64_t>(_mm_cvtsi128_si64(sums)) +
                          static_cast<std::uint64_t>(_mm_cvtsi128_si64(_mm_unpackhi_epi64(sums, sums)));
    lanes = zero;
    steps = 0;
  };
  for (; i + 16 <= text.size(); i += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(text.data() + i));
    const __m128i before = _mm_loadu_si128(reinterpret_cast<const __m128i*>(text.data() + i - 1));
    const __m128i ops = operators(v);
    const __m128i here = boundaries(v, ops);
    const __m128i starts = _mm_andnot_si128(here, boundaries(before, operators(before)));
    const __m128i hit = _mm_or_si128(_mm_or_si128(ops, _mm_cmpeq_epi8(v, quote)), starts);
    lanes = _mm_sub_epi8(lanes, hit);
    if (++steps == 255) add_lanes();
    bad_mask |= _mm_movemask_epi8(_mm_or_si128(_mm_cmpeq_epi8(v, backslash), _mm_cmpeq_epi8(v, zero)));
  }
  add_lanes();
  counts.bad |= static_cast<unsigned>(bad_mask != 0);
#endif
  for (; i < text.size(); ++i) counts.add(byte(i - 1), byte(i));
  return {counts.bad == 0 && !text.starts_with(kUtf8Bom), counts.structurals};
}

// A string's bytes, from just after its opening quote in the padded text:
// without backslashes the next quote closes it. The streaming parser refuses
// control characters inside strings and any string over kMaxJsonTokenBytes;
// both decline here.
bool raw_string(const char* start, const char* text_end, std::string_view& out) {
  const void* close = std::memchr(start, '"', static_cast<std::size_t>(text_end - start));
  if (close == nullptr) return false;
  out = std::string_view(start, static_cast<std::size_t>(static_cast<const char*>(close) - start));
  if (out.size() + 2 > kMaxJsonTokenBytes) return false;  // the streaming parser counts both quotes
  return std::none_of(out.begin(), out.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20; });
}

enum class Walk { Fed, Stopped, Declined };

class LargeWalker {
 public:
  LargeWalker(StrictSax& sax, const char* text_end, std::string_view what)
      : sax_(sax), text_end_(text_end), what_(what) {}

  Walk document(simdjson::ondemand::document& doc, std::string_view text) {
    // On-Demand does not look past the root: nothing but whitespace may
    // follow it. Its extent first (a skip over the structural index), then
    // the walk from the start.
    simdjson::ondemand::object top;
    std::string_view root;
    if (doc.get_object().get(top) != simdjson::SUCCESS || top.raw_json().get(root) != simdjson::SUCCESS) {
      return Walk::Declined;
    }
    const std::size_t root_end = static_cast<std::size_t>(root.data() - text.data()) + root.size();
    if (text.find_first_not_of(" \t\n\r", root_end) != std::string_view::npos) return Walk::Declined;
    doc.rewind();
    if (doc.get_object().get(top) != simdjson::SUCCESS) return Walk::Declined;
    return object(top, true);
  }

 private:
  // Keys and string values straight from the text; at the top level, an
  // object value is walked the same way (the weight_map); everything else
  // goes through the streaming parser from its raw JSON.
  Walk object(simdjson::ondemand::object& object, bool top) {
    if (!sax_.start_object(static_cast<std::size_t>(-1))) return Walk::Stopped;
    for (auto member : object) {
      simdjson::ondemand::field field;
      if (std::move(member).get(field) != simdjson::SUCCESS) return Walk::Declined;
      std::string_view key;
      if (!raw_string(field.key().raw(), text_end_, key)) return Walk::Declined;
      scratch_.assign(key);
      if (!sax_.key(scratch_)) return Walk::Stopped;
      const Walk w = value(field.value(), top);
      if (w != Walk::Fed) return w;
    }
    return sax_.end_object() ? Walk::Fed : Walk::Stopped;
  }

  Walk value(simdjson::ondemand::value v, bool top) {
    simdjson::ondemand::json_type type;
    if (v.type().get(type) != simdjson::SUCCESS) return Walk::Declined;
    std::string_view raw;
    switch (type) {
      case simdjson::ondemand::json_type::string: {
        simdjson::ondemand::raw_json_string s;
        if (v.get_raw_json_string().get(s) != simdjson::SUCCESS || !raw_string(s.raw(), text_end_, raw)) {
          return Walk::Declined;
        }
        scratch_.assign(raw);
        return sax_.string(scratch_) ? Walk::Fed : Walk::Stopped;
      }
      case simdjson::ondemand::json_type::object: {
        simdjson::ondemand::object o;
        if (v.get_object().get(o) != simdjson::SUCCESS) return Walk::Declined;
        if (top) return object(o, false);
        if (o.raw_json().get(raw) != simdjson::SUCCESS) return Walk::Declined;
        break;
      }
      case simdjson::ondemand::json_type::array: {
        simdjson::ondemand::array a;
        if (v.get_array().get(a) != simdjson::SUCCESS || a.raw_json().get(raw) != simdjson::SUCCESS) {
          return Walk::Declined;
        }
        break;
      }
      default: raw = v.raw_json_token(); break;
    }
    // The canonical parser for everything but strings; throws (declining)
    // on anything it refuses.
    const MemorySource piece(raw);
    parse_json_streaming(piece, 0, raw.size(), sax_, what_);
    return Walk::Fed;
  }

  StrictSax& sax_;
  const char* text_end_;
  std::string_view what_;
  std::string scratch_;
};

}  // namespace

bool parse_large_object_fast(const ByteSource& source, std::uint64_t length, StrictSax& handler,
                             std::string_view what) {
  if (length == 0 || length > kLargeJsonMaxBytes) return false;
  static std::mutex one_at_a_time;
  const std::scoped_lock lock(one_at_a_time);
  try {
    const auto n = static_cast<std::size_t>(length);
    // Not zeroed (every byte but the padding is read into it): a pass over
    // the whole index saved; the padding is zeroed, as simdjson requires it
    // readable.
    const auto text_bytes = std::make_unique_for_overwrite<char[]>(n + simdjson::SIMDJSON_PADDING);
    const std::span<char> text(text_bytes.get(), n + simdjson::SIMDJSON_PADDING);
    std::fill(text.begin() + static_cast<std::ptrdiff_t>(n), text.end(), '\0');
    source.read_at(0, std::as_writable_bytes(text.first(n)));
    const LargeScan scan = scan_large(std::string_view(text.data(), n));
    if (!scan.clean || scan.structurals > kLargeJsonMaxStructurals) return false;
    simdjson::ondemand::parser parser(n);
    simdjson::ondemand::document doc;
    if (parser.iterate(text.data(), n, text.size()).get(doc) != simdjson::SUCCESS) return false;
    LargeWalker walker(handler, text.data() + n, what);
    return walker.document(doc, std::string_view(text.data(), n)) != Walk::Declined;
  } catch (const Error&) {
    return false;  // the streaming parser, run by the caller, raises the canonical error
  }
}

}  // namespace mx2nv

// The fast path for small strict JSON documents (shard headers, each read
// more than once per command). nlohmann's lexer reads a character at a
// time; simdjson validates a whole document with vector instructions. This
// path parses with simdjson and feeds the handler the very events
// nlohmann's SAX parser would, so every rule (schema, duplicate keys, depth,
// caps) stays in the one handler.
//
// It only *accepts*: it declines, having fed the handler nothing, whenever
// the two parsers could differ or an error must be reported, and the caller
// then runs the streaming parser (json_stream.hpp), whose verdict and error
// message are canonical. It declines on
//   * documents over kFastJsonMaxBytes (simdjson's working memory is up to
//     ~14 bytes per input byte; the streaming parser's is bounded instead),
//   * any byte below 0x20 (NUL, control characters; whitespace other than
//     spaces), a backslash (escapes), "-0" (nlohmann reports -0 as a signed
//     integer, simdjson's value cannot say) and a leading byte order mark,
//   * anything simdjson refuses (syntax, UTF-8, depth, number range),
//   * all of its permits being taken (kFastJsonParsers documents at once,
//     so memory stays bounded however many threads parse; nothing is kept
//     between documents).
// With those excluded, a string is its raw UTF-8 bytes in both parsers and a
// number has the same kind (unsigned, signed, float) and value.
#pragma once

#include "common/byte_source.hpp"
#include "json/strict_json.hpp"

#include <cstdint>

namespace mx2nv {

class StrictSax;

inline constexpr std::uint64_t kFastJsonMaxBytes = 2ull << 20;
inline constexpr unsigned kFastJsonParsers = 4;

// Parses bytes [offset, offset + length) of `source` and feeds `handler`;
// false if it declined (nothing fed). A handler's exception propagates.
bool parse_json_fast(const ByteSource& source, std::uint64_t offset, std::uint64_t length, StrictSax& handler);

// The fast path for one large document whose top level is an object of
// mostly strings: the shard index (parsed once per command). simdjson's
// On-Demand API walks it without a DOM: the text, plus 4 bytes per
// structural character, is all it holds, freed before the index's tables
// grow past it. Object
// keys and string values are fed from the text itself; every other value
// (numbers, nested objects and arrays: the index's small "metadata") is fed
// by the streaming parser from its raw JSON, so numbers keep nlohmann's
// exact kinds and values.
//
// Unlike parse_json_fast, On-Demand validates as it walks, so a decline may
// come after events were fed: on false, the caller must discard the handler
// and everything it built, and run the streaming parser on a fresh one. It
// declines on documents over kLargeJsonMaxBytes or with more than
// kLargeJsonMaxStructurals structural characters (memory), a backslash, a
// NUL, a control character inside a string, a leading byte order mark, a top
// level that is not an object, anything simdjson refuses, and any exception
// (including the handler's: the streaming parser then raises the canonical
// one), with one document at a time in this path.
inline constexpr std::uint64_t kLargeJsonMaxBytes = 64ull << 20;
inline constexpr std::uint64_t kLargeJsonMaxStructurals = 8ull << 20;
bool parse_large_object_fast(const ByteSource& source, std::uint64_t length, StrictSax& handler,
                             std::string_view what);

}  // namespace mx2nv

// Strict, streaming JSON for the large untrusted documents (shard headers up
// to 100 MB, an index up to 512 MB: the caps of checkpoint/reader.hpp). The
// text is read in fixed chunks from a ByteSource and fed to nlohmann's SAX
// parser, so memory is what the handler keeps, never the document or a DOM
// of it.
//
// Small documents (shard headers) and an index of up to 64 MiB go through
// simdjson first (json_fast.hpp), which accepts only where it is certain to
// agree; everything else, and every error, comes from this path. Why not
// simdjson for all: it needs the whole document in memory plus a structural
// index of up to 4 bytes per input byte (~2 GB for a capped 512 MB index),
// and it does not detect duplicate keys, which we must refuse. nlohmann's lexer validates UTF-8 and
// control characters; the rules it lacks are enforced here and in StrictSax:
//   * a UTF-8 byte order mark is refused (nlohmann skips it silently);
//   * a NUL byte anywhere is refused (nlohmann's lexer takes NUL for the end
//     of input and would ignore everything after it);
//   * nesting deeper than kMaxJsonDepth is refused;
//   * duplicate keys are refused by each handler (it knows its keys).
#pragma once

#include "common/byte_source.hpp"
#include "common/error.hpp"
#include "json/strict_json.hpp"

#include <cstdint>
#include <string>
#include <string_view>

namespace mx2nv {

inline constexpr std::size_t kJsonChunkBytes = 1 << 16;
inline constexpr std::string_view kUtf8Bom = "\xEF\xBB\xBF";
// The longest string, number or literal token accepted (a tensor name, a
// shard file name, a metadata value): bounds the lexer's buffers.
inline constexpr std::uint64_t kMaxJsonTokenBytes = 4 << 20;

// Refuses a leading BOM and any NUL byte in a JSON text held in memory.
void check_json_bytes(std::string_view text, std::string_view what);

// Base for strict handlers: depth limit, binary values and parse errors
// become Error(InvalidInput) naming `what` and the byte offset.
//
// Order of errors: a document that is not well-formed JSON (syntax, UTF-8,
// NUL, BOM, nesting, duplicate keys) is refused for that, as a DOM parser
// would; only a well-formed one is refused for breaking the handler's
// schema. So a schema error is recorded (reject), the rest of the document
// is still parsed, ignoring content, and finish() throws it.
class StrictSax : public nlohmann::json_sax<Json> {
 public:
  explicit StrictSax(std::string_view what) : what_(what) {}
  bool binary(binary_t&) override;
  bool parse_error(std::size_t position, const std::string& last_token,
                   const nlohmann::detail::exception& ex) override;
  // Throws the first recorded schema error, if any.
  void finish() const;

 protected:
  template <typename... Args>
  bool reject(fmt::format_string<Args...> format, Args&&... args) {
    if (rejection_.empty()) rejection_ = fmt::format(format, std::forward<Args>(args)...);
    return true;
  }
  // Call on every start_object/start_array and end_object/end_array.
  void enter();
  void leave() { --depth_; }
  std::size_t depth() const { return depth_; }
  const std::string& what() const { return what_; }

 private:
  friend void parse_json_streaming(const ByteSource&, std::uint64_t, std::uint64_t, StrictSax&, std::string_view);
  std::string what_;
  std::size_t depth_ = 0;
  std::string rejection_;
  std::uint64_t skipped_ = 0;  // whitespace the lexer did not see (error offsets)
};

// Parses bytes [offset, offset + length) of `source` as one JSON document,
// nothing after it but whitespace. Memory: the handler's, a chunk, and at
// most kMaxJsonTokenBytes of lexer buffers, whatever the document's size.
void parse_json_stream(const ByteSource& source, std::uint64_t offset, std::uint64_t length, StrictSax& handler,
                       std::string_view what);
// The streaming parser alone, without the fast path (tests compare the two).
void parse_json_streaming(const ByteSource& source, std::uint64_t offset, std::uint64_t length, StrictSax& handler,
                          std::string_view what);

// A ByteSource over bytes in memory (tests, fuzzing, small files).
class MemorySource final : public ByteSource {
 public:
  explicit MemorySource(std::string_view bytes) : bytes_(bytes) {}
  void read_at(std::uint64_t offset, std::span<std::byte> out) const override;

 private:
  std::string_view bytes_;
};

}  // namespace mx2nv

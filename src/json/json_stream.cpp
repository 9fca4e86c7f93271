#include "json/json_stream.hpp"

#include "common/error.hpp"
#include "common/printable.hpp"
#include "json/json_fast.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace mx2nv {
namespace {

// Chunked reader behind ChunkAdapter; refuses a BOM and NUL bytes as it reads.
class ChunkReader {
 public:
  ChunkReader(const ByteSource& source, std::uint64_t offset, std::uint64_t length, std::string_view what)
      : source_(source), next_(offset), end_(offset + length), start_(offset), what_(what) {}
  // The next chunk of text, validated; empty at the end.
  std::string_view next() {
    const auto size = static_cast<std::size_t>(std::min<std::uint64_t>(kJsonChunkBytes, end_ - next_));
    if (size == 0) return {};
    buffer_.resize(kJsonChunkBytes);
    source_.read_at(next_, std::as_writable_bytes(std::span(buffer_.data(), size)));
    const std::string_view chunk(buffer_.data(), size);
    if (next_ == start_ && chunk.starts_with(kUtf8Bom)) {
      fail_input("{}: starts with a UTF-8 byte order mark, which JSON does not allow", what_);
    }
    if (const void* nul = std::memchr(chunk.data(), 0, size)) {
      const auto at = next_ - start_ + static_cast<std::uint64_t>(static_cast<const char*>(nul) - chunk.data());
      fail_input("{}: NUL byte at byte {}; JSON text cannot contain one", what_, at);
    }
    next_ += size;
    return chunk;
  }
  std::string_view what() const { return what_; }

 private:
  const ByteSource& source_;
  std::uint64_t next_, end_, start_;
  std::string_view what_;
  std::vector<char> buffer_;
};

bool is_json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_json_structural(char c) { return c == '{' || c == '}' || c == '[' || c == ']' || c == ':' || c == ','; }

// The input adapter nlohmann's lexer reads a character at a time: a pointer
// bump within the chunk at hand, since it is called once per byte of every
// document (an iterator adapter over a chunked iterator costs more than the
// lexing).
//
// It also bounds what the lexer buffers. nlohmann keeps every character of
// the current token *and of the whitespace before it* (token_string, for
// error messages), so 500 MB of padding spaces in a capped index cost 500 MB
// (times two while the string grows). Outside strings a run of whitespace
// is handed over as one character, which changes neither the tokens nor the
// document's validity; a token (string, number, literal) longer than
// kMaxJsonTokenBytes is refused. Bytes skipped are counted so errors still
// name the byte offset in the file.
class ChunkAdapter {
 public:
  using char_type = char;
  ChunkAdapter(ChunkReader& reader, std::uint64_t& skipped) : reader_(&reader), skipped_(&skipped) {}
  std::char_traits<char>::int_type get_character() {
    for (;;) {
      if (at_ == end_) {
        const std::string_view chunk = reader_->next();
        if (chunk.empty()) return std::char_traits<char>::eof();
        at_ = chunk.data();
        end_ = chunk.data() + chunk.size();
      }
      const char c = *at_++;
      if (in_string_) {
        if (escaped_) {
          escaped_ = false;
        } else if (c == '\\') {
          escaped_ = true;
        } else if (c == '"') {
          in_string_ = false;
        }
        count_token_byte();
      } else if (is_json_space(c)) {
        token_ = 0;
        if (after_space_) {
          ++*skipped_;
          continue;
        }
        after_space_ = true;
        return std::char_traits<char>::to_int_type(c);
      } else if (is_json_structural(c)) {
        token_ = 0;
      } else {
        in_string_ = c == '"';
        count_token_byte();
      }
      after_space_ = false;
      return std::char_traits<char>::to_int_type(c);
    }
  }

 private:
  void count_token_byte() {
    if (++token_ > kMaxJsonTokenBytes) {
      fail_input("{}: a JSON string or number longer than {} bytes", reader_->what(), kMaxJsonTokenBytes);
    }
  }
  ChunkReader* reader_;
  std::uint64_t* skipped_;
  const char* at_ = nullptr;
  const char* end_ = nullptr;
  std::uint64_t token_ = 0;
  bool in_string_ = false, escaped_ = false, after_space_ = false;
};

}  // namespace

void check_json_bytes(std::string_view text, std::string_view what) {
  if (text.starts_with(kUtf8Bom)) fail_input("{}: starts with a UTF-8 byte order mark, which JSON does not allow", what);
  if (const auto nul = text.find('\0'); nul != std::string_view::npos) {
    fail_input("{}: NUL byte at byte {}; JSON text cannot contain one", what, nul);
  }
}

bool StrictSax::binary(binary_t&) { fail_input("{}: binary values are not JSON", what_); }

bool StrictSax::parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex) {
  // nlohmann's message quotes the token it last read, which may be megabytes.
  fail_input("{}: invalid JSON at byte {}: {}", what_, position + skipped_, excerpt(ex.what(), 512));
}

void StrictSax::finish() const {
  if (!rejection_.empty()) throw Error(ErrorKind::InvalidInput, rejection_);
}

void StrictSax::enter() {
  if (++depth_ > kMaxJsonDepth) fail_input("{}: JSON nested deeper than {} levels", what_, kMaxJsonDepth);
}

void parse_json_stream(const ByteSource& source, std::uint64_t offset, std::uint64_t length, StrictSax& handler,
                       std::string_view what) {
  if (parse_json_fast(source, offset, length, handler)) return;
  parse_json_streaming(source, offset, length, handler, what);
}

void parse_json_streaming(const ByteSource& source, std::uint64_t offset, std::uint64_t length, StrictSax& handler,
                          std::string_view what) {
  ChunkReader reader(source, offset, length, what);
  // What Json::sax_parse does, with our adapter instead of an iterator one.
  nlohmann::detail::parser<Json, ChunkAdapter>(ChunkAdapter(reader, handler.skipped_), nullptr, true, false)
      .sax_parse(&handler, true);
}

void MemorySource::read_at(std::uint64_t offset, std::span<std::byte> out) const {
  if (offset > bytes_.size() || out.size() > bytes_.size() - offset) {
    fail_input("read of {} bytes at {} past the end of {} bytes", out.size(), offset, bytes_.size());
  }
  std::memcpy(out.data(), bytes_.data() + offset, out.size());
}

}  // namespace mx2nv

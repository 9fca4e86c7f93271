#include "core/json_stream.hpp"

#include "core/error.hpp"

#include <cstring>
#include <iterator>
#include <vector>

namespace mx2nv {
namespace {

constexpr std::string_view kBom = "\xEF\xBB\xBF";

// Chunked reader behind ChunkIterator; refuses a BOM and NUL bytes as it reads.
class ChunkReader {
 public:
  ChunkReader(const ByteSource& source, std::uint64_t offset, std::uint64_t length, std::string_view what)
      : source_(source), next_(offset), end_(offset + length), start_(offset), what_(what) {
    fill();
    if (std::string_view(buffer_.data(), size_).starts_with(kBom)) {
      fail_input("{}: starts with a UTF-8 byte order mark, which JSON does not allow", what_);
    }
  }
  bool done() const { return at_ == size_; }
  char current() const { return buffer_[at_]; }
  void advance() {
    if (++at_ == size_) fill();
  }

 private:
  void fill() {
    at_ = 0;
    size_ = static_cast<std::size_t>(std::min<std::uint64_t>(kJsonChunkBytes, end_ - next_));
    if (size_ == 0) return;
    buffer_.resize(kJsonChunkBytes);
    source_.read_at(next_, std::as_writable_bytes(std::span(buffer_.data(), size_)));
    if (const void* nul = std::memchr(buffer_.data(), 0, size_)) {
      const auto at = next_ - start_ + static_cast<std::uint64_t>(static_cast<const char*>(nul) - buffer_.data());
      fail_input("{}: NUL byte at byte {}; JSON text cannot contain one", what_, at);
    }
    next_ += size_;
  }

  const ByteSource& source_;
  std::uint64_t next_, end_, start_;
  std::string_view what_;
  std::vector<char> buffer_;
  std::size_t at_ = 0, size_ = 0;
};

// The single-pass input iterator nlohmann's iterator adapter reads through.
class ChunkIterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = char;

  ChunkIterator() = default;
  explicit ChunkIterator(ChunkReader* reader) : reader_(reader) {}
  char operator*() const { return reader_->current(); }
  ChunkIterator& operator++() {
    reader_->advance();
    return *this;
  }
  ChunkIterator operator++(int) {
    ChunkIterator before = *this;
    reader_->advance();
    return before;
  }
  bool operator==(const ChunkIterator& other) const { return at_end() == other.at_end(); }

 private:
  bool at_end() const { return reader_ == nullptr || reader_->done(); }
  ChunkReader* reader_ = nullptr;
};

}  // namespace

void check_json_bytes(std::string_view text, std::string_view what) {
  if (text.starts_with(kBom)) fail_input("{}: starts with a UTF-8 byte order mark, which JSON does not allow", what);
  if (const auto nul = text.find('\0'); nul != std::string_view::npos) {
    fail_input("{}: NUL byte at byte {}; JSON text cannot contain one", what, nul);
  }
}

bool StrictSax::binary(binary_t&) { fail_input("{}: binary values are not JSON", what_); }

bool StrictSax::parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex) {
  fail_input("{}: invalid JSON at byte {}: {}", what_, position, ex.what());
}

void StrictSax::finish() const {
  if (!rejection_.empty()) throw Error(ErrorKind::InvalidInput, rejection_);
}

void StrictSax::enter() {
  if (++depth_ > kMaxJsonDepth) fail_input("{}: JSON nested deeper than {} levels", what_, kMaxJsonDepth);
}

void parse_json_stream(const ByteSource& source, std::uint64_t offset, std::uint64_t length,
                       nlohmann::json_sax<Json>& handler, std::string_view what) {
  ChunkReader reader(source, offset, length, what);
  Json::sax_parse(ChunkIterator(&reader), ChunkIterator(), &handler, nlohmann::detail::input_format_t::json, true);
}

void parse_json_text(std::string_view text, nlohmann::json_sax<Json>& handler, std::string_view what) {
  const MemorySource source(text);
  parse_json_stream(source, 0, text.size(), handler, what);
}

void MemorySource::read_at(std::uint64_t offset, std::span<std::byte> out) const {
  if (offset > bytes_.size() || out.size() > bytes_.size() - offset) {
    fail_input("read of {} bytes at {} past the end of {} bytes", out.size(), offset, bytes_.size());
  }
  std::memcpy(out.data(), bytes_.data() + offset, out.size());
}

}  // namespace mx2nv

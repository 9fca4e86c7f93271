#include "sys/read_buffer.hpp"

#include "common/error.hpp"

#include <sys/mman.h>

#include <new>

namespace mx2nv {
namespace {

constexpr std::size_t kHugePage = std::size_t{2} << 20;

}  // namespace

std::span<std::byte> ReadBuffer::reserve(std::uint64_t n) {
  if (n > capacity_) {
    // Under a megabyte a direct read's pages are few enough for one request
    // (a device takes a few hundred segments): plain pages, no huge page
    // made resident for a module's scales. Callers read chunks of megabytes
    // (stream_chunk_bytes): the round-ups cannot overflow.
    const std::size_t align = n >= kHugePage / 2 ? kHugePage : kDirectAlignment;
    const std::size_t bytes = static_cast<std::size_t>((n + align - 1) / align * align);
    memory_.reset();
    capacity_ = 0;
    memory_.reset(static_cast<std::byte*>(std::aligned_alloc(align, bytes)));
    if (!memory_) throw std::bad_alloc();
    if (align == kHugePage) (void)::madvise(memory_.get(), bytes, MADV_HUGEPAGE);  // advice: ignored without THP
    capacity_ = bytes;
  }
  return {memory_.get(), static_cast<std::size_t>(n)};
}

std::span<const std::byte> ReadBuffer::read(const File& file, std::uint64_t offset, std::uint64_t n) {
  const auto out = reserve(n);
  file.read_at(offset, out);
  return out;
}

std::optional<std::span<const std::byte>> ReadBuffer::read_direct(const File& file, std::uint64_t offset,
                                                                  std::uint64_t n) {
  // A range inside a file whose size was checked (below 2^63): no overflow.
  const std::uint64_t end = offset + n;
  const std::uint64_t first = offset / kDirectAlignment * kDirectAlignment;
  const std::uint64_t last = (end + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
  const auto span = reserve(last - first);
  const std::optional<std::size_t> got = file.read_direct(first, span);
  if (!got) return std::nullopt;
  if (first + *got < end) {
    // Sizes were validated against the file when it was opened: it shrank.
    fail(ErrorKind::Io, "{}: unexpected end of file at byte {} (file changed while reading?)", file.path().string(),
         first + *got);
  }
  return std::span<const std::byte>(
      span.subspan(static_cast<std::size_t>(offset - first), static_cast<std::size_t>(n)));
}

}  // namespace mx2nv

#include "sys/read_buffer.hpp"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

namespace mx2nv {
namespace {

constexpr std::size_t kHugePage = std::size_t{2} << 20;

std::uint64_t round_up(std::uint64_t n, std::uint64_t to) { return (n + to - 1) / to * to; }

// `bytes` (a multiple of kHugePage) at a kHugePage boundary: a mapping of
// one huge page more, its ends cut off.
std::byte* map_aligned(std::size_t bytes) {
  void* p = ::mmap(nullptr, bytes + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  const auto start = reinterpret_cast<std::uintptr_t>(p);
  const auto aligned = static_cast<std::uintptr_t>(round_up(start, kHugePage));
  if (aligned > start) ::munmap(p, aligned - start);
  const std::uintptr_t tail = aligned + bytes;
  if (start + bytes + kHugePage > tail) ::munmap(reinterpret_cast<void*>(tail), start + bytes + kHugePage - tail);
  auto* data = reinterpret_cast<std::byte*>(aligned);
  (void)::madvise(data, bytes, MADV_HUGEPAGE);  // advice: a kernel without THP ignores it
  return data;
}

}  // namespace

ReadBuffer::~ReadBuffer() { release(); }

void ReadBuffer::release() {
  if (!data_) return;
  if (mapped_) {
    ::munmap(data_, capacity_);
  } else {
    std::free(data_);
  }
  data_ = nullptr;
  capacity_ = 0;
}

std::span<std::byte> ReadBuffer::reserve(std::uint64_t n) {
  if (n > capacity_) {
    // Callers read chunks of at most megabytes (stream_chunk_bytes): the
    // round-ups cannot overflow.
    release();
    const auto wanted = static_cast<std::size_t>(n);
    // A chunk of 2 MiB less two pages (stream_chunk_bytes) with its pages
    // around it is mapped too; one of 1 MiB is not (2 MiB for it would be waste).
    mapped_ = wanted + 2 * kDirectAlignment >= kHugePage;
    const auto bytes = static_cast<std::size_t>(round_up(wanted, mapped_ ? kHugePage : kDirectAlignment));
    if (mapped_) {
      data_ = map_aligned(bytes);
    } else {
      data_ = static_cast<std::byte*>(std::aligned_alloc(kDirectAlignment, bytes));
      if (!data_) throw std::bad_alloc();
    }
    capacity_ = bytes;
  }
  return {data_, static_cast<std::size_t>(n)};
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
  const std::uint64_t last = round_up(end, kDirectAlignment);
  const auto span = reserve(last - first);
  const std::optional<std::size_t> got = file.read_direct(first, span);
  if (!got) return std::nullopt;
  if (first + *got < end) fail_shrunk(file.path(), first + *got);
  return std::span<const std::byte>(
      span.subspan(static_cast<std::size_t>(offset - first), static_cast<std::size_t>(n)));
}

}  // namespace mx2nv

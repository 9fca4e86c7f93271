// A worker's buffer for the ranges it reads one at a time (verify and
// compare read a module's tensors from both trees), kept from one range to
// the next: allocating megabytes per range would cost page faults on each.
//
// Its memory suits direct reads (File::read_direct): page-aligned, and from
// 2 MiB on mapped on its own, aligned to 2 MiB and asked for in huge pages
// (MADV_HUGEPAGE). A direct read's request is made of one segment per
// physically contiguous run of the buffer, and a device takes a bounded
// number of segments: in 4 KiB pages a request may stop near a megabyte, in
// 2 MiB pages it can reach the device's largest (where the kernel has no
// huge page to give, reads are as correct, in smaller requests).
#pragma once

#include "sys/file.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace mx2nv {

class ReadBuffer {
 public:
  ReadBuffer() = default;
  ~ReadBuffer();
  ReadBuffer(const ReadBuffer&) = delete;
  ReadBuffer& operator=(const ReadBuffer&) = delete;

  // The n bytes of `file` at `offset`, through the page cache.
  std::span<const std::byte> read(const File& file, std::uint64_t offset, std::uint64_t n);
  // The same past the page cache: the aligned range around them read
  // direct, the n bytes a view into it. nullopt where the file cannot be
  // read so (File::read_direct); the buffer's contents are then undefined.
  std::optional<std::span<const std::byte>> read_direct(const File& file, std::uint64_t offset, std::uint64_t n);
  std::size_t capacity() const { return capacity_; }

 private:
  std::span<std::byte> reserve(std::uint64_t n);
  void release();

  std::byte* data_ = nullptr;
  std::size_t capacity_ = 0;
  bool mapped_ = false;  // mmap'd (2 MiB and more), else aligned_alloc'd
};

}  // namespace mx2nv

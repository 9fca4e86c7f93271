// A worker's buffer for the ranges it reads one at a time (verify and
// compare read a module's tensors from both trees), kept from one range to
// the next: allocating megabytes per range would cost page faults on each.
//
// Its memory suits direct reads (File::read_direct): aligned to 2 MiB and
// asked for in huge pages (MADV_HUGEPAGE). A direct read's request is made
// of one segment per physically contiguous run of the buffer, and a device
// takes a bounded number of segments: in 4 KiB pages a request would stop
// near a megabyte, in 2 MiB pages it reaches the device's largest (where the
// kernel has no huge page to give, reads are as correct, in smaller requests).
#pragma once

#include "sys/file.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <span>

namespace mx2nv {

class ReadBuffer {
 public:
  // The n bytes of `file` at `offset`, through the page cache.
  std::span<const std::byte> read(const File& file, std::uint64_t offset, std::uint64_t n);
  // The same past the page cache: the aligned range around them read
  // direct, the n bytes a view into it. nullopt where the file cannot be
  // read so (File::read_direct), having read nothing.
  std::optional<std::span<const std::byte>> read_direct(const File& file, std::uint64_t offset, std::uint64_t n);

 private:
  std::span<std::byte> reserve(std::uint64_t n);

  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> memory_;
  std::size_t capacity_ = 0;
};

}  // namespace mx2nv

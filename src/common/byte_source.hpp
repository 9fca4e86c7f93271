// Positional reads, abstracted so the core can scan tensors without owning
// files: the I/O layer implements it over file descriptors, tests over memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace mx2nv {

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Fills `out` with the bytes at absolute `offset`; throws Error on failure.
  virtual void read_at(std::uint64_t offset, std::span<std::byte> out) const = 0;
};

}  // namespace mx2nv

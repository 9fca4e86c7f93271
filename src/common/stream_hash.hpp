// XXH3-64 over a byte stream (libxxhash), RAII-wrapped.
#pragma once

#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <new>
#include <span>

namespace mx2nv {

class StreamHash {
 public:
  StreamHash() : state_(XXH3_createState()) {
    if (state_ == nullptr) throw std::bad_alloc();
    XXH3_64bits_reset(state_);
  }
  ~StreamHash() { XXH3_freeState(state_); }
  StreamHash(const StreamHash&) = delete;
  StreamHash& operator=(const StreamHash&) = delete;
  void update(std::span<const std::byte> bytes) { XXH3_64bits_update(state_, bytes.data(), bytes.size()); }
  std::uint64_t digest() const { return XXH3_64bits_digest(state_); }

 private:
  XXH3_state_t* state_;
};

}  // namespace mx2nv

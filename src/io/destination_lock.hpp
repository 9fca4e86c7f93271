// One converter per destination. The lock is an flock(2) on DST/.mx2nv/lock:
// the kernel drops it when its holder dies, however it dies, so a lock file
// left by a killed run is recognised as stale and taken over.
#pragma once

#include "io/file.hpp"

#include <string>

namespace mx2nv {

inline constexpr std::string_view kStateDirName = ".mx2nv";

class DestinationLock {
 public:
  // Throws Error(Usage) naming the holder's pid when another process holds it.
  explicit DestinationLock(const fs::path& destination);
  ~DestinationLock();
  DestinationLock(const DestinationLock&) = delete;
  DestinationLock& operator=(const DestinationLock&) = delete;
  // Removes the lock file (when the state directory goes away with it).
  void release_and_remove() noexcept;

 private:
  int fd_ = -1;
  fs::path path_;
};

}  // namespace mx2nv

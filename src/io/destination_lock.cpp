#include "io/destination_lock.hpp"

#include "core/error.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace mx2nv {

DestinationLock::DestinationLock(const fs::path& destination) : path_(destination / kStateDirName / "lock") {
  // A finishing converter removes the state directory; if that happens
  // between our mkdir and our open, try again.
  for (int attempt = 0; fd_ < 0; ++attempt) {
    std::error_code ec;
    fs::create_directories(path_.parent_path(), ec);
    if (ec) fail(ErrorKind::Io, "{}: create directory: {}", path_.parent_path().string(), ec.message());
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0 && (errno != ENOENT || attempt >= 3)) fail_io(path_, "open lock", errno);
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char pid[32] = {};
    const ssize_t n = ::pread(fd_, pid, sizeof pid - 1, 0);
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK) {
      fail(ErrorKind::Usage, "{} is being written by another mx2nv (pid {}); refusing to run concurrently",
           destination.string(), n > 0 ? std::string(pid, static_cast<std::size_t>(n)) : "unknown");
    }
    fail_io(path_, "lock", err);
  }
  // We hold it; whatever pid the file named before is gone (stale lock).
  const std::string me = std::to_string(::getpid());
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    fail_io(path_, "write lock", errno);
  }
}

DestinationLock::~DestinationLock() {
  if (fd_ >= 0) ::close(fd_);  // closing drops the flock
}

void DestinationLock::release_and_remove() noexcept {
  std::error_code ec;
  fs::remove(path_, ec);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

}  // namespace mx2nv

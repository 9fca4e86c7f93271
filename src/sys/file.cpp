#include "sys/file.hpp"

#include "common/error.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>

namespace mx2nv {
namespace {

// RWF_DONTCACHE (uapi linux/fs.h since Linux 6.14), spelled out for older headers.
constexpr int kReadDontCache = 0x00000080;
// Cleared at the first refusal (an older kernel, or a file system without it):
// a hint is not worth a refused call before every read.
std::atomic<bool> dontcache_reads{true};
// cachestat(2) (Linux 6.5): 451 in the table most architectures share,
// spelled out for older headers; none elsewhere. Cleared when the kernel
// lacks it; a refusal for one file (EPERM: a file the caller may not
// write, on kernels that ask) says nothing of the next.
#if defined(SYS_cachestat)
constexpr long kCachestatSyscall = SYS_cachestat;
#elif defined(__x86_64__) || defined(__aarch64__) || defined(__i386__) || defined(__arm__) || defined(__riscv) || \
    defined(__powerpc64__) || defined(__s390x__) || defined(__loongarch64)
constexpr long kCachestatSyscall = 451;
#else
constexpr long kCachestatSyscall = -1;
#endif
struct CachestatRange {
  std::uint64_t offset, length;
};
struct Cachestat {
  std::uint64_t cache, dirty, writeback, evicted, recently_evicted;
};
std::atomic<bool> cachestat_works{kCachestatSyscall >= 0};
// overlayfs (OVERLAYFS_SUPER_MAGIC): cachestat sees the overlay's own
// mapping, never the lower file's pages, so it would call a cached file
// uncached.
constexpr unsigned long kOverlayMagic = 0x794c7630;
// procfs (PROC_SUPER_MAGIC): File::read_direct reopens through its links.
constexpr unsigned long kProcMagic = 0x9fa0;

}  // namespace

void fail_io(const fs::path& path, const char* operation, int error_number) {
  fail(ErrorKind::Io, "{}: {}: {}", path.string(), operation, std::strerror(error_number));
}

void fail_shrunk(const fs::path& path, std::uint64_t at) {
  fail(ErrorKind::Io, "{}: unexpected end of file at byte {} (file changed while reading?)", path.string(), at);
}

File File::open_read(const fs::path& path) {
  // O_NONBLOCK: a FIFO planted in a hostile checkpoint must not block the
  // open; it is refused below. Regular files ignore the flag.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail_io(path, "open for reading", errno);
  File f(fd, path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail_io(path, "stat", errno);
  if (!S_ISREG(st.st_mode)) fail(ErrorKind::InvalidInput, "{}: not a regular file", path.string());
  return f;
}

File File::create_new(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail_io(path, "create", errno);
  return File(fd, path);
}

namespace {

File checked_regular(File f, const fs::path& path) {
  struct stat st {};
  if (::fstat(f.fd(), &st) != 0) fail_io(path, "stat", errno);
  if (!S_ISREG(st.st_mode)) fail(ErrorKind::InvalidInput, "{}: not a regular file", path.string());
  return f;
}

}  // namespace

File File::open_read_at(int directory_fd, const std::string& name, fs::path display) {
  const int fd = ::openat(directory_fd, name.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  if (fd < 0) fail_io(display, errno == ELOOP ? "open for reading (a symbolic link)" : "open for reading", errno);
  return checked_regular(File(fd, display), display);
}

File File::create_new_at(int directory_fd, const std::string& name, fs::path display) {
  // Readable too: a shard writer reads back bytes it wrote ahead of their turn.
  const int fd = ::openat(directory_fd, name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) fail_io(display, "create", errno);
  return File(fd, std::move(display));
}

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

File::File(File&& other) noexcept
    : fd_(other.fd_),
      direct_fd_(other.direct_fd_.exchange(kDirectUntried)),
      direct_refused_(other.direct_refused_.load()),
      drop_behind_(other.drop_behind_),
      path_(std::move(other.path_)) {
  other.fd_ = -1;
}

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    close_direct();
    fd_ = other.fd_;
    direct_fd_.store(other.direct_fd_.exchange(kDirectUntried));
    direct_refused_.store(other.direct_refused_.load());
    drop_behind_ = other.drop_behind_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
  close_direct();
}

void File::close_direct() {
  const int fd = direct_fd_.exchange(kDirectUntried);
  if (fd >= 0) ::close(fd);
}

std::uint64_t File::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail_io(path_, "stat", errno);
  return static_cast<std::uint64_t>(st.st_size);
}

ssize_t File::read_some(std::uint64_t offset, std::span<std::byte> out) const {
  if (drop_behind_ && dontcache_reads.load(std::memory_order_relaxed)) {
    iovec v{out.data(), out.size()};
    const ssize_t n = ::preadv2(fd_, &v, 1, static_cast<off_t>(offset), kReadDontCache);
    // A kernel or file system without it refuses the flag before reading
    // (a sandbox may refuse preadv2 itself); pread then reports any real error.
    if (n >= 0 || (errno != EOPNOTSUPP && errno != EINVAL && errno != ENOSYS && errno != EPERM)) return n;
    dontcache_reads.store(false, std::memory_order_relaxed);
  }
  return ::pread(fd_, out.data(), out.size(), static_cast<off_t>(offset));
}

void File::read_at(std::uint64_t offset, std::span<std::byte> out) const {
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = read_some(offset + done, out.subspan(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_io(path_, "read", errno);
    }
    if (n == 0) fail_shrunk(path_, offset + done);
    done += static_cast<std::size_t>(n);
  }
}

std::optional<bool> File::cached(std::uint64_t offset, std::uint64_t length) const {
  if (length == 0) return true;
  if (!cachestat_works.load(std::memory_order_relaxed)) return std::nullopt;
  struct statfs fs {};
  if (::fstatfs(fd_, &fs) != 0 || static_cast<unsigned long>(fs.f_type) == kOverlayMagic) return std::nullopt;
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const CachestatRange range{offset, length};
  Cachestat stat{};
  if (::syscall(kCachestatSyscall, fd_, &range, &stat, 0U) != 0) {
    if (errno == ENOSYS) cachestat_works.store(false, std::memory_order_relaxed);
    return std::nullopt;
  }
  const std::uint64_t pages = (offset + length + page - 1) / page - offset / page;
  return stat.cache >= pages;
}

int File::direct_descriptor() const {
  const int known = direct_fd_.load(std::memory_order_acquire);
  if (known != kDirectUntried) return known;
  // A new open file description of the same file (the descriptor's own flags
  // stay as they are, for the buffered reads that share it), checked to be
  // the same file: /proc's link names the open file, not a path in SRC or
  // DST, where /proc is the kernel's own.
  const std::string link = "/proc/self/fd/" + std::to_string(fd_);
  struct statfs proc {};
  int fd = -1;
  if (::statfs("/proc/self", &proc) == 0 && static_cast<unsigned long>(proc.f_type) == kProcMagic) {
    fd = ::open(link.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC | O_NONBLOCK);
    // Out of descriptors or memory for now: buffered this time, asked again next.
    if (fd < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == EINTR)) return kDirectNone;
  }
  struct stat mine {}, theirs {};
  if (fd >= 0 && (::fstat(fd, &theirs) != 0 || ::fstat(fd_, &mine) != 0 || mine.st_dev != theirs.st_dev ||
                  mine.st_ino != theirs.st_ino || !S_ISREG(theirs.st_mode))) {
    ::close(fd);
    fd = -1;
  }
  int expected = kDirectUntried;
  if (direct_fd_.compare_exchange_strong(expected, fd < 0 ? kDirectNone : fd, std::memory_order_acq_rel)) {
    return fd < 0 ? kDirectNone : fd;
  }
  if (fd >= 0) ::close(fd);  // another thread's call opened it first
  return expected;
}

std::optional<std::size_t> File::read_direct(std::uint64_t offset, std::span<std::byte> out) const {
  if (direct_refused_.load(std::memory_order_relaxed)) return std::nullopt;
  const int fd = direct_descriptor();
  if (fd < 0) return std::nullopt;
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      // The file system or the device refuses direct reads, or this
      // alignment: buffered reads from now on (the descriptor stays open
      // until the file closes, as another thread may be reading through it).
      if (errno == EINVAL || errno == EOPNOTSUPP || errno == ENOTSUP) {
        direct_refused_.store(true, std::memory_order_relaxed);
        return std::nullopt;
      }
      fail_io(path_, "read", errno);
    }
    done += static_cast<std::size_t>(n);
    // The end of the file (a short read leaves the next offset unaligned,
    // which some file systems refuse rather than report the end).
    if (n == 0 || done % kDirectAlignment != 0) break;
  }
  return done;
}

void File::write_at(std::uint64_t offset, std::span<const std::byte> data) const {
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::pwrite(fd_, data.data() + done, data.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_io(path_, "write", errno);
    }
    done += static_cast<std::size_t>(n);
  }
}

void File::start_writeback(std::uint64_t offset, std::uint64_t length) const {
  (void)::sync_file_range(fd_, static_cast<off_t>(offset), static_cast<off_t>(length), SYNC_FILE_RANGE_WRITE);
}

void File::set_size(std::uint64_t size) const {
  while (::ftruncate(fd_, static_cast<off_t>(size)) != 0) {
    if (errno != EINTR) fail_io(path_, "set size", errno);
  }
}

void File::sync() const {
  if (::fsync(fd_) != 0) fail_io(path_, "fsync", errno);
}

void File::close() {
  close_direct();
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail_io(path_, "close", errno);
}

void File::advise_sequential() const { (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL); }

void File::set_cache_use(CacheUse use) {
  (void)::posix_fadvise(fd_, 0, 0, use == CacheUse::Normal ? POSIX_FADV_NORMAL : POSIX_FADV_RANDOM);
  drop_behind_ = use == CacheUse::Passing;
}

std::string read_text_file(const fs::path& path, std::uint64_t max_bytes) {
  return read_text_file(File::open_read(path), max_bytes);
}

std::string read_text_file(const File& f, std::uint64_t max_bytes) {
  const std::uint64_t size = f.size();
  if (size > max_bytes) {
    fail(ErrorKind::InvalidInput, "{}: {} bytes exceeds the {} byte limit for this file", f.path().string(), size,
         max_bytes);
  }
  std::string text(static_cast<std::size_t>(size), '\0');
  f.read_at(0, std::as_writable_bytes(std::span(text)));
  return text;
}

void fsync_directory(int directory_fd, const fs::path& display) {
  if (::fsync(directory_fd) != 0) fail_io(display, "fsync directory", errno);
}

void fsync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail_io(dir, "open directory", errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) fail_io(dir, "fsync directory", err);
}

}  // namespace mx2nv

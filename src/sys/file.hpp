// File descriptors with RAII and positional, retrying reads and writes. Every
// failure becomes Error(Io) naming the path and the operation.
#pragma once

#include "common/byte_source.hpp"

#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace mx2nv {

// The buffer of every streamed copy and scan: small enough to stay in cache
// between the read and the write (bench/benchmark.py compares it with 8 MiB).
inline constexpr std::size_t kCopyBufferBytes = 1 << 20;

// What File::read_direct asks of offsets, lengths and memory: 4 KiB, a
// multiple of the logical block size of the disks this runs on (a file
// system that asks more refuses the read, and reads go through the cache).
inline constexpr std::uint64_t kDirectAlignment = 4096;

// Passes that compare two trees range by range (verify, compare) read each
// range in chunks of at most this size, one buffer per tree and worker: 8
// MiB with up to four workers (a K3 expert's tensor, 5.5 MiB, in one read),
// 32 MiB shared among more, never under 1 MiB; each a power of two less the
// two pages a direct read may add around it, so that such a read fills a
// ReadBuffer of that power of two (sys/read_buffer.hpp), not the next.
inline constexpr std::uint64_t kStreamBuffersBytes = 32 << 20;
inline constexpr std::uint64_t stream_chunk_bytes(unsigned workers) {
  const std::uint64_t share = kStreamBuffersBytes / std::max(1u, workers);
  return std::bit_floor(std::clamp<std::uint64_t>(share, 1 << 20, 8 << 20)) - 2 * kDirectAlignment;
}

namespace fs = std::filesystem;

// How a file's reads use the page cache. Random and Passing are for a pass
// that reads a little of each region of a file (a module's scales, a few of
// its groups) before another pass reads more of it.
enum class CacheUse {
  Normal,  // the kernel's readahead; pages stay cached
  // Only what is asked (the random-access hint: no readahead); pages stay
  // cached. Where the next pass reads those same ranges again.
  Random,
  // Only what is asked, and pages a read brings in are dropped once copied
  // out (RWF_DONTCACHE, Linux 6.14 and later; an older kernel keeps them);
  // pages already cached stay. Where the next pass streams the whole file:
  // what a scan left cached would break that stream into the short requests
  // of a readahead that restarts after every cached island.
  Passing,
};

[[noreturn]] void fail_io(const fs::path& path, const char* operation, int error_number);
// Error(Io) for a file that ended at `at`, before a range its size, checked
// when it was opened, promised: it shrank while being read.
[[noreturn]] void fail_shrunk(const fs::path& path, std::uint64_t at);

class File {
 public:
  File() = default;
  static File open_read(const fs::path& path);
  // Creates a new file; refuses to replace one that exists (O_EXCL).
  static File create_new(const fs::path& path);
  // The same relative to an open directory, never following a symlink in
  // `name` (O_NOFOLLOW): how everything inside DST is opened. `display` names
  // the file in errors.
  static File open_read_at(int directory_fd, const std::string& name, fs::path display);
  static File create_new_at(int directory_fd, const std::string& name, fs::path display);
  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  std::uint64_t size() const;
  void read_at(std::uint64_t offset, std::span<std::byte> out) const;
  // Whether the page cache holds all of [offset, offset + length), asking
  // without reading (cachestat, Linux 6.5); nullopt where the kernel cannot
  // tell (an older kernel, a file the caller may not write on kernels that
  // refuse those, overlayfs, which reports its lower files uncached).
  std::optional<bool> cached(std::uint64_t offset, std::uint64_t length) const;
  // Reads [offset, offset + out.size()) past the page cache (O_DIRECT, on a
  // second descriptor of the same file, opened at the first call): offset,
  // out.data() and out.size() multiples of kDirectAlignment. The bytes read,
  // fewer only at the end of the file; nullopt where the file cannot be read
  // so (no procfs, a file system or alignment that refuses O_DIRECT), and
  // from then on for this file (but for a reopen refused for want of
  // descriptors or memory, asked again at the next call). Pages of the range
  // that are cached but not yet written are written first (the kernel's
  // rule), so the bytes are the file's either way.
  std::optional<std::size_t> read_direct(std::uint64_t offset, std::span<std::byte> out) const;
  void write_at(std::uint64_t offset, std::span<const std::byte> data) const;
  void sync() const;
  // Starts asynchronous writeback of a written range (sync_file_range), so
  // the closing fsync finds little left to do and disk writes overlap the
  // copying instead of trailing it. Advisory: errors surface at fsync.
  void start_writeback(std::uint64_t offset, std::uint64_t length) const;
  // Sets the file's size (ftruncate): a new output is sized before its
  // ranges are written, shared or copied in any order.
  void set_size(std::uint64_t size) const;
  void close();  // reports errors that a destructor would have to swallow
  const fs::path& path() const { return path_; }
  // The sequential-access hint: shards are streamed front to back.
  void advise_sequential() const;
  // How reads from now on use the page cache (CacheUse). Set before the
  // file is shared.
  void set_cache_use(CacheUse use);
  int fd() const { return fd_; }

 private:
  File(int fd, fs::path path) : fd_(fd), path_(std::move(path)) {}
  ssize_t read_some(std::uint64_t offset, std::span<std::byte> out) const;
  int direct_descriptor() const;
  void close_direct();
  int fd_ = -1;
  // read_direct's descriptor: kDirectUntried until its first call, then the
  // descriptor or kDirectNone.
  static constexpr int kDirectUntried = -2, kDirectNone = -1;
  mutable std::atomic<int> direct_fd_{kDirectUntried};
  mutable std::atomic<bool> direct_refused_{false};  // an EINVAL: buffered reads from then on
  bool drop_behind_ = false;  // CacheUse::Passing
  fs::path path_;
};

class FileSource final : public ByteSource {
 public:
  explicit FileSource(const File& file) : file_(&file) {}
  void read_at(std::uint64_t offset, std::span<std::byte> out) const override { file_->read_at(offset, out); }

 private:
  const File* file_;
};

// Reads [offset, offset + length) of `file` through `buffer`, calling
// visit(chunk, position) with position relative to `offset`.
template <typename Visit>
void read_in_chunks(const File& file, std::uint64_t offset, std::uint64_t length, std::span<std::byte> buffer,
                    Visit&& visit) {
  for (std::uint64_t done = 0; done < length; done += buffer.size()) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), length - done));
    file.read_at(offset + done, buffer.first(n));
    visit(std::span<const std::byte>(buffer.first(n)), done);
  }
}

// An owned file descriptor (directories inside DST).
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Whole small file (config.json, index) with a size cap before allocation.
std::string read_text_file(const fs::path& path, std::uint64_t max_bytes);
std::string read_text_file(const File& file, std::uint64_t max_bytes);
void fsync_directory(const fs::path& dir);
void fsync_directory(int directory_fd, const fs::path& display);

}  // namespace mx2nv

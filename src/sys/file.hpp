// File descriptors with RAII and positional, retrying reads and writes. Every
// failure becomes Error(Io) naming the path and the operation.
#pragma once

#include "common/byte_source.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

namespace mx2nv {

// The buffer of every streamed copy and scan: small enough to stay in cache
// between the read and the write (bench/benchmark.py compares it with 8 MiB).
inline constexpr std::size_t kCopyBufferBytes = 1 << 20;

namespace fs = std::filesystem;

[[noreturn]] void fail_io(const fs::path& path, const char* operation, int error_number);

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
  // Asks the kernel to start reading [offset, offset + length) now
  // (POSIX_FADV_WILLNEED), so the read that follows finds it or waits less:
  // a reader of several ranges keeps the disk busy while it computes.
  // Advisory: errors are ignored; nothing is read into this process.
  void prefetch(std::uint64_t offset, std::uint64_t length) const;
  int fd() const { return fd_; }

 private:
  File(int fd, fs::path path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
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

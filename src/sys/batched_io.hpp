// Many small positional reads and writes served by a few large ones.
//
// A checkpoint of many small tensors (thousands a shard, most of them a few
// KiB) would otherwise cost a system call per tensor read and per tensor
// written, and then those calls, not the bytes, are the conversion's time. Real
// expert tensors (MiBs) pass straight through both: nothing is batched that
// is larger than kMaxBatchedRead, and a write larger than the buffer is
// written directly.
#pragma once

#include "sys/file.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

namespace mx2nv {

struct ByteRange {
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

// Reads at most this large are batched; larger ones go to the file directly.
inline constexpr std::uint64_t kMaxBatchedRead = 64 << 10;

// Serves a known sequence of small reads from one file. A read that misses
// the current window reads a new one starting at it and extended over the
// following requests while the gaps stay small: a gap is read only when it
// is at most kMergeGap bytes (the kernel's readahead has those pages in
// memory anyway, and copying 8 KiB costs about one system call) or no larger
// than the useful bytes already in the window, so no more than about twice
// the requested bytes are ever read. Windows never exceed kWindowBytes.
class BatchedReader {
 public:
  static constexpr std::uint64_t kMergeGap = 8 << 10;
  static constexpr std::uint64_t kWindowBytes = 1 << 20;

  // `ranges`: every read to come, in the order next() will be called (meant
  // for ranges of at most kMaxBatchedRead bytes; a longer one gets a window
  // of its own).
  BatchedReader(const File& file, std::vector<ByteRange> ranges);

  // The bytes of the next range, valid until the next call; empty past the
  // last range.
  std::span<const std::byte> next();

  std::size_t reads() const { return reads_; }  // system calls made (tests)

 private:
  void fill_window(std::size_t first);

  const File& file_;
  std::vector<ByteRange> ranges_;
  std::size_t next_ = 0;
  std::vector<std::byte> window_;
  std::uint64_t window_offset_ = 0;
  std::uint64_t window_size_ = 0;
  std::size_t reads_ = 0;
};

// Gathers writes that continue each other into one buffer and writes it when
// a write does not continue it, when it is full, or at flush(). Writes at
// least as large as the buffer bypass it. `on_written(offset, length)` is told
// every range that reached the file (writeback kicks).
class CoalescingWriter {
 public:
  using Written = std::function<void(std::uint64_t offset, std::uint64_t length)>;
  CoalescingWriter(const File& file, std::size_t capacity, Written on_written = {});
  void write(std::uint64_t offset, std::span<const std::byte> bytes);
  void flush();

  std::size_t writes() const { return writes_; }  // system calls made (tests)

 private:
  void write_through(std::uint64_t offset, std::span<const std::byte> bytes);

  const File& file_;
  std::unique_ptr<std::byte[]> buffer_;  // not zeroed: bytes are copied in before they are written
  std::size_t capacity_ = 0;
  std::size_t used_ = 0;
  std::uint64_t buffer_offset_ = 0;
  Written on_written_;
  std::size_t writes_ = 0;
};

}  // namespace mx2nv

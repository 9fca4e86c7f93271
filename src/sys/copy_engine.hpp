// Moving unchanged bytes from a source shard into an output file, cheapest
// first: share them (FICLONERANGE: the output's blocks become references to
// the source's extents on XFS, btrfs, bcachefs, ZFS >= 2.2, ...), let the
// kernel copy them (copy_file_range: server-side on NFS 4.2 and SMB, in-kernel
// elsewhere, and itself a reflink on some file systems), or stream them
// through a buffer. Every method leaves the same bytes in the output.
//
// Sharing works on whole file-system blocks whose source and destination
// offsets agree modulo the block size (plan/target_layout.hpp arranges that);
// the partial blocks at either end of a range are copied.
#pragma once

#include "common/choice.hpp"

#include "sys/file.hpp"

#include <atomic>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace mx2nv {

// `--copy`: auto = the best the file systems offer; reflink = share or fail
// (exit 2, checked before anything is written); copy = read and write every
// byte through mx2nv, never sharing (like `cp --reflink=never`).
enum class CopyMode { Auto, Reflink, Copy };
template <>
std::span<const Choice<CopyMode>> choices<CopyMode>();  // --copy

// The methods, best first. An engine starts at the best its mode allows and
// falls back for good when the file system refuses one (Auto only). After a
// refused clone it skips KernelCopy on a local file system, where
// copy_file_range is the kernel's own read/write loop (see copy_engine.cpp).
enum class CopyMethod { Clone, KernelCopy, Stream };

// Where the bytes of a transfer went.
struct TransferTally {
  std::uint64_t shared = 0;  // cloned: no new data blocks
  std::uint64_t copied = 0;  // duplicated by the kernel or through mx2nv's buffer
};

class CopyEngine {
 public:
  explicit CopyEngine(CopyMode mode);
  // Starts at `best`; with `require_clone` a failed clone is an error
  // instead of a fallback (CopyMode::Reflink). Tests force each method here.
  CopyEngine(CopyMethod best, bool require_clone);

  // Copies [src_offset, src_offset + length) of `from` to `dst_offset` of
  // `to`, sharing what can be shared. `buffer` serves the streaming copy.
  // Thread-safe; one engine serves every shard of a conversion (one
  // destination file system).
  void transfer(const File& from, std::uint64_t src_offset, const File& to, std::uint64_t dst_offset,
                std::uint64_t length, std::span<std::byte> buffer, TransferTally& tally);

  // The best method still in use (after any fallback).
  CopyMethod method() const { return method_.load(std::memory_order_relaxed); }

  // Told up front that files like `to` cannot share extents with the source
  // (probe_sharing said No): falls back as a refused clone would, so a
  // writer knows before its first transfer whether bytes will be read.
  // Ignored with `require_clone` (sharing was checked before any write).
  void sharing_refused(const File& to);
  // Whether a clone has succeeded in this engine's run.
  bool has_shared() const { return shared_.load(std::memory_order_relaxed); }

  // For CopyMode::Reflink, before anything is written: can files in
  // `destination_dir` share extents with `source`? Throws Error(Usage) naming
  // the reason when they cannot. Uses an unnamed temporary file (O_TMPFILE),
  // so nothing is left behind.
  static void require_sharing(const File& source, const fs::path& destination_dir);
  // The same for the directory open as `destination_dir_fd` (`shown` in messages).
  static void require_sharing(const File& source, int destination_dir_fd, const fs::path& shown);
  // The same question without an error: Yes, No (the clone was refused as
  // unsupported, as a transfer's would be), or Unknown (no unnamed temporary
  // file could be made there, or the clone failed otherwise: a transfer
  // finds out).
  enum class Sharing { Yes, No, Unknown };
  static Sharing probe_sharing(const File& source, int destination_dir_fd);

 private:
  // One attempt per method; false means "fall back" (the engine has moved on).
  bool clone(const File& from, std::uint64_t src_offset, const File& to, std::uint64_t dst_offset,
             std::uint64_t length, TransferTally& tally);
  bool kernel_copy(const File& from, std::uint64_t src_offset, const File& to, std::uint64_t dst_offset,
                   std::uint64_t length, TransferTally& tally);
  void fall_back(CopyMethod from, const File& to);

  std::atomic<CopyMethod> method_;
  std::atomic<bool> shared_{false};
  bool require_clone_ = false;
  std::atomic<std::uint64_t> granularity_{0};  // of the destination; 0 until the first transfer
};

// The block size sharing must respect for files on `file`'s file system.
std::uint64_t share_granularity(const File& file);

}  // namespace mx2nv

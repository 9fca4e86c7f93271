#include "sys/copy_engine.hpp"

#include "common/cancel.hpp"
#include "common/error.hpp"

#include <fcntl.h>
#include <linux/fs.h>
#include <linux/magic.h>
#include <sys/ioctl.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace mx2nv {
namespace {

// copy_file_range per call: large enough to amortise the call, small enough
// to notice a stop request (SIGINT) within a second or so.
constexpr std::uint64_t kKernelCopyChunk = 64 << 20;

// Errors that mean "this file system (pair) cannot do that", as opposed to a
// failing disk or a full one: the engine falls back instead of failing.
bool means_unsupported(int error_number) {
  return error_number == EOPNOTSUPP || error_number == ENOTTY || error_number == EXDEV || error_number == EINVAL ||
         error_number == ENOSYS || error_number == EPERM || error_number == ETXTBSY;
}

std::uint64_t granularity_of(int fd) {
  struct statfs st {};
  if (::fstatfs(fd, &st) != 0) return 4096;
  const auto b = static_cast<std::uint64_t>(st.f_bsize);
  // A power of two in a sane range; anything else (a network file system's
  // transfer size, say) falls back to the common 4 KiB.
  return b >= 512 && b <= (1u << 20) && (b & (b - 1)) == 0 ? b : 4096;
}

// copy_file_range on a file system that cannot share extents is a
// server-side copy on network file systems (NFS, SMB, Ceph), but on these
// local ones the kernel's generic splice through the page cache: the bytes
// cross memory as they would through mx2nv's buffer, and under memory
// pressure the splice's readahead is evicted and read again, in smaller
// requests. There read and write go through mx2nv. Other file systems keep
// copy_file_range.
bool kernel_copy_is_splice(int fd) {
  struct statfs st {};
  if (::fstatfs(fd, &st) != 0) return false;
  switch (static_cast<unsigned long>(st.f_type)) {
    case EXT4_SUPER_MAGIC:  // also ext2 and ext3
    case XFS_SUPER_MAGIC:
    case BTRFS_SUPER_MAGIC:
    case TMPFS_MAGIC:
    case F2FS_SUPER_MAGIC:
      return true;
    default:
      return false;
  }
}

int clone_range(int from_fd, std::uint64_t src_offset, std::uint64_t length, int to_fd, std::uint64_t dst_offset) {
  file_clone_range r{};
  r.src_fd = from_fd;
  r.src_offset = src_offset;
  r.src_length = length;
  r.dest_offset = dst_offset;
  while (::ioctl(to_fd, FICLONERANGE, &r) != 0) {
    if (errno != EINTR) return errno;
  }
  return 0;
}

}  // namespace

namespace {
constexpr Choice<CopyMode> kCopyModes[] = {
    {CopyMode::Auto, "auto",
     "share with SRC where the file system can, else copy_file_range (server-side on NFS and SMB; skipped on "
     "ext4, XFS, btrfs, tmpfs and F2FS), else read/write"},
    {CopyMode::Reflink, "reflink", "share or fail with exit 2 before writing"},
    {CopyMode::Copy, "copy", "read and write every byte, never share"},
};
}  // namespace

template <>
std::span<const Choice<CopyMode>> choices<CopyMode>() {
  return kCopyModes;
}

std::uint64_t share_granularity(const File& file) { return granularity_of(file.fd()); }

CopyEngine::CopyEngine(CopyMode mode)
    : CopyEngine(mode == CopyMode::Copy ? CopyMethod::Stream : CopyMethod::Clone, mode == CopyMode::Reflink) {}

CopyEngine::CopyEngine(CopyMethod best, bool require_clone) : method_(best), require_clone_(require_clone) {}

void CopyEngine::fall_back(CopyMethod from, const File& to) {
  // Only ever downwards; concurrent shards may race to the same conclusion.
  CopyMethod current = from;
  const CopyMethod next =
      from == CopyMethod::Clone && !kernel_copy_is_splice(to.fd()) ? CopyMethod::KernelCopy : CopyMethod::Stream;
  method_.compare_exchange_strong(current, next);
}

void CopyEngine::sharing_refused(const File& to) {
  if (!require_clone_ && method() == CopyMethod::Clone) fall_back(CopyMethod::Clone, to);
}

bool CopyEngine::clone(const File& from, std::uint64_t src_offset, const File& to, std::uint64_t dst_offset,
                       std::uint64_t length, TransferTally& tally) {
  const int err = clone_range(from.fd(), src_offset, length, to.fd(), dst_offset);
  if (err == 0) {
    tally.shared += length;
    shared_.store(true, std::memory_order_relaxed);
    return true;
  }
  if (require_clone_) {
    fail(ErrorKind::Io, "{}: cannot share {} bytes at offset {} with {} (--copy reflink): {}", to.path().string(),
         length, dst_offset, from.path().string(), std::strerror(err));
  }
  if (!means_unsupported(err)) fail_io(to.path(), "share extents (FICLONERANGE)", err);
  fall_back(CopyMethod::Clone, to);
  return false;
}

bool CopyEngine::kernel_copy(const File& from, std::uint64_t src_offset, const File& to, std::uint64_t dst_offset,
                             std::uint64_t length, TransferTally& tally) {
  auto in = static_cast<loff_t>(src_offset);
  auto out = static_cast<loff_t>(dst_offset);
  std::uint64_t done = 0;
  while (done < length) {
    const auto want = static_cast<std::size_t>(std::min(kKernelCopyChunk, length - done));
    const ssize_t n = ::copy_file_range(from.fd(), &in, to.fd(), &out, want, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (!means_unsupported(errno) || done > 0) fail_io(to.path(), "copy_file_range", errno);
      fall_back(CopyMethod::KernelCopy, to);
      return false;
    }
    if (n == 0) fail_shrunk(from.path(), src_offset + done);
    done += static_cast<std::uint64_t>(n);
    tally.copied += static_cast<std::uint64_t>(n);
    throw_if_stopped();
  }
  return true;
}

void CopyEngine::transfer(const File& from, std::uint64_t src_offset, const File& to, std::uint64_t dst_offset,
                          std::uint64_t length, std::span<std::byte> buffer, TransferTally& tally) {
  // The bytes that cannot be shared: the kernel copies them, else we do.
  const auto copy = [&](std::uint64_t at, std::uint64_t n) {
    if (n == 0) return;
    if (method() != CopyMethod::Stream && kernel_copy(from, src_offset + at, to, dst_offset + at, n, tally)) return;
    read_in_chunks(from, src_offset + at, n, buffer, [&](std::span<const std::byte> chunk, std::uint64_t done) {
      to.write_at(dst_offset + at + done, chunk);
      tally.copied += chunk.size();
      throw_if_stopped();
    });
  };
  if (method() == CopyMethod::Clone) {
    std::uint64_t g = granularity_.load(std::memory_order_relaxed);
    if (g == 0) {
      g = share_granularity(to);
      granularity_.store(g, std::memory_order_relaxed);
    }
    if (src_offset % g == dst_offset % g) {
      const std::uint64_t head = (g - src_offset % g) % g;
      const std::uint64_t body = length > head ? (length - head) / g * g : 0;
      if (body > 0) {
        copy(0, head);
        if (clone(from, src_offset + head, to, dst_offset + head, body, tally)) {
          copy(head + body, length - head - body);
        } else {
          copy(head, length - head);
        }
        return;
      }
    }
  }
  copy(0, length);
}

void CopyEngine::require_sharing(const File& source, const fs::path& destination_dir) {
  const int dir = ::open(destination_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) {
    fail(ErrorKind::Usage, "--copy reflink: cannot test sharing in {} ({}); use --copy auto", destination_dir.string(),
         std::strerror(errno));
  }
  const UniqueFd owned(dir);
  require_sharing(source, dir, destination_dir);
}

namespace {

// Clones one block of `source` (or the whole of a smaller one) into an
// unnamed temporary file in the directory: 0, or the errno of the clone;
// `made` says whether the temporary file could be made at all (else the
// errno is its).
int try_sharing(const File& source, int destination_dir_fd, bool& made) {
  const int fd = ::openat(destination_dir_fd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
  made = fd >= 0;
  if (!made) return errno;
  const std::uint64_t g = granularity_of(fd);
  // Length 0 means "to the end of the source".
  const int err = clone_range(source.fd(), 0, source.size() >= g ? g : 0, fd, 0);
  ::close(fd);
  return err;
}

}  // namespace

void CopyEngine::require_sharing(const File& source, int destination_dir_fd, const fs::path& destination_dir) {
  bool made = false;
  const int err = try_sharing(source, destination_dir_fd, made);
  if (!made) {
    fail(ErrorKind::Usage, "--copy reflink: cannot test sharing in {} (unnamed temporary file: {}); use --copy auto",
         destination_dir.string(), std::strerror(err));
  }
  if (err != 0) {
    fail(ErrorKind::Usage,
         "--copy reflink: files in {} cannot share extents with {} ({}); sharing needs SRC and DST on one file system "
         "that supports reflinks (XFS with reflink=1, btrfs, bcachefs, ZFS >= 2.2); use --copy auto or --copy copy",
         destination_dir.string(), source.path().string(), std::strerror(err));
  }
}

CopyEngine::Sharing CopyEngine::probe_sharing(const File& source, int destination_dir_fd) {
  bool made = false;
  const int err = try_sharing(source, destination_dir_fd, made);
  if (!made) return Sharing::Unknown;
  if (err == 0) return Sharing::Yes;
  return means_unsupported(err) ? Sharing::No : Sharing::Unknown;
}

}  // namespace mx2nv

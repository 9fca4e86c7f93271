// File::set_cache_use and File::read_direct: the bytes are the file's; under Random and Passing no
// readahead settles around a read; Passing drops what a read brought in and
// keeps what was cached before; Random keeps what it read. Residency is asked of
// the kernel (mincore on a mapping of the file); a page this process cannot
// evict first (another process pinning it) skips rather than fails.
#include "scratch.hpp"
#include "sys/file.hpp"
#include "sys/read_buffer.hpp"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <random>
#include <span>
#include <vector>

namespace mx2nv {
namespace {

constexpr std::size_t kPage = 4096;
constexpr std::size_t kPages = 1024;  // 4 MiB: several readahead windows

// A file of kPages random pages, synced (clean: an eviction can drop them).
class DataFile {
 public:
  DataFile() : bytes_(write_random_file(path(), kPage * kPages, 11)) {}
  fs::path path() const { return dir_ / "data"; }
  const std::vector<std::byte>& bytes() const { return bytes_; }

 private:
  Scratch dir_;
  std::vector<std::byte> bytes_;
};

// Which pages of the file are in the page cache now.
std::vector<bool> resident(const fs::path& path) {
  const File f = File::open_read(path);
  void* map = ::mmap(nullptr, kPage * kPages, PROT_READ, MAP_SHARED, f.fd(), 0);
  if (map == MAP_FAILED) return {};
  std::vector<unsigned char> in(kPages);
  const int rc = ::mincore(map, kPage * kPages, in.data());
  ::munmap(map, kPage * kPages);
  if (rc != 0) return {};
  std::vector<bool> out(kPages);
  for (std::size_t i = 0; i < kPages; ++i) out[i] = (in[i] & 1) != 0;
  return out;
}

std::size_t count(const std::vector<bool>& pages, std::size_t from, std::size_t to) {
  std::size_t n = 0;
  for (std::size_t i = from; i < to; ++i) {
    if (pages[i]) ++n;
  }
  return n;
}

// Drops the file's pages (clean: synced above); false where some stay.
bool evict(const fs::path& path) {
  const File f = File::open_read(path);
  (void)::posix_fadvise(f.fd(), 0, 0, POSIX_FADV_DONTNEED);
  const std::vector<bool> pages = resident(path);
  return !pages.empty() && count(pages, 0, kPages) == 0;
}

// The file starts uncached, and a plain read caches what it reads: false on
// a file system whose reads bypass the page cache (ZFS keeps its own) or
// whose pages cannot be evicted here. The residency tests skip there.
bool cache_is_observable(const fs::path& path) {
  if (!evict(path)) return false;
  {
    const File f = File::open_read(path);
    std::vector<std::byte> page(kPage);
    f.read_at(0, page);
  }
  const std::vector<bool> pages = resident(path);
  return !pages.empty() && pages[0] && evict(path);
}

// Whether this file's file system takes RWF_DONTCACHE (Linux 6.14 and later,
// and not every file system): asked the way File asks.
bool drops_behind(const fs::path& path) {
  const File f = File::open_read(path);
  std::vector<std::byte> page(kPage);
  iovec v{page.data(), page.size()};
  return ::preadv2(f.fd(), &v, 1, 0, 0x80) >= 0;
}

// Residency after reading the first page through a file set to `use` (the
// page where a plain read starts a stream and reads ahead); `got` receives it.
std::vector<bool> resident_after_first_page(const fs::path& path, CacheUse use, std::vector<std::byte>& got) {
  File f = File::open_read(path);
  f.set_cache_use(use);
  got.resize(kPage);
  f.read_at(0, got);
  return resident(path);
}

TEST(File, PassingReadsReturnTheFilesBytes) {
  DataFile s;
  File f = File::open_read(s.path());
  f.set_cache_use(CacheUse::Passing);
  for (const std::size_t at : {std::size_t{0}, std::size_t{12345}, kPage * kPages - 77}) {
    std::vector<std::byte> got(std::min<std::size_t>(70000, kPage * kPages - at));
    f.read_at(at, got);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), s.bytes().begin() + static_cast<std::ptrdiff_t>(at))) << at;
  }
  // Moved, it still passes (and still reads right).
  File moved = std::move(f);
  std::vector<std::byte> got(100);
  moved.read_at(500, got);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), s.bytes().begin() + 500));
}

TEST(File, APassingReadLeavesNoReadaheadBehind) {
  DataFile s;
  if (!cache_is_observable(s.path())) GTEST_SKIP() << "reads here leave no page-cache trace to observe";
  std::vector<std::byte> got;
  const std::vector<bool> after = resident_after_first_page(s.path(), CacheUse::Passing, got);
  ASSERT_FALSE(after.empty());
  EXPECT_EQ(count(after, 1, kPages), 0u);  // nothing around it
  // The page itself is dropped too where the file system drops behind.
  if (drops_behind(s.path())) {
    EXPECT_FALSE(after[0]);
  }
}

TEST(File, APassingReadKeepsWhatWasAlreadyCached) {
  DataFile s;
  if (!cache_is_observable(s.path())) GTEST_SKIP() << "reads here leave no page-cache trace to observe";
  {
    const File plain = File::open_read(s.path());
    std::vector<std::byte> all(kPage * kPages);
    plain.read_at(0, all);
  }
  const std::vector<bool> before = resident(s.path());
  ASSERT_FALSE(before.empty());
  if (count(before, 0, kPages) != kPages) GTEST_SKIP() << "the file did not stay cached";
  File f = File::open_read(s.path());
  f.set_cache_use(CacheUse::Passing);
  std::vector<std::byte> got(64 * kPage);
  f.read_at(200 * kPage, got);
  EXPECT_EQ(count(resident(s.path()), 0, kPages), kPages);
}

TEST(File, ARandomReadKeepsWhatItReadAndNothingAround) {
  DataFile s;
  if (!cache_is_observable(s.path())) GTEST_SKIP() << "reads here leave no page-cache trace to observe";
  std::vector<std::byte> got;
  const std::vector<bool> after = resident_after_first_page(s.path(), CacheUse::Random, got);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), s.bytes().begin()));
  ASSERT_FALSE(after.empty());
  EXPECT_TRUE(after[0]);
  EXPECT_EQ(count(after, 1, kPages), 0u);
}

// The plain read the passing one is measured against: it does read ahead,
// so the test above would see a regression to plain reads.
TEST(File, APlainReadReadsAhead) {
  DataFile s;
  if (!cache_is_observable(s.path())) GTEST_SKIP() << "reads here leave no page-cache trace to observe";
  std::vector<std::byte> got;
  const std::vector<bool> after = resident_after_first_page(s.path(), CacheUse::Normal, got);
  ASSERT_FALSE(after.empty());
  EXPECT_TRUE(after[0]);
  if (count(after, 1, kPages) == 0) GTEST_SKIP() << "no readahead on this device (read_ahead_kb 0?)";
}

// ReadBuffer: reads of megabytes at offsets and lengths that are not whole
// pages are the file's bytes, in memory aligned to 2 MiB from 2 MiB on,
// through the cache and past it, the buffer growing and then reused.
TEST(ReadBuffer, LargeReadsAtAnyOffsetAreTheFilesBytes) {
  Scratch dir;
  const std::vector<std::byte> bytes = write_random_file(dir / "big", (12u << 20) + 123, 17);
  const File f = File::open_read(dir / "big");
  ReadBuffer buffer;
  // `skipped`: the bytes before the range in the buffer (a direct read's, to
  // the page boundary below it).
  const auto check = [&](std::span<const std::byte> got, std::uint64_t offset, std::uint64_t n,
                         std::uint64_t skipped) {
    ASSERT_EQ(got.size(), n);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), bytes.begin() + static_cast<std::ptrdiff_t>(offset))) << offset;
    if (buffer.capacity() >= (2u << 20)) {
      const auto base = reinterpret_cast<std::uintptr_t>(got.data()) - skipped;
      EXPECT_EQ(base % (2u << 20), 0u) << offset;
    }
  };
  bool direct = true;
  for (const auto& [offset, n] : std::vector<std::pair<std::uint64_t, std::uint64_t>>{
           {4097, 3u << 20}, {1, (9u << 20) + 5}, {bytes.size() - (2u << 20) + 8192, (2u << 20) - 8192},
           {4096, 1000}, {bytes.size() - 1, 1}}) {
    const auto got = buffer.read_direct(f, offset, n);
    if (!got) {
      direct = false;
      break;
    }
    check(*got, offset, n, offset % 4096);
  }
  EXPECT_GE(buffer.capacity(), (9u << 20) + 8192);
  check(buffer.read(f, 5, 7u << 20), 5, 7u << 20, 0);
  // A chunk of 2 MiB less two pages, with the pages around it, fills one
  // huge page of a fresh buffer; a chunk of 1 MiB takes plain pages.
  if (direct) {
    ReadBuffer fresh;
    const std::uint64_t n = stream_chunk_bytes(16);
    ASSERT_EQ(n, (2u << 20) - 8192);
    const auto got = fresh.read_direct(f, 4095, n);
    ASSERT_TRUE(got);
    EXPECT_EQ(fresh.capacity(), 2u << 20);
    EXPECT_EQ((reinterpret_cast<std::uintptr_t>(got->data()) - 4095) % (2u << 20), 0u);
    ReadBuffer small;
    ASSERT_TRUE(small.read_direct(f, 4095, stream_chunk_bytes(32)));
    EXPECT_LE(small.capacity(), 1u << 20);  // whole pages, not a huge one
  }
  if (!direct) GTEST_SKIP() << "this file system refuses O_DIRECT (the buffered reads were checked)";
}

// Descriptors open now (procfs), or -1 where they cannot be counted.
long open_descriptors() {
  std::error_code ec;
  long n = 0;
  for (fs::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end; it.increment(ec)) ++n;
  return ec ? -1 : n;
}

// read_direct: the bytes are the file's at aligned offsets, fewer only at
// the end of the file, and leave nothing cached; its second descriptor
// follows the File through moves and is closed with it.
TEST(File, DirectReadsAreTheFilesBytesAndTheirDescriptorGoesWithTheFile) {
  DataFile data;
  const long before = open_descriptors();
  {
    File f = File::open_read(data.path());
    void* memory = std::aligned_alloc(kPage, 2 * kPage);
    ASSERT_NE(memory, nullptr);
    const std::span<std::byte> buffer(static_cast<std::byte*>(memory), 2 * kPage);
    const std::optional<std::size_t> got = f.read_direct(kPage * 3, buffer);
    if (!got) {
      std::free(memory);
      GTEST_SKIP() << "this file system refuses O_DIRECT";
    }
    EXPECT_EQ(*got, 2 * kPage);
    EXPECT_TRUE(std::equal(buffer.begin(), buffer.end(), data.bytes().begin() + 3 * kPage));
    if (cache_is_observable(data.path())) {
      ASSERT_TRUE(f.read_direct(kPage * 5, buffer));
      EXPECT_EQ(count(resident(data.path()), 0, kPages), 0u);
    }
    // The file's last page and past its end: what there is.
    EXPECT_EQ(f.read_direct(kPage * (kPages - 1), buffer), std::optional<std::size_t>(kPage));
    EXPECT_TRUE(std::equal(buffer.begin(), buffer.begin() + kPage, data.bytes().end() - kPage));
    if (before >= 0) {
      EXPECT_EQ(open_descriptors(), before + 2);
    }
    File moved(std::move(f));
    EXPECT_EQ(moved.read_direct(0, buffer), std::optional<std::size_t>(2 * kPage));
    File assigned = File::open_read(data.path());
    assigned = std::move(moved);
    EXPECT_EQ(assigned.read_direct(0, buffer), std::optional<std::size_t>(2 * kPage));
    if (before >= 0) {
      EXPECT_EQ(open_descriptors(), before + 2);
    }
    assigned.close();
    if (before >= 0) {
      EXPECT_EQ(open_descriptors(), before);
    }
    std::free(memory);
  }
  if (before >= 0) {
    EXPECT_EQ(open_descriptors(), before);
  }
}

}  // namespace
}  // namespace mx2nv

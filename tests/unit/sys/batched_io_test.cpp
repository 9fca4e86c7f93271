// Batched small reads and coalesced writes: every byte comes back as asked,
// whatever the order and spacing of the requests, the number of system calls
// drops where requests are dense, and gaps are read only within the rule
// (never more than about twice the requested bytes).
#include "sys/batched_io.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace mx2nv {
namespace {

class ScratchFile {
 public:
  explicit ScratchFile(std::size_t size, unsigned seed) {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base ? base : "/tmp") + "/mx2nv-batched-XXXXXX";
    dir_ = ::mkdtemp(tmpl.data());
    std::mt19937 rng(seed);
    bytes_.resize(size);
    for (auto& b : bytes_) b = static_cast<std::byte>(rng() & 0xFF);
    File f = File::create_new(dir_ / "source");
    f.write_at(0, bytes_);
    f.close();
  }
  ~ScratchFile() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  fs::path path() const { return dir_ / "source"; }
  fs::path dir() const { return dir_; }
  const std::vector<std::byte>& bytes() const { return bytes_; }

 private:
  fs::path dir_;
  std::vector<std::byte> bytes_;
};

std::vector<std::byte> slice(const std::vector<std::byte>& v, ByteRange r) {
  return {v.begin() + static_cast<std::ptrdiff_t>(r.offset), v.begin() + static_cast<std::ptrdiff_t>(r.offset + r.length)};
}

void expect_served(const ScratchFile& data, const std::vector<ByteRange>& ranges, std::size_t* reads = nullptr) {
  const File f = File::open_read(data.path());
  BatchedReader reader(f, ranges);
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const auto got = reader.next();
    ASSERT_EQ(std::vector<std::byte>(got.begin(), got.end()), slice(data.bytes(), ranges[i])) << "range " << i;
  }
  EXPECT_TRUE(reader.next().empty());
  if (reads) *reads = reader.reads();
}

TEST(BatchedReader, DenseSmallRequestsShareReads) {
  const ScratchFile data(4 << 20, 1);
  // Two passes like a shard writer's: packed-like ranges then scale-like
  // ranges of the same region, each 1 KiB with 64-byte gaps.
  std::vector<ByteRange> ranges;
  for (std::uint64_t at = 0; at + 1024 <= (3 << 20); at += 1088) ranges.push_back({at, 1024});
  for (std::uint64_t at = 1024; at + 64 <= (3 << 20); at += 1088) ranges.push_back({at, 64});
  std::size_t reads = 0;
  expect_served(data, ranges, &reads);
  // 3 MiB per pass in windows of at most 1 MiB: a handful of reads, not thousands.
  EXPECT_LE(reads, 10u);
  EXPECT_GE(reads, 6u);
}

TEST(BatchedReader, LargeGapsAreNotRead) {
  const ScratchFile data(8 << 20, 2);
  // Small requests 1 MiB apart (a real checkpoint's scales between large
  // packed tensors): one read each, never the packed bytes between.
  std::vector<ByteRange> ranges;
  for (std::uint64_t at = 100; at + 4096 < (8 << 20); at += 1 << 20) ranges.push_back({at, 4096});
  std::size_t reads = 0;
  expect_served(data, ranges, &reads);
  EXPECT_EQ(reads, ranges.size());
}

TEST(BatchedReader, GapsUpToTheUsefulBytesAreMerged) {
  const ScratchFile data(1 << 20, 3);
  // 32 KiB requests with 16 KiB gaps: gap <= useful, so they merge; 32 KiB
  // requests with 40 KiB gaps after a single one do not.
  const std::vector<ByteRange> merged = {{0, 32 << 10}, {48 << 10, 32 << 10}, {96 << 10, 32 << 10}};
  std::size_t reads = 0;
  expect_served(data, merged, &reads);
  EXPECT_EQ(reads, 1u);
  const std::vector<ByteRange> apart = {{0, 32 << 10}, {72 << 10, 32 << 10}};
  expect_served(data, apart, &reads);
  EXPECT_EQ(reads, 2u);
}

TEST(BatchedReader, RandomRequestsComeBackExact) {
  const ScratchFile data(2 << 20, 4);
  std::mt19937 rng(5);
  for (int round = 0; round < 50; ++round) {
    std::vector<ByteRange> ranges;
    const int n = 1 + static_cast<int>(rng() % 200);
    for (int i = 0; i < n; ++i) {
      const std::uint64_t length = rng() % 3 == 0 ? 0 : rng() % (kMaxBatchedRead + 1);
      const std::uint64_t offset = rng() % (data.bytes().size() - length + 1);
      ranges.push_back({offset, length});
    }
    if (rng() % 2) std::sort(ranges.begin(), ranges.end(), [](auto a, auto b) { return a.offset < b.offset; });
    expect_served(data, ranges);
  }
  // A request larger than a window still comes back whole.
  expect_served(data, {{10, BatchedReader::kWindowBytes + 5}, {3, 7}});
}

TEST(CoalescingWriter, ContiguousWritesBecomeOne) {
  const ScratchFile data(1, 6);
  File out = File::create_new(data.dir() / "out");
  std::vector<std::pair<std::uint64_t, std::uint64_t>> written;  // (offset, length) told
  CoalescingWriter writer(out, 4096, [&](std::uint64_t offset, std::uint64_t length) {
    written.emplace_back(offset, length);
  });
  std::vector<std::byte> expect(20000, std::byte{0});
  std::mt19937 rng(7);
  std::uint64_t at = 0;
  // Contiguous 100-byte writes, a jump, a write larger than the buffer.
  const auto put = [&](std::uint64_t offset, std::size_t n) {
    std::vector<std::byte> b(n);
    for (auto& x : b) x = static_cast<std::byte>(rng() & 0xFF);
    std::copy(b.begin(), b.end(), expect.begin() + static_cast<std::ptrdiff_t>(offset));
    writer.write(offset, b);
  };
  for (int i = 0; i < 30; ++i, at += 100) put(at, 100);
  put(10000, 50);
  put(10050, 5000);
  put(15050, 10);
  writer.flush();
  // 3000 contiguous bytes in one write, the jump flushes, the big one goes
  // straight through (after flushing the 50 before it), then the tail.
  EXPECT_EQ(writer.writes(), 4u);
  EXPECT_EQ(written, (std::vector<std::pair<std::uint64_t, std::uint64_t>>{{0, 3000}, {10000, 50}, {10050, 5000},
                                                                            {15050, 10}}));
  out.set_size(expect.size());
  out.close();
  std::vector<std::byte> got(expect.size());
  File::open_read(data.dir() / "out").read_at(0, got);
  EXPECT_EQ(got, expect);
}

TEST(CoalescingWriter, FullBufferIsWrittenAndRefilled) {
  const ScratchFile data(1, 8);
  File out = File::create_new(data.dir() / "out");
  CoalescingWriter writer(out, 1000);
  std::vector<std::byte> expect;
  for (int i = 0; i < 25; ++i) {
    std::vector<std::byte> b(300, static_cast<std::byte>(i));
    writer.write(expect.size(), b);
    expect.insert(expect.end(), b.begin(), b.end());
  }
  writer.flush();
  writer.flush();  // a second flush writes nothing
  EXPECT_EQ(writer.writes(), 9u);  // 3 writes of 300 fill 900 < 1000; 25 writes -> 8 full + 1
  out.close();
  std::vector<std::byte> got(expect.size());
  File::open_read(data.dir() / "out").read_at(0, got);
  EXPECT_EQ(got, expect);
}

}  // namespace
}  // namespace mx2nv

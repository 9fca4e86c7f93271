// ReadOrder: the items that wait read in item order whatever the workers'
// timing; items that cannot wait hold nobody up; a throwing item releases
// every waiter; a large item reads what the page cache lacks past it (at any
// offset and length, unwritten pages included) and what it holds from it, a
// small one through it; the bytes are the file's either way.
#include "common/parallel.hpp"
#include "scratch.hpp"
#include "sys/ordered_reads.hpp"

#include <gtest/gtest.h>
#include <fcntl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

namespace mx2nv {
namespace {

// Each item sleeps a while that varies from item to item before it records
// itself, so that without the order later items would often record first.
void jitter(std::size_t item) { std::this_thread::sleep_for(std::chrono::microseconds((item * 7919) % 5 * 300)); }

TEST(ReadOrder, ItemsThatWaitGoInItemOrder) {
  constexpr std::size_t kItems = 96;
  std::vector<bool> may_wait(kItems);
  for (std::size_t k = 0; k < kItems; ++k) may_wait[k] = k % 3 != 0;
  ReadOrder order(may_wait, 4);
  std::mutex mutex;
  std::vector<std::size_t> log;
  parallel_for(kItems, 4, [&](std::size_t k) {
    ReadOrder::Place turn_place;
    ReadOrder::Turn turn(order, k, turn_place);
    if (k % 3 == 0) {  // cannot wait: no later item waits for it, even while it runs
      jitter(k + 2);
      turn.wait();
      EXPECT_FALSE(turn.waited());
      return;
    }
    jitter(k);
    turn.wait();
    {
      std::lock_guard lock(mutex);
      log.push_back(k);
    }
    jitter(k + 1);
    turn.pass();
  });
  ASSERT_EQ(log.size(), kItems - kItems / 3);
  for (std::size_t i = 1; i < log.size(); ++i) EXPECT_LT(log[i - 1], log[i]);
}

TEST(ReadOrder, AThrowingItemReleasesEveryWaiter) {
  constexpr std::size_t kItems = 64;
  ReadOrder order(std::vector<bool>(kItems, true), 4);
  std::mutex mutex;
  std::vector<std::size_t> done;
  // Item 9 fails in its turn, before passing: items after it that wait would
  // wait forever if the failure did not give up the order (items the failed
  // pass leaves unstarted never pass either).
  EXPECT_THROW(parallel_for(kItems, 4,
                            [&](std::size_t k) {
                              ReadOrder::Place turn_place;
                              ReadOrder::Turn turn(order, k, turn_place);
                              jitter(k);
                              turn.wait();
                              if (k == 9) throw std::runtime_error("item 9");
                              std::lock_guard lock(mutex);
                              done.push_back(k);
                            }),
               std::runtime_error);
  for (const std::size_t k : done) EXPECT_NE(k, 9u);
}

// The same with places kept across items and fewer places than workers: a
// failing worker's place goes back when it stops, so the others finish.
TEST(ReadOrder, AThrowingItemGivesItsKeptPlaceBack) {
  constexpr std::size_t kItems = 64;
  ReadOrder order(std::vector<bool>(kItems, true), 1);
  ASSERT_EQ(order.readers(), 2u);
  EXPECT_THROW(parallel_for_with<ReadOrder::Place>(kItems, order.readers(),
                                                   [&](ReadOrder::Place& place, std::size_t k) {
                                                     ReadOrder::Turn turn(order, k, place);
                                                     jitter(k);
                                                     turn.wait();
                                                     turn.pass();  // takes the one place
                                                     if (k == 9) throw std::runtime_error("item 9");
                                                   }),
               std::runtime_error);
  // Every place is back: a later turn takes one without waiting forever.
  ReadOrder::Place place;
  ReadOrder::Turn later(order, kItems - 1, place);
  later.pass();
}

// A pass stops its workers between fetching an item and running it, so an
// item fetched then never runs nor passes: whatever item fails, before or
// after its own pass, and whether or not it could wait, later items must not
// wait for it (a regression hangs here).
TEST(ReadOrder, AFailureAfterItsPassStillReleasesLaterItems) {
  for (const bool first_may_wait : {true, false}) {
    ReadOrder order(std::vector<bool>{first_may_wait, true, true}, 2);
    try {
      ReadOrder::Place first_place;
      ReadOrder::Turn first(order, 0, first_place);
      first.wait();
      first.pass();
      throw std::runtime_error("after its pass");
    } catch (const std::runtime_error&) {
    }
    // Item 1 was fetched by a worker that saw the failure: it never runs.
    ReadOrder::Place third_place;
    ReadOrder::Turn third(order, 2, third_place);
    third.wait();
    EXPECT_TRUE(third.waited()) << first_may_wait;
  }
}

TEST(ReadOrder, NoMoreThanTheAskedThreadsComputeAtOnce) {
  std::vector<bool> one_large(1000);
  one_large[999] = true;
  EXPECT_EQ(ReadOrder(one_large, 2).readers(), 4u);
  EXPECT_EQ(ReadOrder(std::vector<bool>(1000), 2).readers(), 2u);  // none may wait: a worker a thread
  EXPECT_EQ(ReadOrder(std::vector<bool>(5, true), 3).readers(), 5u);  // no more workers than items
  EXPECT_EQ(ReadOrder({}, 0).readers(), 1u);
  EXPECT_EQ(ReadOrder(std::vector<bool>(4096, true), 1024).readers(), 1032u);  // at most 8 more
  constexpr std::size_t kItems = 64;
  for (const unsigned computing : {1u, 3u}) {
    ReadOrder order(std::vector<bool>(kItems, true), computing);
    std::atomic<unsigned> now{0}, most{0};
    // Each worker keeps its place from one item to the next, as verify's do.
    parallel_for_with<ReadOrder::Place>(kItems, order.readers(), [&](ReadOrder::Place& place, std::size_t k) {
      ReadOrder::Turn turn(order, k, place);
      jitter(k);
      turn.wait();  // gives its place up meanwhile: more workers than places do not deadlock
      turn.pass();
      const unsigned n = ++now;
      unsigned seen = most.load();
      while (n > seen && !most.compare_exchange_weak(seen, n)) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      --now;
    });
    EXPECT_LE(most.load(), computing);
  }
}

constexpr std::size_t kFileBytes = 4 << 20;

TEST(ReadOrder, AnUncachedRangeOfALargeItemIsReadPastTheCache) {
  Scratch dir;
  std::vector<std::byte> bytes = write_random_file(dir / "data", kFileBytes + 1234, 5);  // not whole pages
  const File f = File::open_read(dir / "data");
  (void)::posix_fadvise(f.fd(), 0, 0, POSIX_FADV_DONTNEED);
  const std::optional<bool> cold = f.cached(0, bytes.size());
  if (cold != false) GTEST_SKIP() << "the page cache is not observable here (cachestat, or an eviction refused)";
  {
    // Where direct reads are refused, a large item would wait for item 0,
    // which never comes here.
    ReadBuffer probe;
    if (!probe.read_direct(f, 0, 4096)) GTEST_SKIP() << "this file system refuses O_DIRECT";
  }
  const auto same = [&](std::span<const std::byte> got, std::uint64_t offset) {
    return got.size() > 0 && std::equal(got.begin(), got.end(), bytes.begin() + static_cast<std::ptrdiff_t>(offset));
  };

  // Items 0 and 2 are large (they may wait), item 1 small.
  ReadOrder order({true, false, true, true}, 1);
  ReadBuffer buffer;
  {
    ReadOrder::Place small_place;
    ReadOrder::Turn small(order, 1, small_place);  // small: through the cache, never waits (item 0 has not passed)
    EXPECT_TRUE(same(small.read(f, 1000, kOrderedReadBytes - 1, buffer), 1000));
    EXPECT_FALSE(small.waited());
    EXPECT_EQ(small.direct_reads(), 0u);
    EXPECT_EQ(f.cached(1000, kOrderedReadBytes - 1), true);
  }
  (void)::posix_fadvise(f.fd(), 0, 0, POSIX_FADV_DONTNEED);
  {
    // Large and uncached: past the cache, at offsets and lengths that are not
    // whole pages and up to the file's last byte, without waiting for item 0
    // (which has not passed) and leaving nothing cached.
    ReadOrder::Place large_place;
    ReadOrder::Turn large(order, 2, large_place);
    for (const auto& [offset, n] : std::vector<std::pair<std::uint64_t, std::uint64_t>>{
             {1, kOrderedReadBytes}, {4095, 3}, {kFileBytes - 4097, 4097 + 1234}, {4096, 8192}}) {
      EXPECT_TRUE(same(large.read(f, offset, n, buffer), offset)) << offset;
    }
    EXPECT_EQ(large.direct_reads(), 4u);
    EXPECT_FALSE(large.waited());
    EXPECT_EQ(f.cached(0, bytes.size()), false);
    EXPECT_EQ(f.cached(4096, 4096), false);
    // A range the cache holds whole is read from it.
    std::vector<std::byte> warm(4096);
    f.read_at(8192, warm);
    ASSERT_EQ(f.cached(8192, 4096), true);
    EXPECT_TRUE(same(large.read(f, 8192, 4096, buffer), 8192));
    EXPECT_EQ(large.direct_reads(), 4u);
    large.pass();
  }
  // A page written but not yet on the disk, in a range otherwise uncached:
  // read past the cache, and still the file's bytes.
  (void)::posix_fadvise(f.fd(), 0, 0, POSIX_FADV_DONTNEED);
  {
    std::fstream out(dir / "data", std::ios::in | std::ios::out | std::ios::binary);
    out.seekp(5000);
    out.put('\x5a');
  }
  bytes[5000] = std::byte{0x5a};
  ReadOrder::Place dirty_place;
  ReadOrder::Turn dirty(order, 3, dirty_place);
  EXPECT_TRUE(same(dirty.read(f, 4100, kOrderedReadBytes, buffer), 4100));
  EXPECT_EQ(dirty.direct_reads(), 1u);
}

}  // namespace
}  // namespace mx2nv

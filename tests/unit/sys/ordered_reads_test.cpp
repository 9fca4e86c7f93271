// ReadOrder: the items that wait read in item order whatever the workers'
// timing; items that cannot wait hold nobody up; a throwing item releases
// every waiter; a large read waits only where the page cache lacks some of
// it, a small one never; the bytes are the file's either way.
#include "common/parallel.hpp"
#include "scratch.hpp"
#include "sys/ordered_reads.hpp"

#include <gtest/gtest.h>
#include <fcntl.h>

#include <chrono>
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
  ReadOrder order(may_wait);
  std::mutex mutex;
  std::vector<std::size_t> log;
  parallel_for(kItems, 4, [&](std::size_t k) {
    ReadOrder::Turn turn(order, k);
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
  ReadOrder order(std::vector<bool>(kItems, true));
  std::mutex mutex;
  std::vector<std::size_t> done;
  // Item 9 fails in its turn, before passing: items after it that wait would
  // wait forever if the failure did not give up the order (items the failed
  // pass leaves unstarted never pass either).
  EXPECT_THROW(parallel_for(kItems, 4,
                            [&](std::size_t k) {
                              ReadOrder::Turn turn(order, k);
                              jitter(k);
                              turn.wait();
                              if (k == 9) throw std::runtime_error("item 9");
                              std::lock_guard lock(mutex);
                              done.push_back(k);
                            }),
               std::runtime_error);
  for (const std::size_t k : done) EXPECT_NE(k, 9u);
}

// A pass stops its workers between fetching an item and running it, so an
// item fetched then never runs nor passes: whatever item fails, before or
// after its own pass, and whether or not it could wait, later items must not
// wait for it (a regression hangs here).
TEST(ReadOrder, AFailureAfterItsPassStillReleasesLaterItems) {
  for (const bool first_may_wait : {true, false}) {
    ReadOrder order(std::vector<bool>{first_may_wait, true, true});
    try {
      ReadOrder::Turn first(order, 0);
      first.wait();
      first.pass();
      throw std::runtime_error("after its pass");
    } catch (const std::runtime_error&) {
    }
    // Item 1 was fetched by a worker that saw the failure: it never runs.
    ReadOrder::Turn third(order, 2);
    third.wait();
    EXPECT_TRUE(third.waited()) << first_may_wait;
  }
}

constexpr std::size_t kFileBytes = 4 << 20;

TEST(ReadOrder, ALargeReadWaitsOnlyForWhatTheCacheLacks) {
  Scratch dir;
  std::vector<std::byte> bytes(kFileBytes);
  std::mt19937 rng(5);
  for (auto& b : bytes) b = static_cast<std::byte>(rng() & 0xFF);
  {
    File f = File::create_new(dir / "data");
    f.write_at(0, bytes);
    f.sync();
    f.close();
  }
  const File f = File::open_read(dir / "data");
  (void)::posix_fadvise(f.fd(), 0, 0, POSIX_FADV_DONTNEED);
  const std::optional<bool> cold = f.cached(0, kFileBytes);
  if (cold != false) GTEST_SKIP() << "the page cache is not observable here (cachestat, or an eviction refused)";

  ReadOrder order(std::vector<bool>(4, true));
  std::vector<std::byte> got(kOrderedReadBytes);
  {
    ReadOrder::Turn small(order, 0);  // below kOrderedReadBytes: never waits
    std::vector<std::byte> few(kOrderedReadBytes - 1);
    small.read(f, 1000, few);
    EXPECT_FALSE(small.waited());
    EXPECT_TRUE(std::equal(few.begin(), few.end(), bytes.begin() + 1000));
  }
  (void)::posix_fadvise(f.fd(), 0, 0, POSIX_FADV_DONTNEED);
  {
    ReadOrder::Turn large(order, 1);  // not cached: waits (its turn has come: item 0 passed)
    large.read(f, kOrderedReadBytes, got);
    EXPECT_TRUE(large.waited());
    EXPECT_TRUE(std::equal(got.begin(), got.end(), bytes.begin() + kOrderedReadBytes));
  }
  {
    ReadOrder::Turn again(order, 2);  // what item 1 read is cached now: no wait
    EXPECT_EQ(f.cached(kOrderedReadBytes, got.size()), true);
    again.read(f, kOrderedReadBytes, got);
    EXPECT_FALSE(again.waited());
    EXPECT_TRUE(std::equal(got.begin(), got.end(), bytes.begin() + kOrderedReadBytes));
  }
}

}  // namespace
}  // namespace mx2nv

// The process-wide budget of shard headers held at once (checkpoint/header_budget.hpp).
#include "checkpoint/header_budget.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace mx2nv {
namespace {

TEST(HeaderBudget, SmallHeadersShareTheBudgetAndGiveItBack) {
  ASSERT_EQ(HeaderTicket::in_use(), 0u);
  {
    const HeaderTicket a(700'000), b(700'000);  // K3-sized headers: both at once
    EXPECT_EQ(HeaderTicket::in_use(), 1'400'000u);
    HeaderTicket moved = HeaderTicket(1'000);
    EXPECT_EQ(HeaderTicket::in_use(), 1'401'000u);
  }
  EXPECT_EQ(HeaderTicket::in_use(), 0u);
}

TEST(HeaderBudget, AHugeHeaderTakesTheWholeBudgetAndOtherThreadsWait) {
  std::atomic<bool> granted{false};
  std::jthread other;
  {
    const HeaderTicket huge(100'000'000);
    EXPECT_EQ(HeaderTicket::in_use(), kHeaderBytesInFlight);
    // The thread holding a ticket may take another (verify: SRC and DST headers of one shard).
    const HeaderTicket nested(100'000'000);
    EXPECT_EQ(HeaderTicket::in_use(), 2 * kHeaderBytesInFlight);
    other = std::jthread([&] {
      const HeaderTicket t(1'000);
      granted = true;
    });
    std::this_thread::yield();
    EXPECT_FALSE(granted.load());  // cannot be granted while the budget is taken
  }
  other.join();
  EXPECT_TRUE(granted.load());
  EXPECT_EQ(HeaderTicket::in_use(), 0u);
}

}  // namespace
}  // namespace mx2nv

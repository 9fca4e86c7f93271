// The helpers of streamed passes: parallel_for_with's per-worker state,
// stream_chunk_bytes' bounds, and the file order
// verify and compare visit modules in.
#include "common/parallel.hpp"
#include "model/modules.hpp"
#include "sys/file.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

namespace mx2nv {
namespace {

TEST(ParallelForWith, EveryIndexOnceAndEachWorkerItsOwnState) {
  struct State {
    std::thread::id owner = std::this_thread::get_id();
    std::size_t items = 0;
  };
  constexpr std::size_t kItems = 1000;
  std::vector<std::atomic<int>> seen(kItems);
  std::atomic<bool> shared_state{false};
  std::mutex m;
  std::set<const State*> states;
  parallel_for_with<State>(kItems, 4, [&](State& s, std::size_t i) {
    if (s.owner != std::this_thread::get_id()) shared_state = true;
    ++s.items;
    ++seen[i];
    std::lock_guard lock(m);
    states.insert(&s);
  });
  for (const auto& n : seen) EXPECT_EQ(n.load(), 1);
  EXPECT_FALSE(shared_state.load());
  EXPECT_GE(states.size(), 1u);
  EXPECT_LE(states.size(), 4u);
}

TEST(ParallelForWith, FirstErrorStopsAndIsRethrown) {
  std::atomic<std::size_t> calls{0};
  EXPECT_THROW(parallel_for_with<int>(100, 1,
                                      [&](int&, std::size_t i) {
                                        ++calls;
                                        if (i == 3) throw std::runtime_error("stop");
                                      }),
               std::runtime_error);
  EXPECT_EQ(calls.load(), 4u);  // one worker: nothing after the failing index
}

TEST(StreamChunkBytes, EightMiBForFewWorkersThenSharedButNeverUnderOneMiBLessTwoPages) {
  constexpr std::uint64_t kPages = 2 * 4096;
  EXPECT_EQ(stream_chunk_bytes(0), (8u << 20) - kPages);
  EXPECT_EQ(stream_chunk_bytes(1), (8u << 20) - kPages);
  EXPECT_EQ(stream_chunk_bytes(4), (8u << 20) - kPages);
  EXPECT_EQ(stream_chunk_bytes(5), (4u << 20) - kPages);  // 6.4 MiB: down to a power of two
  EXPECT_EQ(stream_chunk_bytes(16), (2u << 20) - kPages);
  EXPECT_EQ(stream_chunk_bytes(32), (1u << 20) - kPages);
  EXPECT_EQ(stream_chunk_bytes(2048), (1u << 20) - kPages);
  for (const unsigned w : {1u, 3u, 7u, 100u}) EXPECT_EQ(stream_chunk_bytes(w) % 128, 0u) << w;  // whole groups
}

TEST(ModulesInFileOrder, ByShardThenOffsetWhateverTheNames) {
  ModuleSet set;
  const auto add = [&](std::size_t shard, std::uint64_t begin) {
    QuantModule m;
    m.packed_shard = shard;
    m.packed.begin = begin;
    set.modules.push_back(m);
  };
  add(1, 0);    // 0
  add(0, 500);  // 1
  add(0, 20);   // 2
  add(1, 10);   // 3
  EXPECT_EQ(modules_in_file_order(set), (std::vector<std::size_t>{2, 1, 0, 3}));
  EXPECT_TRUE(before_in_file(set.modules[2], set.modules[1]));
  EXPECT_FALSE(before_in_file(set.modules[1], set.modules[1]));
}

}  // namespace
}  // namespace mx2nv

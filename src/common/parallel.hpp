// Runs fn(i) for i in [0, n) on up to `threads` workers pulling indices from a
// shared counter. The first exception stops further work and is rethrown.
// parallel_for_with gives each worker its own State (default-constructed,
// passed to every call it makes): buffers reused from one item to the next.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace mx2nv {

template <typename State, typename Fn>
void parallel_for_with(std::size_t n, unsigned threads, Fn&& fn) {
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  const auto worker = [&] {
    State state{};
    for (;;) {
      const std::size_t i = next.fetch_add(1);
      if (i >= n || failed.load()) return;
      try {
        fn(state, i);
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
        failed = true;
        return;
      }
    }
  };
  const std::size_t count = std::min<std::size_t>(std::max(1u, threads), n);
  std::vector<std::jthread> pool;
  for (std::size_t t = 1; t < count; ++t) pool.emplace_back(worker);
  worker();
  pool.clear();  // joins
  if (error) std::rethrow_exception(error);
}

template <typename Fn>
void parallel_for(std::size_t n, unsigned threads, Fn&& fn) {
  struct None {};
  parallel_for_with<None>(n, threads, [&](None&, std::size_t i) { fn(i); });
}

}  // namespace mx2nv

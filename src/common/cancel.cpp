#include "common/cancel.hpp"

#include "common/error.hpp"

#include <atomic>
#include <csignal>

namespace mx2nv {
namespace {

std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

}  // namespace

void request_stop(int signal_number) noexcept { g_signal.store(signal_number == 0 ? -1 : signal_number); }

bool stop_requested() noexcept { return g_signal.load(std::memory_order_relaxed) != 0; }

void clear_stop() noexcept { g_signal.store(0); }

void throw_if_stopped() {
  const int s = g_signal.load(std::memory_order_relaxed);
  if (s == 0) return;
  const char* name = s == SIGINT ? "SIGINT" : s == SIGTERM ? "SIGTERM" : "a stop request";
  fail(ErrorKind::Io, "interrupted by {}; temporary files removed, finished shards kept (continue with --resume)",
       name);
}

}  // namespace mx2nv

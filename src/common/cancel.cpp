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
  // What was left behind, and how to go on, depends on the command: its
  // front end says so (the CLI: cli/main.cpp; Python raises KeyboardInterrupt).
  fail(ErrorKind::Io, "interrupted by {}", stop_signal_name());
}

int stop_signal() noexcept { return g_signal.load(std::memory_order_relaxed); }

const char* stop_signal_name() noexcept {
  const int s = stop_signal();
  return s == SIGINT ? "SIGINT" : s == SIGTERM ? "SIGTERM" : "a stop request";
}

}  // namespace mx2nv

#include "checkpoint/header_budget.hpp"

#include <algorithm>
#include <condition_variable>
#include <mutex>

namespace mx2nv {
namespace {

std::mutex budget_mutex;
std::condition_variable budget_freed;
std::uint64_t budget_in_use = 0;
thread_local unsigned tickets_of_this_thread = 0;

}  // namespace

HeaderTicket::HeaderTicket(std::uint64_t header_length)
    : bytes_(std::min(header_length, kHeaderBytesInFlight)), held_(true) {
  std::unique_lock lock(budget_mutex);
  if (tickets_of_this_thread == 0) {
    budget_freed.wait(lock, [&] { return budget_in_use + bytes_ <= kHeaderBytesInFlight; });
  }
  budget_in_use += bytes_;
  ++tickets_of_this_thread;
}

HeaderTicket& HeaderTicket::operator=(HeaderTicket&& other) noexcept {
  if (this != &other) {
    release();
    bytes_ = other.bytes_;
    held_ = other.held_;
    other.held_ = false;
  }
  return *this;
}

void HeaderTicket::release() noexcept {
  if (!held_) return;
  held_ = false;
  {
    std::lock_guard lock(budget_mutex);
    budget_in_use -= bytes_;
    --tickets_of_this_thread;
  }
  budget_freed.notify_all();
}

std::uint64_t HeaderTicket::in_use() {
  std::lock_guard lock(budget_mutex);
  return budget_in_use;
}

}  // namespace mx2nv

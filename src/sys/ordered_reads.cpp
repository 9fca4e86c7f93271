#include "sys/ordered_reads.hpp"

#include <exception>
#include <limits>
#include <utility>

namespace mx2nv {

ReadOrder::ReadOrder(std::vector<bool> may_wait) : may_wait_(std::move(may_wait)), passed_(may_wait_) {
  passed_.flip();
  while (lowest_open_ < passed_.size() && passed_[lowest_open_]) ++lowest_open_;
}

ReadOrder::Turn::Turn(ReadOrder& order, std::size_t item)
    : order_(&order),
      item_(item),
      passed_(item >= order.may_wait_.size() || !order.may_wait_[item]),
      exceptions_(std::uncaught_exceptions()) {}

ReadOrder::Turn::~Turn() {
  // A failing item gives the order up whether or not it had passed (or could
  // ever wait): once a pass fails, its workers stop taking items between
  // fetching one and running it, and an item so fetched never passes.
  if (std::uncaught_exceptions() > exceptions_) {
    order_->abandon();
  } else if (!passed_) {
    order_->pass(item_);
  }
}

void ReadOrder::Turn::read(const File& file, std::uint64_t offset, std::span<std::byte> out) {
  if (!passed_ && !waited_ && out.size() >= kOrderedReadBytes && file.cached(offset, out.size()) == false) wait();
  file.read_at(offset, out);
}

void ReadOrder::Turn::wait() {
  if (passed_ || waited_) return;
  order_->wait_for(item_);
  waited_ = true;
}

void ReadOrder::Turn::pass() {
  if (passed_) return;
  passed_ = true;
  order_->pass(item_);
}

void ReadOrder::wait_for(std::size_t item) {
  std::unique_lock lock(mutex_);
  ++waiting_;
  advanced_.wait(lock, [&] { return lowest_open_ >= item; });
  --waiting_;
}

void ReadOrder::pass(std::size_t item) {
  bool advanced = false;
  {
    std::lock_guard lock(mutex_);
    if (item < passed_.size()) passed_[item] = true;
    while (lowest_open_ < passed_.size() && passed_[lowest_open_]) {
      ++lowest_open_;
      advanced = true;
    }
    advanced = advanced && waiting_ > 0;
  }
  if (advanced) advanced_.notify_all();
}

void ReadOrder::abandon() {
  {
    std::lock_guard lock(mutex_);
    lowest_open_ = std::numeric_limits<std::size_t>::max();
  }
  advanced_.notify_all();
}

}  // namespace mx2nv

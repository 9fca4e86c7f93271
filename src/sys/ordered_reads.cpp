#include "sys/ordered_reads.hpp"

#include <algorithm>
#include <exception>
#include <limits>
#include <utility>

namespace mx2nv {

namespace {

unsigned readers_for(const std::vector<bool>& may_wait, unsigned computing) {
  const bool any = std::find(may_wait.begin(), may_wait.end(), true) != may_wait.end();
  const std::uint64_t wanted = std::uint64_t{computing} + (any ? std::min(computing, ReadOrder::kMostExtraReaders) : 0);
  return static_cast<unsigned>(std::max<std::uint64_t>(1, std::min<std::uint64_t>(wanted, may_wait.size())));
}

}  // namespace

ReadOrder::ReadOrder(std::vector<bool> may_wait, unsigned computing)
    : may_wait_(std::move(may_wait)),
      passed_(may_wait_),
      readers_(readers_for(may_wait_, std::max(1u, computing))),
      computing_(std::max(1u, computing)) {
  passed_.flip();
  while (lowest_open_ < passed_.size() && passed_[lowest_open_]) ++lowest_open_;
}

void ReadOrder::Place::take(ReadOrder& order) {
  if (order_ == &order) return;
  leave();  // another order's (a state reused across passes)
  order.computing_.acquire();
  order_ = &order;
}

void ReadOrder::Place::leave() {
  if (!order_) return;
  order_->computing_.release();
  order_ = nullptr;
}

ReadOrder::Turn::Turn(ReadOrder& order, std::size_t item, Place& place)
    : order_(&order),
      place_(&place),
      item_(item),
      large_(item < order.may_wait_.size() && order.may_wait_[item]),
      passed_(!large_),
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

std::span<const std::byte> ReadOrder::Turn::read(const File& file, std::uint64_t offset, std::uint64_t n,
                                                 ReadBuffer& buffer) {
  if (large_ && file.cached(offset, n) == false) {
    place_->leave();  // waiting for the disk
    if (const auto direct = buffer.read_direct(file, offset, n)) {
      ++direct_reads_;
      return *direct;
    }
    wait();  // once, and only before the item's pass
    return buffer.read(file, offset, n);  // from the disk: no place held, taken at the pass
  }
  place_->take(*order_);  // copying from the cache
  return buffer.read(file, offset, n);
}

void ReadOrder::Turn::wait() {
  if (passed_ || waited_) return;
  place_->leave();
  order_->wait_for(item_);
  waited_ = true;
}

void ReadOrder::Turn::pass() {
  if (!passed_) {
    passed_ = true;
    order_->pass(item_);
  }
  place_->take(*order_);  // the work on what was read
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

#include "destination/commit_queue.hpp"

#include <algorithm>
#include <utility>

namespace mx2nv {

CommitQueue::CommitQueue(Destination& out, std::size_t max_pending)
    : out_(out), max_pending_(std::max<std::size_t>(1, max_pending)), thread_([this] { run(); }) {}

CommitQueue::~CommitQueue() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void CommitQueue::rethrow_locked() {
  if (error_) std::rethrow_exception(error_);
}

void CommitQueue::push(Destination::Pending pending, AfterCommit after) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return error_ || items_.size() < max_pending_; });
  rethrow_locked();
  items_.push_back({std::move(pending), std::move(after)});
  lock.unlock();
  changed_.notify_all();
}

void CommitQueue::finish() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return error_ || (items_.empty() && !busy_); });
  rethrow_locked();
}

void CommitQueue::run() {
  for (;;) {
    Item item;
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || (!items_.empty() && !error_); });
      if (stopping_ || error_) return;
      item = std::move(items_.front());
      items_.pop_front();
      busy_ = true;
    }
    changed_.notify_all();  // room for a pusher
    try {
      out_.commit(item.pending);
      if (item.after) item.after();
    } catch (...) {
      std::lock_guard lock(mutex_);
      error_ = std::current_exception();
    }
    {
      std::lock_guard lock(mutex_);
      busy_ = false;
    }
    changed_.notify_all();
  }
}

}  // namespace mx2nv

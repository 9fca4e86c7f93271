// Commits written files on a thread of its own, so a shard worker does not
// wait for the device: the fsync (and the rename, and whatever the caller
// does once a file is in place, such as its resume record) happens while the
// worker computes its next shard. With many small shards, fsyncs done by the
// workers themselves would hold up every shard.
//
// Bounded: at most `max_pending` files wait, each holding its descriptor and
// whatever its callback keeps (a shard's lock, its record); push() blocks
// while the queue is full. The first error of a commit or callback is
// rethrown by the next push() and by finish(); later items are then dropped,
// their temporary files left to Destination's clean-up.
#pragma once

#include "destination/destination.hpp"

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace mx2nv {

class CommitQueue {
 public:
  // Runs on the committing thread once the file is in place.
  using AfterCommit = std::function<void()>;

  CommitQueue(Destination& out, std::size_t max_pending);
  // Stops after the commit in progress; what is still queued is dropped
  // (finish() was not reached: the run is failing or cancelled).
  ~CommitQueue();
  CommitQueue(const CommitQueue&) = delete;
  CommitQueue& operator=(const CommitQueue&) = delete;

  void push(Destination::Pending pending, AfterCommit after);
  // Waits until everything pushed is committed; rethrows the first error.
  void finish();

 private:
  struct Item {
    Destination::Pending pending;
    AfterCommit after;
  };
  void run();
  void rethrow_locked();

  Destination& out_;
  const std::size_t max_pending_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Item> items_;
  bool busy_ = false;  // an item taken off the queue is being committed
  bool stopping_ = false;
  std::exception_ptr error_;
  std::jthread thread_;  // last: started once everything above exists
};

}  // namespace mx2nv

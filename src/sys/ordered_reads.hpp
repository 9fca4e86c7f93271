// Reads that reach the disk in the order of the items they serve, whichever
// worker makes them.
//
// verify and compare hand modules to their workers in file order
// (parallel_for_with) and read each module's ranges front to back. Left to
// themselves, two workers send each file two interleaved streams, every
// read skipping the other worker's module: the kernel's readahead, kept per
// open file, restarts at the jumps, its requests come out shorter, and under
// a memory limit pages read ahead are evicted before their use and read
// again. Here an item's reads of kOrderedReadBytes or more that the page
// cache does not hold whole (File::cached) wait until every earlier item that
// may wait has passed (verify and compare pass after a module's first
// chunk): the files read front to back, as a sequential copy reads them. A read
// the cache holds does not wait, so a pass over cached files runs as before
// (and where the kernel cannot tell, as before too); smaller reads never
// wait (a K3-structure checkpoint's tiny tensors, by the hundred thousand,
// would spend more in the hand-over than the order gives back).
#pragma once

#include "sys/file.hpp"

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

namespace mx2nv {

inline constexpr std::size_t kOrderedReadBytes = 1 << 20;

class ReadOrder {
 public:
  // Items 0 .. may_wait.size() - 1; an item whose reads are all smaller than
  // kOrderedReadBytes never waits and is nobody's wait (no lock taken for it):
  // may_wait[item] false.
  explicit ReadOrder(std::vector<bool> may_wait);
  // Whether an item whose largest read is `bytes` may wait (the one place the
  // threshold is applied).
  static bool may_wait(std::uint64_t bytes) { return bytes >= kOrderedReadBytes; }

  // One item's reads. Passes the item on when it ends; a throw, before or
  // after its pass, gives up the order altogether, so no worker waits for an
  // item that no worker will run.
  class Turn {
   public:
    Turn(ReadOrder& order, std::size_t item);
    ~Turn();
    Turn(const Turn&) = delete;
    Turn& operator=(const Turn&) = delete;

    // file.read_at(offset, out), in the item's turn where it is large and
    // the page cache does not hold all of it (file comment).
    void read(const File& file, std::uint64_t offset, std::span<std::byte> out);
    // Waits, once, until every earlier item has passed (read's wait).
    void wait();
    // The item's reads are made (later ones do not wait): the next item may
    // read.
    void pass();
    bool waited() const { return waited_; }

   private:
    ReadOrder* order_;
    std::size_t item_;
    bool waited_ = false, passed_ = false;
    int exceptions_;  // std::uncaught_exceptions() when made
  };

 private:
  void wait_for(std::size_t item);
  void pass(std::size_t item);
  void abandon();

  std::mutex mutex_;
  std::condition_variable advanced_;
  const std::vector<bool> may_wait_;  // read without the lock: never written
  std::vector<bool> passed_;          // items that cannot wait start passed
  std::size_t lowest_open_ = 0;  // every item below it has passed
  std::size_t waiting_ = 0;
};

}  // namespace mx2nv

// How verify and compare read a module's ranges from a cold cache, whichever
// worker reads them.
//
// Both hand modules to their workers in file order (parallel_for_with) and
// read each module's ranges front to back. Through the page cache, two
// workers send each file two interleaved streams, every read skipping the
// other worker's module: the kernel's readahead, kept per open file,
// restarts at the jumps, its requests come out shorter, and under a memory
// limit pages read ahead are evicted before their use and read again.
//
// So a module whose largest read is kOrderedReadBytes or more reads each
// range that the page cache does not hold whole (File::cached) past the
// cache (File::read_direct into a ReadBuffer): each range once, in requests
// as large as the buffer's pages allow, whatever the other workers read, and
// nothing left cached to crowd out what the pass still needs. Where a file
// cannot be read so, such a read waits instead until every earlier module
// that may wait has passed (verify and compare pass after each chunk's
// reads; only the first chunk's can wait), so the files are read front to
// back, as a sequential copy reads them. Ranges the cache holds are read
// from it and never wait (a warm pass runs as it would alone; so too where
// the kernel cannot tell what is cached). Smaller modules always read
// through the cache and never wait: a K3-structure checkpoint's tiny
// tensors, by the hundred thousand, are read best by the kernel's readahead,
// and would spend more in the hand-over than the order gives back.
//
// A read past the cache is synchronous, and no readahead reads ahead of the
// worker while it computes: so a pass with items that may wait runs
// readers() workers, the threads it may compute on and up to
// kMostExtraReaders more (also where the files turn out to refuse direct
// reads, or the kernel cannot tell what is cached: the extra workers then
// mostly wait). A worker runs only while it holds one of `computing` places
// (its Place), which it gives up while it waits for the disk or for its turn
// and otherwise keeps from one item to the next: some read while others
// compute, no more than the asked-for threads are busy at once, and in a
// pass whose reads the cache serves the first workers to take places keep
// them (the others wait until they finish), as with a worker per thread. A
// pass without items that may wait runs a worker per thread.
#pragma once

#include "sys/file.hpp"
#include "sys/read_buffer.hpp"

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <semaphore>
#include <span>
#include <vector>

namespace mx2nv {

inline constexpr std::size_t kOrderedReadBytes = 1 << 20;

class ReadOrder {
 public:
  // Items 0 .. may_wait.size() - 1; an item whose reads are all smaller than
  // kOrderedReadBytes never waits and is nobody's wait (no lock taken for it):
  // may_wait[item] false.
  // `computing`: the threads the pass may compute on (at least 1).
  ReadOrder(std::vector<bool> may_wait, unsigned computing);
  // The workers to run: the computing threads, and as many more (at most
  // kMostExtraReaders: with more threads the disk has readers enough) where
  // an item may wait; no more than there are items, at least one.
  unsigned readers() const { return readers_; }
  static constexpr unsigned kMostExtraReaders = 8;
  // Whether an item whose largest read is `bytes` may wait, and reads past
  // the cache (the one place the threshold is applied).
  static bool may_wait(std::uint64_t bytes) { return bytes >= kOrderedReadBytes; }

  class Turn;
  // A worker's computing place, kept from one of its items to the next
  // (a member of the worker's state, default-made), given back when
  // destroyed: when the worker stops. Only for Turns of one ReadOrder, which
  // outlives it.
  class Place {
   public:
    Place() = default;
    ~Place() { leave(); }
    Place(const Place&) = delete;
    Place& operator=(const Place&) = delete;

   private:
    friend class Turn;
    void take(ReadOrder& order);
    void leave();
    ReadOrder* order_ = nullptr;  // while held
  };

  // One item's reads and work, in its worker's Place: taken (waiting for
  // one) before a read through the cache or at its pass, given up while the
  // item waits for the disk or its turn. Passes the item on when it ends; a
  // throw, before or after its pass, gives up the order altogether, so no
  // worker waits for an item that no worker will run.
  class Turn {
   public:
    Turn(ReadOrder& order, std::size_t item, Place& place);
    ~Turn();
    Turn(const Turn&) = delete;
    Turn& operator=(const Turn&) = delete;

    // The n bytes of `file` at `offset`, read into `buffer`: past the cache
    // or in the item's turn where the item may wait and the page cache does
    // not hold all of them (file comment).
    std::span<const std::byte> read(const File& file, std::uint64_t offset, std::uint64_t n, ReadBuffer& buffer);
    // Waits, once, until every earlier item has passed (read's wait),
    // without its computing place meanwhile.
    void wait();
    // A chunk's reads are made, its work begins: the next item may read
    // (later reads of this one do not wait), and the worker takes a
    // computing place (waiting for one) until it reads from the disk again.
    // Called after each chunk's reads.
    void pass();
    bool waited() const { return waited_; }
    std::size_t direct_reads() const { return direct_reads_; }  // read past the cache

   private:
    ReadOrder* order_;
    Place* place_;
    std::size_t item_;
    bool large_;  // the item may wait (ReadOrder::may_wait)
    bool waited_ = false, passed_ = false;
    std::size_t direct_reads_ = 0;
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
  const unsigned readers_;
  std::counting_semaphore<> computing_;
};

}  // namespace mx2nv

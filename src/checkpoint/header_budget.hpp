// Shard headers held at once across worker threads. A header is small in a
// real checkpoint but may be 100 MB (the format's cap) in a hostile one, and
// what the parsed header and the layouts derived from it hold is a
// few times its text. Each worker holds a shard's header while it works on
// the shard, so without a gate N workers could hold N capped headers. A
// ticket for a header of length L takes min(L, kHeaderBytesInFlight) of one
// process-wide budget and waits while the budget is taken: real headers
// never wait, hostile ones go one at a time.
//
// A thread that already holds a ticket may always take another (verify holds
// a shard's source and target headers together): only threads holding none
// wait, so waiting never deadlocks. A ticket is released on the thread that
// took it.
#pragma once

#include <cstdint>

namespace mx2nv {

inline constexpr std::uint64_t kHeaderBytesInFlight = 32ull << 20;

class HeaderTicket {
 public:
  HeaderTicket() = default;
  explicit HeaderTicket(std::uint64_t header_length);  // blocks until granted
  HeaderTicket(HeaderTicket&& other) noexcept : bytes_(other.bytes_), held_(other.held_) { other.held_ = false; }
  HeaderTicket& operator=(HeaderTicket&& other) noexcept;
  HeaderTicket(const HeaderTicket&) = delete;
  HeaderTicket& operator=(const HeaderTicket&) = delete;
  ~HeaderTicket() { release(); }

  // Budget bytes taken by all tickets now (tests).
  static std::uint64_t in_use();

 private:
  void release() noexcept;
  std::uint64_t bytes_ = 0;
  bool held_ = false;
};

}  // namespace mx2nv

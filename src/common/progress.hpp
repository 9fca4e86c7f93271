// Progress of a long-running command (convert, verify), reported through a
// callback the front end supplies: the library never prints. The CLI renders
// it as a live terminal line or JSON lines; the Python package hands it to a
// Python callable or tqdm.
//
// Callbacks are serialized (never two at once) but may come from any worker
// thread. Updates are rate-limited (at most one per kMinInterval), except
// phase changes, the last unit of a phase and the final update, which are
// always delivered.
#pragma once

#include "common/command.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

namespace mx2nv {

enum class ProgressPhase {
  Plan,      // read headers and scales, decide (convert); open both sides, check structure (verify)
  Shards,    // the bulk: write shards (convert), compare values (verify)
  Finalize,  // companions, config, index (convert); tally (verify)
  Done,      // the last update of a successful run
};
const char* phase_name(ProgressPhase phase) noexcept;

struct Progress {
  Command command = Command::Convert;  // convert or verify
  ProgressPhase phase = ProgressPhase::Plan;
  std::uint64_t bytes_done = 0;   // bytes of tensor data written (convert) or compared (verify)
  std::uint64_t bytes_total = 0;  // 0 while unknown (plan)
  std::uint64_t units_done = 0;   // shards written (convert) or modules compared (verify)
  std::uint64_t units_total = 0;
  std::string unit;               // "shards" | "modules"
  double seconds = 0;             // since the command started
};

using ProgressCallback = std::function<void(const Progress&)>;

// Counts work from many threads and calls the callback. Without a callback
// every method is a cheap no-op.
class ProgressTracker {
 public:
  static constexpr std::chrono::milliseconds kMinInterval{50};

  ProgressTracker(Command command, std::string unit, ProgressCallback callback);

  // Enters a phase; totals of 0 mean "unknown". Resets the done counters.
  void phase(ProgressPhase phase, std::uint64_t bytes_total = 0, std::uint64_t units_total = 0);
  void add_bytes(std::uint64_t n);  // hot path: an atomic add, a clock read, rarely a callback
  void unit_done(std::uint64_t bytes_not_counted = 0);  // one unit finished; its remaining bytes, if any
  void done();

 private:
  void emit(bool force);

  ProgressCallback callback_;
  Command command_;
  std::string unit_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::atomic<std::int64_t> last_emit_ns_{0};
  std::atomic<std::uint64_t> bytes_done_{0}, units_done_{0};
  std::mutex mutex_;  // serializes callbacks and guards the fields below
  ProgressPhase phase_ = ProgressPhase::Plan;
  std::uint64_t bytes_total_ = 0, units_total_ = 0;
};

}  // namespace mx2nv

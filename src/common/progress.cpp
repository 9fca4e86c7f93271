#include "common/progress.hpp"

namespace mx2nv {

const char* phase_name(ProgressPhase phase) noexcept {
  switch (phase) {
    case ProgressPhase::Plan: return "plan";
    case ProgressPhase::Shards: return "shards";
    case ProgressPhase::Finalize: return "finalize";
    case ProgressPhase::Done: return "done";
  }
  return "unknown";
}

ProgressTracker::ProgressTracker(Command command, std::string unit, ProgressCallback callback)
    : callback_(std::move(callback)), command_(command), unit_(std::move(unit)) {}

void ProgressTracker::phase(ProgressPhase phase, std::uint64_t bytes_total, std::uint64_t units_total) {
  if (!callback_) return;
  {
    std::lock_guard lock(mutex_);
    phase_ = phase;
    bytes_total_ = bytes_total;
    units_total_ = units_total;
    bytes_done_ = 0;
    units_done_ = 0;
  }
  emit(true);
}

void ProgressTracker::add_bytes(std::uint64_t n) {
  if (!callback_) return;
  bytes_done_.fetch_add(n, std::memory_order_relaxed);
  emit(false);
}

void ProgressTracker::unit_done(std::uint64_t bytes_not_counted) {
  if (!callback_) return;
  bytes_done_.fetch_add(bytes_not_counted, std::memory_order_relaxed);
  const std::uint64_t done = units_done_.fetch_add(1, std::memory_order_relaxed) + 1;
  std::uint64_t total = 0;
  {
    std::lock_guard lock(mutex_);
    total = units_total_;
  }
  emit(done == total);  // the last unit always; the others rate-limited (verify counts 100k+ modules)
}

void ProgressTracker::done() {
  if (!callback_) return;
  {
    std::lock_guard lock(mutex_);
    phase_ = ProgressPhase::Done;
  }
  emit(true);
}

void ProgressTracker::emit(bool force) {
  const auto now = std::chrono::steady_clock::now();
  const std::int64_t now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now - started_).count();
  if (!force) {
    const std::int64_t last = last_emit_ns_.load(std::memory_order_relaxed);
    if (now_ns - last < std::chrono::nanoseconds(kMinInterval).count()) return;
    // One worker wins the slot; the others go back to work.
    std::int64_t expected = last;
    if (!last_emit_ns_.compare_exchange_strong(expected, now_ns)) return;
  } else {
    last_emit_ns_.store(now_ns, std::memory_order_relaxed);
  }
  std::unique_lock lock(mutex_, std::defer_lock);
  if (force) {
    lock.lock();
  } else if (!lock.try_lock()) {
    return;  // a callback is running; a later update will carry these bytes
  }
  Progress p;
  p.command = command_;
  p.phase = phase_;
  p.bytes_total = bytes_total_;
  p.units_total = units_total_;
  p.unit = unit_;
  // Counters can run ahead of the totals only through a bug; clamp so a
  // renderer never shows more than 100%.
  p.bytes_done = bytes_done_.load(std::memory_order_relaxed);
  if (p.bytes_total && p.bytes_done > p.bytes_total) p.bytes_done = p.bytes_total;
  p.units_done = units_done_.load(std::memory_order_relaxed);
  p.seconds = static_cast<double>(now_ns) / 1e9;
  callback_(p);
}

}  // namespace mx2nv

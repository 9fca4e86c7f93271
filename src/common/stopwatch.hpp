// Wall time of a run, as the reports' `seconds` give it: a monotonic clock,
// so a clock adjustment during a run never yields a negative or jumped time.
#pragma once

#include <chrono>

namespace mx2nv {

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace mx2nv

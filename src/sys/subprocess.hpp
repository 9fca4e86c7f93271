// Running another program (gate's runtime probe in a Python interpreter)
// and taking its output, bounded in every way: argv only (no shell), the
// caller's environment unchanged, stdin from a string, stdout kept up to a
// cap, the tail of stderr kept, a wall-clock limit, the whole process group
// killed when a limit is hit. Nothing here throws for what the program
// does; the result says how it ended.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace mx2nv {

struct SubprocessLimits {
  std::chrono::milliseconds timeout{120'000};
  std::size_t max_stdout = std::size_t{1} << 20;  // more is an error (the program is not what we think)
  std::size_t max_stderr_tail = 8 << 10;         // only the last bytes are kept
};

struct SubprocessResult {
  enum class End {
    Exited,          // status: the exit code
    Signaled,        // status: the signal
    TimedOut,        // killed at the limit
    OutputTooLarge,  // killed: stdout passed max_stdout
    Cancelled,       // killed: a stop was requested (common/cancel.hpp)
    NotStarted,      // spawn failed: start_error says why (e.g. no such program)
  } end = End::NotStarted;
  int status = 0;
  std::string out;
  std::string err_tail;
  std::string start_error;
};

// argv[0] is looked up on PATH when it has no '/'. Throws Error(Usage) for an
// empty argv or an argument holding a NUL byte; Error(Io) when pipes cannot
// be made.
SubprocessResult run_subprocess(const std::vector<std::string>& argv, std::string_view input,
                                const SubprocessLimits& limits);

// "exited with status 3", "killed by signal 9", "timed out after 120 s"...
std::string describe_end(const SubprocessResult& r, const SubprocessLimits& limits);

}  // namespace mx2nv

// What the commands print. Standard output is written through one checked
// path: a failure to write it (a full device, a closed descriptor, a reader
// that went away) is an I/O error, exit 4, "cannot write to standard output:
// <reason>", never a silent success and never a SIGPIPE death; a write that
// waits on a reader gives up once SIGINT or SIGTERM arrived. Standard error
// carries messages only; a failure there is ignored (nowhere is left to tell).
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>
#include <utility>

namespace mx2nv::cli {

// Before anything else in main: descriptors 0, 1 and 2 that are closed are
// held by /dev/null opened read-only (so no file the command opens becomes
// its stdout, and a write there fails with EBADF), and SIGPIPE is ignored
// (a reader that went away is EPIPE, told like any other write error).
void prepare_standard_streams() noexcept;

// Appends to standard output; written when enough is gathered and at
// flush_out(). Throws Error(Io) as described above.
void out_text(std::string_view text);
template <typename... Args>
void out(fmt::format_string<Args...> format, Args&&... args) {
  out_text(fmt::format(format, std::forward<Args>(args)...));
}
// Writes what out() gathered (before a report goes to /dev/stdout too, and
// before the command exits).
void flush_out();
// Forgets what out() gathered and not yet wrote (after a failure to write it).
void discard_out() noexcept;

// A message on standard error; never throws.
void err_text(std::string_view text) noexcept;
template <typename... Args>
void err(fmt::format_string<Args...> format, Args&&... args) noexcept {
  try {
    err_text(fmt::format(format, std::forward<Args>(args)...));
  } catch (...) {
  }
}

}  // namespace mx2nv::cli

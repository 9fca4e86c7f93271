// How a run ends, and the one error type of the library. A run ends in one
// Outcome; an Error carries a kind that says which exit code it maps to and a
// message that names what was concerned (file, tensor, row, group) so a user
// can act on it without a debugger. exit_code() is the only mapping to
// process exit codes; scripts depend on it.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace mx2nv {

// ok: done. refused: policy said no (over-span, unrepresentable global).
// mismatch: verify found a difference. error: an Error was thrown.
enum class Outcome { Ok, Refused, Mismatch, Error };

enum class ErrorKind {
  Usage,         // the caller asked for something impossible: exit 2
  InvalidInput,  // the checkpoint is malformed or unsupported: exit 3
  Io,            // the operating system said no (also interruption, out of memory): exit 4
};

inline constexpr int kExitOk = 0;
inline constexpr int kExitRefusedOrMismatch = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitInvalidInput = 3;
inline constexpr int kExitIo = 4;

// Stable exit codes: 0 ok, 1 refused or mismatch, 2 usage, 3 invalid input, 4 I/O.
int exit_code(ErrorKind kind) noexcept;
int exit_code(Outcome outcome, ErrorKind error_kind) noexcept;
std::string_view outcome_name(Outcome outcome) noexcept;
const char* kind_name(ErrorKind kind) noexcept;

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message);
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

template <typename... Args>
[[noreturn]] void fail(ErrorKind kind, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(kind, fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
[[noreturn]] void fail_input(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(ErrorKind::InvalidInput, fmt::format(format, std::forward<Args>(args)...));
}

// Re-throws `error` with `context` prepended, keeping its kind.
[[noreturn]] void rethrow_with_context(const Error& error, const std::string& context);

// The exception in flight (inside a catch block) as an Error: an Error as it
// is; out of memory and file-system exceptions as Io. Anything else is a bug
// in mx2nv, reported as an Io error whose message says "internal error".
Error current_exception_as_error() noexcept;

}  // namespace mx2nv

// One error type for the whole library. Every failure carries a kind that maps
// to a stable process exit code, and a message that names what was concerned
// (file, tensor, row, group) so a user can act on it without a debugger.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace mx2nv {

enum class ErrorKind {
  Refused,       // policy says no (over-span), or verify found a difference: exit 1
  Usage,         // the caller asked for something impossible: exit 2
  InvalidInput,  // the checkpoint is malformed or unsupported: exit 3
  Io,            // the operating system said no: exit 4
};

// Stable exit codes; scripts depend on them.
int exit_code(ErrorKind kind) noexcept;
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

}  // namespace mx2nv

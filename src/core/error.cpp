#include "core/error.hpp"

namespace mx2nv {

int exit_code(ErrorKind kind) noexcept {
  switch (kind) {
    case ErrorKind::Refused: return 1;
    case ErrorKind::Usage: return 2;
    case ErrorKind::InvalidInput: return 3;
    case ErrorKind::Io: return 4;
  }
  return 4;
}

const char* kind_name(ErrorKind kind) noexcept {
  switch (kind) {
    case ErrorKind::Refused: return "refused";
    case ErrorKind::Usage: return "usage";
    case ErrorKind::InvalidInput: return "invalid input";
    case ErrorKind::Io: return "I/O error";
  }
  return "error";
}

Error::Error(ErrorKind kind, std::string message) : std::runtime_error(std::move(message)), kind_(kind) {}

void rethrow_with_context(const Error& error, const std::string& context) {
  throw Error(error.kind(), context + ": " + error.what());
}

}  // namespace mx2nv

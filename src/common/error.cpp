#include "common/error.hpp"

#include <filesystem>
#include <new>

namespace mx2nv {

int exit_code(ErrorKind kind) noexcept {
  switch (kind) {
    case ErrorKind::Usage: return kExitUsage;
    case ErrorKind::InvalidInput: return kExitInvalidInput;
    case ErrorKind::Io: return kExitIo;
  }
  return kExitIo;
}

int exit_code(Outcome outcome, ErrorKind error_kind) noexcept {
  switch (outcome) {
    case Outcome::Ok: return kExitOk;
    case Outcome::Refused:
    case Outcome::Mismatch: return kExitRefusedOrMismatch;
    case Outcome::Error: return exit_code(error_kind);
  }
  return kExitIo;
}

std::string_view outcome_name(Outcome outcome) noexcept {
  switch (outcome) {
    case Outcome::Ok: return "ok";
    case Outcome::Refused: return "refused";
    case Outcome::Mismatch: return "mismatch";
    case Outcome::Error: return "error";
  }
  return "error";
}

const char* kind_name(ErrorKind kind) noexcept {
  switch (kind) {
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

Error current_exception_as_error() noexcept {
  try {
    try {
      throw;
    } catch (const Error& e) {
      return e;
    } catch (const std::bad_alloc&) {
      return Error(ErrorKind::Io, "out of memory");
    } catch (const std::filesystem::filesystem_error& e) {
      return Error(ErrorKind::Io, e.what());
    } catch (const std::exception& e) {
      return Error(ErrorKind::Io, std::string("internal error: ") + e.what());
    } catch (...) {
      return Error(ErrorKind::Io, "internal error: unknown exception");
    }
  } catch (...) {  // building the message itself ran out of memory
    return Error(ErrorKind::Io, "");
  }
}

}  // namespace mx2nv

#include "cli/standard_output.hpp"

#include "common/cancel.hpp"
#include "common/error.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

namespace mx2nv::cli {
namespace {

// Gathered output is written once it reaches this size.
constexpr std::size_t kOutBufferBytes = std::size_t{1} << 16;
// A pipe accepts a write of at most PIPE_BUF bytes without blocking once
// poll() says it is writable.
constexpr std::size_t kPipeChunkBytes = PIPE_BUF;
// How often a write waiting on a reader looks for SIGINT or SIGTERM.
constexpr int kStopPollMs = 100;

std::string& gathered() {
  static std::string text;
  return text;
}

[[noreturn]] void fail_stdout(int error) {
  discard_out();
  fail(ErrorKind::Io, "cannot write to standard output: {}", std::strerror(error));
}

// Regular files and block devices never wait on a reader; anything else
// (a pipe, FIFO, socket or terminal) may, so it is written in pieces a
// writable descriptor takes without blocking, polled so that a stop request
// is seen while the reader does not read.
bool may_wait(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return false;
  return !S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode);
}

void write_stdout(std::string_view text) {
  static const bool waits = may_wait(STDOUT_FILENO);
  std::size_t done = 0;
  while (done < text.size()) {
    throw_if_stopped();
    std::size_t size = text.size() - done;
    if (waits) {
      pollfd p{STDOUT_FILENO, POLLOUT, 0};
      const int ready = ::poll(&p, 1, kStopPollMs);
      if (ready < 0 && errno != EINTR) fail_stdout(errno);
      if (ready <= 0) continue;
      if ((p.revents & POLLNVAL) != 0) fail_stdout(EBADF);
      size = std::min(size, kPipeChunkBytes);
    }
    const ssize_t n = ::write(STDOUT_FILENO, text.data() + done, size);
    if (n >= 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {  // a descriptor another process made non-blocking
      pollfd p{STDOUT_FILENO, POLLOUT, 0};
      (void)::poll(&p, 1, kStopPollMs);
      continue;
    }
    fail_stdout(errno);
  }
}

}  // namespace

void prepare_standard_streams() noexcept {
  for (const int fd : {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO}) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    const int held = ::open("/dev/null", O_RDONLY);
    if (held >= 0 && held != fd) {  // the lowest free descriptor, `fd` itself unless a lower one is free too
      ::dup2(held, fd);
      ::close(held);
    }
  }
  std::signal(SIGPIPE, SIG_IGN);
}

void out_text(std::string_view text) {
  // A terminal sees each line as it is printed (the demo prints in stages).
  static const bool terminal = ::isatty(STDOUT_FILENO) == 1;
  std::string& buffer = gathered();
  buffer += text;
  if (buffer.size() >= kOutBufferBytes || terminal) flush_out();
}

void flush_out() {
  std::string& buffer = gathered();
  if (buffer.empty()) return;
  write_stdout(buffer);
  buffer.clear();
}

void discard_out() noexcept { gathered().clear(); }

void err_text(std::string_view text) noexcept {
  // Like stdout, a stderr nobody reads is waited for, but once a stop was
  // requested only for a moment: the message is lost rather than the
  // interrupted command kept from exiting.
  static const bool waits = may_wait(STDERR_FILENO);
  constexpr int kPollsAfterStop = 10;
  int polls_after_stop = 0;
  std::size_t done = 0;
  while (done < text.size()) {
    std::size_t size = text.size() - done;
    if (waits) {
      pollfd p{STDERR_FILENO, POLLOUT, 0};
      const int ready = ::poll(&p, 1, kStopPollMs);
      if (ready < 0 && errno != EINTR) return;
      if (ready <= 0) {
        if (stop_requested() && ++polls_after_stop >= kPollsAfterStop) return;
        continue;
      }
      if ((p.revents & POLLNVAL) != 0) return;
      size = std::min(size, kPipeChunkBytes);
    }
    const ssize_t n = ::write(STDERR_FILENO, text.data() + done, size);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
    } else if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (stop_requested() && ++polls_after_stop >= kPollsAfterStop) return;
      if (errno != EINTR) {
        pollfd p{STDERR_FILENO, POLLOUT, 0};
        (void)::poll(&p, 1, kStopPollMs);
      }
    } else {
      return;
    }
  }
}

}  // namespace mx2nv::cli

#include "sys/subprocess.hpp"

#include "common/cancel.hpp"
#include "common/error.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <optional>
#include <span>
#include <thread>

extern char** environ;  // NOLINT: POSIX; the child gets the caller's environment unchanged

namespace mx2nv {
namespace {

// How often the wait wakes up to see a stop request (Ctrl-C): the child has
// its own process group, so the terminal's SIGINT reaches only us.
constexpr int kPollSliceMs = 100;

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  void adopt(int fd) {
    reset();
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    fail(ErrorKind::Io, "fcntl(O_NONBLOCK): {}", std::strerror(errno));
  }
}

void make_pipe(Fd& read_end, Fd& write_end) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) fail(ErrorKind::Io, "pipe2: {}", std::strerror(errno));
  read_end.adopt(fds[0]);
  write_end.adopt(fds[1]);
}

// Owns the spawn attributes for one call.
struct SpawnSetup {
  posix_spawn_file_actions_t actions{};
  posix_spawnattr_t attr{};
  SpawnSetup() {
    posix_spawn_file_actions_init(&actions);
    posix_spawnattr_init(&attr);
  }
  SpawnSetup(const SpawnSetup&) = delete;
  SpawnSetup& operator=(const SpawnSetup&) = delete;
  ~SpawnSetup() {
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
  }
};

// Only before the child is reaped (its pid cannot be reused until then).
void kill_group(pid_t pid) {
  ::kill(-pid, SIGKILL);  // the child leads its own group: its children go too
  ::kill(pid, SIGKILL);
}

int wait_blocking(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

using End = SubprocessResult::End;
using Deadline = std::chrono::steady_clock::time_point;

// The child's standard streams, our ends and its. stdin is a socket so that
// writing to a child that stopped reading fails with EPIPE (MSG_NOSIGNAL)
// instead of raising SIGPIPE in this process.
struct ChildStreams {
  Fd in_parent, in_child, out_read, out_write, err_read, err_write;
  ChildStreams() {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
      fail(ErrorKind::Io, "socketpair: {}", std::strerror(errno));
    }
    in_parent.adopt(sv[0]);
    in_child.adopt(sv[1]);
    make_pipe(out_read, out_write);
    make_pipe(err_read, err_write);
  }
};

// Starts argv (PATH searched) on the child's ends of `s`: 0 and `pid`, or
// posix_spawn's error.
int spawn_child(const std::vector<std::string>& argv, const ChildStreams& s, pid_t& pid) {
  SpawnSetup setup;
  posix_spawn_file_actions_adddup2(&setup.actions, s.in_child.get(), 0);
  posix_spawn_file_actions_adddup2(&setup.actions, s.out_write.get(), 1);
  posix_spawn_file_actions_adddup2(&setup.actions, s.err_write.get(), 2);
  // Its own process group (to kill it with its children), default signal
  // dispositions (we may ignore SIGPIPE), nothing blocked.
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (const int sig : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD}) sigaddset(&defaults, sig);
  posix_spawnattr_setpgroup(&setup.attr, 0);
  posix_spawnattr_setsigmask(&setup.attr, &none);
  posix_spawnattr_setsigdefault(&setup.attr, &defaults);
  posix_spawnattr_setflags(&setup.attr, static_cast<short>(POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                                           POSIX_SPAWN_SETSIGDEF));
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));  // posix_spawn's historic signature
  args.push_back(nullptr);
  return ::posix_spawnp(&pid, args[0], &setup.actions, &setup.attr, args.data(), environ);
}

// One read from the child's stdout or stderr into `result`; closes the
// stream at its end. OutputTooLarge when stdout passes its limit.
std::optional<End> read_stream(Fd& fd, bool is_stdout, std::span<char> buf, SubprocessResult& result,
                               const SubprocessLimits& limits) {
  const ssize_t r = ::read(fd.get(), buf.data(), buf.size());
  if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
    fd.reset();
    return std::nullopt;
  }
  if (r < 0) return std::nullopt;
  const std::string_view got(buf.data(), static_cast<std::size_t>(r));
  if (is_stdout) {
    if (result.out.size() + got.size() > limits.max_stdout) return End::OutputTooLarge;
    result.out.append(got);
  } else {
    result.err_tail.append(got);
    if (result.err_tail.size() > 2 * limits.max_stderr_tail) {
      result.err_tail.erase(0, result.err_tail.size() - limits.max_stderr_tail);
    }
  }
  return std::nullopt;
}

// Feeds `input` to the child's stdin and reads its stdout and stderr until
// both close: nullopt, or why the child is to be killed (a stop request, the
// deadline, too much output).
std::optional<End> exchange(pid_t pid, ChildStreams& s, std::string_view input, Deadline deadline,
                            SubprocessResult& result, const SubprocessLimits& limits) {
  std::size_t sent = 0;
  if (input.empty()) s.in_parent.reset();
  std::array<char, 65536> buf{};
  while (s.out_read.get() >= 0 || s.err_read.get() >= 0) {
    if (stop_requested()) return End::Cancelled;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return End::TimedOut;
    std::array<pollfd, 3> fds{{{s.out_read.get(), POLLIN, 0}, {s.err_read.get(), POLLIN, 0}, {s.in_parent.get(), POLLOUT, 0}}};
    const int n = ::poll(fds.data(), fds.size(), static_cast<int>(std::min<long long>(left.count(), kPollSliceMs)));
    if (n < 0 && errno != EINTR) {
      kill_group(pid);
      wait_blocking(pid);
      fail(ErrorKind::Io, "poll: {}", std::strerror(errno));
    }
    if (n <= 0) continue;
    if (fds[2].revents != 0) {
      const ssize_t w = ::send(s.in_parent.get(), input.data() + sent, input.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) sent += static_cast<std::size_t>(w);
      // Done, or the child closed its stdin (EPIPE): it answers without the rest.
      if (sent == input.size() || (w < 0 && errno != EAGAIN && errno != EINTR)) s.in_parent.reset();
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[static_cast<std::size_t>(i)].revents == 0) continue;
      if (const auto end = read_stream(i == 0 ? s.out_read : s.err_read, i == 0, buf, result, limits)) return end;
    }
  }
  return std::nullopt;
}

// Output closed: the child is exiting (or closed its pipes and lingers,
// which the deadline ends). nullopt with its wait status, or why it is to be
// killed.
std::optional<End> wait_for_exit(pid_t pid, Deadline deadline, int& status) {
  for (;;) {
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) return std::nullopt;
    if (w < 0 && errno != EINTR) return std::nullopt;
    std::optional<End> why;
    if (stop_requested()) why = End::Cancelled;
    if (std::chrono::steady_clock::now() >= deadline) why = End::TimedOut;  // the deadline is the reason when both
    if (why) return why;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

SubprocessResult run_subprocess(const std::vector<std::string>& argv, std::string_view input,
                                const SubprocessLimits& limits) {
  if (argv.empty()) fail(ErrorKind::Usage, "no program to run");
  for (const auto& a : argv) {
    if (a.find('\0') != std::string::npos) fail(ErrorKind::Usage, "a program argument holds a NUL byte");
  }
  SubprocessResult result;
  ChildStreams streams;
  pid_t pid = 0;
  if (const int rc = spawn_child(argv, streams, pid); rc != 0) {
    result.end = End::NotStarted;
    result.start_error = std::strerror(rc);
    return result;
  }
  streams.in_child.reset();
  streams.out_write.reset();
  streams.err_write.reset();
  set_nonblocking(streams.in_parent.get());
  set_nonblocking(streams.out_read.get());
  set_nonblocking(streams.err_read.get());

  const Deadline deadline = std::chrono::steady_clock::now() + limits.timeout;
  std::optional<End> killed = exchange(pid, streams, input, deadline, result, limits);
  if (result.err_tail.size() > limits.max_stderr_tail) {
    result.err_tail.erase(0, result.err_tail.size() - limits.max_stderr_tail);
  }
  int status = 0;
  if (!killed) killed = wait_for_exit(pid, deadline, status);
  if (killed) {
    kill_group(pid);
    wait_blocking(pid);
    result.end = *killed;
    return result;
  }
  if (WIFEXITED(status)) {
    result.end = End::Exited;
    result.status = WEXITSTATUS(status);
  } else {
    result.end = End::Signaled;
    result.status = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  }
  return result;
}

std::string describe_end(const SubprocessResult& r, const SubprocessLimits& limits) {
  switch (r.end) {
    case SubprocessResult::End::Exited: return fmt::format("exited with status {}", r.status);
    case SubprocessResult::End::Signaled: return fmt::format("killed by signal {}", r.status);
    case SubprocessResult::End::TimedOut:
      return fmt::format("gave no complete answer within {} s and was killed", static_cast<double>(limits.timeout.count()) / 1000.0);
    case SubprocessResult::End::OutputTooLarge:
      return fmt::format("wrote more than {} bytes to stdout and was killed", limits.max_stdout);
    case SubprocessResult::End::Cancelled: return "was stopped (interrupted)";
    case SubprocessResult::End::NotStarted: return fmt::format("could not be started: {}", r.start_error);
  }
  return "ended";
}

}  // namespace mx2nv

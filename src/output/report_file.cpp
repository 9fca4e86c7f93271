#include "output/report_file.hpp"

#include "common/error.hpp"
#include "common/cancel.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <set>
#include <stdexcept>

namespace mx2nv {
namespace {

// Every symlink a path may pass through before it is refused (the kernel's
// own limit is 40).
constexpr int kMaxLinkHops = 40;
// How long a FIFO's reader may take to open its end after mx2nv starts.
constexpr int kFifoReaderGraceMs = 2000;
// The checkpoint reader follows directory symlinks this deep (checkpoint/reader.cpp).
constexpr std::size_t kMaxTreeDepth = 16;

bool is_within(const fs::path& inner, const fs::path& outer) {
  const auto [o, i] = std::mismatch(outer.begin(), outer.end(), inner.begin(), inner.end());
  return o == outer.end();
}

// Absolute, lexically normal, without a trailing separator (whose empty last
// element would keep is_within from matching).
fs::path normal(const fs::path& p) {
  std::error_code ec;
  fs::path out = fs::absolute(p, ec).lexically_normal();
  if (ec) out = p.lexically_normal();
  if (!out.has_filename() && out.has_relative_path()) out = out.parent_path();
  return out;
}

std::optional<FileId> id_of(const struct stat& st) { return FileId{st.st_dev, st.st_ino}; }

std::optional<fs::path> real_path(const fs::path& p) {
  char* r = ::realpath(p.c_str(), nullptr);
  if (r == nullptr) return std::nullopt;
  fs::path out(r);
  std::free(r);
  return out;
}

std::optional<std::string> read_link(const fs::path& p) {
  std::string buf(PATH_MAX, '\0');
  const ssize_t n = ::readlink(p.c_str(), buf.data(), buf.size());
  if (n < 0 || static_cast<std::size_t>(n) >= buf.size()) return std::nullopt;
  buf.resize(static_cast<std::size_t>(n));
  return buf;
}

// Where a file that does not exist (yet) would be created for `path`: the
// resolved directory it names plus its name, following a dangling symlink
// to the path it names (opening it with O_CREAT creates that). nullopt when
// its directory does not exist, or after kMaxLinkHops links.
struct Absent {
  fs::path resolved;
  fs::path directory_given;  // for messages
};
std::optional<Absent> where_created(fs::path p) {
  for (int hop = 0; hop < kMaxLinkHops; ++hop) {
    const fs::path name = p.filename();
    if (name.empty() || name == "." || name == "..") return std::nullopt;
    fs::path parent = p.parent_path();
    if (parent.empty()) parent = ".";
    const auto dir = real_path(parent);
    struct stat st {};
    if (!dir || ::stat(dir->c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return std::nullopt;
    const fs::path candidate = *dir / name;
    if (::lstat(candidate.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
      const auto target = read_link(candidate);
      if (!target || target->empty()) return std::nullopt;
      const fs::path t(*target);
      p = t.is_absolute() ? t : *dir / t;
      continue;
    }
    return Absent{candidate, parent};
  }
  return std::nullopt;
}

// Writes all of `text` to `fd`, a descriptor opened for writing through
// (O_NONBLOCK for devices, FIFOs and sockets). A reader that does not read
// is waited for, in short polls, until a stop is requested (SIGINT,
// SIGTERM): then nothing waits any more. A reader that went away is EPIPE,
// an I/O error, not a SIGPIPE that kills the process: SIGPIPE is blocked in
// this thread meanwhile and a pending one taken back.
void write_all(int fd, std::string_view text, const fs::path& display) {
  sigset_t pipe_only, old;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_only, &old);
  int err = 0;
  bool gave_up = false;
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n >= 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (stop_requested()) {
        gave_up = true;
        break;
      }
      pollfd p{fd, POLLOUT, 0};
      (void)::poll(&p, 1, 200);
      continue;
    }
    err = errno;
    break;
  }
  if (err == EPIPE) {
    const timespec zero{};
    while (::sigtimedwait(&pipe_only, nullptr, &zero) == SIGPIPE) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (gave_up) {
    fail(ErrorKind::Io, "{}: write report: interrupted while waiting for a reader; nothing more is written there",
         display.string());
  }
  if (err != 0) fail_io(display, "write report", err);
}

std::string entry_name(const fs::path& root, const fs::path& entry) {
  return entry.lexically_relative(root).generic_string();
}

std::atomic<unsigned> g_report_counter{0};

}  // namespace

// --- ProtectedPaths ----------------------------------------------------------

void ProtectedPaths::add_tree(const fs::path& root) {
  if (root.empty()) return;
  const fs::path given = normal(root);
  lexical_.push_back(given);
  std::error_code ec;
  fs::path resolved = fs::weakly_canonical(given, ec);
  if (ec) resolved = given;
  resolved = normal(resolved);
  trees_.push_back({root, resolved, ""});
  struct stat st {};
  if (::stat(resolved.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return;

  // Walked as the checkpoint reader walks it: symlinks followed, directory
  // links to kMaxTreeDepth, each directory once (a link loop ends there).
  struct Dir {
    fs::path path;
    std::size_t depth;
  };
  std::vector<Dir> pending{{resolved, 0}};
  std::set<FileId> seen_dirs{FileId{st.st_dev, st.st_ino}};
  std::size_t entries = 0;
  const std::string shown = root.string();
  while (!pending.empty()) {
    const Dir dir = std::move(pending.back());
    pending.pop_back();
    DIR* d = ::opendir(dir.path.c_str());
    if (d == nullptr) continue;  // unreadable: its paths are still inside the tree
    std::vector<std::string> names;
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n == "." || n == "..") continue;
      if (++entries > kMaxProtectedEntries) {
        ::closedir(d);
        fail_input("{}: more than {} files and directories (no checkpoint holds that many)", shown,
                   kMaxProtectedEntries);
      }
      names.push_back(n);
    }
    ::closedir(d);
    for (const auto& n : names) {
      const fs::path entry = dir.path / n;
      struct stat lst {};
      if (::lstat(entry.c_str(), &lst) != 0) continue;
      const std::string rel = entry_name(resolved, entry);
      if (S_ISLNK(lst.st_mode)) {
        if (::stat(entry.c_str(), &st) != 0) {
          // Dangling: writing where it leads would complete the link.
          if (const auto target = where_created(entry)) {
            exact_.emplace(target->resolved, Named{fmt::format("where {}'s link {} leads", shown, rel), true});
          }
          continue;
        }
        if (S_ISDIR(st.st_mode)) {
          const auto target = real_path(entry);
          if (!target) continue;
          trees_.push_back({*target, normal(*target), fmt::format("{}'s link {}", shown, rel)});
          if (dir.depth + 1 <= kMaxTreeDepth && seen_dirs.insert(FileId{st.st_dev, st.st_ino}).second) {
            pending.push_back({*target, dir.depth + 1});
          }
        } else if (S_ISREG(st.st_mode)) {
          files_.emplace(FileId{st.st_dev, st.st_ino}, Named{fmt::format("{}'s file {}", shown, rel), true});
        }
        continue;
      }
      if (S_ISDIR(lst.st_mode)) {
        if (dir.depth + 1 <= kMaxTreeDepth && seen_dirs.insert(FileId{lst.st_dev, lst.st_ino}).second) {
          pending.push_back({entry, dir.depth + 1});
        }
      } else if (S_ISREG(lst.st_mode)) {
        files_.emplace(FileId{lst.st_dev, lst.st_ino}, Named{fmt::format("{}'s file {}", shown, rel), true});
      }
    }
  }
}

void ProtectedPaths::add_input(const fs::path& file, std::string what) {
  if (file.empty()) return;
  const Named named{std::move(what), false};
  struct stat st {};
  if (::stat(file.c_str(), &st) == 0) {
    if (S_ISREG(st.st_mode)) files_.emplace(FileId{st.st_dev, st.st_ino}, named);
    if (const auto r = real_path(file)) exact_.emplace(*r, named);
  } else if (const auto absent = where_created(file)) {
    exact_.emplace(absent->resolved, named);
  }
  exact_.emplace(normal(file), named);
}

std::optional<std::string> ProtectedPaths::refusal(const fs::path& resolved, std::optional<FileId> id) const {
  for (const auto& t : trees_) {
    if (!is_within(resolved, t.resolved)) continue;
    if (t.why.empty()) return fmt::format("inside {}; mx2nv never writes a report into SRC or DST", t.shown.string());
    return fmt::format("inside {}, where {} leads; mx2nv never writes a report into SRC or DST", t.shown.string(),
                       t.why);
  }
  if (const auto it = exact_.find(resolved); it != exact_.end()) {
    const Named& n = it->second;
    if (n.in_tree) return fmt::format("is {}; mx2nv never writes a report into SRC or DST", n.what);
    return fmt::format("is {}; refusing to replace it", n.what);
  }
  if (id) {
    if (const auto it = files_.find(*id); it != files_.end()) {
      const Named& n = it->second;
      if (n.in_tree) return fmt::format("is {} (the same file); mx2nv never writes a report into SRC or DST", n.what);
      return fmt::format("is {} (the same file); refusing to replace it", n.what);
    }
  }
  return std::nullopt;
}

std::optional<std::string> ProtectedPaths::lexical_refusal(const fs::path& absolute) const {
  for (const auto& t : lexical_) {
    if (is_within(absolute, t)) {
      return fmt::format("inside {}; mx2nv never writes a report into SRC or DST", t.string());
    }
  }
  return std::nullopt;
}

// --- ReportFile --------------------------------------------------------------

ReportFile::ReportFile(const fs::path& path, std::string_view option) : path_(path), option_(option) {
  if (path.empty()) fail(ErrorKind::Usage, "{}: empty path", option);
  const std::string shown = path.string();
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err != ENOENT) {
      fail(ErrorKind::Usage, "{} {}: cannot be written: {}", option, shown, std::strerror(err));
    }
    // A new file (or a dangling symlink's target): created in its directory.
    const auto absent = where_created(path);
    if (!absent) {
      // Refused by check() or require_directory(); inside SRC or DST (a DST
      // not created yet) is the first thing it says.
      fs::path parent = path.parent_path();
      missing_directory_ = parent.empty() ? fs::path(".") : parent;
      std::error_code ec;
      resolved_ = normal(fs::weakly_canonical(normal(path), ec));
      return;
    }
    resolved_ = absent->resolved;
  } else if (S_ISDIR(st.st_mode)) {
    // The next step names a file in that folder, by what the option writes.
    const std::string_view file = option.find("html") != std::string_view::npos   ? "report.html"
                                  : option.find("plan") != std::string_view::npos ? "plan.json"
                                                                                  : "report.json";
    fail(ErrorKind::Usage, "{} {}: is a directory; {} takes a file's path, e.g. {} {}", option, shown, option, option,
         (path / std::string(file)).string());
  } else if (S_ISBLK(st.st_mode)) {
    fail(ErrorKind::Usage, "{} {}: is a block device; refusing to write a report onto a disk", option, shown);
  } else if (!S_ISREG(st.st_mode)) {
    // A character device, FIFO, pipe or socket: written through, opened now.
    // O_NONBLOCK: a FIFO nothing reads is refused here, not waited for
    // forever; a reader started beside mx2nv (`cat ff & mx2nv ... ff`) is
    // given kFifoReaderGraceMs to open its end.
    int fd = -1;
    for (int waited = 0;; waited += 10) {
      fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
      if (fd >= 0 || errno != ENXIO || waited >= kFifoReaderGraceMs || stop_requested()) break;
      ::usleep(10'000);
    }
    if (fd < 0) {
      const int err = errno;
      if (err == ENXIO) {
        fail(ErrorKind::Usage, "{} {}: nothing reads it (a FIFO or socket with no reader); refusing to wait for one",
             option, shown);
      }
      fail(ErrorKind::Usage, "{} {}: cannot be opened for writing: {}", option, shown, std::strerror(err));
    }
    fd_ = UniqueFd(fd);
    struct stat now {};
    if (::fstat(fd, &now) != 0 || S_ISREG(now.st_mode) || S_ISDIR(now.st_mode)) {
      fail(ErrorKind::Usage, "{} {}: changed while it was checked", option, shown);
    }
    return;
  } else {
    // A regular file, wherever it lives and whatever leads to it: by the
    // path that names it once every link is resolved. A magic link to a file
    // no path names (deleted, or in another mount namespace) is refused: it
    // could not be checked.
    const auto r = real_path(path);
    struct stat again {};
    if (!r || ::stat(r->c_str(), &again) != 0 || again.st_dev != st.st_dev || again.st_ino != st.st_ino) {
      fail(ErrorKind::Usage, "{} {}: leads to a file no path names (deleted?); refusing to write there", option,
           shown);
    }
    resolved_ = *r;
    id_ = id_of(st);
    // This process's standard output or error (`--report /dev/stdout >
    // r.json`): appended to, after what the command printed.
    for (const int stream : {STDOUT_FILENO, STDERR_FILENO}) {
      struct stat s {};
      if (::fstat(stream, &s) == 0 && S_ISREG(s.st_mode) && s.st_dev == st.st_dev && s.st_ino == st.st_ino) {
        const int fd = ::open(r->c_str(), O_WRONLY | O_APPEND | O_NOCTTY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) {
          fail(ErrorKind::Usage, "{} {}: cannot be opened for writing: {}", option, shown, std::strerror(errno));
        }
        fd_ = UniqueFd(fd);
        struct stat now {};
        if (::fstat(fd, &now) != 0 || now.st_dev != st.st_dev || now.st_ino != st.st_ino || now.st_nlink == 0) {
          fail(ErrorKind::Usage, "{} {}: changed while it was checked", option, shown);
        }
        return;
      }
    }
  }
  // Replaced atomically: the directory is held from now on, so the file is
  // written in the directory that was checked.
  replace_ = true;
  name_ = resolved_.filename().string();
  const fs::path dir = resolved_.parent_path();
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    fail(ErrorKind::Usage, "{} {}: cannot open its directory {}: {}", option, shown, dir.string(),
         std::strerror(errno));
  }
  dir_ = UniqueFd(dfd);
}

ReportFile::ReportFile(const fs::path& path, const std::vector<fs::path>& protected_trees, std::string_view option)
    : ReportFile(path, option) {
  check(protect_paths(protected_trees));
}

void ReportFile::check(std::shared_ptr<const ProtectedPaths> protect) {
  protect_ = std::move(protect);
  if (!protect_) throw std::logic_error("ReportFile::check without ProtectedPaths");
  if (resolved_.empty()) return;  // a device, FIFO or socket: it holds no file of SRC or DST
  const auto refuse = [&](const std::string& why) {
    fail(ErrorKind::Usage, "{} {}: {}", option_, path_.string(), why);
  };
  if (auto why = protect_->lexical_refusal(normal(path_))) refuse(*why);
  if (auto why = protect_->refusal(resolved_, id_)) refuse(*why);
  require_directory();
}

void ReportFile::require_directory() const {
  if (missing_directory_) {
    fail(ErrorKind::Usage, "{} {}: the directory {} does not exist", option_, path_.string(),
         missing_directory_->string());
  }
}

void ReportFile::refuse_same_file(const ReportFile& other, std::string_view what) const {
  // One FIFO, device or stdout's file twice: appended to twice, harmlessly.
  if (!replace_ || !other.replace_) return;
  if (resolved_ == other.resolved_ || (id_ && id_ == other.id_)) {
    fail(ErrorKind::Usage, "{} {}: is {}; refusing to replace it", option_, path_.string(), what);
  }
}

void ReportFile::write(std::string_view text) const {
  write_pieces([&](const PieceSink& sink) { sink(text); });
}

void ReportFile::write_pieces(const std::function<void(const PieceSink&)>& produce) const {
  if (!protect_ || missing_directory_) throw std::logic_error("ReportFile::write before check");
  // Pieces are gathered up to kCopyBufferBytes and written in order.
  std::string buffer;
  const auto gathered = [&](const std::function<void(std::string_view)>& flush) {
    produce([&](std::string_view piece) {
      if (buffer.empty() && piece.size() >= kCopyBufferBytes) return flush(piece);  // large: not copied
      buffer += piece;
      if (buffer.size() >= kCopyBufferBytes) {
        flush(buffer);
        buffer.clear();
      }
    });
    if (!buffer.empty()) flush(buffer);
  };
  if (!replace_) {
    gathered([&](std::string_view text) { write_all(fd_.get(), text, path_); });
    return;
  }
  const fs::path dir = resolved_.parent_path();
  const std::string temp = fmt::format(".mx2nv-report.{}.{}", ::getpid(), g_report_counter.fetch_add(1));
  ::unlinkat(dir_.get(), temp.c_str(), 0);  // a leftover of a killed run with our pid
  {
    File f = File::create_new_at(dir_.get(), temp, dir / temp);
    try {
      std::uint64_t offset = 0;
      gathered([&](std::string_view text) {
        f.write_at(offset, std::as_bytes(std::span(text)));
        offset += text.size();
      });
      f.sync();
      f.close();
    } catch (...) {
      ::unlinkat(dir_.get(), temp.c_str(), 0);
      throw;
    }
  }
  // What the name holds now, again: the work took a while.
  struct stat now {};
  if (::fstatat(dir_.get(), name_.c_str(), &now, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(now.st_mode)) {
    if (auto why = protect_->refusal(resolved_, id_of(now))) {
      ::unlinkat(dir_.get(), temp.c_str(), 0);
      fail(ErrorKind::Usage, "{} {}: {}", option_, path_.string(), *why);
    }
  }
  if (::renameat(dir_.get(), temp.c_str(), dir_.get(), name_.c_str()) != 0) {
    const int err = errno;
    ::unlinkat(dir_.get(), temp.c_str(), 0);
    fail_io(resolved_, "rename report into place", err);
  }
  fsync_directory(dir_.get(), dir);
}

std::shared_ptr<const ProtectedPaths> protect_paths(const std::vector<fs::path>& trees,
                                                    const std::vector<std::pair<fs::path, std::string>>& inputs) {
  auto protect = std::make_shared<ProtectedPaths>();
  for (const auto& t : trees) protect->add_tree(t);
  for (const auto& [path, what] : inputs) protect->add_input(path, what);
  return protect;
}

CommandOutputs check_command_outputs(const std::optional<fs::path>& report, const std::optional<fs::path>& html,
                                     const std::vector<fs::path>& trees,
                                     const std::vector<std::pair<fs::path, std::string>>& inputs) {
  CommandOutputs out;
  if (!report && !html) return out;
  // Each path resolves (and a FIFO opens) before the trees are walked: a
  // directory or a missing folder is named first.
  if (report) out.report.emplace(*report, "--report");
  if (html) out.html.emplace(*html, "--html");
  const auto protect = protect_paths(trees, inputs);
  if (out.report) out.report->check(protect);
  if (out.html) out.html->check(protect);
  if (out.report && out.html) out.html->refuse_same_file(*out.report, "the --report file too");
  return out;
}

void check_distinct_inputs(const std::vector<fs::path>& inputs, std::string_view option) {
  std::map<FileId, const fs::path*> seen;
  for (const auto& path : inputs) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      if (errno == ENOENT || errno == ENOTDIR) fail(ErrorKind::Usage, "{} {}: no such file", option, path.string());
      fail_io(path, "stat", errno);
    }
    if (S_ISDIR(st.st_mode)) fail(ErrorKind::Usage, "{} {}: is a directory", option, path.string());
    const auto [at, inserted] = seen.emplace(FileId{st.st_dev, st.st_ino}, &path);
    if (!inserted) {
      fail(ErrorKind::Usage, "{}: {} and {} are the same file, given twice", option, at->second->string(), path.string());
    }
  }
}

std::optional<fs::path> resolved_path(const fs::path& path) { return real_path(path); }

}  // namespace mx2nv

#include "destination/destination.hpp"

#include "common/cancel.hpp"
#include "common/error.hpp"
#include "common/printable.hpp"
#include "common/stream_hash.hpp"
#include "plan/overspan.hpp"
#include "plan/plan_file.hpp"
#include "safetensors/card_files.hpp"
#include "safetensors/index.hpp"
#include "sys/copy_engine.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>

namespace mx2nv {
namespace {

constexpr std::uint64_t kMaxRecordBytes = 1 << 20;
constexpr std::uint64_t kMaxFinishedRecordBytes = 256 << 20;  // a record per shard, up to kMaxShards, with room to spare

bool is_within(const fs::path& inner, const fs::path& outer) {
  const auto [o, i] = std::mismatch(outer.begin(), outer.end(), inner.begin(), inner.end());
  return o == outer.end();
}

// Removes every entry of the directory `dir_fd` but `keep` and `keep_too`,
// recursively, never following a symlink.
void remove_entries_except(int dir_fd, const std::string& keep, const std::string& keep_too = {}) {
  const int scan = ::fcntl(dir_fd, F_DUPFD_CLOEXEC, 0);
  DIR* d = scan >= 0 ? ::fdopendir(scan) : nullptr;
  if (d == nullptr) {
    if (scan >= 0) ::close(scan);
    return;
  }
  // A dup shares the directory's read position with every other dup: from the start.
  ::rewinddir(d);
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != ".." && n != keep && (keep_too.empty() || n != keep_too)) names.push_back(n);
  }
  ::closedir(d);
  for (const auto& n : names) {
    if (::unlinkat(dir_fd, n.c_str(), 0) == 0) continue;
    const int sub = ::openat(dir_fd, n.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub < 0) continue;
    remove_entries_except(sub, "");
    ::close(sub);
    ::unlinkat(dir_fd, n.c_str(), AT_REMOVEDIR);
  }
}

std::string state_path(std::string_view name) { return fmt::format("{}/{}", kStateDirName, name); }
std::string records_path() { return state_path(kRecordsDirName); }

// (parent, name) of a '/'-separated relative path.
// ".mx2nv-tmp.<n>.<file>", exactly: matched by suffix alone, shard
// "b.safetensors" would claim the temporary file of "a.b.safetensors".
bool is_temp_of(std::string_view name, std::string_view file) {
  if (!name.starts_with(kTempPrefix)) return false;
  name.remove_prefix(kTempPrefix.size());
  const std::size_t digits = name.find_first_not_of("0123456789");
  if (digits == 0 || digits == std::string_view::npos || name[digits] != '.') return false;
  return name.substr(digits + 1) == file;
}

std::pair<std::string, std::string> split(const std::string& relative) {
  const auto slash = relative.rfind('/');
  if (slash == std::string::npos) return {"", relative};
  return {relative.substr(0, slash), relative.substr(slash + 1)};
}

// DST's finished record, if it is finished: finished.json readable and its
// commit point there. Opened relative to `root_fd`, never through a symlink.
// Exit 2 when finished.json is there but unreadable.
std::optional<FinishedRecord> finished_record_at(int root_fd, const fs::path& root) {
  const int state = ::openat(root_fd, std::string(kStateDirName).c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (state < 0) return std::nullopt;
  const UniqueFd state_fd(state);
  struct stat st {};
  const std::string name(kFinishedFileName);
  if (::fstatat(state, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return std::nullopt;
  std::optional<FinishedRecord> record;
  try {
    record = finished_record_from_text(
        read_text_file(File::open_read_at(state, name, root / state_path(name)), kMaxFinishedRecordBytes));
  } catch (const Error&) {
  }
  if (!record) {
    fail(ErrorKind::Usage, "DST {}: {} is unreadable; refusing to guess what DST holds (check it with mx2nv verify)",
         root.string(), state_path(name));
  }
  const std::string commit(record->index_hash != 0 ? kIndexFileName : kConfigFileName);
  if (::fstatat(root_fd, commit.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) {
    return std::nullopt;  // finalize was interrupted before its commit point: not finished
  }
  return record;
}

// A file of DST opened to be written in place (the lock files, whose
// holder writes its pid into DST's): opened with O_NOFOLLOW, and only a
// regular file with one name is used. A hard link planted there (to SRC's
// config.json, say) would make that write land in the other file.
void check_in_place(int fd, const fs::path& display, const fs::path& root) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail_io(display, "stat", errno);
  if (!S_ISREG(st.st_mode)) fail(ErrorKind::Usage, "{}: not a regular file", display.string());
  if (st.st_nlink != 1) {
    fail(ErrorKind::Usage,
         "DST {}: {} has {} names (a hard link planted in DST?); refusing to write where it could lead elsewhere",
         root.string(), display.lexically_relative(root).generic_string(), st.st_nlink);
  }
}

// A regular file of DST with more than one name is planted (mx2nv never
// links two names of DST to one file for good), unless it is mx2nv's own
// link into place in flight: the final name and its temporary name share
// the inode until the temporary name is removed (claim_identity where the
// file system lacks RENAME_NOREPLACE), or the temporary name went away
// since the first look.
bool planted_link(const fs::path& file) {
  struct stat st {};
  if (::lstat(file.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink <= 1) return false;
  const std::string name = file.filename().string();
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(file.parent_path(), ec)) {
    const std::string other = e.path().filename().string();
    if (other == name || !(is_temp_of(other, name) || is_temp_of(name, other))) continue;
    struct stat o {};
    if (::lstat(e.path().c_str(), &o) == 0 && o.st_dev == st.st_dev && o.st_ino == st.st_ino) return false;
  }
  return ::lstat(file.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink > 1;
}

// What a finished DST keeps of mx2nv's: finished.json, and card.json once
// `mx2nv card` has written its card. A finalize
// killed after its commit point (the index) leaves the identity, records,
// locks and a plan beside it; a retried finalize or convert --resume removes
// them (tidy_finished). Under the exclusive lock when a lock file is left
// (skipped while anyone holds it, a step answering "already complete" too:
// the next retry tidies), without one otherwise (nothing takes a new lock
// on a finished DST). Only inside .mx2nv/, never a file of the checkpoint;
// finished.json and the commit point stay, so DST stays finished. Best
// effort: the answer does not depend on it.
void tidy_finished_at(int root_fd, const fs::path& root) {
  const int s = ::openat(root_fd, std::string(kStateDirName).c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (s < 0) return;
  const UniqueFd state(s);
  bool leftovers = false;
  // A killed `mx2nv card`'s temporaries in DST's root are card's leftovers too.
  std::vector<std::string> card_temps;
  {
    const int scan = ::fcntl(root_fd, F_DUPFD_CLOEXEC, 0);
    if (DIR* d = scan >= 0 ? ::fdopendir(scan) : nullptr) {
      ::rewinddir(d);
      while (const dirent* e = ::readdir(d)) {
        if (is_card_temporary_in_root(e->d_name)) card_temps.emplace_back(e->d_name);
      }
      ::closedir(d);
    } else if (scan >= 0) {
      ::close(scan);
    }
    leftovers = !card_temps.empty();
  }
  {
    const int scan = ::fcntl(s, F_DUPFD_CLOEXEC, 0);
    DIR* d = scan >= 0 ? ::fdopendir(scan) : nullptr;
    if (d == nullptr) {
      if (scan >= 0) ::close(scan);
      return;
    }
    ::rewinddir(d);
    while (const dirent* e = ::readdir(d)) {
      const std::string_view n = e->d_name;
      if (n != "." && n != ".." && n != kFinishedFileName && n != kCardRecordFileName) leftovers = true;
    }
    ::closedir(d);
  }
  if (!leftovers) return;
  UniqueFd lock(::openat(s, std::string(kLockFileName).c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (lock) {
    struct stat st {};
    if (::fstat(lock.get(), &st) != 0 || !S_ISREG(st.st_mode)) return;
    if (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) return;
  } else if (errno != ENOENT) {
    return;
  }
  try {
    if (!finished_record_at(root_fd, root)) return;
    remove_entries_except(s, std::string(kFinishedFileName), std::string(kCardRecordFileName));
    fsync_directory(s, root / kStateDirName);
    struct stat st {};
    for (const auto& n : card_temps) {
      if (::fstatat(root_fd, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode)) {
        ::unlinkat(root_fd, n.c_str(), 0);
      }
    }
    if (!card_temps.empty()) fsync_directory(root_fd, root);
  } catch (const Error&) {
  }
}

}  // namespace

Destination::Destination(const fs::path& source, fs::path root, bool resume) : root_(std::move(root)), resume_(resume) {
  std::error_code ec;
  const fs::path s = fs::weakly_canonical(source, ec);
  if (ec) fail(ErrorKind::Io, "{}: {}", source.string(), ec.message());
  const fs::path d = fs::weakly_canonical(root_, ec);
  if (ec) fail(ErrorKind::Io, "{}: {}", root_.string(), ec.message());
  if (s == d) fail(ErrorKind::Usage, "DST {} is SRC", root_.string());
  if (is_within(d, s)) fail(ErrorKind::Usage, "DST {} is inside SRC {}", root_.string(), source.string());
  if (is_within(s, d)) fail(ErrorKind::Usage, "DST {} contains SRC {}", root_.string(), source.string());

  struct stat st {};
  if (::stat(root_.c_str(), &st) != 0) {
    if (errno == ENOENT) return;  // created by open_for_writing
    fail_io(root_, "stat", errno);
  }
  if (!S_ISDIR(st.st_mode)) fail(ErrorKind::Usage, "DST {} exists and is not a directory", root_.string());
  const int fd = ::open(root_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail_io(root_, "open directory", errno);
  root_fd_ = UniqueFd(fd);
  check_tree(root_);
  if (fs::is_empty(root_)) return;

  const bool has_state = fs::exists(fs::symlink_status(root_ / kStateDirName));
  if (!resume) {
    fail(ErrorKind::Usage, "DST {} is not empty; refusing to mix outputs{}", root_.string(),
         has_state ? " (it holds an mx2nv conversion: add --resume to continue or confirm it)" : "");
  }
  if (!has_state) {
    const bool finished = fs::exists(fs::symlink_status(root_ / kIndexFileName)) ||
                          fs::exists(fs::symlink_status(root_ / kConfigFileName));
    fail(ErrorKind::Usage, "DST {} {}", root_.string(),
         finished ? "holds a checkpoint with no mx2nv record of its conversion; nothing to resume (check it with "
                    "mx2nv verify)"
                  : "is not empty and holds no interrupted mx2nv conversion to resume");
  }
  if (!fs::is_directory(fs::symlink_status(root_ / kStateDirName))) {
    fail(ErrorKind::Usage, "DST {}: {} is not a directory", root_.string(), kStateDirName);
  }
  state_ = DestinationState::Interrupted;
  finished_ = finished_now();
  if (finished_) state_ = DestinationState::Finished;
}

std::optional<FinishedRecord> Destination::finished_now() const { return finished_record_at(root_fd_.get(), root_); }

std::optional<FinishedRecord> Destination::finished_record(const fs::path& root) {
  const int fd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  const UniqueFd owned(fd);
  return finished_record_at(fd, root);
}

std::optional<Window> Destination::recorded_window(const fs::path& root) {
  try {
    const auto finished = finished_record(root);
    if (!finished) return std::nullopt;
    return window_of_mode(finished->window);
  } catch (const Error&) {
    return std::nullopt;
  }
}

std::optional<Window> Destination::window_of_mode(std::string_view mode) {
  const auto recorded = parse_mode(mode);
  if (!recorded || recorded->kind != PlanKind::Convert) return std::nullopt;
  return recorded->window;
}

void Destination::tidy_finished() {
  if (state_ == DestinationState::Finished && root_fd_) tidy_finished_at(root_fd_.get(), root_);
}

void Destination::tidy_finished(const fs::path& root) {
  const int fd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  const UniqueFd owned(fd);
  tidy_finished_at(fd, root);
}

Destination::~Destination() {
  if (!finalized_) abandon();
}

// Refuses a DST tree holding a symlink (a write through it could land
// anywhere) or a special file (opening a FIFO blocks).
void Destination::check_tree(const fs::path& root) {
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec); it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (ec) break;
    const fs::file_status st = it->symlink_status(ec);
    if (ec == std::errc::no_such_file_or_directory) {
      // Gone since it was listed: per-shard workers write beside each other,
      // and another's temporary file was renamed or removed meanwhile. A name
      // that no longer exists leads nowhere (taken for a special file, it
      // failed a concurrent worker with exit 2).
      ec.clear();
      continue;
    }
    if (ec) break;
    const std::string rel = it->path().lexically_relative(root).generic_string();
    if (fs::is_symlink(st)) {
      fail(ErrorKind::Usage, "DST {} holds a symbolic link, {}; refusing to write where links could lead elsewhere",
           root.string(), rel);
    }
    if (!fs::is_directory(st) && !fs::is_regular_file(st)) {
      fail(ErrorKind::Usage, "DST {} holds {}, which is not a regular file or directory", root.string(), rel);
    }
    if (fs::is_regular_file(st) && planted_link(it->path())) {
      fail(ErrorKind::Usage,
           "DST {} holds {}, a file with more than one name (a hard link planted in DST?); refusing to write where "
           "it could lead elsewhere",
           root.string(), rel);
    }
  }
  if (ec) fail(ErrorKind::Io, "{}: list directory: {}", root.string(), ec.message());
}

UniqueFd Destination::open_directory(const std::string& relative, bool create) {
  UniqueFd dir(::fcntl(root_fd_.get(), F_DUPFD_CLOEXEC, 0));
  if (!dir) fail_io(root_, "dup", errno);
  if (relative.empty()) return dir;
  if (!is_confined_relative_path(relative)) {
    fail(ErrorKind::InvalidInput, "{}: not a plain relative path inside DST", relative);
  }
  std::string so_far;
  std::size_t start = 0;
  while (start <= relative.size()) {
    const auto slash = relative.find('/', start);
    const std::string part = relative.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    so_far += (so_far.empty() ? "" : "/") + part;
    if (create) {
      if (::mkdirat(dir.get(), part.c_str(), 0755) == 0) {
        std::lock_guard lock(mutex_);
        created_dirs_.push_back(so_far);
      } else if (errno != EEXIST) {
        fail_io(root_ / so_far, "create directory", errno);
      }
    }
    const int fd = ::openat(dir.get(), part.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ELOOP || errno == ENOTDIR) {
        fail(ErrorKind::Usage, "DST {}: {} is not a directory (a symbolic link?); refusing to write through it",
             root_.string(), so_far);
      }
      fail_io(root_ / so_far, "open directory", errno);
    }
    dir = UniqueFd(fd);
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return dir;
}

bool Destination::create_root_and_lock(int operation) {
  writing_ = true;
  if (!root_fd_) {
    if (::mkdir(root_.c_str(), 0755) == 0) {
      created_root_ = true;  // another converter may create it at the same moment: only ours is ours to remove
    } else if (errno != EEXIST) {
      fail_io(root_, "create directory", errno);
    }
    const int fd = ::open(root_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) fail_io(root_, "open directory", errno);
    root_fd_ = UniqueFd(fd);
  }

  if (::mkdirat(root_fd_.get(), std::string(kStateDirName).c_str(), 0755) == 0) {
    created_state_dir_ = true;
  } else if (errno != EEXIST) {
    fail_io(root_ / kStateDirName, "create directory", errno);
  }
  const UniqueFd state = open_directory(std::string(kStateDirName), false);
  const fs::path lock_path = root_ / state_path(kLockFileName);
  // Created exclusively when absent, so we know whether it is ours: a run
  // refused after creating a new one must not leave it behind. A finished
  // DST has no lock file (finish() removed it), so one that is missing is
  // created only once DST is seen unfinished: a finished DST never gets one
  // (but for a finalize completing in between, which the check under the
  // lock below undoes).
  const std::string lock_name(kLockFileName);
  constexpr int kOpen = O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;
  int lfd = ::openat(state.get(), lock_name.c_str(), kOpen);
  for (int attempt = 0; lfd < 0 && errno == ENOENT && attempt < 8; ++attempt) {
    if (auto record = finished_now()) {
      state_ = DestinationState::Finished;
      finished_ = std::move(record);
      writing_ = false;
      return false;
    }
    lfd = ::openat(state.get(), lock_name.c_str(), kOpen | O_CREAT | O_EXCL, 0644);
    created_lock_file_ = lfd >= 0;
    if (lfd < 0 && errno == EEXIST) lfd = ::openat(state.get(), lock_name.c_str(), kOpen);
  }
  if (lfd < 0) {
    if (errno == ELOOP) fail(ErrorKind::Usage, "{}: a symbolic link; refusing to write through it", lock_path.string());
    fail_io(lock_path, "open lock", errno);
  }
  UniqueFd lock(lfd);
  // The pid is written into it below: a regular file with one name only.
  check_in_place(lock.get(), lock_path, root_);
  // flock(2): the kernel drops it when its holder dies, however it dies, so a
  // lock file left by a killed run is stale and taken over. Whole-DST writers
  // hold it exclusively, per-shard workers shared.
  if (::flock(lock.get(), operation | LOCK_NB) != 0) {
    const int err = errno;
    char pid[32] = {};
    const ssize_t n = ::pread(lock.get(), pid, sizeof pid - 1, 0);
    if (err == EWOULDBLOCK) {
      fail(ErrorKind::Usage, "{} is being written by another mx2nv (pid {}); refusing to run concurrently",
           root_.string(), n > 0 ? printable(std::string_view(pid, static_cast<std::size_t>(n))) : "unknown");
    }
    fail_io(lock_path, "lock", err);
  }
  // Finished is decided here, under the lock that excludes finalize: a DST
  // finished since it was opened is left exactly as finalize left it.
  if (auto record = finished_now()) {
    if (created_lock_file_) ::unlinkat(state.get(), lock_name.c_str(), 0);  // ours, created after finalize removed its own
    created_lock_file_ = false;
    state_ = DestinationState::Finished;
    finished_ = std::move(record);
    writing_ = false;
    return false;
  }
  if (operation == LOCK_EX) {
    const std::string me = std::to_string(::getpid());
    if (::ftruncate(lock.get(), 0) != 0 ||
        ::pwrite(lock.get(), me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
      fail_io(lock_path, "write lock", errno);
    }
  }
  lock_fd_ = std::move(lock);
  return true;
}

bool Destination::open_for_shards() {
  if (!create_root_and_lock(LOCK_SH)) return false;
  shared_ = true;
  check_tree(root_);
  return true;
}

Destination::ShardLock Destination::lock_shard(const std::string& shard) {
  if (!shared_) return {};
  const std::string locks = state_path("locks");
  const UniqueFd dir = open_directory(locks, true);
  const std::string name = record_file_name(shard) + ".lock";
  const int fd = ::openat(dir.get(), name.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (errno == ELOOP) {
      fail(ErrorKind::Usage, "{}: a symbolic link; refusing to write through it", (root_ / locks / name).string());
    }
    fail_io(root_ / locks / name, "open lock", errno);
  }
  UniqueFd lock(fd);
  check_in_place(lock.get(), root_ / locks / name, root_);
  while (::flock(lock.get(), LOCK_EX) != 0) {  // another worker on the same shard: wait for it
    if (errno != EINTR) fail_io(root_ / locks / name, "lock", errno);
    throw_if_stopped();
  }
  // That shard is ours now: whatever temporary file of it exists is stale.
  const auto [parent, file] = split(shard);
  const UniqueFd pdir = open_directory(parent, true);
  const int scan = ::fcntl(pdir.get(), F_DUPFD_CLOEXEC, 0);
  if (DIR* d = scan >= 0 ? ::fdopendir(scan) : nullptr) {
    ::rewinddir(d);  // a dup of DST's descriptor shares its read position
    std::vector<std::string> stale;
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (is_temp_of(n, file)) stale.push_back(n);
    }
    for (const auto& n : stale) ::unlinkat(pdir.get(), n.c_str(), 0);
    ::closedir(d);
  } else if (scan >= 0) {
    ::close(scan);
  }
  return ShardLock(std::move(lock));
}

bool Destination::open_for_writing(const std::set<std::string>& expected) {
  if (!create_root_and_lock(LOCK_EX)) {
    if (!resume_) fail(ErrorKind::Usage, "DST {} changed while planning; refusing to mix outputs", root_.string());
    return false;
  }

  // What we checked before planning may have changed; we hold the lock now.
  check_tree(root_);
  std::vector<fs::path> stale;
  const std::string state_prefix = std::string(kStateDirName) + "/";
  for (auto it = fs::recursive_directory_iterator(root_); it != fs::recursive_directory_iterator(); ++it) {
    const std::string rel = it->path().lexically_relative(root_).generic_string();
    if (it->path().filename().string().starts_with(kTempPrefix)) {
      stale.push_back(it->path());
      continue;
    }
    if (rel == kStateDirName || it->is_directory()) continue;
    if (rel.starts_with(state_prefix)) {
      // A fresh run's state directory holds our lock (and the identity we
      // may have claimed) and nothing else: anything more is another run's state.
      if (!resume_ && rel != state_path(kLockFileName) && !(created_identity_ && rel == state_path(kConversionFileName))) {
        fail(ErrorKind::Usage, "DST {} changed while planning; refusing to mix outputs", root_.string());
      }
      continue;
    }
    if (!resume_) fail(ErrorKind::Usage, "DST {} changed while planning; refusing to mix outputs", root_.string());
    // Resuming into a DST that holds files this conversion would never write
    // (another model's shards, say) would mix outputs: refuse instead.
    if (!expected.count(rel)) {
      fail(ErrorKind::Usage, "DST {} holds {}, which this conversion would not write; refusing to resume into it",
           root_.string(), rel);
    }
  }
  for (const auto& p : stale) fs::remove(p);
  return true;
}

std::optional<ConversionIdentity> Destination::read_identity() const {
  if (!root_fd_) return std::nullopt;  // DST does not exist yet
  const std::string path = state_path(kConversionFileName);
  struct stat st {};
  if (::fstatat(root_fd_.get(), path.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return std::nullopt;
    fail_io(root_ / path, "stat", errno);
  }
  std::optional<ConversionIdentity> found;
  try {
    found = conversion_identity_from_text(read_text_file(open_read(path), kMaxRecordBytes));
  } catch (const Error&) {
  }
  if (!found) {
    fail(ErrorKind::Usage, "DST {}: {} is unreadable; refusing to guess which conversion DST holds", root_.string(), path);
  }
  return found;
}

void Destination::check_identity(const ConversionIdentity& wanted) const {
  const auto found = read_identity();
  if (!found) return;
  if (const auto why = identity_difference(*found, wanted)) {
    fail(ErrorKind::Usage,
         "DST {} holds part of another conversion: {}; refusing to mix conversions (finish that one with the "
         "options it was started with, or use another DST)",
         root_.string(), *why);
  }
}

void Destination::claim_identity(const ConversionIdentity& wanted) {
  check_identity(wanted);
  if (read_identity()) return;
  // Written under a temporary name and renamed into place without
  // replacing (RENAME_NOREPLACE), so of two workers claiming at once one
  // records and the other finds the record (and is checked against it).
  // Where the file system lacks that (NFS), linked into place, which never
  // replaces either; the two names then share the file until the temporary
  // one is dropped, which check_tree knows for mx2nv's own.
  Pending p = begin(state_path(kConversionFileName));
  const std::string text = conversion_identity_to_text(wanted);
  p.file.write_at(0, std::as_bytes(std::span(text)));
  p.file.sync();
  p.file.close();
  bool linked =
      ::renameat2(p.parent.get(), p.temp_name.c_str(), p.parent.get(), p.final_name.c_str(), RENAME_NOREPLACE) == 0;
  int err = errno;
  if (!linked && (err == EINVAL || err == ENOSYS || err == EOPNOTSUPP)) {
    linked = ::linkat(p.parent.get(), p.temp_name.c_str(), p.parent.get(), p.final_name.c_str(), 0) == 0;
    err = errno;
  }
  drop(p);  // the temporary name either way (gone already once renamed)
  if (!linked && err != EEXIST) fail_io(root_ / p.relative, "link into place", err);
  if (linked) {
    std::lock_guard lock(mutex_);
    created_identity_ = true;
    unsynced_dirs_.insert(std::string(kStateDirName));
  }
  check_identity(wanted);
}

bool Destination::holds_plan() const {
  if (!root_fd_) return false;
  struct stat st {};
  const std::string path = state_path(kPlanFileName);
  return ::fstatat(root_fd_.get(), path.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
}

CopyEngine::Sharing Destination::probe_sharing(const File& source) const {
  return root_fd_ ? CopyEngine::probe_sharing(source, root_fd_.get()) : CopyEngine::Sharing::Unknown;
}

fs::path Destination::sharing_directory() const {
  std::error_code ec;
  fs::path dir = fs::absolute(root_, ec).lexically_normal();
  if (root_fd_) return dir;
  // DST does not exist yet: the directory it will be created in (a new
  // directory is on its parent's file system).
  if (!dir.has_filename()) dir = dir.parent_path();
  return dir.parent_path();
}

bool Destination::may_share(const File& source) const {
  const fs::path dir = sharing_directory();
  struct stat from {}, to {};
  struct statfs kind {};
  if (::fstat(source.fd(), &from) != 0 || ::stat(dir.c_str(), &to) != 0 || ::statfs(dir.c_str(), &kind) != 0) {
    return false;
  }
  const auto type = static_cast<unsigned long>(kind.f_type);
  return from.st_dev == to.st_dev && (type == XFS_SUPER_MAGIC || type == BTRFS_SUPER_MAGIC);
}

void Destination::require_sharing(const File& source) const {
  if (root_fd_) {
    CopyEngine::require_sharing(source, root_fd_.get(), root_);
    return;
  }
  const fs::path dir = sharing_directory();
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail_io(dir, "open directory", errno);
  const UniqueFd owned(fd);
  CopyEngine::require_sharing(source, owned.get(), dir);
}

Destination::Pending Destination::begin(const std::string& relative) {
  auto [parent, name] = split(relative);
  Pending p;
  p.parent = open_directory(parent, true);
  p.final_name = name;
  p.relative = relative;
  {
    std::lock_guard lock(mutex_);
    p.temp_name = fmt::format("{}{}.{}", kTempPrefix, counter_++, name);
    temps_.push_back(parent.empty() ? p.temp_name : parent + "/" + p.temp_name);
  }
  p.file = File::create_new_at(p.parent.get(), p.temp_name, root_ / relative);
  return p;
}

void Destination::commit(Pending& p) { commit(p, true); }

void Destination::commit(Pending& p, bool sync_data) {
  if (sync_data) p.file.sync();
  p.file.close();
  if (::renameat(p.parent.get(), p.temp_name.c_str(), p.parent.get(), p.final_name.c_str()) != 0) {
    fail_io(root_ / p.relative, "rename into place", errno);
  }
  const auto [parent, name] = split(p.relative);
  std::lock_guard lock(mutex_);
  std::erase(temps_, parent.empty() ? p.temp_name : parent + "/" + p.temp_name);
  committed_.push_back(p.relative);
  unsynced_dirs_.insert(parent);
}

void Destination::keep(const std::string& relative) {
  const auto [parent, name] = split(relative);
  std::lock_guard lock(mutex_);
  unsynced_dirs_.insert(parent);
}

void Destination::drop(Pending& p) {
  p.file.close();
  if (::unlinkat(p.parent.get(), p.temp_name.c_str(), 0) != 0 && errno != ENOENT) {
    fail_io(root_ / p.relative, "remove", errno);
  }
  const auto [parent, name] = split(p.relative);
  std::lock_guard lock(mutex_);
  std::erase(temps_, parent.empty() ? p.temp_name : parent + "/" + p.temp_name);
}

void Destination::sync_directories() {
  std::set<std::string> dirs;
  {
    std::lock_guard lock(mutex_);
    dirs.swap(unsynced_dirs_);
  }
  for (const auto& dir : dirs) {
    if (dir.empty()) {
      fsync_directory(root_fd_.get(), root_);
    } else {
      fsync_directory(open_directory(dir, false).get(), root_ / dir);
    }
  }
}

void Destination::write_file(const std::string& relative, std::string_view contents) {
  Pending p = begin(relative);
  p.file.write_at(0, std::as_bytes(std::span(contents)));
  commit(p);
}

void Destination::discard(const std::string& relative) {
  const auto [parent, name] = split(relative);
  const UniqueFd dir = open_directory(parent, false);
  if (::unlinkat(dir.get(), name.c_str(), 0) != 0 && errno != ENOENT) fail_io(root_ / relative, "remove", errno);
}

std::optional<FileStamp> Destination::stamp(const std::string& relative) const {
  const auto [parent, name] = split(relative);
  try {
    const UniqueFd dir = const_cast<Destination*>(this)->open_directory(parent, false);
    struct stat st {};
    if (::fstatat(dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
    return FileStamp{relative, static_cast<std::uint64_t>(st.st_size), static_cast<std::uint64_t>(st.st_ino),
                     ctime_ns(st)};
  } catch (const Error&) {
    return std::nullopt;
  }
}

File Destination::open_read(const std::string& relative) const {
  const auto [parent, name] = split(relative);
  const UniqueFd dir = const_cast<Destination*>(this)->open_directory(parent, false);
  return File::open_read_at(dir.get(), name, root_ / relative);
}

std::uint64_t Destination::hash(const std::string& relative) const {
  const File f = open_read(relative);
  StreamHash h;
  std::vector<std::byte> buffer(4 << 20);
  read_in_chunks(f, 0, f.size(), buffer, [&](std::span<const std::byte> chunk, std::uint64_t) { h.update(chunk); });
  return h.digest();
}

std::optional<ShardRecord> Destination::read_record(const std::string& shard) const {
  try {
    const UniqueFd dir = const_cast<Destination*>(this)->open_directory(records_path(), false);
    const std::string name = record_file_name(shard);
    const File f = File::open_read_at(dir.get(), name, root_ / records_path() / name);
    return shard_record_from_text(read_text_file(f, kMaxRecordBytes));
  } catch (const Error&) {
    return std::nullopt;  // absent or unreadable: redo the shard
  }
}

void Destination::write_record(const ShardRecord& record) {
  // Not fsynced: a record only saves redoing its shard, which was made
  // durable before it. One lost or torn by a crash does not parse, or does
  // not match the output's inode, ctime, size and written bytes, and the
  // shard is redone (read_record, reusable_record).
  Pending p = begin(records_path() + "/" + record_file_name(record.shard));
  const std::string text = shard_record_to_text(record);
  p.file.write_at(0, std::as_bytes(std::span(text)));
  commit(p, false);
}

void Destination::finish(const FinishedRecord& record, const std::string& commit_point,
                         std::string_view commit_contents) {
  Pending pending = begin(commit_point);
  pending.file.write_at(0, std::as_bytes(std::span(commit_contents)));
  finish(record, pending);
}

void Destination::finish(const FinishedRecord& record, Pending& commit_point) {
  // Order on disk: every output's name (their data was synced at commit),
  // then finished.json, then the commit point. Other processes (the
  // per-shard step) synced their own names before they exited.
  sync_directories();
  write_file(state_path(kFinishedFileName), finished_record_to_text(record));
  sync_directories();
  commit(commit_point);
  sync_directories();
  // Complete: records, locks and a plan kept here have served their purpose.
  const UniqueFd state = open_directory(std::string(kStateDirName), false);
  remove_entries_except(state.get(), std::string(kFinishedFileName));
  fsync_directory(state.get(), root_ / kStateDirName);
  lock_fd_ = UniqueFd();
  finalized_ = true;
}

void Destination::abandon() noexcept {
  if (!writing_ || !root_fd_) return;  // never opened for writing: nothing of ours is there
  try {
    for (const auto& rel : temps_) {
      const auto [parent, name] = split(rel);
      const UniqueFd dir = open_directory(parent, false);
      ::unlinkat(dir.get(), name.c_str(), 0);
    }
    if (!committed_.empty() || shared_) return;  // finished files serve --resume; other workers' are theirs
    if (lock_fd_ && created_identity_) {
      // The identity we recorded for a conversion that wrote nothing.
      const UniqueFd state = open_directory(std::string(kStateDirName), false);
      ::unlinkat(state.get(), std::string(kConversionFileName).c_str(), 0);
    }
    if (lock_fd_ && (created_state_dir_ || created_lock_file_)) {
      // Our own state directory or lock file: the lock goes with it.
      const UniqueFd state = open_directory(std::string(kStateDirName), false);
      ::unlinkat(state.get(), std::string(kLockFileName).c_str(), 0);
    }
    // Non-recursive removes: a directory someone else has written into stays.
    for (auto it = created_dirs_.rbegin(); it != created_dirs_.rend(); ++it) {
      ::unlinkat(root_fd_.get(), it->c_str(), AT_REMOVEDIR);
    }
    if (created_state_dir_ && lock_fd_) ::unlinkat(root_fd_.get(), std::string(kStateDirName).c_str(), AT_REMOVEDIR);
    lock_fd_ = UniqueFd();
    root_fd_ = UniqueFd();
    if (created_root_) ::rmdir(root_.c_str());
  } catch (...) {
    // Best effort: leftovers are temporary files the next run removes.
  }
}

}  // namespace mx2nv

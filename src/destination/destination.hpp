// DST's lifecycle, in one place: check it against SRC, lock it, keep the state
// directory and its records, refuse foreign files, detect a finished
// conversion, write files atomically, finalize, and abandon on failure.
//
// DST is hostile ground: whatever is already in it may be a symlink or a hard
// link planted to redirect a write. Everything inside DST is opened relative
// to a directory descriptor opened once (openat, mkdirat, renameat, unlinkat)
// with O_NOFOLLOW, and a DST whose tree holds a symlink, a special file or a
// regular file with more than one name is refused before any work. Files
// are written under new names and renamed into place; the only files
// written in place are the lock files, and only after fstat shows a regular
// file with one name. (DST itself may be given as a symlink to a
// directory: that is the user's own path, resolved once and checked against
// SRC.)
//
// Files are written as ".mx2nv-tmp.<n>.<name>" in their final directory,
// fsynced and renamed into place; the directories that received names are
// fsynced together (sync_directories) before finished.json, before the
// commit point and at the end of a per-shard step, not once per file (for
// many small shards, an fsync per file costs more than writing their data).
// Resume records are not fsynced at all: a lost or torn one only means its
// shard is redone. A run that finished nothing leaves DST as it found it;
// finished shards and their records stay
// for --resume. A conversion is complete once its commit point (the index, or
// config.json for a single-file model) exists next to .mx2nv/finished.json.
//
// A finished DST is never written again. Finished is a final state, so a DST
// seen finished at construction is; one seen unfinished may be finished by
// another process (finalize) before this one locks it, so it is decided
// again under the lock, which excludes finalize, and a writer that finds it
// finished there writes nothing (open_for_writing/open_for_shards return
// false).
#pragma once

#include "destination/records.hpp"
#include "safetensors/file_names.hpp"
#include "sys/copy_engine.hpp"
#include "sys/file.hpp"

#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace mx2nv {

enum class DestinationState {
  Empty,        // absent or an empty directory
  Interrupted,  // holds an unfinished run's state
  Finished,     // holds a finished conversion and its record
};

class Destination {
 public:
  // Checks, without writing anything (usage errors, exit 2): DST is not SRC,
  // inside it or containing it; it is a directory or absent; its tree holds no
  // symlink or special file; without `resume` it is empty; with `resume` it is
  // empty or holds an mx2nv run (interrupted or finished).
  Destination(const fs::path& source, fs::path root, bool resume);
  ~Destination();  // abandons unless finalized
  Destination(const Destination&) = delete;
  Destination& operator=(const Destination&) = delete;

  // The finished record of the DST at `root` if it holds a finished
  // conversion (without the checks of a Destination: for a step whose plan
  // and SRC are gone); exit 2 for an unreadable record.
  static std::optional<FinishedRecord> finished_record(const fs::path& root);
  // The window a finished DST was converted under ("marlin" of
  // "marlin+bf16"); nullopt when DST records none (requantize's output, no
  // record) or its record cannot be read (verify then says what is wrong).
  static std::optional<Window> recorded_window(const fs::path& root);
  // The window of a recorded mode ("marlin+bf16" -> marlin); nullopt for one
  // without a window ("requantize").
  static std::optional<Window> window_of_mode(std::string_view mode);

  // A finished DST keeps only .mx2nv/finished.json of mx2nv's: a finalize
  // killed after its commit point leaves its identity, records, locks and a
  // plan beside it. A retried finalize or convert --resume that answers
  // "already complete" removes them with this (under the exclusive lock
  // when a lock file is left; skipped while anyone holds it), never a file
  // outside .mx2nv/; DST stays finished. Best effort, no error. The static
  // form is for a step whose plan is gone.
  void tidy_finished();
  static void tidy_finished(const fs::path& root);

  // The tree checks of the constructor alone (no symlink, special file or
  // hard link planted anywhere in DST; usage errors, exit 2), for a command
  // that writes into a finished DST (card).
  static void check_tree(const fs::path& root);

  DestinationState state() const { return state_; }
  const fs::path& root() const { return root_; }
  // The finished conversion's record (state() == Finished).
  const std::optional<FinishedRecord>& finished() const { return finished_; }
  // Name, size and identity of a regular file in DST, never following a symlink.
  std::optional<FileStamp> stamp(const std::string& relative) const;
  // A regular file in DST for reading, never following a symlink.
  File open_read(const std::string& relative) const;
  // XXH3-64 of a whole file in DST.
  std::uint64_t hash(const std::string& relative) const;

  // Starts writing: creates DST if absent, takes the lock (exit 2 while another
  // mx2nv holds it), re-checks that nothing appeared meanwhile (fresh runs),
  // refuses files a conversion would not write (resumed runs: `expected` lists
  // every file the conversion writes), removes stale temporary files.
  // False, with nothing written and state() Finished, when DST turned out
  // finished under the lock (a resumed run answers "already complete"; a
  // fresh one is refused, exit 2, since DST is no longer empty).
  [[nodiscard]] bool open_for_writing(const std::set<std::string>& expected);

  // The per-shard step of a planned conversion (`convert --plan P --shards
  // I/N`), which runs in many processes at once: a shared lock on DST (a
  // whole-DST writer or finalize holds it exclusively) and no tree-wide
  // clean-up; each shard is then taken with lock_shard(). False as for
  // open_for_writing.
  [[nodiscard]] bool open_for_shards();

  // Which conversion DST receives (shard_record.hpp). read_identity: nullopt
  // when DST records none (new, or written by an earlier mx2nv); exit 2 when
  // its record is unreadable. check_identity: exit 2 naming the difference
  // when DST records another. claim_identity (lock held): check, then record
  // `wanted` if DST records none yet (atomically: of two claimants only the
  // first records, and the second is checked against it).
  std::optional<ConversionIdentity> read_identity() const;
  void check_identity(const ConversionIdentity& wanted) const;
  void claim_identity(const ConversionIdentity& wanted);
  // Whether DST holds a plan made by `mx2nv plan` (.mx2nv/plan.json).
  bool holds_plan() const;

  // `--copy reflink`, before anything is written: can files in DST (or, if
  // it does not exist yet, in the directory it will be created in) share
  // extents with `source`? Exit 2 naming why not.
  void require_sharing(const File& source) const;
  // The same question without an error, asked only of a DST that exists
  // (Unknown before): nothing is made outside DST.
  CopyEngine::Sharing probe_sharing(const File& source) const;
  // A guess that writes nothing: is DST (or the directory it will be created
  // in) on `source`'s file system, and is that one that shares extents (XFS,
  // btrfs)? For choices that only change how the page cache is used.
  bool may_share(const File& source) const;
  class ShardLock {
   public:
    ShardLock() = default;
    explicit ShardLock(UniqueFd fd) : fd_(std::move(fd)) {}
   private:
    UniqueFd fd_;
  };
  // Waits until no other process works on `shard`, then removes that shard's
  // stale temporary files. A no-op lock when DST is held exclusively.
  ShardLock lock_shard(const std::string& shard);

  struct Pending {
    File file;
    UniqueFd parent;
    std::string temp_name;
    std::string final_name;
    std::string relative;
  };
  // Opens `relative` for writing under a temporary name. Thread-safe.
  Pending begin(const std::string& relative);
  // fsync, close, rename into place; the directory is fsynced by the next
  // sync_directories(). Thread-safe.
  void commit(Pending& pending);
  // Makes the names committed so far durable: fsyncs each directory that
  // received one. finish() calls it; a process that commits without
  // finishing (the per-shard step, `mx2nv plan`) calls it before it reports
  // success.
  void sync_directories();
  // A file an earlier run committed, kept as it is (a reused shard): its
  // directory is synced with the next sync_directories(), since that run may
  // have ended before it synced it. Thread-safe.
  void keep(const std::string& relative);
  // Removes a file begun and not committed (written for nothing). Thread-safe.
  void drop(Pending& pending);
  // Whole small file in one step.
  void write_file(const std::string& relative, std::string_view contents);
  // Removes a finished file of an earlier run that is about to be redone.
  void discard(const std::string& relative);

  // Resume records (DST/.mx2nv/state/).
  std::optional<ShardRecord> read_record(const std::string& shard) const;
  void write_record(const ShardRecord& record);

  // Finalize: writes .mx2nv/finished.json, then the commit point, then removes
  // everything else in .mx2nv (records, locks, a plan kept there). After this
  // the destructor keeps everything.
  void finish(const FinishedRecord& record, const std::string& commit_point, std::string_view commit_contents);
  // The same for a commit point already written under its temporary name
  // (begin(), written in pieces: a large index is never held as one string).
  void finish(const FinishedRecord& record, Pending& commit_point);

 private:
  UniqueFd open_directory(const std::string& relative, bool create);
  // DST while it exists, else the directory it will be created in: where
  // require_sharing and may_share ask.
  fs::path sharing_directory() const;
  bool create_root_and_lock(int operation);
  // The finished record if DST is finished now (read through root_fd_);
  // exit 2 when finished.json is there but unreadable.
  std::optional<FinishedRecord> finished_now() const;
  void abandon() noexcept;
  void commit(Pending& pending, bool sync_data);

  fs::path root_;
  DestinationState state_ = DestinationState::Empty;
  std::optional<FinishedRecord> finished_;
  bool resume_ = false;
  bool created_root_ = false;
  bool created_state_dir_ = false;
  bool created_lock_file_ = false;  // ours to remove if we give up (a lost race)
  bool created_identity_ = false;   // likewise
  bool finalized_ = false;
  bool writing_ = false;
  bool shared_ = false;  // open_for_shards: many writers, each on its own shards
  UniqueFd root_fd_;
  UniqueFd lock_fd_;
  std::mutex mutex_;
  std::vector<std::string> temps_;          // relative paths of files being written
  std::vector<std::string> committed_;
  std::set<std::string> unsynced_dirs_;     // relative ("" for DST) directories renamed into since the last sync
  std::vector<std::string> created_dirs_;   // relative, in creation order
  std::uint64_t counter_ = 0;
};

}  // namespace mx2nv

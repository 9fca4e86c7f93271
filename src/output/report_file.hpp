// Where a command's own output files go (`--report FILE`, `--html FILE`,
// `plan --plan-out FILE`). The path is the user's, so it is checked before
// any work, and it must never become a way to write into SRC or DST, or over
// a file the command reads. What a path is decides how it is written, never
// how it is spelled (/dev/..., /proc/self/root/..., /dev/fd/N are paths like
// any other):
// - it is resolved as the kernel would open it: every symlink followed, a
//   dangling one too (the file it leads to is the one written), ".." after a
//   symlink taken from where the link leads;
// - exit 2 (before anything runs) for a directory, a block device, a missing
//   parent directory, a FIFO or socket nothing reads (opening it for
//   writing would wait for a reader forever), or a path that leads to a
//   file no path names (a deleted file behind /proc/PID/fd/N);
// - a regular file, existing or new, is checked against ProtectedPaths: its
//   resolved path must not be inside SRC or DST (nor inside a directory a
//   symlink of theirs leads to), and the file there, if any, must not be one
//   of their files under another name (a hard link, or the blob a Hugging
//   Face snapshot's symlink leads to) or one of the command's inputs. It is
//   then replaced atomically: a temporary file in the directory checked
//   (held open from the check on), fsync, rename;
// - except a regular file that is also this process's standard output or
//   error (`--report /dev/stdout > r.json`), checked the same way and then
//   appended to through a descriptor opened at check time, after what the
//   command printed (replacing it would leave the summary in an unlinked
//   file);
// - non-regular files (character devices such as /dev/null or a terminal,
//   FIFOs, pipes, sockets) are written through, appended, never replaced.
//   They are opened at check time, without blocking, and that descriptor
//   is written at the end: a FIFO with no reader is refused before any work,
//   and a reader that stops reading delays the write only until a SIGINT or
//   SIGTERM, after which nothing waits on an output again.
#pragma once

#include "sys/file.hpp"

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mx2nv {


// What a file is, whatever it is called: (st_dev, st_ino).
struct FileId {
  dev_t device = 0;
  ino_t inode = 0;
  auto operator<=>(const FileId&) const = default;
};

// What one command's outputs must never touch.
class ProtectedPaths {
 public:
  // A tree the command reads or writes (SRC or DST as it uses them): its
  // path as given and resolved (it may not exist yet), every regular file
  // below it by identity, and, following its symlinks as the checkpoint
  // reader does (depth <= 16), the directories they lead to as trees and
  // the files they lead to by identity (a dangling link by the path it
  // names). Throws Error(InvalidInput) for a tree of more than
  // kMaxProtectedEntries entries, which no checkpoint is.
  void add_tree(const fs::path& root);
  // A file the command reads or writes otherwise (the plan a step reads, a
  // merged part, the --plan-out file), named `what` in messages: by its
  // resolved path and, if it exists, its identity.
  void add_input(const fs::path& file, std::string what);

  // Why the file at `resolved` (absolute, symlinks resolved), identity `id`
  // if it exists, may not be written; nullopt if it may.
  std::optional<std::string> refusal(const fs::path& resolved, std::optional<FileId> id) const;
  // The same for a path as given (absolute, lexically normal): inside a
  // tree as spelled, before any resolution (a tree that does not exist yet).
  std::optional<std::string> lexical_refusal(const fs::path& absolute) const;

  // A checkpoint holds at most kMaxShards shards and kMaxCompanionFiles other
  // files (checkpoint/reader.hpp), and a few folders.
  static constexpr std::size_t kMaxProtectedEntries = 250'000;

 private:
  struct Tree {
    fs::path shown;     // for messages
    fs::path resolved;  // absolute, symlinks resolved
    std::string why;    // "SRC or DST", or where the link leading here is
  };
  std::vector<Tree> trees_;
  // What a protected file or path is, for messages: part of SRC or DST
  // (never written) or an input of the command (never replaced).
  struct Named {
    std::string what;
    bool in_tree = false;
  };
  std::vector<fs::path> lexical_;  // the trees as given, absolute and lexically normal
  std::map<FileId, Named> files_;  // by identity
  std::map<fs::path, Named> exact_;  // by resolved path
};

class ReportFile {
 public:
  // Resolves `path` and opens what is written through (see above); exit 2
  // naming `option` (--report, --html, --plan-out) when it may not be
  // written anywhere. check() must follow before write().
  explicit ReportFile(const fs::path& path, std::string_view option = "--report");
  // Both steps, against the trees and inputs given (tests, the demo).
  ReportFile(const fs::path& path, const std::vector<fs::path>& protected_trees,
             std::string_view option = "--report");
  ReportFile(ReportFile&&) noexcept = default;
  ReportFile& operator=(ReportFile&&) noexcept = default;

  // Exit 2 when `protect` forbids this file (see ProtectedPaths), or when
  // its directory does not exist.
  void check(std::shared_ptr<const ProtectedPaths> protect);
  // Exit 2 when the directory it would be created in does not exist (what
  // check() says last, for a caller that learns the trees later).
  void require_directory() const;
  // Exit 2 when this and `other` are one file (two outputs into one file are
  // never intended; one FIFO or device twice is written twice, harmlessly).
  void refuse_same_file(const ReportFile& other, std::string_view what) const;
  void write(std::string_view text) const;
  // The same for text made in pieces: `produce` calls its argument with each
  // piece in order (a large document need never be held whole).
  using PieceSink = std::function<void(std::string_view)>;
  void write_pieces(const std::function<void(const PieceSink&)>& produce) const;
  const fs::path& path() const { return path_; }
  bool written_through() const { return fd_ && !replace_; }

 private:
  fs::path path_;      // as given
  std::string option_;
  bool replace_ = false;   // a regular file replaced atomically
  fs::path resolved_;      // replace_: where the file is (or will be), symlinks resolved
  std::string name_;       // replace_: its name in dir_
  UniqueFd dir_;           // replace_: its directory, opened at check time
  UniqueFd fd_;            // written through (a device, FIFO, socket, or stdout's file)
  std::optional<FileId> id_;  // the file at the path when checked, if any
  std::optional<fs::path> missing_directory_;  // a new file whose directory does not exist (refused by check)
  std::shared_ptr<const ProtectedPaths> protect_;
};

// The output files of one command (--report FILE, --html FILE), checked
// together before any work: each against the SRC and DST the command uses
// (`trees`; for a planned step the plan's, convert/planned.hpp
// planned_paths), against the files it reads or writes otherwise (`inputs`:
// the plan a step reads, the plan --plan-out writes, each with what it is),
// and against each other. The CLI and the Python package both use this.
struct CommandOutputs {
  std::optional<ReportFile> report;
  std::optional<ReportFile> html;
};
CommandOutputs check_command_outputs(const std::optional<fs::path>& report, const std::optional<fs::path>& html,
                                     const std::vector<fs::path>& trees,
                                     const std::vector<std::pair<fs::path, std::string>>& inputs = {});
// The protection check_command_outputs uses.
std::shared_ptr<const ProtectedPaths> protect_paths(const std::vector<fs::path>& trees,
                                                    const std::vector<std::pair<fs::path, std::string>>& inputs = {});

// Input files named on the command line (verify --merge's parts): throws
// Error(Usage) for one that does not exist or is a directory, and for one
// file named twice under any names (a link, ./a and a): the same part given
// twice is a wrong invocation, not two parts.
void check_distinct_inputs(const std::vector<fs::path>& inputs, std::string_view option);

// The path the kernel opens for `path`, every symlink resolved (realpath),
// or nullopt when it does not exist. For records that must not depend on a
// symlink that could be re-pointed later (verify --shards' parts).
std::optional<fs::path> resolved_path(const fs::path& path);

}  // namespace mx2nv

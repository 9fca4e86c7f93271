// Where a JSON report goes (`--report FILE`). The path is the user's, so it is
// checked before any work, and it must never become a way to write into SRC
// or DST:
// - exit 2 (before anything runs) for a path inside SRC or DST (after
//   resolving symlinks), a directory, or a missing parent directory;
// - special files (a FIFO, a terminal, /dev/null) and anything under /dev or
//   /proc (`--report /dev/stdout`) are written through, appended, never
//   replaced;
// - a regular file (or a new one, or a symlink to one) is replaced atomically:
//   temporary file next to the resolved target, fsync, rename.
#pragma once

#include "io/file.hpp"

#include <string_view>
#include <vector>

namespace mx2nv {

class ReportFile {
 public:
  // Throws Error(Usage) when the report may not be written there; messages
  // name `option` (--report, --html).
  ReportFile(const fs::path& path, const std::vector<fs::path>& protected_trees,
             std::string_view option = "--report");
  void write(std::string_view text) const;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;      // as given
  fs::path resolved_;  // symlinks resolved: the file an atomic write replaces
  bool write_through_ = false;
};

}  // namespace mx2nv

namespace mx2nv {

// Input files named on the command line (verify --merge's parts): throws
// Error(Usage) for one that does not exist or is a directory, and for one
// file named twice under any names (a link, ./a and a): the same part given
// twice is a wrong invocation, not two parts.
void check_distinct_inputs(const std::vector<fs::path>& inputs, std::string_view option);

// Throws Error(Usage) when a report written to `report` would replace one of
// `inputs` (the same file, under any name): a command never writes over
// what it reads.
void check_not_an_input(const fs::path& report, const std::vector<fs::path>& inputs, std::string_view option = "--report");

}  // namespace mx2nv

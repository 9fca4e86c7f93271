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

#include "sys/file.hpp"

#include <optional>
#include <string>
#include <string_view>
#include <utility>
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
  // Exit 2 when this path names the file `other` (another output, or an
  // input such as the plan a step reads), described as `what`: two outputs
  // into one file, or a report replacing an input, are never intended.
  void refuse_same_file(const fs::path& other, std::string_view what) const;

 private:
  fs::path path_;      // as given
  fs::path resolved_;  // symlinks resolved: the file an atomic write replaces
  bool write_through_ = false;
  std::string option_;
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

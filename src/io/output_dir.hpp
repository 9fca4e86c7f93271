// The destination directory. Files are written under a temporary name in
// their final directory, fsynced, renamed, and the directory fsynced. On
// failure the temporary files are removed; finished files stay for --resume
// (the index, written last, is what makes a DST complete). A run that
// finished nothing leaves DST as it found it.
#pragma once

#include "io/file.hpp"

#include <mutex>
#include <string>
#include <vector>

namespace mx2nv {

inline constexpr std::string_view kTempPrefix = ".mx2nv-tmp.";

// Usage errors (exit 2): DST equal to, inside or containing SRC; DST
// non-empty, unless `resume` and DST holds an interrupted run's state.
void check_destination(const fs::path& src, const fs::path& dst, bool resume);

// Removes temporary files an interrupted run left below `root`.
void remove_stale_temporaries(const fs::path& root);

class OutputDir {
 public:
  explicit OutputDir(fs::path root);  // creates root if missing
  ~OutputDir();                       // abandons unless committed
  OutputDir(const OutputDir&) = delete;
  OutputDir& operator=(const OutputDir&) = delete;

  struct Pending {
    File file;
    fs::path temp;
    fs::path final_path;
  };
  // Opens `relative` for writing under a temporary name. Thread-safe.
  Pending begin(const std::string& relative);
  // fsync, close, rename into place, fsync the directory. Thread-safe.
  void commit(Pending& pending);
  // Whole small file in one step (config.json, index).
  void write_file(const std::string& relative, std::string_view contents);
  // Marks the run complete: the destructor keeps everything.
  void keep() { kept_ = true; }
  // Removes a finished file of an earlier run that is about to be redone.
  void discard(const std::string& relative);
  const fs::path& root() const { return root_; }
  bool committed_anything() {
    std::lock_guard lock(mutex_);
    return !committed_.empty();
  }

 private:
  void abandon() noexcept;
  fs::path ensure_parent(const std::string& relative);

  fs::path root_;
  bool created_root_ = false;
  bool kept_ = false;
  std::mutex mutex_;
  std::vector<fs::path> temps_;
  std::vector<fs::path> committed_;
  std::vector<fs::path> created_dirs_;
  std::uint64_t counter_ = 0;
};

}  // namespace mx2nv

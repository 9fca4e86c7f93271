// The destination directory. Files are written under a temporary name in
// their final directory, fsynced, renamed, and the directory fsynced; on
// failure everything this run put in DST is removed, so an interrupted or
// refused run never leaves something that looks like a checkpoint.
#pragma once

#include "io/file.hpp"

#include <mutex>
#include <string>
#include <vector>

namespace mx2nv {

inline constexpr std::string_view kTempPrefix = ".mx2nv-tmp.";

// Usage errors (exit 2): DST non-empty, DST equal to, inside or containing SRC.
void check_destination(const fs::path& src, const fs::path& dst);

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
  const fs::path& root() const { return root_; }

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

#include "report/report_file.hpp"

#include "common/error.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <optional>

namespace mx2nv {
namespace {

bool is_within(const fs::path& inner, const fs::path& outer) {
  const auto [o, i] = std::mismatch(outer.begin(), outer.end(), inner.begin(), inner.end());
  return o == outer.end();
}

bool under_device_or_proc(const fs::path& absolute) {
  const auto first = ++absolute.begin();  // the component after "/"
  return first != absolute.end() && (*first == "dev" || *first == "proc");
}

}  // namespace

ReportFile::ReportFile(const fs::path& path, const std::vector<fs::path>& protected_trees, std::string_view option)
    : path_(path), option_(option) {
  if (path.empty()) fail(ErrorKind::Usage, "{}: empty path", option);
  std::error_code ec;
  const fs::path absolute = fs::absolute(path, ec).lexically_normal();
  if (ec) fail(ErrorKind::Usage, "{} {}: {}", option, path.string(), ec.message());
  struct stat st {};
  const bool exists = ::stat(path.c_str(), &st) == 0;  // follows symlinks
  if (exists && S_ISDIR(st.st_mode)) fail(ErrorKind::Usage, "{} {}: is a directory", option, path.string());
  write_through_ = under_device_or_proc(absolute) || (exists && !S_ISREG(st.st_mode));
  resolved_ = write_through_ ? absolute : fs::weakly_canonical(absolute, ec);
  if (ec) fail(ErrorKind::Usage, "{} {}: {}", option, path.string(), ec.message());
  for (const auto& tree : protected_trees) {
    if (tree.empty()) continue;
    const fs::path t = fs::weakly_canonical(tree, ec);
    if (ec) continue;
    if (is_within(resolved_, t) || is_within(absolute, fs::absolute(tree).lexically_normal())) {
      fail(ErrorKind::Usage, "{} {}: inside {}; mx2nv never writes a report into SRC or DST", option, path.string(),
           tree.string());
    }
  }
  if (!write_through_) {
    const fs::path parent = resolved_.parent_path();
    if (!fs::is_directory(parent, ec)) {
      fail(ErrorKind::Usage, "{} {}: the directory {} does not exist", option, path.string(), parent.string());
    }
  }
}

void ReportFile::refuse_same_file(const fs::path& other, std::string_view what) const {
  if (other.empty() || write_through_) return;  // /dev/stdout twice appends twice: harmless
  std::error_code ec;
  const fs::path resolved = fs::weakly_canonical(fs::absolute(other, ec).lexically_normal(), ec);
  struct stat a {}, b {};
  const bool same_inode = ::stat(resolved_.c_str(), &a) == 0 && ::stat(other.c_str(), &b) == 0 &&
                          a.st_dev == b.st_dev && a.st_ino == b.st_ino;
  if ((!ec && resolved == resolved_) || same_inode) {
    fail(ErrorKind::Usage, "{} {}: is {}; refusing to replace it", option_, path_.string(), what);
  }
}

void ReportFile::write(std::string_view text) const {
  if (write_through_) {
    // O_APPEND: /dev/stdout redirected to a file must not overwrite what was
    // printed before the report.
    const int fd = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) fail_io(path_, "open report", errno);
    UniqueFd owned(fd);
    std::size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        fail_io(path_, "write report", errno);
      }
      done += static_cast<std::size_t>(n);
    }
    return;
  }
  const fs::path dir = resolved_.parent_path();
  const fs::path temp = dir / fmt::format(".{}.mx2nv-report.{}", resolved_.filename().string(), ::getpid());
  ::unlink(temp.c_str());  // a leftover of a killed run with our pid
  {
    File f = File::create_new(temp);
    try {
      f.write_at(0, std::as_bytes(std::span(text)));
      f.sync();
      f.close();
    } catch (...) {
      ::unlink(temp.c_str());
      throw;
    }
  }
  if (::rename(temp.c_str(), resolved_.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    fail_io(resolved_, "rename report into place", err);
  }
  fsync_directory(dir);
}

CommandOutputs check_command_outputs(const std::optional<fs::path>& report, const std::optional<fs::path>& html,
                                     const std::vector<fs::path>& trees,
                                     const std::vector<std::pair<fs::path, std::string>>& inputs) {
  CommandOutputs out;
  if (report) out.report.emplace(*report, trees, "--report");
  if (html) out.html.emplace(*html, trees, "--html");
  for (const auto& [path, what] : inputs) {
    if (out.report) out.report->refuse_same_file(path, what);
    if (out.html) out.html->refuse_same_file(path, what);
  }
  if (out.report && out.html) out.html->refuse_same_file(out.report->path(), "the --report file too");
  return out;
}

}  // namespace mx2nv

namespace mx2nv {
namespace {

struct FileId {
  dev_t device;
  ino_t inode;
  auto operator<=>(const FileId&) const = default;
};

std::optional<FileId> file_id(const fs::path& path) {  // follows symlinks
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileId{st.st_dev, st.st_ino};
}

}  // namespace

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

void check_not_an_input(const fs::path& report, const std::vector<fs::path>& inputs, std::string_view option) {
  const auto target = file_id(report);
  if (!target) return;  // a new file replaces nothing
  for (const auto& path : inputs) {
    if (file_id(path) == target) {
      fail(ErrorKind::Usage, "{} {}: is {}, an input of this command; mx2nv never writes a report over its input",
           option, report.string(), path.string());
    }
  }
}

}  // namespace mx2nv

#include "io/output_dir.hpp"

#include "core/error.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace mx2nv {
namespace {

bool is_within(const fs::path& inner, const fs::path& outer) {
  const auto [o, i] = std::mismatch(outer.begin(), outer.end(), inner.begin(), inner.end());
  return o == outer.end();
}

}  // namespace

void check_destination(const fs::path& src, const fs::path& dst, bool resume) {
  std::error_code ec;
  const fs::path s = fs::weakly_canonical(src, ec);
  if (ec) fail(ErrorKind::Io, "{}: {}", src.string(), ec.message());
  const fs::path d = fs::weakly_canonical(dst, ec);
  if (ec) fail(ErrorKind::Io, "{}: {}", dst.string(), ec.message());
  if (s == d) fail(ErrorKind::Usage, "DST {} is SRC", dst.string());
  if (is_within(d, s)) fail(ErrorKind::Usage, "DST {} is inside SRC {}", dst.string(), src.string());
  if (is_within(s, d)) fail(ErrorKind::Usage, "DST {} contains SRC {}", dst.string(), src.string());
  if (fs::exists(d, ec)) {
    if (!fs::is_directory(d, ec)) fail(ErrorKind::Usage, "DST {} exists and is not a directory", dst.string());
    if (!fs::is_empty(d, ec)) {
      if (!resume) {
        fail(ErrorKind::Usage, "DST {} is not empty; refusing to mix outputs{}", dst.string(),
             fs::exists(d / ".mx2nv", ec) ? " (it holds an interrupted conversion: add --resume)" : "");
      }
      if (!fs::exists(d / ".mx2nv", ec)) {
        const bool finished = fs::exists(d / "model.safetensors.index.json", ec) || fs::exists(d / "config.json", ec);
        fail(ErrorKind::Usage, "DST {} {}", dst.string(),
             finished ? "already holds a finished conversion; nothing to resume (check it with mx2nv verify)"
                      : "is not empty and holds no interrupted mx2nv conversion to resume");
      }
    }
  }
}

void remove_stale_temporaries(const fs::path& root) {
  std::error_code ec;
  std::vector<fs::path> stale;
  for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it->path().filename().string().starts_with(kTempPrefix)) stale.push_back(it->path());
  }
  for (const auto& p : stale) fs::remove(p, ec);
}

OutputDir::OutputDir(fs::path root) : root_(std::move(root)) {
  // Another converter may create it at the same moment: only an error is an
  // error, and only a directory we created is ours to remove.
  std::error_code ec;
  created_root_ = fs::create_directories(root_, ec);
  if (ec) fail(ErrorKind::Io, "{}: create directory: {}", root_.string(), ec.message());
}

OutputDir::~OutputDir() {
  if (!kept_) abandon();
}

fs::path OutputDir::ensure_parent(const std::string& relative) {
  const fs::path final_path = root_ / relative;
  fs::path parent = final_path.parent_path();
  std::vector<fs::path> missing;
  for (fs::path p = parent; p != root_ && !fs::exists(p); p = p.parent_path()) missing.push_back(p);
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    std::error_code ec;
    fs::create_directory(*it, ec);
    if (ec) fail(ErrorKind::Io, "{}: create directory: {}", it->string(), ec.message());
    created_dirs_.push_back(*it);
  }
  return final_path;
}

OutputDir::Pending OutputDir::begin(const std::string& relative) {
  std::lock_guard lock(mutex_);
  const fs::path final_path = ensure_parent(relative);
  const fs::path temp =
      final_path.parent_path() / (std::string(kTempPrefix) + std::to_string(counter_++) + "." +
                                  final_path.filename().string());
  temps_.push_back(temp);
  return {File::create_new(temp), temp, final_path};
}

void OutputDir::commit(Pending& pending) {
  pending.file.sync();
  pending.file.close();
  std::error_code ec;
  fs::rename(pending.temp, pending.final_path, ec);
  if (ec) fail(ErrorKind::Io, "{}: rename into place: {}", pending.final_path.string(), ec.message());
  fsync_directory(pending.final_path.parent_path());
  std::lock_guard lock(mutex_);
  std::erase(temps_, pending.temp);
  committed_.push_back(pending.final_path);
}

void OutputDir::write_file(const std::string& relative, std::string_view contents) {
  Pending p = begin(relative);
  p.file.write_at(0, std::as_bytes(std::span(contents)));
  commit(p);
}

void OutputDir::discard(const std::string& relative) {
  std::error_code ec;
  fs::remove(root_ / relative, ec);
  if (ec) fail(ErrorKind::Io, "{}: remove: {}", (root_ / relative).string(), ec.message());
}

void OutputDir::abandon() noexcept {
  std::error_code ec;
  for (const auto& p : temps_) fs::remove(p, ec);
  if (!committed_.empty()) return;  // finished files (and their records) serve --resume
  // Non-recursive removes: a directory someone else has written into stays.
  for (auto it = created_dirs_.rbegin(); it != created_dirs_.rend(); ++it) fs::remove(*it, ec);
  if (created_root_) fs::remove(root_, ec);
}

}  // namespace mx2nv

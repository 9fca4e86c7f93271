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

void check_destination(const fs::path& src, const fs::path& dst) {
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
    if (!fs::is_empty(d, ec)) fail(ErrorKind::Usage, "DST {} is not empty; refusing to mix outputs", dst.string());
  }
}

OutputDir::OutputDir(fs::path root) : root_(std::move(root)) {
  std::error_code ec;
  if (!fs::exists(root_, ec)) {
    if (!fs::create_directories(root_, ec) || ec) {
      fail(ErrorKind::Io, "{}: create directory: {}", root_.string(), ec.message());
    }
    created_root_ = true;
  }
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

void OutputDir::abandon() noexcept {
  std::error_code ec;
  for (const auto& p : temps_) fs::remove(p, ec);
  for (auto it = committed_.rbegin(); it != committed_.rend(); ++it) fs::remove(*it, ec);
  for (auto it = created_dirs_.rbegin(); it != created_dirs_.rend(); ++it) fs::remove(*it, ec);
  if (created_root_) fs::remove(root_, ec);
}

}  // namespace mx2nv

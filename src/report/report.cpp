#include "report/report.hpp"

#include "common/printable.hpp"
#include "output/report_file.hpp"

#include <cmath>

namespace mx2nv {

std::optional<std::string> hf_snapshot_revision(const std::string& path) {
  const std::string marker = "/snapshots/";
  const auto at = path.rfind(marker);
  if (at == std::string::npos) return std::nullopt;
  const auto start = at + marker.size();
  const auto end = path.find('/', start);
  std::string rev = path.substr(start, end == std::string::npos ? std::string::npos : end - start);
  if (rev.empty()) return std::nullopt;
  return rev;
}

Report start_report(Command command, Window window, const fs::path& source, const fs::path& target) {
  Report r;
  r.command = command;
  r.window = window;
  // An empty path is one the command does not know (a planned step whose
  // plan is gone and which was given no SRC): left empty in the report.
  if (!source.empty()) {
    r.provenance.source = fs::absolute(source).lexically_normal().string();
    r.provenance.revision = hf_snapshot_revision(r.provenance.source);
  }
  if (!target.empty()) r.provenance.target = fs::absolute(target).lexically_normal().string();
  return r;
}

Report failed_report(Command command, Window window, const fs::path& source, const fs::path& target,
                     const Error& error, UnresolvedPaths unresolved) {
  Report r;
  try {
    r = start_report(command, window, source, target);
  } catch (...) {
    if (unresolved == UnresolvedPaths::Throw) throw;
    Provenance as_given;
    as_given.source = source.string();
    as_given.target = target.string();
    return failed_report(command, window, std::move(as_given), error);
  }
  r.set_error(error);
  return r;
}

Report failed_report(Command command, Window window, Provenance provenance, const Error& error) {
  Report r;
  r.command = command;
  r.window = window;
  r.provenance = std::move(provenance);
  r.set_error(error);
  return r;
}

std::optional<double> Report::size_change_percent() const {
  if (size_change_withheld || !source_tensor_bytes || !target_tensor_bytes || *source_tensor_bytes == 0) {
    return std::nullopt;
  }
  return 100.0 * (static_cast<double>(*target_tensor_bytes) - static_cast<double>(*source_tensor_bytes)) /
         static_cast<double>(*source_tensor_bytes);
}

std::optional<double> Report::written_size_change_percent() const {
  const auto change = size_change_percent();
  if (!change) return std::nullopt;
  return std::round(*change * 1e4) / 1e4;
}

void Report::set_error(const Error& e) {
  result = Outcome::Error;
  error_kind = e.kind();
  error = e.what();
}


void record_resolved_paths(Report& report, const fs::path& source, const fs::path& target) {
  const auto resolved = [](const fs::path& p) {
    std::error_code ec;
    return resolved_path(p).value_or(fs::absolute(p, ec).lexically_normal()).string();
  };
  report.resolved_source = resolved(source);
  report.resolved_target = resolved(target);
}
}  // namespace mx2nv

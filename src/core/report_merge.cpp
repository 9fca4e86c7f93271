#include "core/report_merge.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <charconv>
#include <map>
#include <set>

namespace mx2nv {
namespace {

const Json& field(const Json& j, const char* key, std::size_t part) {
  if (!j.is_object() || !j.contains(key)) fail(ErrorKind::Usage, "--merge: report {} has no \"{}\"", part + 1, key);
  return j[key];
}

std::uint64_t number(const Json& j, std::size_t part) {
  if (!j.is_number_unsigned() && !(j.is_number_integer() && j.get<std::int64_t>() >= 0)) {
    fail(ErrorKind::Usage, "--merge: report {} has a count that is not a non-negative integer", part + 1);
  }
  return j.get<std::uint64_t>();
}

// "I/N" -> (I, N); a whole report -> (0, 1).
std::pair<std::uint64_t, std::uint64_t> subset_of(const Json& j, std::size_t part) {
  if (!j.contains("shard_subset")) return {0, 1};
  const Json& s = j["shard_subset"];
  if (!s.is_string()) fail(ErrorKind::Usage, "--merge: report {}: shard_subset is not a string", part + 1);
  const std::string& t = s.get_ref<const std::string&>();
  const auto slash = t.find('/');
  std::uint64_t i = 0, n = 0;
  if (slash == std::string::npos ||
      std::from_chars(t.data(), t.data() + slash, i).ptr != t.data() + slash ||
      std::from_chars(t.data() + slash + 1, t.data() + t.size(), n).ptr != t.data() + t.size() || n == 0 || i >= n) {
    fail(ErrorKind::Usage, "--merge: report {}: shard_subset \"{}\" is not I/N (a single --shard part cannot be merged)",
         part + 1, t);
  }
  return {i, n};
}

}  // namespace

Json merge_verify_reports(const std::vector<Json>& parts) {
  if (parts.empty()) fail(ErrorKind::Usage, "--merge: no reports");
  const Json& first = parts.front();
  std::uint64_t n = 0;
  std::set<std::uint64_t> seen;
  for (std::size_t p = 0; p < parts.size(); ++p) {
    const Json& j = parts[p];
    if (field(j, "command", p) != "verify") fail(ErrorKind::Usage, "--merge: report {} is not a verify report", p + 1);
    for (const char* key : {"window"}) {
      if (field(j, key, p) != field(first, key, 0)) {
        fail(ErrorKind::Usage, "--merge: report {} has another {} than report 1", p + 1, key);
      }
    }
    for (const char* key : {"source", "target", "tool_version"}) {
      if (field(j, "provenance", p).value(key, Json()) != first["provenance"].value(key, Json())) {
        fail(ErrorKind::Usage, "--merge: report {} is of another {} than report 1", p + 1, key);
      }
    }
    const auto [i, parts_n] = subset_of(j, p);
    if (n == 0) n = parts_n;
    if (parts_n != n) fail(ErrorKind::Usage, "--merge: report {} splits the shards {} ways, report 1 {}", p + 1, parts_n, n);
    if (!seen.insert(i).second) fail(ErrorKind::Usage, "--merge: part {}/{} given twice", i, n);
  }
  if (seen.size() != n) {
    std::string missing;
    for (std::uint64_t i = 0; i < n; ++i) {
      if (!seen.count(i)) missing += fmt::format("{}{}/{}", missing.empty() ? "" : ", ", i, n);
    }
    fail(ErrorKind::Usage, "--merge: parts missing: {}", missing);
  }

  Json merged = first;
  merged.erase("shard_subset");
  for (const char* key : {"values_compared", "mismatches"}) merged[key] = 0;
  for (const char* key : {"active_groups", "zero_groups", "marlin_zeroed_groups", "passthrough_tensors"}) {
    merged["counts"][key] = 0;
  }
  merged["max_abs_error"] = 0.0;
  merged["differences"] = Json::array();
  std::set<std::string> differences;
  // Requantized modules (convert --overspan requantize): each part measured its own shards' modules.
  std::map<std::string, Json> requantized;
  std::string result = "ok";
  double seconds = 0;
  for (std::size_t p = 0; p < parts.size(); ++p) {
    const Json& j = parts[p];
    for (const char* key : {"values_compared", "mismatches"}) {
      merged[key] = merged[key].get<std::uint64_t>() + number(field(j, key, p), p);
    }
    for (const char* key : {"active_groups", "zero_groups", "marlin_zeroed_groups", "passthrough_tensors"}) {
      merged["counts"][key] = merged["counts"][key].get<std::uint64_t>() + number(field(field(j, "counts", p), key, p), p);
    }
    const Json& e = field(j, "max_abs_error", p);
    if (e.is_string() || merged["max_abs_error"].is_string()) {
      merged["max_abs_error"] = "inf";
    } else if (e.is_number()) {
      merged["max_abs_error"] = std::max(merged["max_abs_error"].get<double>(), e.get<double>());
    }
    const Json& d = field(j, "differences", p);
    if (d.is_array()) {
      for (const Json& item : d) {
        if (item.is_string() && differences.insert(item.get<std::string>()).second) merged["differences"].push_back(item);
      }
    }
    if (j.contains("requantized") && j["requantized"].is_array()) {
      for (const Json& row : j["requantized"]) {
        if (row.is_object() && row.contains("module") && row["module"].is_string()) {
          requantized.emplace(row["module"].get<std::string>(), row);
        }
      }
    }
    const Json& r = field(j, "result", p);
    if (r == "error") {
      result = "error";
      merged["error"] = j.value("error", Json("error"));
      merged["error_kind"] = j.value("error_kind", Json("I/O error"));
      merged["exit_code"] = j.value("exit_code", Json(4));
    } else if (r == "mismatch" && result == "ok") {
      result = "mismatch";
    } else if (r != "ok" && r != "mismatch") {
      fail(ErrorKind::Usage, "--merge: report {} has result {}", p + 1, r.dump());
    }
    if (j.contains("seconds") && j["seconds"].is_number()) seconds = std::max(seconds, j["seconds"].get<double>());
  }
  merged["result"] = result;
  if (result != "error") merged["exit_code"] = result == "ok" ? 0 : 1;
  merged["seconds"] = seconds;  // the slowest part: they ran side by side
  merged["merged_parts"] = parts.size();
  if (!requantized.empty() || merged.contains("requantized")) {
    merged["requantized"] = Json::array();
    std::uint64_t zeroed = 0;
    for (auto& [name, row] : requantized) {
      zeroed += row.value("marlin_zeroed_blocks", std::uint64_t{0});
      merged["requantized"].push_back(std::move(row));
    }
    if (merged.contains("overspan") && merged["overspan"].is_object()) {
      merged["overspan"]["requantized_marlin_zeroed_blocks"] = zeroed;
      merged["overspan"]["lossy"] = !requantized.empty();
    }
  }
  return merged;
}

}  // namespace mx2nv

// Fuzz target: verify --merge's parts (verify/merge.hpp). The input is
// one or more parts separated by NUL bytes (which no JSON text holds).
// Properties: no crash and no exception but mx2nv::Error; a merged report
// tells one story (result, exit code, mismatches, differences), serialises
// to strict JSON, and merges alone into itself, since it is a whole report.
#include "common/error.hpp"
#include "common/printable.hpp"
#include "verify/merge.hpp"

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

constexpr std::size_t kMaxFuzzParts = 16;

void check_story(const mx2nv::Json& merged) {
  const std::string& result = merged.at("result").get_ref<const std::string&>();
  const auto exit = merged.at("exit_code").get<std::int64_t>();
  const auto mismatches = merged.at("mismatches").get<std::uint64_t>();
  if (result == "ok") {
    if (exit != 0 || mismatches != 0 || !merged.at("differences").empty()) std::abort();
  } else if (result == "mismatch") {
    if (exit != 1 || (mismatches == 0 && merged.at("differences").empty())) std::abort();
  } else if (result == "error") {
    if (exit < 2 || exit > 4 || !merged.at("error").is_string()) std::abort();
  } else {
    std::abort();
  }
  if (mismatches > merged.at("values_compared").get<std::uint64_t>()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace mx2nv;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::vector<std::pair<std::string, std::string>> parts;
  for (std::size_t start = 0; parts.size() < kMaxFuzzParts;) {
    const std::size_t end = input.find('\0', start);
    parts.emplace_back("part" + std::to_string(parts.size()), std::string(input.substr(start, end - start)));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  Json merged;
  try {
    merged = report_to_json(merge_verify_reports(parts));
  } catch (const Error&) {
    return 0;
  }
  check_story(merged);
  const std::string text = dump_json(merged);
  Json again;
  try {
    again = report_to_json(merge_verify_reports({{"merged", text}}));
  } catch (const Error&) {
    std::abort();  // a merged report is a valid whole report
  }
  check_story(again);
  for (const char* key : {"result", "exit_code", "values_compared", "mismatches", "max_abs_error", "counts",
                          "requantized", "overspan"}) {
    if (merged.value(key, Json()) != again.value(key, Json())) std::abort();
  }
  // Up to the cap, the same differences (past it, the last line counts what was left out).
  if (merged.at("differences").size() <= kMaxReportedDifferences && merged.at("differences") != again.at("differences")) {
    std::abort();
  }
  return 0;
}

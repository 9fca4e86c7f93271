// verify --merge's parts are input, not trusted state (verify/merge.hpp):
// every key the merge reads is checked for type and range (exit 3 naming the
// part and the key), a part that contradicts itself is refused, parts that
// do not make one whole are a usage error (exit 2), memory follows what the
// parts hold, never what they claim, and the result is ok only when every
// part is ok and the set is complete.
#include "common/error.hpp"
#include "verify/merge.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <random>

namespace mx2nv {
namespace {

// A part as `verify --shards I/N` writes it, with every section filled in
// (over-span rows, a BF16 layer, a global conflict) so every key is tried.
Json part(std::uint64_t i, std::uint64_t n) {
  Json j = Json::parse(R"({
    "command": "verify", "result": "ok", "window": "marlin",
    "provenance": {"tool": "mx2nv", "tool_version": ")" MX2NV_VERSION R"(", "source": "/data/src",
                   "revision": null, "target": "/data/dst"},
    "counts": {"shards": 3, "resumed_shards": null, "modules": 24, "scale_groups": 16, "active_groups": 100,
               "zero_groups": 7, "canonicalised_zero_groups": 0, "marlin_zeroed_groups": 0, "raised_globals": 0,
               "global_conflicts": 1, "passthrough_tensors": 8, "companion_files": 4},
    "source_tensor_bytes": 184608, "target_tensor_bytes": 187776, "size_change_percent": 1.7161,
    "values_compared": 40960, "mismatches": 0, "max_abs_error": 0.0,
    "over_span": [{"module": "m.0.w2", "span": 30, "limit": 14, "groups_outside": 120}],
    "requantized": [],
    "overspan": {"choice": "requantize", "lossy": true, "requantized_marlin_zeroed_blocks": 3,
                 "resolved_over_span": [{"module": "m.0.w2", "span": 30, "limit": 14, "groups_outside": 120}],
                 "bf16_layers": [{"layer": "m.1", "modules": ["m.1.w1", "m.1.w3"], "why": ["m.1.w1"],
                                  "bf16_bytes": 100, "nvfp4_bytes": 30, "size_cost_bytes": 70}]},
    "unrepresentable_globals": ["m.2.w1"],
    "global_conflicts": [{"scale_group": "m.2.w1", "k_max": 10, "k_min": -20, "needed": [-3, 4], "allowed": [5, 9]}],
    "differences": [], "exit_code": 0, "seconds": 0.25})");
  j["shard_subset"] = fmt::format("{}/{}", i, n);
  j["resolved"] = {{"source", "/mnt/data/src"}, {"target", "/mnt/data/dst"}};
  j["requantized"].push_back({{"module", fmt::format("m.{}.w1", i)},
                              {"global_scale", 28672.0},
                              {"values", 8192},
                              {"relative_rmse", 0.0125},
                              {"cosine", 0.99992},
                              {"max_abs_error", 0.0033},
                              {"marlin_zeroed_blocks", 3}});
  j["counts"]["active_groups"] = 100 + i;
  j["values_compared"] = 40960 + i;
  return j;
}

std::vector<Json> whole_set(std::uint64_t n) {
  std::vector<Json> parts;
  for (std::uint64_t i = 0; i < n; ++i) parts.push_back(part(i, n));
  return parts;
}

Json merge(const std::vector<Json>& parts) {
  std::vector<std::pair<std::string, std::string>> texts;
  for (std::size_t i = 0; i < parts.size(); ++i) texts.emplace_back(fmt::format("part{}.json", i), parts[i].dump());
  return report_to_json(merge_verify_reports(texts));
}

// The error `f` throws: it must be an Error of `kind` (anything else, or
// nothing, fails the test).
std::string error_of(ErrorKind kind, const std::function<void()>& f, const std::string& trace = "") {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << trace << ": " << e.what();
    EXPECT_EQ(std::string(e.what()).find("internal error"), std::string::npos) << e.what();
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << trace << ": not an mx2nv::Error: " << e.what();
    return {};
  }
  ADD_FAILURE() << trace << ": accepted";
  return {};
}

std::string merge_error(ErrorKind kind, const std::vector<Json>& parts, const std::string& trace = "") {
  return error_of(kind, [&] { merge(parts); }, trace);
}

bool contains(const std::string& text, const std::string& piece) { return text.find(piece) != std::string::npos; }

// Whether a message names the key at `path` (quoted).
bool names_key(const std::string& text, const std::string& path) { return contains(text, "\"" + path + "\""); }

// Every value in a part, with the path the merge's messages use for it
// (dotted keys, [i] for array items).
void leaves(const Json& j, const std::string& path, std::vector<std::pair<std::string, Json::json_pointer>>& out,
            const Json::json_pointer& at = Json::json_pointer()) {
  if (j.is_object()) {
    for (const auto& [key, value] : j.items()) {
      leaves(value, path.empty() ? key : path + "." + key, out, at / key);
    }
  } else if (j.is_array()) {
    for (std::size_t i = 0; i < j.size(); ++i) leaves(j[i], fmt::format("{}[{}]", path, i), out, at / i);
  }
  if (!path.empty()) out.emplace_back(path, at);
}

// Figures a report writes as null when its command did not compute them.
bool nullable_figure(const std::string& path) {
  return path.rfind("counts.", 0) == 0 || path == "source_tensor_bytes" || path == "target_tensor_bytes" ||
         path == "size_change_percent" || path == "values_compared" || path == "mismatches" ||
         path == "max_abs_error";
}

enum class Kind { Null, Bool, Number, String, Array, Object };
Kind kind_of(const Json& j) {
  if (j.is_null()) return Kind::Null;
  if (j.is_boolean()) return Kind::Bool;
  if (j.is_number()) return Kind::Number;
  if (j.is_string()) return Kind::String;
  if (j.is_array()) return Kind::Array;
  return Kind::Object;
}

TEST(ReportMerge, PartsAddUpToTheWhole) {
  const Json merged = merge(whole_set(3));
  EXPECT_EQ(merged["result"], "ok");
  EXPECT_EQ(merged["exit_code"], 0);
  EXPECT_EQ(merged["values_compared"], 3 * 40960 + 3);
  EXPECT_EQ(merged["counts"]["active_groups"], 303);
  EXPECT_EQ(merged["counts"]["zero_groups"], 21);
  EXPECT_EQ(merged["counts"]["modules"], 24);  // the whole checkpoint's, once
  EXPECT_EQ(merged["requantized"].size(), 3u);
  EXPECT_EQ(merged["overspan"]["requantized_marlin_zeroed_blocks"], 9);
  EXPECT_EQ(merged["overspan"]["lossy"], true);
  EXPECT_EQ(merged["merged_parts"], 3);
  EXPECT_FALSE(merged.contains("shard_subset"));
  // Any order of the parts gives the same report.
  std::vector<Json> parts = whole_set(3);
  std::reverse(parts.begin(), parts.end());
  EXPECT_EQ(merge(parts), merged);
  // A merged report is a whole report: it merges alone into itself.
  Json again = merge({merged});
  again.erase("merged_parts");
  Json expected = merged;
  expected.erase("merged_parts");
  EXPECT_EQ(again, expected);
}

TEST(ReportMerge, AWrongTypeForAnyKeyIsInvalidInputNamingTheKey) {
  std::vector<std::pair<std::string, Json::json_pointer>> paths;
  leaves(part(1, 3), "", paths);
  ASSERT_GT(paths.size(), 60u);
  const std::vector<Json> candidates = {Json(nullptr), Json(true), Json(7), Json("x"), Json::array(), Json::object()};
  int tried = 0;
  for (const auto& [path, pointer] : paths) {
    const Json original = part(1, 3)[pointer];
    for (const Json& replacement : candidates) {
      const Kind k = kind_of(replacement);
      if (k == kind_of(original)) continue;
      if (path == "provenance.revision" && k == Kind::String) continue;  // a revision is a string or null
      if (k == Kind::Null && nullable_figure(path)) continue;              // a figure not computed
      std::vector<Json> parts = whole_set(3);
      parts[1][pointer] = replacement;
      const std::string trace = path + " = " + replacement.dump();
      const std::string what = merge_error(ErrorKind::InvalidInput, parts, trace);
      EXPECT_TRUE(contains(what, "part1.json")) << trace << ": " << what;
      EXPECT_TRUE(names_key(what, path)) << trace << ": " << what;
      ++tried;
    }
  }
  EXPECT_GT(tried, 300);
}

TEST(ReportMerge, EveryRequiredKeyMissingIsNamed) {
  std::vector<std::pair<std::string, Json::json_pointer>> paths;
  leaves(part(1, 3), "", paths);
  for (const auto& [path, pointer] : paths) {
    if (contains(path, "[")) continue;  // array items are not keys
    if (path == "shard_subset" || path == "requantized" || path == "overspan") continue;  // optional
    std::vector<Json> parts = whole_set(3);
    parts[1][pointer.parent_pointer()].erase(pointer.back());
    const std::string what = merge_error(ErrorKind::InvalidInput, parts, path);
    EXPECT_TRUE(contains(what, "\"" + path + "\" is missing") || contains(what, "\"" + path + "\" must be")) << what;
  }
}

TEST(ReportMerge, UnknownKeysAreRefused) {
  for (const char* where : {"", "/counts", "/provenance", "/overspan", "/requantized/0", "/over_span/0",
                            "/global_conflicts/0", "/overspan/bf16_layers/0"}) {
    std::vector<Json> parts = whole_set(3);
    parts[2][Json::json_pointer(where)]["surprise"] = 1;
    const std::string what = merge_error(ErrorKind::InvalidInput, parts, where);
    EXPECT_TRUE(contains(what, "surprise\" is not a key of a report")) << what;
  }
  std::vector<Json> parts = whole_set(2);
  parts[0]["copy"] = {{"mode", "auto"}};
  EXPECT_TRUE(contains(merge_error(ErrorKind::InvalidInput, parts), "copy."));
  // A whole copy section, as convert writes it, is still no key of a verify report.
  parts[0]["copy"] = {{"mode", "auto"}, {"copied_bytes", 0}, {"shared_bytes", 0}, {"written_bytes", 0}};
  EXPECT_TRUE(contains(merge_error(ErrorKind::InvalidInput, parts), "\"copy\" is not a key of a verify report"));
}

TEST(ReportMerge, NumbersOutOfRangeAreInvalidInput) {
  struct Case {
    const char* pointer;
    const char* value;
  };
  const Case cases[] = {
      {"/values_compared", "-1"},
      {"/values_compared", "18446744073709551616"},
      {"/values_compared", "1.5"},
      {"/values_compared", "1e999"},
      {"/mismatches", "-0.0"},
      {"/counts/active_groups", "-5"},
      {"/counts/modules", "3.0"},
      {"/counts/shards", "-9223372036854775808"},
      {"/source_tensor_bytes", "1e20"},
      {"/max_abs_error", "-0.5"},
      {"/max_abs_error", "1e999"},
      {"/max_abs_error", "-1e999"},
      {"/max_abs_error", "\"nan\""},
      {"/max_abs_error", "\"Infinity\""},
      {"/max_abs_error", "\"-inf\""},
      {"/seconds", "-1"},
      {"/seconds", "1e400"},
      {"/size_change_percent", "-1e999"},
      {"/exit_code", "9223372036854775808"},
      {"/exit_code", "0.0"},
      {"/requantized/0/values", "-1"},
      {"/requantized/0/relative_rmse", "-0.1"},
      {"/requantized/0/max_abs_error", "\"NaN\""},
      {"/requantized/0/global_scale", "1e999"},
      {"/requantized/0/marlin_zeroed_blocks", "1.0"},
      {"/over_span/0/span", "18446744073709551615"},
      {"/global_conflicts/0/needed", "[1]"},
      {"/global_conflicts/0/allowed", "[1, 2, 3]"},
      {"/global_conflicts/0/needed/1", "2.5"},
      {"/overspan/bf16_layers/0/size_cost_bytes", "9223372036854775808"},
      {"/merged_parts", "0"},
  };
  for (const auto& c : cases) {
    // Written into the text as is: 1e999 is no value a DOM can hold.
    Json p = part(1, 2);
    p[Json::json_pointer(c.pointer)] = "@@value@@";
    std::string text = p.dump();
    text.replace(text.find("\"@@value@@\""), 11, c.value);
    error_of(ErrorKind::InvalidInput, [&] { merge_verify_reports({{"part0.json", part(0, 2).dump()}, {"part1.json", text}}); },
             std::string(c.pointer) + " = " + c.value);
  }
}

TEST(ReportMerge, StringsOutOfRangeAreInvalidInput) {
  const std::pair<const char*, const char*> cases[] = {
      {"/command", "convert"},        {"/command", "Verify"},
      {"/window", "Marlin"},          {"/window", ""},
      {"/result", "refused"},         {"/result", "OK"},
      {"/provenance/tool", "other"},  {"/provenance/tool_version", ""},
      {"/provenance/source", ""},     {"/provenance/source", "relative/src"},
      {"/provenance/target", "dst"},  {"/overspan/choice", "fail"},
      {"/overspan/choice", "BF16"},
  };
  for (const auto& [pointer, value] : cases) {
    std::vector<Json> parts = whole_set(2);
    parts[0][Json::json_pointer(pointer)] = value;
    const std::string what = merge_error(ErrorKind::InvalidInput, parts, std::string(pointer) + " = " + value);
    EXPECT_TRUE(contains(what, "part0.json")) << what;
  }
}

TEST(ReportMerge, ShardSubsetMustBeIOverN) {
  for (const char* subset : {"1", "", "/", "a/b", "01/3", "+1/3", "1/+3", "1/3/4", "3/3", "4/3", "0/0", " 0/3", "0/3 ",
                             "-1/3", "0x1/3", "1/03", "0/18446744073709551616", "0/100001",
                             "0/18446744073709551615", "18446744073709551614/18446744073709551615"}) {
    std::vector<Json> parts = whole_set(3);
    parts[1]["shard_subset"] = subset;
    const std::string what = merge_error(ErrorKind::InvalidInput, parts, subset);
    // "": no subset, so the "resolved" a part records is refused first.
    EXPECT_TRUE(contains(what, std::string(subset).empty() ? "\"resolved\"" : "\"shard_subset\"")) << what;
  }
}

TEST(ReportMerge, MissingPartsAreListedBoundedWhateverNIs) {
  // The largest N a part may claim, with one part: a bounded message, at once.
  const auto start = std::chrono::steady_clock::now();
  const std::string what = merge_error(ErrorKind::Usage, {part(5, kMaxMergeParts)});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_TRUE(contains(what, fmt::format("{} of {} parts missing", kMaxMergeParts - 1, kMaxMergeParts))) << what;
  EXPECT_TRUE(contains(what, "0/100000, 1/100000, 2/100000, 3/100000, 4/100000, 6/100000")) << what;
  EXPECT_TRUE(contains(what, fmt::format("and {} more", kMaxMergeParts - 1 - kMaxListedMissingParts))) << what;
  EXPECT_LT(what.size(), 600u);
  // A few missing: every one named, none left over.
  std::vector<Json> parts = whole_set(6);
  parts.erase(parts.begin() + 4);
  parts.erase(parts.begin() + 1);
  const std::string two = merge_error(ErrorKind::Usage, parts);
  EXPECT_TRUE(contains(two, "2 of 6 parts missing: 1/6, 4/6 (")) << two;
}

TEST(ReportMerge, PartsGivenTwiceOrNoneOrTooManyAreUsage) {
  std::vector<Json> parts = whole_set(3);
  parts.push_back(part(1, 3));
  EXPECT_TRUE(contains(merge_error(ErrorKind::Usage, parts), "part 1/3 given twice (part1.json and part3.json)"));
  EXPECT_TRUE(contains(merge_error(ErrorKind::Usage, {}), "no reports"));
  error_of(ErrorKind::Usage, [] { VerifyReportMerger m(kMaxMergeParts + 1); });
  error_of(ErrorKind::Usage, [] { VerifyReportMerger m(0); });
}

TEST(ReportMerge, PartsOfDifferentConversionsAreUsage) {
  const std::pair<const char*, Json> cases[] = {
      {"/provenance/source", "/data/other-src"},
      {"/provenance/target", "/data/other-dst"},
      {"/provenance/revision", "abc123"},
      {"/window", "e4m3"},
      {"/shard_subset", "1/4"},
      {"/counts/modules", 25},
      {"/counts/shards", 4},
      {"/source_tensor_bytes", 1},
      {"/target_tensor_bytes", 2},
      {"/unrepresentable_globals", Json::array()},
      {"/overspan/choice", "bf16"},
      {"/overspan/resolved_over_span", Json::array()},
      {"/overspan/bf16_layers/0/nvfp4_bytes", 31},
  };
  for (const auto& [pointer, value] : cases) {
    std::vector<Json> parts = whole_set(3);
    parts[2][Json::json_pointer(pointer)] = value;
    // Each part consistent on its own: the size change follows the sizes
    // (null: withheld), a BF16 layer's cost its sizes, no requantized rows
    // under a bf16 choice.
    if (contains(pointer, "tensor_bytes")) parts[2]["size_change_percent"] = nullptr;  // (withheld)
    if (contains(pointer, "nvfp4_bytes")) parts[2]["overspan"]["bf16_layers"][0]["size_cost_bytes"] = 69;
    if (std::string(pointer) == "/overspan/choice") {
      parts[2].erase("requantized");
      parts[2]["overspan"]["lossy"] = false;
      parts[2]["overspan"]["requantized_marlin_zeroed_blocks"] = 0;
    }
    const std::string what = merge_error(ErrorKind::Usage, parts, pointer);
    EXPECT_TRUE(contains(what, "part0.json and part2.json")) << what;
  }
  // A whole report (no shard_subset) and parts.
  std::vector<Json> parts = whole_set(2);
  parts[1].erase("shard_subset");
  parts[1].erase("resolved");
  merge_error(ErrorKind::Usage, parts, "whole and part");
  // One part without the over-span section at all.
  parts = whole_set(2);
  parts[1].erase("overspan");
  parts[1].erase("requantized");
  merge_error(ErrorKind::Usage, parts, "no overspan");
}

TEST(ReportMerge, PartsOfAnotherMx2nvAreUsage) {
  std::vector<Json> parts = whole_set(2);
  for (Json& p : parts) p["provenance"]["tool_version"] = "0.0.1";
  EXPECT_TRUE(contains(merge_error(ErrorKind::Usage, parts), "written by mx2nv 0.0.1"));
  parts = whole_set(2);
  parts[1]["provenance"]["tool_version"] = "99.0";
  merge_error(ErrorKind::Usage, parts);
}

TEST(ReportMerge, SelfContradictoryPartsAreInvalidInput) {
  using Edit = std::function<void(Json&)>;
  const std::pair<const char*, Edit> cases[] = {
      {"ok with mismatches", [](Json& j) { j["mismatches"] = 1; }},
      {"ok with a difference", [](Json& j) { j["differences"] = {"x differs"}; }},
      {"ok with an error measured", [](Json& j) { j["max_abs_error"] = 0.5; }},
      {"ok with infinite error", [](Json& j) { j["max_abs_error"] = "inf"; }},
      {"ok exiting 1", [](Json& j) { j["exit_code"] = 1; }},
      {"ok exiting 4", [](Json& j) { j["exit_code"] = 4; }},
      {"ok with an error message", [](Json& j) { j["error"] = "boom"; }},
      {"ok with an error kind", [](Json& j) { j["error_kind"] = "usage"; }},
      {"mismatch exiting 0",
       [](Json& j) { j["result"] = "mismatch", j["differences"] = {"x"}; }},
      {"mismatch with nothing", [](Json& j) { j["result"] = "mismatch", j["exit_code"] = 1; }},
      {"mismatch without an error measured",
       [](Json& j) { j["result"] = "mismatch", j["exit_code"] = 1, j["mismatches"] = 3, j["differences"] = {"x"}; }},
      {"error exiting 0",
       [](Json& j) { j["result"] = "error", j["error"] = "boom", j["error_kind"] = "I/O error"; }},
      {"error without a message", [](Json& j) { j["result"] = "error", j["error_kind"] = "usage", j["exit_code"] = 2; }},
      {"error without a kind", [](Json& j) { j["result"] = "error", j["error"] = "boom", j["exit_code"] = 2; }},
      {"error of another kind's code",
       [](Json& j) { j["result"] = "error", j["error"] = "boom", j["error_kind"] = "usage", j["exit_code"] = 3; }},
      {"error of no kind",
       [](Json& j) { j["result"] = "error", j["error"] = "boom", j["error_kind"] = "panic", j["exit_code"] = 4; }},
      {"more mismatches than values",
       [](Json& j) {
         j["result"] = "mismatch", j["exit_code"] = 1, j["mismatches"] = 50000, j["max_abs_error"] = 1.0,
         j["differences"] = {"x"};
       }},
      {"lossy without rows", [](Json& j) { j["requantized"] = Json::array(); }},
      {"rows without lossy", [](Json& j) { j["overspan"]["lossy"] = false; }},
      {"zeroed blocks that do not add up", [](Json& j) { j["overspan"]["requantized_marlin_zeroed_blocks"] = 4; }},
      {"rows under a bf16 choice", [](Json& j) { j["overspan"]["choice"] = "bf16"; }},
      {"rows without an overspan section", [](Json& j) { j.erase("overspan"); }},
      {"a module listed twice", [](Json& j) { j["requantized"].push_back(j["requantized"][0]); }},
      {"global conflicts miscounted", [](Json& j) { j["counts"]["global_conflicts"] = 2; }},
      {"a merged report that is a part", [](Json& j) { j["merged_parts"] = 3; }},
      {"more differences than verify lists", [](Json& j) {
         j["result"] = "mismatch", j["exit_code"] = 1;
         for (int k = 0; k < 202; ++k) j["differences"].push_back(fmt::format("d{}", k));
       }},
      {"more requantized rows than modules", [](Json& j) { j["counts"]["modules"] = 0; }},
      {"more BF16 modules than modules",
       [](Json& j) {
         j["counts"]["modules"] = 1, j["requantized"] = Json::array(), j["overspan"]["lossy"] = false;
         j["overspan"]["requantized_marlin_zeroed_blocks"] = 0;
       }},
  };
  for (const auto& [what, edit] : cases) {
    std::vector<Json> parts = whole_set(3);
    edit(parts[1]);
    const std::string message = merge_error(ErrorKind::InvalidInput, parts, what);
    EXPECT_TRUE(contains(message, "part1.json")) << what << ": " << message;
  }
}

TEST(ReportMerge, CountsThatAddUpPastTwoToThe64AreInvalidInput) {
  for (const char* pointer : {"/values_compared", "/counts/active_groups", "/counts/zero_groups",
                              "/counts/passthrough_tensors", "/counts/marlin_zeroed_groups"}) {
    std::vector<Json> parts = whole_set(3);
    parts[0][Json::json_pointer(pointer)] = std::numeric_limits<std::uint64_t>::max();
    parts[2][Json::json_pointer(pointer)] = std::numeric_limits<std::uint64_t>::max() / 2 + 1;
    const std::string what = merge_error(ErrorKind::InvalidInput, parts, pointer);
    EXPECT_TRUE(contains(what, "2^64")) << what;
  }
  // Mismatches too (each part consistent on its own).
  std::vector<Json> parts = whole_set(2);
  for (Json& p : parts) {
    p["result"] = "mismatch", p["exit_code"] = 1, p["differences"] = {"x"}, p["max_abs_error"] = 1.0;
    p["values_compared"] = p["mismatches"] = std::numeric_limits<std::uint64_t>::max() - 1;
  }
  EXPECT_TRUE(contains(merge_error(ErrorKind::InvalidInput, parts), "2^64"));
  // The requantized rows' zeroed blocks.
  parts = whole_set(2);
  for (Json& p : parts) {
    p["requantized"][0]["marlin_zeroed_blocks"] = std::numeric_limits<std::uint64_t>::max();
    p["overspan"]["requantized_marlin_zeroed_blocks"] = std::numeric_limits<std::uint64_t>::max();
  }
  EXPECT_TRUE(contains(merge_error(ErrorKind::InvalidInput, parts), "2^64"));
}

TEST(ReportMerge, NeverOkUnlessEveryPartIsOk) {
  // A mismatch anywhere makes the whole a mismatch.
  std::vector<Json> parts = whole_set(3);
  parts[2]["result"] = "mismatch", parts[2]["exit_code"] = 1, parts[2]["mismatches"] = 2;
  parts[2]["max_abs_error"] = "inf", parts[2]["differences"] = {"\"m.2.w1\" row 0 group 0 element 1: SRC 1 DST nan"};
  Json merged = merge(parts);
  EXPECT_EQ(merged["result"], "mismatch");
  EXPECT_EQ(merged["exit_code"], 1);
  EXPECT_EQ(merged["mismatches"], 2);
  EXPECT_EQ(merged["max_abs_error"], "inf");
  EXPECT_EQ(merged["differences"].size(), 1u);
  // An error anywhere makes the whole an error: the lowest part's, with its exit code.
  parts[1]["result"] = "error", parts[1]["error"] = "DST/model-2.safetensors: read: EIO";
  parts[1]["error_kind"] = "I/O error", parts[1]["exit_code"] = 4;
  parts[0]["result"] = "error", parts[0]["error"] = "SRC/config.json: bad";
  parts[0]["error_kind"] = "invalid input", parts[0]["exit_code"] = 3;
  merged = merge(parts);
  EXPECT_EQ(merged["result"], "error");
  EXPECT_EQ(merged["exit_code"], 3);
  EXPECT_EQ(merged["error"], "SRC/config.json: bad");
  // Error parts need not agree on whole-checkpoint fields (they stopped early).
  parts[0]["counts"]["shards"] = 0;
  parts[0].erase("requantized"), parts[0].erase("overspan");
  EXPECT_EQ(merge(parts)["exit_code"], 3);
  // Every part in error: the lowest part's error.
  for (Json& p : parts) p["result"] = "error", p["error"] = "x", p["error_kind"] = "usage", p["exit_code"] = 2;
  EXPECT_EQ(merge(parts)["exit_code"], 2);
}

TEST(ReportMerge, ARequantizedModuleInTwoPartsIsInvalidInput) {
  std::vector<Json> parts = whole_set(3);
  parts[2]["requantized"][0]["module"] = "m.0.w1";
  const std::string what = merge_error(ErrorKind::InvalidInput, parts);
  EXPECT_TRUE(contains(what, "also listed by part0.json")) << what;
}

TEST(ReportMerge, DifferencesAreJoinedOnceAndCapped) {
  std::vector<Json> parts = whole_set(3);
  for (std::size_t p = 0; p < parts.size(); ++p) {
    Json& j = parts[p];
    j["result"] = "mismatch", j["exit_code"] = 1;
    j["differences"] = {"config.json: the same in every part"};
    for (int k = 0; k < 150; ++k) j["differences"].push_back(fmt::format("part {} difference {}", p, k));
  }
  const Json merged = merge(parts);
  const Json& d = merged["differences"];
  ASSERT_EQ(d.size(), kMaxReportedDifferences + 1);
  EXPECT_EQ(d[0], "config.json: the same in every part");
  EXPECT_EQ(d[1], "part 0 difference 0");
  EXPECT_EQ(d[151], "part 1 difference 0");
  EXPECT_TRUE(contains(d.back().get<std::string>(), "... and up to ")) << d.back();
  // In any order of the parts, the same list.
  std::vector<Json> reversed(parts.rbegin(), parts.rend());
  EXPECT_EQ(merge(reversed)["differences"], d);
}

TEST(ReportMerge, WhatIsNotAJsonObjectIsInvalidInput) {
  const std::string nul(1, '\0');
  for (const std::string& text : {std::string(""), std::string("[]"), std::string("\"verify\""), std::string("5"),
                                  std::string("null"), std::string("{"), std::string("{\"command\": \"verify\"} x"),
                                  std::string("\xEF\xBB\xBF{}"), "{}" + nul, std::string("{\"a\": 1, \"a\": 2}"),
                                  std::string("{\"command\": NaN}"), std::string("{\"command\": \"\xff\"}"),
                                  std::string(100, '[') + std::string(100, ']'), std::string("{}")}) {
    error_of(ErrorKind::InvalidInput, [&] { merge_verify_reports({{"p.json", text}}); }, text.substr(0, 20));
  }
}

TEST(ReportMerge, MemoryIsBoundedByWhatAPartHolds) {
  // Larger than a part may be: refused before parsing.
  const std::string big(kMaxMergePartBytes + 1, ' ');
  EXPECT_TRUE(contains(error_of(ErrorKind::InvalidInput, [&] { merge_verify_reports({{"p.json", big}}); }), "bytes"));
  // Within the size, too many values: refused while parsing.
  std::string pad = "\"pad\": [0";
  for (std::size_t k = 0; k < kMaxMergePartValues; ++k) pad += ",0";
  const std::string text = "{" + pad + "]," + part(0, 1).dump().substr(1);
  ASSERT_LT(text.size(), kMaxMergePartBytes);
  EXPECT_TRUE(contains(error_of(ErrorKind::InvalidInput, [&] { merge_verify_reports({{"p.json", text}}); }),
                       "JSON values"));
}

// A part records where SRC and DST resolved when it was verified: the
// merge's report is kept out of those too (a symlink given as SRC may point
// elsewhere by the time of the merge).
TEST(ReportMerge, PartsRecordWhereSrcAndDstResolved) {
  VerifyReportMerger merger(2);
  for (std::uint64_t i = 0; i < 2; ++i) merger.add(fmt::format("part{}.json", i), part(i, 2).dump());
  const auto trees = merger.named_trees();
  for (const char* path : {"/data/src", "/data/dst", "/mnt/data/src", "/mnt/data/dst"}) {
    EXPECT_NE(std::find(trees.begin(), trees.end(), path), trees.end()) << path;
  }
  // A whole report records none; one that does contradicts itself.
  Json whole = part(0, 1);
  whole.erase("shard_subset");
  EXPECT_TRUE(contains(merge_error(ErrorKind::InvalidInput, {whole}), "resolved"));
}

TEST(ReportMerge, AWholeReportMergesAlone) {
  Json whole = part(0, 1);
  whole.erase("shard_subset");
  whole.erase("resolved");
  const Json merged = merge({whole});
  EXPECT_EQ(merged["result"], "ok");
  EXPECT_EQ(merged["values_compared"], 40960);
  EXPECT_EQ(merge({part(0, 1)})["result"], "ok");  // "0/1" is the whole as well
}

// Random damage: whatever a part says, the merge answers with an mx2nv
// Error or a report, and a report is ok only when every part said ok.
TEST(ReportMerge, RandomDamageNeverEscapesTheErrorType) {
  std::mt19937_64 rng(20);
  const std::vector<Json> values = {Json(nullptr), Json(false), Json(0), Json(-1), Json(1.5), Json("inf"),
                                    Json("ok"), Json("mismatch"), Json("error"), Json("0/3"), Json("2/3"),
                                    Json(std::numeric_limits<std::uint64_t>::max()), Json::array(), Json::object(),
                                    Json(std::numeric_limits<std::int64_t>::min()), Json(1e308)};
  std::vector<std::pair<std::string, Json::json_pointer>> paths;
  leaves(part(0, 3), "", paths);
  for (int round = 0; round < 3000; ++round) {
    std::vector<Json> parts = whole_set(3);
    for (int edits = 1 + static_cast<int>(rng() % 3); edits > 0; --edits) {
      Json& target = parts[rng() % parts.size()];
      const auto& pointer = paths[rng() % paths.size()].second;
      if (!target.contains(pointer)) continue;
      if (rng() % 5 == 0 && target[pointer.parent_pointer()].is_object()) {
        target[pointer.parent_pointer()].erase(pointer.back());
      } else {
        target[pointer] = values[rng() % values.size()];
      }
    }
    if (rng() % 4 == 0) parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(rng() % parts.size()));
    try {
      const Json merged = merge(parts);
      if (merged["result"] == "ok") {
        for (const Json& p : parts) EXPECT_EQ(p["result"], "ok") << p.dump();
        EXPECT_EQ(merged["mismatches"], 0);
        EXPECT_TRUE(merged["differences"].empty());
      }
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find("internal error"), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      FAIL() << "round " << round << ": not an mx2nv::Error: " << e.what();
    }
  }
}

}  // namespace
}  // namespace mx2nv

namespace mx2nv {
namespace {

TEST(ReportMerge, TheFingerprintIsCarriedOnlyWhenEveryPartAgrees) {
  const Json fp = {{"scheme", "mx2nv-fingerprint/1"}, {"source", "xxh3-128:" + std::string(32, 'a')},
                   {"target", "xxh3-128:" + std::string(32, 'b')}, {"source_files", 9}, {"target_files", 9}};
  std::vector<Json> parts = whole_set(2);
  for (auto& p : parts) p["fingerprint"] = fp;
  const Json merged = merge(parts);
  EXPECT_EQ(merged["result"], "ok");
  EXPECT_EQ(merged["fingerprint"], fp);
  parts[1]["fingerprint"]["target"] = "xxh3-128:" + std::string(32, 'c');
  const Json changed = merge(parts);
  EXPECT_EQ(changed["result"], "mismatch");
  EXPECT_FALSE(changed.contains("fingerprint"));
  EXPECT_EQ(changed["differences"][0], "the parts' fingerprints differ: SRC or DST changed between the parts");
  parts[1].erase("fingerprint");
  EXPECT_FALSE(merge(parts).contains("fingerprint"));
}

}  // namespace
}  // namespace mx2nv

namespace mx2nv {
namespace {

TEST(ReportMerge, AFigureAPartDidNotComputeIsNullInTheWhole) {
  std::vector<Json> parts = whole_set(3);
  const Json complete = merge(parts);
  EXPECT_EQ(complete["counts"]["raised_globals"], 3 * part(0, 3)["counts"]["raised_globals"].get<int>());
  parts[2]["counts"]["raised_globals"] = nullptr;
  const Json merged = merge(parts);
  EXPECT_TRUE(merged["counts"]["raised_globals"].is_null());
  EXPECT_EQ(merged["counts"]["active_groups"], complete["counts"]["active_groups"]);
  // values_compared, mismatches and max_abs_error are computed together.
  parts = whole_set(3);
  parts[1]["values_compared"] = nullptr;
  merge_error(ErrorKind::InvalidInput, parts, "values_compared alone null");
}

}  // namespace
}  // namespace mx2nv

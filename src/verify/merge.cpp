#include "verify/merge.hpp"

#include "common/checked.hpp"
#include "common/error.hpp"
#include "json/json_fields.hpp"
#include "json/strict_json.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <initializer_list>
#include <limits>

namespace mx2nv {
namespace {

// At most this much of a key or value from a part is quoted in a message.
constexpr std::size_t kQuotedBytes = 80;

std::string excerpt(std::string_view text) {
  if (text.size() <= kQuotedBytes) return std::string(text);
  return std::string(text.substr(0, kQuotedBytes)) + "...";
}

std::string join(std::string_view path, std::string_view key) {
  return path.empty() ? excerpt(key) : fmt::format("{}.{}", path, excerpt(key));
}

std::string item(std::string_view path, std::size_t i) { return fmt::format("{}[{}]", path, i); }

// One part, for messages: every error names the part (its file) and the key.
class Part {
 public:
  explicit Part(std::string_view name) : name_(name) {}
  std::string_view name() const { return name_; }

  // The value at `path` is wrong: exit 3.
  template <typename... Args>
  [[noreturn]] void bad(std::string_view path, fmt::format_string<Args...> format, Args&&... args) const {
    fail_input("--merge: {}: {} {}", name_, path.empty() ? std::string("the report") : fmt::format("\"{}\"", path),
               fmt::format(format, std::forward<Args>(args)...));
  }
  // Two of the part's own fields disagree: exit 3.
  template <typename... Args>
  [[noreturn]] void contradicts(fmt::format_string<Args...> format, Args&&... args) const {
    fail_input("--merge: {}: the report contradicts itself: {}", name_, fmt::format(format, std::forward<Args>(args)...));
  }

 private:
  std::string_view name_;
};

// An object with all of `required` and nothing but those and `optional`.
void check_object(const Part& p, const Json& v, std::string_view path, std::initializer_list<const char*> required,
                  std::initializer_list<const char*> optional = {}) {
  if (!v.is_object()) p.bad(path, "must be an object, not {}", json_type_words(v));
  for (const char* key : required) {
    if (!v.contains(key)) p.bad(join(path, key), "is missing");
  }
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string& key = it.key();
    const auto is = [&key](const char* k) { return key == k; };
    if (std::none_of(required.begin(), required.end(), is) && std::none_of(optional.begin(), optional.end(), is)) {
      p.bad(join(path, key), "is not a key of a verify report");
    }
  }
}

using Figure = std::optional<std::uint64_t>;  // nullopt: null in the report, not computed

std::uint64_t uint_at(const Part& p, const Json& v, std::string_view path) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer()) {
    const auto s = v.get<std::int64_t>();
    if (s >= 0) return static_cast<std::uint64_t>(s);  // "-0"
    p.bad(path, "must be a non-negative integer, not {}", s);
  }
  p.bad(path, "must be a non-negative integer below 2^64, not {}", json_type_words(v));
}

std::int64_t int_at(const Part& p, const Json& v, std::string_view path) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) p.bad(path, "is out of range ({})", u);
    return static_cast<std::int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<std::int64_t>();
  p.bad(path, "must be an integer, not {}", json_type_words(v));
}

double finite_at(const Part& p, const Json& v, std::string_view path) {
  if (!v.is_number()) p.bad(path, "must be a number, not {}", json_type_words(v));
  const double d = v.get<double>();
  if (!std::isfinite(d)) p.bad(path, "must be a finite number");  // 1e999 parses as infinity
  return d;
}

double non_negative_at(const Part& p, const Json& v, std::string_view path) {
  const double d = finite_at(p, v, path);
  if (d < 0) p.bad(path, "must not be negative ({})", d);
  return d;
}

// A measured error: a finite number, or "inf", which a report writes for an
// infinite or NaN one. nullopt for "inf".
std::optional<double> error_at(const Part& p, const Json& v, std::string_view path) {
  if (v.is_string()) {
    if (v.get_ref<const std::string&>() != "inf") p.bad(path, "must be a number or \"inf\"");
    return std::nullopt;
  }
  return finite_at(p, v, path);
}

// A figure: a non-negative integer, or null (not computed).
Figure figure_at(const Part& p, const Json& v, std::string_view path) {
  if (v.is_null()) return std::nullopt;
  return uint_at(p, v, path);
}

// A whole-checkpoint bound (counts.modules, counts.scale_groups): 0 when not computed.
std::uint64_t bound_of(const Json& counts, const char* key) {
  const Json& v = counts[key];
  return v.is_null() ? 0 : v.get<std::uint64_t>();
}

const std::string& string_at(const Part& p, const Json& v, std::string_view path) {
  if (!v.is_string()) p.bad(path, "must be a string, not {}", json_type_words(v));
  return v.get_ref<const std::string&>();
}

bool bool_at(const Part& p, const Json& v, std::string_view path) {
  if (!v.is_boolean()) p.bad(path, "must be true or false, not {}", json_type_words(v));
  return v.get<bool>();
}

const Json& array_at(const Part& p, const Json& v, std::string_view path, std::uint64_t max_items,
                     std::string_view limit) {
  if (!v.is_array()) p.bad(path, "must be an array, not {}", json_type_words(v));
  if (v.size() > max_items) p.bad(path, "has {} entries, more than {} ({})", v.size(), max_items, limit);
  return v;
}

// A part's fingerprint: the scheme verify writes, two digests and two file
// counts, each of its type (a wrong type is invalid input, not a difference).
void check_fingerprint(const Part& p, const Json& f) {
  check_object(p, f, "fingerprint", {"scheme", "source", "target", "source_files", "target_files"}, {});
  if (string_at(p, f["scheme"], "fingerprint.scheme") != "mx2nv-fingerprint/1") {
    p.bad("fingerprint.scheme", "is not \"mx2nv-fingerprint/1\"");
  }
  for (const char* side : {"source", "target"}) {
    const std::string& d = string_at(p, f[side], std::string("fingerprint.") + side);
    const bool hex = d.size() == 9 + 32 && d.starts_with("xxh3-128:") &&
                     std::all_of(d.begin() + 9, d.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
    if (!hex) p.bad(std::string("fingerprint.") + side, "is not xxh3-128:<32 lower-case hex digits>");
  }
  uint_at(p, f["source_files"], "fingerprint.source_files");
  uint_at(p, f["target_files"], "fingerprint.target_files");
}


void strings_at(const Part& p, const Json& v, std::string_view path, std::uint64_t max_items, std::string_view limit) {
  const Json& a = array_at(p, v, path, max_items, limit);
  for (std::size_t i = 0; i < a.size(); ++i) string_at(p, a[i], item(path, i));
}

// An absolute path, as start_report writes SRC and DST.
const std::string& absolute_path_at(const Part& p, const Json& v, std::string_view path) {
  const std::string& s = string_at(p, v, path);
  if (s.empty() || s.front() != '/') p.bad(path, "must be an absolute path");
  return s;
}

// "I/N" in canonical decimal (no sign, no leading zeros), 0 <= I < N <= kMaxMergeParts.
std::pair<std::uint64_t, std::uint64_t> subset_at(const Part& p, const Json& v) {
  const std::string& t = string_at(p, v, "shard_subset");
  const auto number = [&](std::string_view s, std::uint64_t& out) {
    if (s.empty() || (s.size() > 1 && s.front() == '0')) return false;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return ec == std::errc() && end == s.data() + s.size();
  };
  const auto slash = t.find('/');
  std::uint64_t i = 0, n = 0;
  if (slash == std::string::npos) {
    p.bad("shard_subset", "is \"{}\", not I/N (a part of verify --shards I/N)", excerpt(t));
  }
  if (!number(std::string_view(t).substr(0, slash), i) || !number(std::string_view(t).substr(slash + 1), n) || n == 0 ||
      i >= n) {
    p.bad("shard_subset", "is \"{}\", not I/N with 0 <= I < N", excerpt(t));
  }
  if (n > kMaxMergeParts) {
    p.bad("shard_subset", "is \"{}\": N is above {} (no checkpoint has more shards, so no merge has more parts)",
          excerpt(t), kMaxMergeParts);
  }
  return {i, n};
}

void over_span_at(const Part& p, const Json& v, std::string_view path, std::uint64_t modules) {
  const Json& a = array_at(p, v, path, modules, "counts.modules");
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::string at = item(path, i);
    check_object(p, a[i], at, {"module", "span", "limit", "groups_outside"});
    string_at(p, a[i]["module"], join(at, "module"));
    int_at(p, a[i]["span"], join(at, "span"));
    int_at(p, a[i]["limit"], join(at, "limit"));
    uint_at(p, a[i]["groups_outside"], join(at, "groups_outside"));
  }
}

void global_conflicts_at(const Part& p, const Json& v, std::uint64_t scale_groups) {
  const Json& a = array_at(p, v, "global_conflicts", scale_groups, "counts.scale_groups");
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::string at = item("global_conflicts", i);
    check_object(p, a[i], at, {"scale_group", "k_max", "k_min", "needed", "allowed"});
    string_at(p, a[i]["scale_group"], join(at, "scale_group"));
    int_at(p, a[i]["k_max"], join(at, "k_max"));
    int_at(p, a[i]["k_min"], join(at, "k_min"));
    for (const char* key : {"needed", "allowed"}) {
      const std::string range = join(at, key);
      const Json& r = a[i][key];
      if (!r.is_array() || r.size() != 2) p.bad(range, "must be an array [lo, hi]");
      int_at(p, r[0], item(range, 0));
      int_at(p, r[1], item(range, 1));
    }
  }
}

}  // namespace

// What a part says, checked.
struct PartData {
  std::uint64_t index = 0, count = 1;  // shard_subset I/N; a whole report is 0/1
  std::string result;
  // The counts each part makes over its own shards, by key (per_part_count).
  std::map<std::string, Figure, std::less<>> counts;
  Figure values_compared, mismatches;
  std::optional<double> max_abs_error;  // nullopt: "inf"
  bool max_abs_error_computed = true;   // false: null
  double seconds = 0;
  Json error;  // {error, error_kind, exit_code} for result "error"
  Json whole;  // the fields every part computes on the whole checkpoint
};

namespace {

// The counts each part makes over its own shards (added up); the others are
// the whole checkpoint's, the same in every part.
bool per_part_count(std::string_view key) {
  return key == "active_groups" || key == "zero_groups" || key == "marlin_zeroed_groups" ||
         key == "passthrough_tensors" || key == "canonicalised_zero_groups" || key == "raised_globals";
}

// A verify report of this schema from mx2nv: its keys, window and provenance.
void check_report_keys(const Part& p, const Json& j) {
  if (!j.is_object()) p.bad("", "must be a JSON object, not {}", json_type_words(j));
  if (!j.contains("command")) p.bad("command", "is missing");
  if (const std::string& command = string_at(p, j["command"], "command"); command != "verify") {
    p.bad("command", "is \"{}\": only verify reports merge", excerpt(command));
  }
  check_object(p, j, "",
               {"command", "result", "window", "provenance", "counts", "source_tensor_bytes", "target_tensor_bytes",
                "size_change_percent", "values_compared", "mismatches", "max_abs_error", "over_span",
                "unrepresentable_globals", "global_conflicts", "differences", "exit_code", "seconds"},
               {"shard_subset", "resolved", "requantized", "overspan", "error", "error_kind", "merged_parts",
                "fingerprint"});
  // A part's fingerprint (verify writes one) is checked for shape only: the
  // merged report does not carry one (docs/reports.md), so `mx2nv card`
  // needs a whole verify.
  if (j.contains("fingerprint")) check_fingerprint(p, j["fingerprint"]);

  if (!parse_window(string_at(p, j["window"], "window"))) {
    p.bad("window", "is \"{}\", not a window mx2nv knows", excerpt(j["window"].get_ref<const std::string&>()));
  }
  const Json& prov = j["provenance"];
  check_object(p, prov, "provenance", {"tool", "tool_version", "source", "revision", "target"});
  if (string_at(p, prov["tool"], "provenance.tool") != "mx2nv") p.bad("provenance.tool", "is not \"mx2nv\"");
  if (string_at(p, prov["tool_version"], "provenance.tool_version").empty()) {
    p.bad("provenance.tool_version", "is empty");
  }
  absolute_path_at(p, prov["source"], "provenance.source");
  absolute_path_at(p, prov["target"], "provenance.target");
  if (!prov["revision"].is_null()) string_at(p, prov["revision"], "provenance.revision");
}

// The counts: those each part makes over its own shards go into `d`; the
// whole checkpoint's are returned.
Json read_counts(const Part& p, const Json& j, PartData& d) {
  const Json& counts = j["counts"];
  check_object(p, counts, "counts",
               {"shards", "resumed_shards", "modules", "scale_groups", "active_groups", "zero_groups",
                "canonicalised_zero_groups", "marlin_zeroed_groups", "raised_globals", "global_conflicts",
                "passthrough_tensors", "companion_files"});
  Json whole_counts = Json::object();
  // A part that ran (ok or mismatch) opened SRC: its structure counts are numbers.
  const bool ran = j["result"] == "ok" || j["result"] == "mismatch";
  // verify resumes nothing: its resumed_shards is null.
  if (!counts["resumed_shards"].is_null()) p.bad("counts.resumed_shards", "must be null in a verify report");
  for (const auto& [key, value] : counts.items()) {
    const bool structure = key == "shards" || key == "modules" || key == "scale_groups" || key == "companion_files";
    const Figure n = ran && structure ? Figure(uint_at(p, value, join("counts", key))) : figure_at(p, value, join("counts", key));
    if (per_part_count(key)) {
      d.counts[key] = n;
    } else {
      whole_counts[key] = n ? Json(*n) : Json(nullptr);
    }
  }
  return whole_counts;
}

// The part's own results and sizes, and the whole checkpoint's refusals.
void read_results(const Part& p, const Json& j, PartData& d, const Json& whole_counts) {
  const std::uint64_t modules = bound_of(whole_counts, "modules");
  const std::uint64_t scale_groups = bound_of(whole_counts, "scale_groups");
  if (j.contains("shard_subset")) std::tie(d.index, d.count) = subset_at(p, j["shard_subset"]);
  // A part records where SRC and DST resolved when it was verified (the
  // merge keeps its report out of those too); a whole report does not.
  if (j.contains("resolved")) {
    if (!j.contains("shard_subset")) p.contradicts("\"resolved\" is recorded by a part (shard_subset) only");
    check_object(p, j["resolved"], "resolved", {"source", "target"});
    absolute_path_at(p, j["resolved"]["source"], "resolved.source");
    absolute_path_at(p, j["resolved"]["target"], "resolved.target");
  } else if (j.contains("shard_subset")) {
    p.bad("resolved", "is missing (a part of verify --shards I/N records where SRC and DST resolved)");
  }
  if (j.contains("merged_parts")) {
    if (uint_at(p, j["merged_parts"], "merged_parts") == 0) p.bad("merged_parts", "must be at least 1");
    if (j.contains("shard_subset")) p.contradicts("a merged report (merged_parts) is not a part (shard_subset)");
  }
  figure_at(p, j["source_tensor_bytes"], "source_tensor_bytes");
  figure_at(p, j["target_tensor_bytes"], "target_tensor_bytes");
  if (!j["size_change_percent"].is_null()) finite_at(p, j["size_change_percent"], "size_change_percent");
  d.values_compared = figure_at(p, j["values_compared"], "values_compared");
  d.mismatches = figure_at(p, j["mismatches"], "mismatches");
  d.max_abs_error_computed = !j["max_abs_error"].is_null();
  if (d.max_abs_error_computed) d.max_abs_error = error_at(p, j["max_abs_error"], "max_abs_error");
  if (d.max_abs_error && *d.max_abs_error < 0) p.bad("max_abs_error", "must not be negative");
  // Computed together: all numbers or all null.
  const bool any = d.values_compared || d.mismatches || d.max_abs_error_computed;
  for (const auto& [key, computed] : {std::pair<const char*, bool>{"values_compared", d.values_compared.has_value()},
                                      {"mismatches", d.mismatches.has_value()},
                                      {"max_abs_error", d.max_abs_error_computed}}) {
    if (any && !computed) p.bad(key, "is null, but values were compared (values_compared, mismatches, max_abs_error)");
  }
  d.seconds = non_negative_at(p, j["seconds"], "seconds");
  over_span_at(p, j["over_span"], "over_span", modules);
  strings_at(p, j["unrepresentable_globals"], "unrepresentable_globals", scale_groups, "counts.scale_groups");
  global_conflicts_at(p, j["global_conflicts"], scale_groups);
  if (whole_counts["global_conflicts"] != j["global_conflicts"].size()) {
    p.contradicts("counts.global_conflicts is {}, global_conflicts lists {}", whole_counts["global_conflicts"].dump(),
                  j["global_conflicts"].size());
  }
  // verify lists kMaxReportedDifferences, then one "... and K more".
  strings_at(p, j["differences"], "differences", kMaxReportedDifferences + 1, "verify lists at most that many");
}

// Requantized modules (convert --overspan requantize): each part lists those
// of its own shards.
struct RequantizedRows {
  std::size_t modules = 0;
  std::uint64_t zeroed_blocks = 0;  // their marlin_zeroed_blocks, added up
};
RequantizedRows read_requantized(const Part& p, const Json& j, std::uint64_t modules) {
  RequantizedRows r;
  if (j.contains("requantized")) {
    const Json& rows = array_at(p, j["requantized"], "requantized", modules, "counts.modules");
    r.modules = rows.size();
    std::set<std::string_view> names;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const std::string at = item("requantized", i);
      const Json& row = rows[i];
      check_object(p, row, at,
                   {"module", "global_scale", "values", "relative_rmse", "cosine", "max_abs_error",
                    "marlin_zeroed_blocks"});
      const std::string& module = string_at(p, row["module"], join(at, "module"));
      if (!names.insert(module).second) p.bad(join(at, "module"), "\"{}\" is listed twice", excerpt(module));
      finite_at(p, row["global_scale"], join(at, "global_scale"));
      uint_at(p, row["values"], join(at, "values"));
      for (const char* key : {"relative_rmse", "max_abs_error"}) {
        if (const auto e = error_at(p, row[key], join(at, key)); e && *e < 0) p.bad(join(at, key), "must not be negative");
      }
      error_at(p, row["cosine"], join(at, "cosine"));
      const auto blocks = checked_add(r.zeroed_blocks, uint_at(p, row["marlin_zeroed_blocks"], join(at, "marlin_zeroed_blocks")));
      if (!blocks) p.bad(join(at, "marlin_zeroed_blocks"), "adds up past 2^64 - 1");
      r.zeroed_blocks = *blocks;
    }
  }
  return r;
}

// The over-span section, checked against the requantized rows; its whole
// checkpoint part is returned (null: no section, convert --overspan fail).
Json read_overspan(const Part& p, const Json& j, std::uint64_t modules, const RequantizedRows& rows) {
  Json whole_overspan;
  if (j.contains("overspan")) {
    const Json& o = j["overspan"];
    check_object(p, o, "overspan", {"choice", "lossy", "resolved_over_span", "bf16_layers", "requantized_marlin_zeroed_blocks"});
    const std::string& choice = string_at(p, o["choice"], "overspan.choice");
    if (choice != "bf16" && choice != "requantize") {
      p.bad("overspan.choice", "is \"{}\", not bf16 or requantize", excerpt(choice));
    }
    const bool lossy = bool_at(p, o["lossy"], "overspan.lossy");
    over_span_at(p, o["resolved_over_span"], "overspan.resolved_over_span", modules);
    const Json& layers = array_at(p, o["bf16_layers"], "overspan.bf16_layers", modules, "counts.modules");
    std::uint64_t layer_modules = 0;
    for (std::size_t i = 0; i < layers.size(); ++i) {
      const std::string at = item("overspan.bf16_layers", i);
      check_object(p, layers[i], at, {"layer", "modules", "why", "bf16_bytes", "nvfp4_bytes", "size_cost_bytes"});
      string_at(p, layers[i]["layer"], join(at, "layer"));
      strings_at(p, layers[i]["modules"], join(at, "modules"), modules, "counts.modules");
      strings_at(p, layers[i]["why"], join(at, "why"), modules, "counts.modules");
      uint_at(p, layers[i]["bf16_bytes"], join(at, "bf16_bytes"));
      uint_at(p, layers[i]["nvfp4_bytes"], join(at, "nvfp4_bytes"));
      int_at(p, layers[i]["size_cost_bytes"], join(at, "size_cost_bytes"));
      layer_modules += layers[i]["modules"].size();  // each <= modules <= 2^20 values: no overflow
    }
    if (layer_modules > modules) p.contradicts("overspan.bf16_layers list {} modules, counts.modules is {}", layer_modules, modules);
    const std::uint64_t claimed = uint_at(p, o["requantized_marlin_zeroed_blocks"], "overspan.requantized_marlin_zeroed_blocks");
    if (lossy != (rows.modules > 0)) {
      p.contradicts("overspan.lossy is {}, but requantized lists {} modules", lossy, rows.modules);
    }
    if (claimed != rows.zeroed_blocks) {
      p.contradicts("overspan.requantized_marlin_zeroed_blocks is {}, the requantized rows add up to {}", claimed,
                    rows.zeroed_blocks);
    }
    if (rows.modules > 0 && choice != "requantize") {
      p.contradicts("requantized lists {} modules, but overspan.choice is \"{}\"", rows.modules, choice);
    }
    whole_overspan = {{"choice", choice}, {"resolved_over_span", o["resolved_over_span"]}, {"bf16_layers", layers}};
  } else if (rows.modules > 0) {
    p.contradicts("requantized lists {} modules, but there is no overspan section", rows.modules);
  }
  return whole_overspan;
}

// result, exit_code, error and the counts must tell one story.
void read_outcome(const Part& p, const Json& j, PartData& d) {
  d.result = string_at(p, j["result"], "result");
  const std::int64_t exit = int_at(p, j["exit_code"], "exit_code");
  const bool has_error = j.contains("error"), has_kind = j.contains("error_kind");
  if (d.result == "error") {
    if (!has_error) p.bad("error", "is missing (result is \"error\")");
    if (!has_kind) p.bad("error_kind", "is missing (result is \"error\")");
    string_at(p, j["error"], "error");
    const std::string& kind = string_at(p, j["error_kind"], "error_kind");
    int expected = -1;
    for (const ErrorKind k : {ErrorKind::Usage, ErrorKind::InvalidInput, ErrorKind::Io}) {
      if (kind == kind_name(k)) expected = exit_code(k);
    }
    if (expected < 0) p.bad("error_kind", "is \"{}\", not usage, invalid input or I/O error", excerpt(kind));
    if (exit != expected) p.contradicts("result \"error\" of kind {} exits {}, not {}", kind, expected, exit);
    d.error = {{"error", j["error"]}, {"error_kind", j["error_kind"]}, {"exit_code", exit}};
  } else if (d.result == "ok" || d.result == "mismatch") {
    const bool ok = d.result == "ok";
    if (has_error || has_kind) p.contradicts("result \"{}\" with an error", d.result);
    if (exit != (ok ? kExitOk : kExitRefusedOrMismatch)) {
      p.contradicts("result \"{}\" exits {}, not {}", d.result, ok ? kExitOk : kExitRefusedOrMismatch, exit);
    }
    const std::size_t differences = j["differences"].size();
    const std::uint64_t mismatches = d.mismatches.value_or(0);
    if (ok && !d.mismatches) p.contradicts("result \"ok\" without the values compared");
    if (ok && (mismatches > 0 || differences > 0)) {
      p.contradicts("result \"ok\" with {} mismatches and {} differences", mismatches, differences);
    }
    if (!ok && mismatches == 0 && differences == 0) p.contradicts("result \"mismatch\" without a mismatch or difference");
    // max_abs_error is measured over the mismatching values only: 0 exactly when there are none.
    const bool error_measured = !d.max_abs_error || *d.max_abs_error > 0;
    if (d.max_abs_error_computed && error_measured != (mismatches > 0)) {
      p.contradicts("{} mismatches, but max_abs_error is {}", mismatches, j["max_abs_error"].dump());
    }
  } else {
    p.bad("result", "is \"{}\", not ok, mismatch or error", excerpt(d.result));
  }
  if (d.mismatches.value_or(0) > d.values_compared.value_or(0)) {
    p.contradicts("{} mismatches among {} values compared", d.mismatches.value_or(0), d.values_compared.value_or(0));
  }
}

PartData read_part(const Part& p, const Json& j) {
  PartData d;
  check_report_keys(p, j);
  Json whole_counts = read_counts(p, j, d);
  const std::uint64_t modules = bound_of(whole_counts, "modules");
  read_results(p, j, d, whole_counts);
  const RequantizedRows requantized = read_requantized(p, j, modules);
  Json whole_overspan = read_overspan(p, j, modules, requantized);
  read_outcome(p, j, d);
  d.whole = {{"counts", std::move(whole_counts)},
             {"source_tensor_bytes", j["source_tensor_bytes"]},
             {"target_tensor_bytes", j["target_tensor_bytes"]},
             {"size_change_percent", j["size_change_percent"]},
             {"over_span", j["over_span"]},
             {"unrepresentable_globals", j["unrepresentable_globals"]},
             {"global_conflicts", j["global_conflicts"]},
             {"overspan", std::move(whole_overspan)}};
  return d;
}

struct FieldDifference {
  std::string path;  // dotted
  const Json* a;
  const Json* b;
};

// The first field where two parts' whole-checkpoint results differ (both
// built by read_part: the same keys, except a section one of them lacks).
std::optional<FieldDifference> first_difference(const Json& a, const Json& b, const std::string& path = "") {
  static const Json kAbsent;
  for (const auto& [key, value] : a.items()) {
    const std::string at = path.empty() ? key : path + "." + key;
    const auto other = b.find(key);
    if (other == b.end()) return FieldDifference{at, &value, &kAbsent};
    if (value.is_object() && other->is_object()) {
      if (auto d = first_difference(value, *other, at)) return d;
    } else if (value != *other) {
      return FieldDifference{at, &value, &*other};
    }
  }
  for (const auto& [key, value] : b.items()) {
    if (!a.contains(key)) return FieldDifference{path.empty() ? key : path + "." + key, &kAbsent, &value};
  }
  return std::nullopt;
}

// Two values of one key for a message: scalars as JSON, containers not at all.
std::string shown_values(const Json& a, const Json& b) {
  if (a.is_structured() || b.is_structured()) return "";
  return fmt::format(": {} and {}", excerpt(a.dump(-1, ' ', false, Json::error_handler_t::replace)),
                     excerpt(b.dump(-1, ' ', false, Json::error_handler_t::replace)));
}

// A json_text() string with its \xNN escapes turned back into bytes (the
// path a \xNN-escaped provenance path stands for, when it was not UTF-8).
std::string unescaped(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    unsigned value = 0;
    if (text[i] == '\\' && i + 3 < text.size() && text[i + 1] == 'x' &&
        std::from_chars(text.data() + i + 2, text.data() + i + 4, value, 16).ptr == text.data() + i + 4) {
      out += static_cast<char>(value);
      i += 3;
    } else {
      out += text[i];
    }
  }
  return out;
}

// A part's text as JSON, within the caps on its size and values.
Json parse_part(std::string_view name, std::string_view text) {
  if (text.size() > kMaxMergePartBytes) {
    fail_input("--merge: {}: {} bytes, more than the {} a verify report may have", name, text.size(), kMaxMergePartBytes);
  }
  try {
    return parse_strict_json(text, name, kMaxMergePartValues).value;
  } catch (const Error& e) {
    rethrow_with_context(e, "--merge");
  }
}

}  // namespace

VerifyReportMerger::VerifyReportMerger(std::size_t parts) : expected_parts_(parts) {
  if (parts == 0) fail(ErrorKind::Usage, "--merge: no reports");
  if (parts > kMaxMergeParts) {
    fail(ErrorKind::Usage, "--merge: {} reports, more than {} (no checkpoint has more shards)", parts, kMaxMergeParts);
  }
}

void VerifyReportMerger::add(std::string_view name, std::string_view text) {
  const Part p(name);
  Json j = parse_part(name, text);
  PartData d = read_part(p, j);
  check_identity(name, j, d);
  keep_whole(name, d);
  add_results(name, j, d);
  if (!j.contains("fingerprint")) {
    fingerprint_missing_ = true;
  } else if (!any_part_added_) {
    fingerprint_ = j["fingerprint"];
  } else if (!fingerprint_ || *fingerprint_ != j["fingerprint"]) {
    fingerprints_differ_ = true;
  }
  any_part_added_ = true;
}

// Every part is of the same SRC, DST, window, mx2nv and split, and each
// part index comes once.
void VerifyReportMerger::check_identity(std::string_view name, const Json& j, const PartData& d) {
  const Json& prov = j["provenance"];
  for (const char* key : {"source", "target"}) {
    const Json* resolved = j.contains("resolved") ? &j["resolved"] : nullptr;
    for (const Json* paths : {&prov, resolved}) {
      if (paths == nullptr) continue;
      const std::string& path = (*paths)[key].get_ref<const std::string&>();
      trees_.insert(path);
      trees_.insert(unescaped(path));
    }
  }
  ++named_parts_;
  const std::string& version = prov["tool_version"].get_ref<const std::string&>();
  if (version != MX2NV_VERSION) {
    fail(ErrorKind::Usage, "--merge: {} was written by mx2nv {}, this is mx2nv {}: merge with the mx2nv that verified",
         name, excerpt(version), MX2NV_VERSION);
  }
  if (!window_) {
    first_name_ = name;
    window_ = parse_window(j["window"].get_ref<const std::string&>());
    source_ = prov["source"].get<std::string>();
    target_ = prov["target"].get<std::string>();
    provenance_ = prov;
    count_ = d.count;
  } else {
    const auto differs = [&](std::string_view what) {
      fail(ErrorKind::Usage, "--merge: {} and {} are not parts of one verify: {} differs", first_name_, name, what);
    };
    if (j["window"] != std::string(window_name(*window_))) differs("the window");
    for (const auto& [key, value] : provenance_.items()) {
      const auto other = prov.find(key);  // read_part checked both have every key
      if (other == prov.end() || *other != value) {
        differs(fmt::format("provenance.{}{}", key, other == prov.end() ? "" : shown_values(value, *other)));
      }
    }
    if (d.count != count_) {
      fail(ErrorKind::Usage, "--merge: {} and {} are not parts of one verify: {} splits the shards {} ways, {} {}",
           first_name_, name, first_name_, count_, name, d.count);
    }
  }
  if (const auto [at, inserted] = seen_.emplace(d.index, std::string(name)); !inserted) {
    fail(ErrorKind::Usage, "--merge: part {}/{} given twice ({} and {})", d.index, count_, at->second, name);
  }
}

// The whole-checkpoint fields: kept from the first part not in error (or
// the first part until one comes), and equal in every other part not in
// error.
void VerifyReportMerger::keep_whole(std::string_view name, PartData& d) {
  const bool in_error = d.result == "error";
  if (!in_error && !whole_from_error_part_) {
    if (const auto diff = first_difference(whole_, d.whole)) {
      // Both ran every whole-checkpoint check on the same SRC and DST paths:
      // SRC or DST changed between them.
      fail(ErrorKind::Usage, "--merge: {} and {} are not parts of one verify of one SRC and DST: {} differs{}",
           whole_name_, name, diff->path, shown_values(*diff->a, *diff->b));
    }
  } else if (whole_.is_null() || (!in_error && whole_from_error_part_)) {
    whole_ = std::move(d.whole);
    whole_name_ = name;
    whole_from_error_part_ = in_error;
  }
}

// What each part counts, lists or finds on its own shards.
void VerifyReportMerger::add_results(std::string_view name, Json& j, PartData& d) {
  const bool in_error = d.result == "error";
  const auto add = [&](std::uint64_t& total, std::uint64_t v, std::string_view key) {
    const auto sum = checked_add(total, v);
    if (!sum) fail_input("--merge: {}: \"{}\": the parts' {} add up past 2^64 - 1", name, key, key);
    total = *sum;
  };
  // A figure a part did not compute makes the sum not computed.
  const auto add_figure = [&](std::optional<std::uint64_t>& total, const Figure& v, std::string_view key) {
    if (!total || !v) {
      total.reset();
      return;
    }
    add(*total, *v, key);
  };
  for (const auto& [key, value] : d.counts) add_figure(counts_.try_emplace(key, 0).first->second, value, join("counts", key));
  add_figure(values_compared_, d.values_compared, "values_compared");
  add_figure(mismatches_, d.mismatches, "mismatches");
  if (!d.max_abs_error_computed) {
    max_abs_error_computed_ = false;
  } else if (!d.max_abs_error) {
    max_abs_error_infinite_ = true;
  } else {
    max_abs_error_ = std::max(max_abs_error_, *d.max_abs_error);
  }
  any_mismatch_ = any_mismatch_ || d.result == "mismatch";
  if (in_error && (!error_ || d.index < error_->first)) error_.emplace(d.index, std::move(d.error));
  seconds_ = std::max(seconds_, d.seconds);  // they ran side by side: the slowest part

  const Json& differences = j["differences"];
  for (std::size_t i = 0; i < differences.size(); ++i) {
    add_difference(d.index, i, differences[i].get_ref<const std::string&>());
  }
  if (j.contains("requantized")) {
    for (Json& row : j["requantized"]) {
      std::string module = row["module"].get<std::string>();
      const auto found = requantized_.find(module);
      if (found != requantized_.end()) {
        fail_input("--merge: {}: requantized module \"{}\" is also listed by {} (a module belongs to the one part "
                   "that holds its shard)",
                   name, excerpt(module), found->second.second);
      }
      add(marlin_zeroed_blocks_, row["marlin_zeroed_blocks"].get<std::uint64_t>(), "requantized.marlin_zeroed_blocks");
      requantized_.emplace(std::move(module), std::make_pair(std::move(row), std::string(name)));
    }
  }
}

void VerifyReportMerger::add_difference(std::uint64_t part, std::uint64_t position, const std::string& text) {
  const std::pair key{part, position};
  if (const auto found = difference_keys_.find(text); found != difference_keys_.end()) {
    if (key < found->second) {  // the same difference, listed by a lower part first
      differences_.erase(found->second);
      found->second = key;
      differences_.emplace(key, text);
    }
    return;
  }
  if (differences_.size() == kMaxReportedDifferences) {
    const auto last = std::prev(differences_.end());
    ++omitted_differences_;
    if (key > last->first) return;
    difference_keys_.erase(last->second);
    differences_.erase(last);
  }
  differences_.emplace(key, text);
  difference_keys_.emplace(text, key);
}

Report VerifyReportMerger::finish() const {
  if (seen_.empty()) fail(ErrorKind::Usage, "--merge: no reports");
  if (seen_.size() < count_) {
    std::string listed;
    std::uint64_t shown = 0;
    auto next_seen = seen_.begin();
    // Walks at most seen_.size() + kMaxListedMissingParts indices, whatever N is.
    for (std::uint64_t i = 0; i < count_ && shown < kMaxListedMissingParts; ++i) {
      if (next_seen != seen_.end() && next_seen->first == i) {
        ++next_seen;
        continue;
      }
      listed += fmt::format("{}{}/{}", listed.empty() ? "" : ", ", i, count_);
      ++shown;
    }
    const std::uint64_t missing = count_ - seen_.size();
    fail(ErrorKind::Usage, "--merge: {} of {} parts missing: {}{} (each is verify SRC DST --shards I/{} --report FILE)",
         missing, count_, listed, missing > shown ? fmt::format(", and {} more", missing - shown) : "", count_);
  }
  const std::uint64_t modules = bound_of(whole_["counts"], "modules");
  if (requantized_.size() > modules) {
    fail_input("--merge: the parts list {} requantized modules, more than counts.modules ({})", requantized_.size(),
               modules);
  }

  Json merged = Json::object();
  merged["command"] = "verify";
  merged["window"] = window_name(*window_);
  merged["provenance"] = provenance_;
  merged["counts"] = whole_["counts"];
  const auto figure = [](const std::optional<std::uint64_t>& v) { return v ? Json(*v) : Json(nullptr); };
  for (const auto& [key, value] : counts_) merged["counts"][key] = figure(value);
  for (const char* key : {"source_tensor_bytes", "target_tensor_bytes", "size_change_percent", "over_span",
                          "unrepresentable_globals", "global_conflicts"}) {
    merged[key] = whole_[key];
  }
  merged["values_compared"] = figure(values_compared_);
  merged["mismatches"] = figure(mismatches_);
  merged["max_abs_error"] = !max_abs_error_computed_ ? Json(nullptr)
                            : max_abs_error_infinite_ ? Json("inf")
                                                      : Json(max_abs_error_);
  if (!requantized_.empty()) {
    merged["requantized"] = Json::array();
    for (const auto& [module, row] : requantized_) merged["requantized"].push_back(row.first);
  }
  if (!whole_["overspan"].is_null()) {
    merged["overspan"] = whole_["overspan"];
    merged["overspan"]["lossy"] = !requantized_.empty();
    merged["overspan"]["requantized_marlin_zeroed_blocks"] = marlin_zeroed_blocks_;
  }
  merged["differences"] = Json::array();
  const bool differ = fingerprints_differ_ && !fingerprint_missing_;
  if (differ) merged["differences"].push_back("the parts' fingerprints differ: SRC or DST changed between the parts");
  if (fingerprint_ && !fingerprint_missing_ && !fingerprints_differ_) merged["fingerprint"] = *fingerprint_;
  for (const auto& [key, text] : differences_) merged["differences"].push_back(text);
  if (omitted_differences_ > 0) {
    merged["differences"].push_back(fmt::format("... and up to {} more in the parts' reports", omitted_differences_));
  }
  if (error_) {
    merged["result"] = "error";
    for (const auto& [key, value] : error_->second.items()) merged[key] = value;
  } else {
    merged["result"] = any_mismatch_ || differ ? "mismatch" : "ok";
    merged["exit_code"] = any_mismatch_ || differ ? kExitRefusedOrMismatch : kExitOk;
  }
  merged["seconds"] = seconds_;
  merged["merged_parts"] = seen_.size();
  // Read back by the report's own reader: the merged report is a Report,
  // written as any other (and a contradiction the parts' checks let
  // through is refused here, as invalid input).
  return report_from_json(merged, "--merge: the merged report");
}

std::vector<std::string> VerifyReportMerger::named_trees() const { return {trees_.begin(), trees_.end()}; }

Report merge_verify_reports(const std::vector<std::pair<std::string, std::string>>& parts) {
  VerifyReportMerger merger(parts.size());
  for (const auto& [name, text] : parts) merger.add(name, text);
  return merger.finish();
}

}  // namespace mx2nv

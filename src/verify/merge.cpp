#include "verify/merge.hpp"

#include "common/checked.hpp"
#include "common/error.hpp"
#include "common/printable.hpp"
#include "json/json_fields.hpp"
#include "json/strict_json.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <set>
#include <tuple>

namespace mx2nv {

struct PartData {
  Report report;
  std::uint64_t index = 0, count = 1;  // shard_subset I/N; a whole report is 0/1
  Json whole;                          // whole_fields(report)
};

namespace {

// At most this much of a key or value from a part is quoted in a message.
constexpr std::size_t kQuotedBytes = 80;


// One part, for messages: every error names the part (its file) and the key.
class Part {
 public:
  explicit Part(std::string_view name) : name_(name) {}

  // The value at `path` is wrong: exit 3.
  template <typename... Args>
  [[noreturn]] void bad(std::string_view path, fmt::format_string<Args...> format, Args&&... args) const {
    fail_input("--merge: {}: \"{}\" {}", name_, path, fmt::format(format, std::forward<Args>(args)...));
  }
  // Two of the part's own fields disagree: exit 3.
  template <typename... Args>
  [[noreturn]] void contradicts(fmt::format_string<Args...> format, Args&&... args) const {
    fail_input("--merge: {}: the report contradicts itself: {}", name_, fmt::format(format, std::forward<Args>(args)...));
  }

 private:
  std::string_view name_;
};

// "I/N" in canonical decimal (no sign, no leading zeros), 0 <= I < N <= kMaxMergeParts.
std::pair<std::uint64_t, std::uint64_t> parse_subset(const Part& p, const std::string& t) {
  const auto number = [&](std::string_view s, std::uint64_t& out) {
    if (s.empty() || (s.size() > 1 && s.front() == '0')) return false;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return ec == std::errc() && end == s.data() + s.size();
  };
  const auto slash = t.find('/');
  std::uint64_t i = 0, n = 0;
  if (slash == std::string::npos) {
    p.bad("shard_subset", "is \"{}\", not I/N (a part of verify --shards I/N)", excerpt(t, kQuotedBytes));
  }
  if (!number(std::string_view(t).substr(0, slash), i) || !number(std::string_view(t).substr(slash + 1), n) || n == 0 ||
      i >= n) {
    p.bad("shard_subset", "is \"{}\", not I/N with 0 <= I < N", excerpt(t, kQuotedBytes));
  }
  if (n > kMaxMergeParts) {
    p.bad("shard_subset", "is \"{}\": N is above {} (no checkpoint has more shards, so no merge has more parts)",
          excerpt(t, kQuotedBytes), kMaxMergeParts);
  }
  return {i, n};
}

// The counts each part makes over its own shards, added up; the others are
// the whole checkpoint's, the same in every part.
struct PerPartCount {
  std::string_view key;  // in "counts"
  Measured<std::uint64_t> Report::*field;
};
constexpr PerPartCount kPerPartCounts[] = {
    {"active_groups", &Report::active_groups},
    {"canonicalised_zero_groups", &Report::canonicalised_zero_groups},
    {"marlin_zeroed_groups", &Report::marlin_zeroed_groups},
    {"passthrough_tensors", &Report::passthrough_tensors},
    {"raised_globals", &Report::raised_globals},
    {"zero_groups", &Report::zero_groups}};
static_assert(std::size(kPerPartCounts) == kMergedCounts);

void check_absolute(const Part& p, std::string_view path, const std::string& s) {
  if (s.empty() || s.front() != '/') p.bad(path, "must be an absolute path");
}

bool is_digest(const std::string& d) {
  return d.size() == 9 + 32 && d.starts_with("xxh3-128:") &&
         std::all_of(d.begin() + 9, d.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

void at_most(const Part& p, std::string_view path, std::size_t n, std::uint64_t max, std::string_view limit) {
  if (n > max) p.bad(path, "has {} entries, more than {} ({})", n, max, limit);
}

// A verify report of a run, as verify --shards I/N (or verify) writes it:
// what report_from_json cannot know from the schema alone.
void check_verify_report(const Part& p, const Report& r) {
  if (r.command != Command::Verify) p.bad("command", "is \"{}\": only verify reports merge", command_name(r.command));
  if (r.copy_mode) p.bad("copy", "is not a key of a verify report");
  if (r.provenance.tool_version.empty()) p.bad("provenance.tool_version", "is empty");
  check_absolute(p, "provenance.source", r.provenance.source);
  check_absolute(p, "provenance.target", r.provenance.target);
  // A part records where SRC and DST resolved when it was verified (the
  // merge keeps its report out of those too); report_from_json has checked
  // that it does exactly when it is a part.
  if (!r.shard_subset.empty()) {
    check_absolute(p, "resolved.source", r.resolved_source);
    check_absolute(p, "resolved.target", r.resolved_target);
  }
  if (r.fingerprint) {
    if (!is_digest(r.fingerprint->source)) p.bad("fingerprint.source", "is not xxh3-128:<32 lower-case hex digits>");
    if (!is_digest(r.fingerprint->target)) p.bad("fingerprint.target", "is not xxh3-128:<32 lower-case hex digits>");
  }
  // verify resumes nothing.
  if (r.resumed_shards) p.bad("counts.resumed_shards", "must be null in a verify report");
  if (r.merged_parts) {
    if (*r.merged_parts == 0) p.bad("merged_parts", "must be at least 1");
    if (!r.shard_subset.empty()) p.contradicts("a merged report (merged_parts) is not a part (shard_subset)");
  }
}

// The counts and lists, against the whole checkpoint's module and scale
// group counts, and the figures verify computes together.
void check_figures(const Part& p, const Report& r) {
  // A part that ran (ok or mismatch) opened SRC: its structure counts are numbers.
  if (r.result == Outcome::Ok || r.result == Outcome::Mismatch) {
    for (const auto& [key, field] : {std::pair{"shards", &r.shards}, std::pair{"modules", &r.modules},
                                     std::pair{"scale_groups", &r.scale_groups},
                                     std::pair{"companion_files", &r.companion_files}}) {
      if (!*field) p.bad(fmt::format("counts.{}", key), "is null, but the part ran (result \"{}\")", outcome_name(r.result));
    }
  }
  const std::uint64_t modules = r.modules.value_or(0), scale_groups = r.scale_groups.value_or(0);
  at_most(p, "over_span", r.refused_spans.size(), modules, "counts.modules");
  at_most(p, "overspan.resolved_over_span", r.resolved_spans.size(), modules, "counts.modules");
  at_most(p, "overspan.bf16_layers", r.bf16_layers.size(), modules, "counts.modules");
  at_most(p, "requantized", r.requantized.size(), modules, "counts.modules");
  at_most(p, "unrepresentable_globals", r.unrepresentable_globals.size(), scale_groups, "counts.scale_groups");
  at_most(p, "global_conflicts", r.global_conflicts.size(), scale_groups, "counts.scale_groups");
  // verify lists kMaxReportedDifferences, then one "... and K more".
  at_most(p, "differences", r.differences.size(), kMaxReportedDifferences + 1, "verify lists at most that many");
  std::uint64_t layer_modules = 0;  // each list is capped by report_from_json: no overflow
  for (const Bf16Layer& l : r.bf16_layers) layer_modules += l.modules.size();
  if (layer_modules > modules) p.contradicts("overspan.bf16_layers list {} modules, counts.modules is {}", layer_modules, modules);
  // Computed together: all numbers or all null.
  const bool any = r.values_compared || r.mismatches || r.max_abs_error;
  for (const auto& [key, computed] : {std::pair{"values_compared", r.values_compared.has_value()},
                                      std::pair{"mismatches", r.mismatches.has_value()},
                                      std::pair{"max_abs_error", r.max_abs_error.has_value()}}) {
    if (any && !computed) p.bad(key, "is null, but values were compared (values_compared, mismatches, max_abs_error)");
  }
  if (r.mismatches.value_or(0) > r.values_compared.value_or(0)) {
    p.contradicts("{} mismatches among {} values compared", r.mismatches.value_or(0), r.values_compared.value_or(0));
  }
}

// Requantized modules (convert --overspan requantize): each part lists those
// of its own shards, once each, and the over-span section sums them.
void check_requantized(const Part& p, const Report& r) {
  std::set<std::string_view> names;
  std::uint64_t blocks = 0;
  for (std::size_t i = 0; i < r.requantized.size(); ++i) {
    const ModuleError& m = r.requantized[i];
    if (!names.insert(m.module).second) {
      p.bad(fmt::format("requantized[{}].module", i), "\"{}\" is listed twice", excerpt(m.module, kQuotedBytes));
    }
    const auto sum = checked_add(blocks, m.marlin_zeroed_blocks);
    if (!sum) p.bad(fmt::format("requantized[{}].marlin_zeroed_blocks", i), "adds up past 2^64 - 1");
    blocks = *sum;
  }
  if (r.over_span_choice == OverSpanChoice::Fail) {
    if (!r.requantized.empty()) p.contradicts("requantized lists {} modules, but there is no overspan section", r.requantized.size());
    return;
  }
  if (!(r.requantized_marlin_zeroed_blocks == blocks)) {
    p.bad("overspan.requantized_marlin_zeroed_blocks", "is {}, but the requantized rows add up to {}",
          r.requantized_marlin_zeroed_blocks, blocks);
  }
  if (!r.requantized.empty() && r.over_span_choice != OverSpanChoice::Requantize) {
    p.contradicts("requantized lists {} modules, but overspan.choice is \"{}\"", r.requantized.size(),
                  choice_name(r.over_span_choice));
  }
}

// result, mismatches, differences and max_abs_error must tell one story
// (report_from_json has checked result, exit_code, error and error_kind).
void check_outcome(const Part& p, const Report& r) {
  if (r.result == Outcome::Refused) p.bad("result", "is \"refused\", not ok, mismatch or error");
  if (r.result == Outcome::Error) return;
  const bool ok = r.result == Outcome::Ok;
  const std::size_t differences = r.differences.size();
  const std::uint64_t mismatches = r.mismatches.value_or(0);
  if (ok && !r.mismatches) p.contradicts("result \"ok\" without the values compared");
  if (ok && (mismatches > 0 || differences > 0)) {
    p.contradicts("result \"ok\" with {} mismatches and {} differences", mismatches, differences);
  }
  if (!ok && mismatches == 0 && differences == 0) p.contradicts("result \"mismatch\" without a mismatch or difference");
  // max_abs_error is measured over the mismatching values only: 0 exactly when there are none.
  if (r.max_abs_error && (*r.max_abs_error > 0) != (mismatches > 0)) {
    p.contradicts("{} mismatches, but max_abs_error is {}", mismatches, r.max_abs_error);
  }
}

// The fields every part computes on the whole checkpoint, as the report
// writes them (so that two parts' are compared by the report's own names).
// size_change_percent follows from the two sizes (report_from_json checked).
Json whole_fields(const Report& r) {
  Json doc = report_to_json(r);
  Json counts = std::move(doc["counts"]);
  for (const PerPartCount& c : kPerPartCounts) counts.erase(std::string(c.key));
  Json overspan;
  if (doc.contains("overspan")) {
    overspan = {{"choice", doc["overspan"]["choice"]},
                {"resolved_over_span", std::move(doc["overspan"]["resolved_over_span"])},
                {"bf16_layers", std::move(doc["overspan"]["bf16_layers"])}};
  }
  return {{"counts", std::move(counts)},
          {"source_tensor_bytes", doc["source_tensor_bytes"]},
          {"target_tensor_bytes", doc["target_tensor_bytes"]},
          {"over_span", std::move(doc["over_span"])},
          {"unrepresentable_globals", std::move(doc["unrepresentable_globals"])},
          {"global_conflicts", std::move(doc["global_conflicts"])},
          {"overspan", std::move(overspan)}};
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
  return fmt::format(": {} and {}", excerpt(a.dump(-1, ' ', false, Json::error_handler_t::replace), kQuotedBytes),
                     excerpt(b.dump(-1, ' ', false, Json::error_handler_t::replace), kQuotedBytes));
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

// One part read (report_from_json: every key of its type, no unknown key,
// derived keys agreeing) and checked against itself.
PartData read_part(std::string_view name, std::string_view text) {
  const Json j = parse_part(name, text);
  const Part p(name);
  if (!j.is_object()) fail_input("--merge: {}: the report must be a JSON object, not {}", name, json_type_words(j));
  PartData d;
  try {
    d.report = report_from_json(j, name);
  } catch (const Error& e) {
    rethrow_with_context(e, "--merge");
  }
  const Report& r = d.report;
  check_verify_report(p, r);
  if (!r.shard_subset.empty()) std::tie(d.index, d.count) = parse_subset(p, r.shard_subset);
  check_figures(p, r);
  check_requantized(p, r);
  check_outcome(p, r);
  d.whole = whole_fields(r);
  return d;
}

}  // namespace

VerifyReportMerger::VerifyReportMerger(std::size_t parts) : expected_parts_(parts) {
  if (parts == 0) fail(ErrorKind::Usage, "--merge: no reports");
  if (parts > kMaxMergeParts) {
    fail(ErrorKind::Usage, "--merge: {} reports, more than {} (no checkpoint has more shards)", parts, kMaxMergeParts);
  }
  counts_.fill(0);
}

void VerifyReportMerger::add(std::string_view name, std::string_view text) {
  PartData d = read_part(name, text);
  check_identity(name, d);
  keep_whole(name, d);
  add_results(name, d);
  const std::optional<Fingerprint>& fingerprint = d.report.fingerprint;
  if (!fingerprint) {
    fingerprint_missing_ = true;
  } else if (!any_part_added_) {
    fingerprint_ = fingerprint;
  } else if (fingerprint_ != fingerprint) {
    fingerprints_differ_ = true;
  }
  any_part_added_ = true;
}

// Every part is of the same SRC, DST, window, mx2nv and split, and each
// part index comes once.
void VerifyReportMerger::check_identity(std::string_view name, const PartData& d) {
  const Report& r = d.report;
  const Provenance& prov = r.provenance;
  for (const std::string* path : {&prov.source, &prov.target, &r.resolved_source, &r.resolved_target}) {
    if (path->empty()) continue;  // resolved: a part's only
    trees_.insert(*path);
    trees_.insert(unescaped(*path));
  }
  ++named_parts_;
  if (prov.tool_version != MX2NV_VERSION) {
    fail(ErrorKind::Usage, "--merge: {} was written by mx2nv {}, this is mx2nv {}: merge with the mx2nv that verified",
         name, excerpt(prov.tool_version, kQuotedBytes), MX2NV_VERSION);
  }
  if (!window_) {
    first_name_ = name;
    window_ = r.window;
    provenance_ = prov;
    count_ = d.count;
  } else {
    const auto differs = [&](std::string_view what) {
      fail(ErrorKind::Usage, "--merge: {} and {} are not parts of one verify: {} differs", first_name_, name, what);
    };
    if (r.window != *window_) differs("the window");
    // In the report's order of provenance's keys (tool and tool_version are checked above).
    const auto text = [](const std::optional<std::string>& s) { return s ? Json(*s) : Json(nullptr); };
    for (const auto& [key, a, b] : {std::tuple{"revision", text(provenance_.revision), text(prov.revision)},
                                    std::tuple{"source", Json(provenance_.source), Json(prov.source)},
                                    std::tuple{"target", Json(provenance_.target), Json(prov.target)}}) {
      if (a != b) differs(fmt::format("provenance.{}{}", key, shown_values(a, b)));
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
  const bool in_error = d.report.result == Outcome::Error;
  if (!in_error && !whole_from_error_part_) {
    if (const auto diff = first_difference(whole_, d.whole)) {
      // Both ran every whole-checkpoint check on the same SRC and DST paths:
      // SRC or DST changed between them.
      fail(ErrorKind::Usage, "--merge: {} and {} are not parts of one verify of one SRC and DST: {} differs{}",
           whole_name_, name, diff->path, shown_values(*diff->a, *diff->b));
    }
  } else if (whole_.is_null() || (!in_error && whole_from_error_part_)) {
    whole_ = std::move(d.whole);
    whole_report_ = d.report;
    whole_report_.requantized.clear();  // the part's own (kept in requantized_)
    whole_report_.differences.clear();
    whole_name_ = name;
    whole_from_error_part_ = in_error;
  }
}

// What each part counts, lists or finds on its own shards.
void VerifyReportMerger::add_results(std::string_view name, PartData& d) {
  Report& r = d.report;
  const bool in_error = r.result == Outcome::Error;
  const auto add = [&](std::uint64_t& total, std::uint64_t v, std::string_view key) {
    const auto sum = checked_add(total, v);
    if (!sum) fail_input("--merge: {}: \"{}\": the parts' {} add up past 2^64 - 1", name, key, key);
    total = *sum;
  };
  // A figure a part did not compute makes the sum not computed.
  const auto add_figure = [&](std::optional<std::uint64_t>& total, const Measured<std::uint64_t>& v, std::string_view key) {
    if (!total || !v) {
      total.reset();
      return;
    }
    add(*total, *v, key);
  };
  for (std::size_t i = 0; i < std::size(kPerPartCounts); ++i) {
    add_figure(counts_[i], r.*kPerPartCounts[i].field, fmt::format("counts.{}", kPerPartCounts[i].key));
  }
  add_figure(values_compared_, r.values_compared, "values_compared");
  add_figure(mismatches_, r.mismatches, "mismatches");
  if (!r.max_abs_error) {
    max_abs_error_computed_ = false;
  } else {
    max_abs_error_ = std::max(max_abs_error_, *r.max_abs_error);  // "inf" reads as infinity
  }
  any_mismatch_ = any_mismatch_ || r.result == Outcome::Mismatch;
  size_change_withheld_ = size_change_withheld_ || (!in_error && r.size_change_withheld);
  if (in_error && (!error_ || d.index < error_->index)) error_ = PartError{d.index, r.error, r.error_kind};
  seconds_ = std::max(seconds_, r.seconds);  // they ran side by side: the slowest part

  for (std::size_t i = 0; i < r.differences.size(); ++i) add_difference(d.index, i, r.differences[i]);
  for (ModuleError& row : r.requantized) {
    const auto found = requantized_.find(row.module);
    if (found != requantized_.end()) {
      fail_input("--merge: {}: requantized module \"{}\" is also listed by {} (a module belongs to the one part "
                 "that holds its shard)",
                 name, excerpt(row.module, kQuotedBytes), found->second.second);
    }
    add(marlin_zeroed_blocks_, row.marlin_zeroed_blocks, "requantized.marlin_zeroed_blocks");
    std::string module = row.module;
    requantized_.emplace(std::move(module), std::make_pair(std::move(row), std::string(name)));
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
  const std::uint64_t modules = whole_report_.modules.value_or(0);
  if (requantized_.size() > modules) {
    fail_input("--merge: the parts list {} requantized modules, more than counts.modules ({})", requantized_.size(),
               modules);
  }

  // The whole checkpoint's fields from whole_report_, the rest from every part.
  Report merged = whole_report_;
  merged.window = *window_;
  merged.provenance = provenance_;
  merged.shard_subset.clear();
  merged.resolved_source.clear();
  merged.resolved_target.clear();
  for (std::size_t i = 0; i < std::size(kPerPartCounts); ++i) {
    Measured<std::uint64_t>& count = merged.*kPerPartCounts[i].field;
    count.reset();
    if (counts_[i]) count = *counts_[i];
  }
  merged.values_compared.reset();
  if (values_compared_) merged.values_compared = *values_compared_;
  merged.mismatches.reset();
  if (mismatches_) merged.mismatches = *mismatches_;
  merged.max_abs_error.reset();
  if (max_abs_error_computed_) merged.max_abs_error = max_abs_error_;
  merged.requantized.clear();
  for (const auto& [module, row] : requantized_) merged.requantized.push_back(row.first);
  merged.requantized_marlin_zeroed_blocks = marlin_zeroed_blocks_;
  const bool differ = fingerprints_differ_ && !fingerprint_missing_;
  merged.differences.clear();
  if (differ) merged.differences.emplace_back("the parts' fingerprints differ: SRC or DST changed between the parts");
  merged.fingerprint.reset();
  if (fingerprint_ && !fingerprint_missing_ && !fingerprints_differ_) merged.fingerprint = fingerprint_;
  for (const auto& [key, text] : differences_) merged.differences.push_back(text);
  if (omitted_differences_ > 0) {
    merged.differences.push_back(fmt::format("... and up to {} more in the parts' reports", omitted_differences_));
  }
  merged.error.clear();
  if (error_) {
    merged.result = Outcome::Error;
    merged.error = error_->error;
    merged.error_kind = error_->kind;
  } else {
    merged.result = any_mismatch_ || differ ? Outcome::Mismatch : Outcome::Ok;
  }
  merged.size_change_withheld = merged.size_change_withheld || size_change_withheld_;
  merged.seconds = seconds_;
  merged.merged_parts = seen_.size();
  // Written and read back by the report's own property list: a contradiction
  // the parts' checks let through is refused here, as invalid input.
  return report_from_json(report_to_json(merged), "--merge: the merged report");
}

std::vector<std::string> VerifyReportMerger::named_trees() const { return {trees_.begin(), trees_.end()}; }

Report merge_verify_reports(const std::vector<std::pair<std::string, std::string>>& parts) {
  VerifyReportMerger merger(parts.size());
  for (const auto& [name, text] : parts) merger.add(name, text);
  return merger.finish();
}

}  // namespace mx2nv

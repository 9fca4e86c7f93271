// The report as JSON, both ways, from one property list (report_fields
// below): ReportWriter walks it writing each member through JsonOut,
// ReportReader walks it reading each member back through JsonFields. A name,
// a type or a condition is therefore spelled once for writing and reading.
//
// The list names members in sorted order at every level: the report has
// always been nlohmann's dump of a document, whose keys are sorted, and the
// writer refuses (logic_error) a list that is not.
//
// Three kinds of member besides plain fields:
// - optional (present only when a condition on the report holds): the
//   reader reads it when present and checks, once the whole report is read,
//   that it is present exactly when the condition holds;
// - derived (a function of other fields: exit_code, size_change_percent,
//   counts.global_conflicts, ...): written from the report, and on reading
//   checked against the report read;
// - derived figures (size_change_percent): derived, or null where a report
//   withholds the figure (Report::size_change_withheld);
// - rows (a member per module): streamed, never built as one document.
#include "common/printable.hpp"
#include "json/json_fields.hpp"
#include "json/json_writer.hpp"
#include "plan/plan_file.hpp"
#include "report/report.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>

namespace mx2nv {
namespace {

// Caps on what a report read back may list (refused before allocating):
// per-module arrays as many as a plan may have modules; differences as
// verify and verify --merge write them (the cap, a "... and K more" line and
// the merge's fingerprint line).
constexpr std::size_t kMaxRows = kMaxPlanModules;
constexpr std::size_t kMaxDifferences = kMaxReportedDifferences + 2;

template <typename E>
std::optional<E> parse_by_name(std::string_view name, std::initializer_list<E> values,
                               std::string_view (*to_name)(E)) {
  for (const E v : values) {
    if (to_name(v) == name) return v;
  }
  return std::nullopt;
}
std::string_view command_text(Command c) { return command_name(c); }
std::optional<Command> parse_command(std::string_view n) {
  return parse_by_name(n, {Command::Convert, Command::Verify, Command::Plan, Command::Requantize, Command::Inspect},
                       command_text);
}
std::string_view outcome_text(Outcome o) { return outcome_name(o); }
std::optional<Outcome> parse_outcome(std::string_view n) {
  return parse_by_name(n, {Outcome::Ok, Outcome::Refused, Outcome::Mismatch, Outcome::Error}, outcome_text);
}
std::string_view kind_text(ErrorKind k) { return kind_name(k); }
std::optional<ErrorKind> parse_kind(std::string_view n) {
  return parse_by_name(n, {ErrorKind::Usage, ErrorKind::InvalidInput, ErrorKind::Io}, kind_text);
}

// A measured error as reports write it: a number, or "inf" for one that is
// not finite (NaN included).
Json error_figure(double v) { return std::isfinite(v) ? Json(v) : Json("inf"); }

// ---- the property list ------------------------------------------------------

template <typename Io, typename Row>
void over_span_fields(Io& io, Row& o) {
  io.field("groups_outside", o.groups_outside);
  io.count("limit", o.limit);
  io.field("module", o.module);
  io.count("span", o.span);
}

template <typename Io, typename Row>
void requantized_fields(Io& io, Row& m) {
  io.signed_figure("cosine", m.cosine);
  io.field("global_scale", m.global_scale);
  io.field("marlin_zeroed_blocks", m.marlin_zeroed_blocks);
  io.error_figure("max_abs_error", m.max_abs_error);
  io.field("module", m.module);
  io.error_figure("relative_rmse", m.relative_rmse);
  io.field("values", m.values);
}

template <typename Io, typename Row>
void global_conflict_fields(Io& io, Row& c) {
  io.pair("allowed", c.allowed_min, c.allowed_max);
  io.field("k_max", c.k_max);
  io.field("k_min", c.k_min);
  io.pair("needed", c.needed_min, c.needed_max);
  io.field("scale_group", c.scale_group);
}

template <typename Io, typename Row>
void bf16_layer_fields(Io& io, Row& l) {
  io.signed_size("bf16_bytes", l.bf16_bytes);
  io.field("layer", l.layer);
  io.strings("modules", l.modules, kMaxRows);
  io.signed_size("nvfp4_bytes", l.nvfp4_bytes);
  // Both sizes are at most 2^63 - 1 (signed_size): the difference is an int64.
  io.derived("size_cost_bytes",
             [&] { return Json(static_cast<std::int64_t>(l.bf16_bytes) - static_cast<std::int64_t>(l.nvfp4_bytes)); });
  io.strings("why", l.refused, kMaxRows);
}

template <typename Io, typename R>
void counts_fields(Io& io, R& r) {
  io.field("active_groups", r.active_groups);
  io.field("canonicalised_zero_groups", r.canonicalised_zero_groups);
  io.field("companion_files", r.companion_files);
  io.derived("global_conflicts", [&] { return Json(r.global_conflicts.size()); });
  io.field("marlin_zeroed_groups", r.marlin_zeroed_groups);
  io.field("modules", r.modules);
  io.field("passthrough_tensors", r.passthrough_tensors);
  io.field("raised_globals", r.raised_globals);
  io.field("resumed_shards", r.resumed_shards);
  io.field("scale_groups", r.scale_groups);
  io.field("shards", r.shards);
  io.field("zero_groups", r.zero_groups);
}

template <typename Io, typename R>
void provenance_fields(Io& io, R& r) {
  auto& p = r.provenance;
  io.field("revision", p.revision);
  io.field("source", p.source);
  io.optional_field("target", [&] { return !r.provenance.target.empty(); }, p.target);
  io.derived("tool", [] { return Json("mx2nv"); });
  io.field("tool_version", p.tool_version);
}

template <typename Io, typename R>
void report_fields(Io& io, R& r) {
  // The commands that answer a retry on their finished DST.
  const auto answers_retries = [&] { return r.command == Command::Convert || r.command == Command::Requantize; };
  io.optional_field("already_complete", answers_retries, r.already_complete);
  io.named("command", r.command, command_text, parse_command);
  io.optional_object("copy", [&] { return r.copy_mode.has_value(); }, [&] {
    io.field("copied_bytes", r.copied_bytes);
    io.named("mode", io.emplace(r.copy_mode), choice_name<CopyMode>, parse_choice<CopyMode>);
    io.field("shared_bytes", r.shared_bytes);
    io.field("written_bytes", r.written_bytes);
  });
  io.object("counts", [&] { counts_fields(io, r); });
  io.strings("differences", r.differences, kMaxDifferences);
  const auto in_error = [&] { return r.result == Outcome::Error; };
  io.optional_field("error", in_error, r.error);
  io.optional_named("error_kind", in_error, r.error_kind, kind_text, parse_kind);
  io.derived("exit_code", [&] { return Json(r.exit_code()); });
  io.optional_object("fingerprint", [&] { return r.fingerprint.has_value(); }, [&] {
    auto& f = io.emplace(r.fingerprint);
    io.derived("scheme", [] { return Json("mx2nv-fingerprint/1"); });
    io.field("source", f.source);
    io.field("source_files", f.source_files);
    io.field("target", f.target);
    io.field("target_files", f.target_files);
  });
  io.rows("global_conflicts", r.global_conflicts, kMaxRows,
          [](auto& in, auto& row) { global_conflict_fields(in, row); });
  io.measured_error("max_abs_error", r.max_abs_error);
  io.optional_field("merged_parts", [&] { return r.merged_parts.has_value(); }, r.merged_parts);
  io.field("mismatches", r.mismatches);
  io.rows("over_span", r.refused_spans, kMaxRows, [](auto& in, auto& row) { over_span_fields(in, row); });
  io.optional_object("overspan", [&] { return r.over_span_choice != OverSpanChoice::Fail; }, [&] {
    io.rows("bf16_layers", r.bf16_layers, kMaxRows, [](auto& in, auto& row) { bf16_layer_fields(in, row); });
    io.named("choice", r.over_span_choice, choice_name<OverSpanChoice>, parse_choice<OverSpanChoice>);
    io.derived("lossy", [&] { return Json(!r.requantized.empty()); });
    io.field("requantized_marlin_zeroed_blocks", r.requantized_marlin_zeroed_blocks);
    io.rows("resolved_over_span", r.resolved_spans, kMaxRows,
            [](auto& in, auto& row) { over_span_fields(in, row); });
  });
  io.object("provenance", [&] { provenance_fields(io, r); });
  io.optional_rows("requantized", [&] { return r.command == Command::Requantize || !r.requantized.empty(); },
                   r.requantized, kMaxRows, [](auto& in, auto& row) { requantized_fields(in, row); });
  const auto subset = [&] { return !r.shard_subset.empty(); };
  io.optional_object("resolved", subset, [&] {
    io.field("source", r.resolved_source);
    io.field("target", r.resolved_target);
  });
  io.named("result", r.result, outcome_text, parse_outcome);
  io.seconds("seconds", r.seconds);
  io.optional_field("shard_subset", subset, r.shard_subset);
  io.derived_figure("size_change_percent", r.size_change_withheld, [&] {
    const auto change = r.written_size_change_percent();
    return change ? Json(*change) : Json(nullptr);
  });
  io.field("source_tensor_bytes", r.source_tensor_bytes);
  io.field("target_tensor_bytes", r.target_tensor_bytes);
  io.strings("unrepresentable_globals", r.unrepresentable_globals, kMaxRows);
  io.field("values_compared", r.values_compared);
  io.named("window", r.window, choice_name<Window>, parse_choice<Window>);
}

// ---- writing -----------------------------------------------------------------

class ReportWriter {
 public:
  explicit ReportWriter(JsonOut& out) : out_(out) {}

  void begin() {
    out_.begin_object();
    last_keys_.emplace_back();
  }
  void end() {
    out_.end_object();
    last_keys_.pop_back();
  }

  void field(std::string_view name, const std::string& v) { key(name), out_.string(json_text(v)); }
  void field(std::string_view name, const std::optional<std::string>& v) {
    key(name);
    v ? out_.string(json_text(*v)) : out_.null();
  }
  void field(std::string_view name, const std::optional<std::uint64_t>& v) { key(name), v ? out_.uint(*v) : out_.null(); }
  void field(std::string_view name, const Measured<std::uint64_t>& v) { key(name), v ? out_.uint(*v) : out_.null(); }
  void field(std::string_view name, std::uint64_t v) { key(name), out_.uint(v); }
  void field(std::string_view name, int v) { key(name), out_.int64(v); }
  void field(std::string_view name, float v) { key(name), out_.number(v); }
  void field(std::string_view name, bool v) { key(name), out_.boolean(v); }
  template <typename Cond, typename T>
  void optional_field(std::string_view name, Cond&& present, const T& v) {
    if (present()) field(name, v);
  }
  void signed_size(std::string_view name, std::uint64_t v) { field(name, v); }
  void count(std::string_view name, int v) { field(name, v); }
  void error_figure(std::string_view name, double v) { key(name), out_.value(mx2nv::error_figure(v)); }
  void signed_figure(std::string_view name, double v) { error_figure(name, v); }
  void measured_error(std::string_view name, const Measured<double>& v) {
    key(name);
    v ? out_.value(mx2nv::error_figure(*v)) : out_.null();
  }
  void seconds(std::string_view name, double v) { key(name), out_.number(std::round(v * 1000) / 1000); }
  void pair(std::string_view name, int a, int b) {
    key(name);
    out_.begin_array();
    out_.int64(a);
    out_.int64(b);
    out_.end_array();
  }
  void strings(std::string_view name, const std::vector<std::string>& v, std::size_t) {
    key(name);
    out_.begin_array();
    for (const auto& s : v) out_.string(json_text(s));
    out_.end_array();
  }
  template <typename Row, typename Body>
  void rows(std::string_view name, const std::vector<Row>& v, std::size_t, Body&& body) {
    key(name);
    out_.begin_array();
    for (const Row& row : v) {
      begin();
      body(*this, row);
      end();
    }
    out_.end_array();
  }
  template <typename Cond, typename Row, typename Body>
  void optional_rows(std::string_view name, Cond&& present, const std::vector<Row>& v, std::size_t cap, Body&& body) {
    if (present()) rows(name, v, cap, body);
  }
  template <typename E, typename ToName, typename Parse>
  void named(std::string_view name, E v, ToName&& to_name, Parse&&) {
    key(name), out_.string(to_name(v));
  }
  template <typename Cond, typename E, typename ToName, typename Parse>
  void optional_named(std::string_view name, Cond&& present, E v, ToName&& to_name, Parse&& parse) {
    if (present()) named(name, v, to_name, parse);
  }
  template <typename Body>
  void object(std::string_view name, Body&& body) {
    key(name);
    begin();
    body();
    end();
  }
  template <typename Cond, typename Body>
  void optional_object(std::string_view name, Cond&& present, Body&& body) {
    if (present()) object(name, body);
  }
  template <typename F>
  void derived(std::string_view name, F&& value) {
    key(name), out_.value(value());
  }
  template <typename F>
  void derived_figure(std::string_view name, bool, F&& value) {
    key(name), out_.value(value());  // null when withheld (Report::size_change_percent)
  }
  template <typename T>
  const T& emplace(const std::optional<T>& v) {
    return *v;
  }

 private:
  // Members in sorted order, as nlohmann's documents had them (and as
  // readers of earlier reports may expect).
  void key(std::string_view name) {
    std::string& last = last_keys_.back();
    if (!last.empty() && !(last < name)) {
      throw std::logic_error(fmt::format("report member \"{}\" listed after \"{}\"", name, last));
    }
    last.assign(name);
    out_.key(name);
  }
  JsonOut& out_;
  std::vector<std::string> last_keys_;
};

// ---- reading -----------------------------------------------------------------

class ReportReader {
 public:
  ReportReader(const Json& root, std::string_view what) { frames_.push_back({JsonFields(root, what), {}, true, {}}); }

  // Checks the root's keys and every deferred condition.
  void finish() { close(); }

  template <typename T>
  void field(std::string_view name, T& v) {
    read(take(name), v);
  }
  template <typename Cond, typename T>
  void optional_field(std::string_view name, Cond&& present, T& v) {
    const auto value = optional(name);
    if (value) read(*value, v);
    check_presence(name, value.has_value(), present);
  }
  void signed_size(std::string_view name, std::uint64_t& v) {
    v = static_cast<std::uint64_t>(take(name).as_int_in(0, std::numeric_limits<std::int64_t>::max()));
  }
  void count(std::string_view name, int& v) {
    v = static_cast<int>(take(name).as_int_in(0, std::numeric_limits<int>::max()));
  }
  void error_figure(std::string_view name, double& v) { v = read_error_figure(take(name), true); }
  void signed_figure(std::string_view name, double& v) { v = read_error_figure(take(name), false); }
  void measured_error(std::string_view name, Measured<double>& v) {
    const JsonValue value = take(name);
    if (value.is_null()) {
      v.reset();
    } else {
      v = read_error_figure(value, true);
    }
  }
  void seconds(std::string_view name, double& v) {
    const JsonValue value = take(name);
    v = value.as_number();
    if (!std::isfinite(v) || v < 0) value.bad("must be a finite number of seconds, at least 0");
  }
  void pair(std::string_view name, int& a, int& b) {
    const JsonValue value = take(name);
    if (value.array_size(2) != 2) value.bad("must be two integers, [low, high]");
    read(value.item(0), a);
    read(value.item(1), b);
  }
  void strings(std::string_view name, std::vector<std::string>& v, std::size_t cap) {
    const JsonValue value = take(name);
    const std::size_t n = value.array_size(cap);
    v.clear();
    v.reserve(n);
    for (std::size_t i = 0; i < n; ++i) v.push_back(value.item(i).as_string());
  }
  template <typename Row, typename Body>
  void rows(std::string_view name, std::vector<Row>& v, std::size_t cap, Body&& body) {
    read_rows(take(name), v, cap, body);
  }
  template <typename Cond, typename Row, typename Body>
  void optional_rows(std::string_view name, Cond&& present, std::vector<Row>& v, std::size_t cap, Body&& body) {
    const auto value = optional(name);
    if (value) read_rows(*value, v, cap, body);
    check_presence(name, value.has_value(), present);
  }
  template <typename E, typename ToName, typename Parse>
  void named(std::string_view name, E& v, ToName&&, Parse&& parse) {
    read_named(take(name), v, parse);
  }
  template <typename Cond, typename E, typename ToName, typename Parse>
  void optional_named(std::string_view name, Cond&& present, E& v, ToName&&, Parse&& parse) {
    const auto value = optional(name);
    if (value) read_named(*value, v, parse);
    check_presence(name, value.has_value(), present);
  }
  template <typename Body>
  void object(std::string_view name, Body&& body) {
    open(take(name), false);
    body();
    close();
  }
  template <typename Cond, typename Body>
  void optional_object(std::string_view name, Cond&& present, Body&& body) {
    const auto value = optional(name);
    if (value) {
      open(*value, false);
      body();
      close();
    }
    check_presence(name, value.has_value(), present);
  }
  template <typename F>
  void derived(std::string_view name, F&& value) {
    derive_check(take(name), value);
  }
  // null is the figure withheld, recorded in `withheld` (checked once the
  // fields it derives from are read); any other value must be the derived one.
  template <typename F>
  void derived_figure(std::string_view name, bool& withheld, F&& value) {
    const JsonValue read = take(name);
    if (read.is_null()) {
      defer([&withheld, value] { withheld = !value().is_null(); });
      return;
    }
    derive_check(read, value);
  }
  template <typename T>
  T& emplace(std::optional<T>& v) {
    return v.emplace();
  }

 private:
  struct Frame {
    JsonFields fields;
    std::vector<std::string_view> known;
    bool checks_here;  // the root and each row: deferred checks run when it closes
    std::vector<std::function<void()>> checks;
  };

  JsonValue take(std::string_view name) {
    frames_.back().known.push_back(name);
    return frames_.back().fields.required(name);
  }
  std::optional<JsonValue> optional(std::string_view name) {
    frames_.back().known.push_back(name);
    return frames_.back().fields.optional(name);
  }
  void open(const JsonValue& value, bool checks_here) { frames_.push_back({value.as_object(), {}, checks_here, {}}); }
  void close() {
    Frame& f = frames_.back();
    const Json& object = f.fields.self().json();
    for (auto it = object.begin(); it != object.end(); ++it) {
      if (std::find(f.known.begin(), f.known.end(), it.key()) == f.known.end()) {
        f.fields.required(it.key()).bad("is not a key of a report");
      }
    }
    const auto checks = std::move(f.checks);
    frames_.pop_back();
    for (const auto& check : checks) check();
  }
  void defer(std::function<void()> check) {
    for (auto f = frames_.rbegin(); f != frames_.rend(); ++f) {
      if (f->checks_here) return f->checks.push_back(std::move(check));
    }
  }
  template <typename Cond>
  void check_presence(std::string_view name, bool present, Cond&& condition) {
    const JsonValue where = frames_.back().fields.at_key(name);
    defer([=] {
      if (present == static_cast<bool>(condition())) return;
      if (present) where.bad("is present, where the rest of the report says it is absent");
      where.bad("is missing, where the rest of the report says it is present");
    });
  }
  template <typename F>
  void derive_check(const JsonValue& read, F&& value) {
    defer([read, value] {
      const Json expected = value();
      // Of the same kind too: 0.0 is no exit code, though it equals 0.
      const bool same_kind = expected.is_number_integer() ? read.json().is_number_integer()
                             : expected.is_number_float() ? read.json().is_number_float()
                                                          : expected.type() == read.json().type();
      if (!same_kind || expected != read.json()) {
        read.bad("is {}, which contradicts the rest of the report ({})", excerpt(dump_json(read.json(), -1), 80),
                 excerpt(dump_json(expected, -1), 80));
      }
    });
  }
  template <typename Row, typename Body>
  void read_rows(const JsonValue& value, std::vector<Row>& v, std::size_t cap, Body&& body) {
    const std::size_t n = value.array_size(cap);
    v.clear();
    v.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      Row row{};
      open(value.item(i), true);
      body(*this, row);
      close();
      v.push_back(std::move(row));
    }
  }
  template <typename E, typename Parse>
  static void read_named(const JsonValue& value, E& v, Parse&& parse) {
    const std::optional<E> parsed = parse(value.as_string());
    if (!parsed) value.bad("is \"{}\", not one mx2nv writes", excerpt(value.as_string(), 80));
    v = *parsed;
  }
  // A measured error (non_negative: a distance, not a cosine) as
  // error_figure writes it: a finite number, or "inf".
  static double read_error_figure(const JsonValue& v, bool non_negative) {
    if (v.json().is_string()) {
      if (v.as_string() != "inf") v.bad("must be a number or \"inf\"");
      return std::numeric_limits<double>::infinity();
    }
    const double d = v.as_number();
    if (!std::isfinite(d)) v.bad("must be a finite number or \"inf\"");
    if (non_negative && d < 0) v.bad("must be a non-negative number or \"inf\", not {}", d);
    return d;
  }
  static void read(const JsonValue& v, std::string& out) { out = v.as_string(); }
  static void read(const JsonValue& v, std::optional<std::string>& out) {
    if (v.is_null()) return out.reset();
    out = v.as_string();
  }
  static void read(const JsonValue& v, std::optional<std::uint64_t>& out) {
    if (v.is_null()) return out.reset();
    out = v.as_uint();
  }
  static void read(const JsonValue& v, Measured<std::uint64_t>& out) {
    if (v.is_null()) return out.reset();
    out = v.as_uint();
  }
  static void read(const JsonValue& v, std::uint64_t& out) { out = v.as_uint(); }
  static void read(const JsonValue& v, int& out) {
    out = static_cast<int>(v.as_int_in(std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
  }
  static void read(const JsonValue& v, bool& out) { out = v.as_bool(); }
  static void read(const JsonValue& v, float& out) {
    const double d = v.as_number();
    const auto f = static_cast<float>(d);
    // Exactly a float: what a report writes for one (a wider value would
    // not survive being written again).
    if (!std::isfinite(d) || std::fabs(d) > std::numeric_limits<float>::max() || static_cast<double>(f) != d) {
      v.bad("must be a single-precision number");
    }
    out = f;
  }

  std::vector<Frame> frames_;
};

}  // namespace

void write_report_json(const Report& r, const std::function<void(std::string_view)>& sink) {
  JsonOut out(sink);
  ReportWriter writer(out);
  writer.begin();
  report_fields(writer, r);
  writer.end();
  out.finish();
}

std::string report_json_text(const Report& r) {
  std::string out;
  write_report_json(r, [&](std::string_view piece) { out += piece; });
  return out;
}

Json report_to_json(const Report& r) { return Json::parse(report_json_text(r)); }

namespace {

// Rows of one kind written alone, as the report writes them, then parsed
// (inspect's per-window lists reuse the report's rows).
template <typename Row, typename Body>
Json rows_to_json(const std::vector<Row>& rows, Body&& body) {
  std::string text;
  JsonOut out([&](std::string_view piece) { text += piece; });
  ReportWriter writer(out);
  writer.begin();
  writer.rows("rows", rows, rows.size(), body);
  writer.end();
  out.finish();
  return Json::parse(text)["rows"];
}

}  // namespace

Json over_span_to_json(const std::vector<OverSpan>& over_span) {
  return rows_to_json(over_span, [](auto& io, auto& row) { over_span_fields(io, row); });
}

Json global_conflicts_to_json(const std::vector<GlobalConflict>& conflicts) {
  return rows_to_json(conflicts, [](auto& io, auto& row) { global_conflict_fields(io, row); });
}

Report report_from_json(const Json& document, std::string_view what) {
  Report r;
  ReportReader reader(document, what);
  report_fields(reader, r);
  reader.finish();
  return r;
}

Report report_from_text(std::string_view text, std::string_view what, std::uint64_t max_bytes,
                        std::size_t max_values) {
  if (text.size() > max_bytes) fail_input("{}: {} bytes, more than the {} a report may have", what, text.size(), max_bytes);
  return report_from_json(parse_strict_json(text, what, max_values).value, what);
}

}  // namespace mx2nv

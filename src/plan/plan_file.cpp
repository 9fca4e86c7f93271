#include "plan/plan_file.hpp"

#include "common/error.hpp"
#include "json/json_stream.hpp"
#include "json/json_writer.hpp"
#include "plan/overspan.hpp"
#include "common/printable.hpp"
#include "safetensors/index.hpp"
#include "json/strict_json.hpp"

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <set>

namespace mx2nv {
namespace {

// The format before paths were recorded byte for byte: read when its paths are
// unambiguous (below), never written.
constexpr std::string_view kPlanFormatV2 = "mx2nv-plan/2";

// The "kind" member's one value: a requantize plan (absent for a conversion's).
const std::string_view kRequantizeKind = choice_name(PlanKind::Requantize);

constexpr std::array<std::string_view, 9> kModuleColumns = {
    "name", "m", "divisor_bits", "zero_scales", "span", "groups_outside", "canonical_zero_groups",
    "marlin_zeroed_groups", "treatment"};
// A shard's members, in the canonical (sorted) order.
constexpr std::array<std::string_view, 7> kShardKeys = {"file",          "output_data_bytes",  "output_tensors",
                                                        "plan_hash",     "source_header_hash", "source_mtime_ns",
                                                        "source_size"};

std::string to_hex(std::string_view bytes) {
  std::string out;
  out.reserve(2 * bytes.size());
  for (const char c : bytes) fmt::format_to(std::back_inserter(out), "{:02x}", static_cast<unsigned char>(c));
  return out;
}

std::optional<std::string> from_hex(std::string_view hex) {
  if (hex.size() % 2 != 0) return std::nullopt;
  std::string out;
  out.reserve(hex.size() / 2);
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    // Lower-case only: one spelling per byte string (to_hex's), so the
    // checksum covers exactly one text for each path.
    for (std::size_t k = i; k < i + 2; ++k) {
      if (!((hex[k] >= '0' && hex[k] <= '9') || (hex[k] >= 'a' && hex[k] <= 'f'))) return std::nullopt;
    }
    unsigned value = 0;
    std::from_chars(hex.data() + i, hex.data() + i + 2, value, 16);
    out.push_back(static_cast<char>(value));
  }
  return out;
}

// Every call to the writers of a plan's two texts (the file's and the
// checksum's), either of which may be absent.
struct BothTexts {
  std::optional<JsonOut> a, b;
  void begin_object(bool block = true) { each([&](JsonOut& o) { o.begin_object(block); }); }
  void end_object() { each([](JsonOut& o) { o.end_object(); }); }
  void begin_array(bool block = true) { each([&](JsonOut& o) { o.begin_array(block); }); }
  void end_array() { each([](JsonOut& o) { o.end_array(); }); }
  void key(std::string_view k) { each([&](JsonOut& o) { o.key(k); }); }
  void string(std::string_view v) { each([&](JsonOut& o) { o.string(v); }); }
  void uint(std::uint64_t v) { each([&](JsonOut& o) { o.uint(v); }); }
  void int64(std::int64_t v) { each([&](JsonOut& o) { o.int64(v); }); }
  void literal(std::string_view json) { each([&](JsonOut& o) { o.literal(json); }); }
  void each(const auto& call) {
    if (a) call(*a);
    if (b) call(*b);
  }
};

// The plan's document in the canonical order: members sorted by key at every
// level, as nlohmann's dump of the document has them, so the checksum is
// the one every earlier mx2nv computed (XXH3-64 of the compact text of all
// members but "fingerprint"). `pretty`: the file's layout (JsonOut with
// indent 1: a line per member, shard and module row, the rows themselves
// compact), with the fingerprint (first in that order), to `pretty`;
// the compact text the checksum is taken over, to `compact`. Either may be
// empty; both are written in one pass (a step reading a plan needs both).
void emit(const PlanFile& p, std::string_view format, std::optional<std::uint64_t> fingerprint,
          const JsonOut::Sink& pretty, const JsonOut::Sink& compact) {
  BothTexts out;
  if (pretty) out.a.emplace(pretty, 1);
  if (compact) out.b.emplace(compact, -1);
  out.begin_object();
  if (fingerprint && out.a) {
    out.a->key("fingerprint");
    out.a->string(fmt::format("{:016x}", *fingerprint));
  }
  out.key("format");
  out.string(format);
  if (p.kind == PlanKind::Requantize) {
    out.key("kind");
    out.string(kRequantizeKind);
  }
  out.key("module_columns");
  out.begin_array(false);
  for (const std::string_view column : kModuleColumns) out.string(column);
  out.end_array();
  // Modules as rows of numbers (a line each): K3 has ~250k of them, each
  // written in one piece, as the inline array JsonOut would write.
  out.key("modules");
  out.begin_array();
  std::string row;
  const auto number = [&row](auto v) {
    char digits[24];
    row += ',';
    row.append(digits, static_cast<std::size_t>(std::to_chars(digits, digits + sizeof digits, v).ptr - digits));
  };
  for (std::size_t i = 0; i < p.modules.size(); ++i) {
    const ModulePlan& m = p.modules[i];
    row.clear();
    row += '[';
    append_dumped_string(row, p.module_names[i]);
    number(m.m);
    number(std::bit_cast<std::uint32_t>(m.divisor));
    number(m.zero_scales ? 1 : 0);
    number(m.span);
    number(m.groups_outside);
    number(m.canonical_zero_groups);
    number(m.marlin_zeroed_groups);
    number(static_cast<int>(m.treatment));
    row += ']';
    out.literal(row);
  }
  out.end_array();
  if (p.format != TargetFormat::CompressedTensors) {  // absent for the default: such plans read as they always have
    out.key("output_format");
    out.string(choice_name(p.format));
  }
  out.key("overspan");
  out.string(choice_name(p.over_span_choice));
  out.key("shards");
  out.begin_array();
  for (const PlannedShard& s : p.shards) {
    out.begin_object(false);
    out.key("file");
    out.string(s.file);
    out.key("output_data_bytes");
    out.uint(s.output_data_bytes);
    out.key("output_tensors");
    out.uint(s.output_tensors);
    out.key("plan_hash");
    out.uint(s.plan_hash);
    out.key("source_header_hash");
    out.uint(s.source_header_hash);
    out.key("source_mtime_ns");
    out.int64(s.source_mtime_ns);
    out.key("source_size");
    out.uint(s.source_size);
    out.end_object();
  }
  out.end_array();
  // Paths are bytes on Linux: "source"/"target" are for people (json_text:
  // invalid UTF-8 as \xNN, which a real path may also spell); the *_bytes
  // members (hex) are what a step opens.
  out.key("source");
  out.string(json_text(p.source));
  if (format != kPlanFormatV2) {
    out.key("source_bytes");
    out.string(to_hex(p.source));
  }
  out.key("target");
  out.string(json_text(p.target));
  if (format != kPlanFormatV2) {
    out.key("target_bytes");
    out.string(to_hex(p.target));
  }
  out.key("tool_version");
  out.string(p.tool_version);
  out.key("window");
  out.string(window_name(p.window));
  out.end_object();
  if (out.a) out.a->raw("\n");
  out.each([](JsonOut& o) { o.finish(); });
}

// A JSON string as dump_json writes it (the one serialisation of every
// document mx2nv writes, which the checksum has always been taken over).
std::string json_string(std::string_view s) {
  std::string out;
  append_dumped_string(out, s);
  return out;
}

struct HashState {
  HashState() : state(XXH3_createState()) {
    if (state == nullptr) throw std::bad_alloc();
    XXH3_64bits_reset(state);
  }
  ~HashState() { XXH3_freeState(state); }
  HashState(const HashState&) = delete;
  HashState& operator=(const HashState&) = delete;
  void update(std::string_view s) { XXH3_64bits_update(state, s.data(), s.size()); }
  std::uint64_t digest() const { return XXH3_64bits_digest(state); }
  XXH3_state_t* state;
};

std::uint64_t checksum(const PlanFile& p, std::string_view format) {
  HashState hash;
  emit(p, format, std::nullopt, {}, [&](std::string_view s) { hash.update(s); });
  return hash.digest();
}

// A planned SRC or DST: the absolute path `mx2nv plan` recorded, which a step
// opens as it is (no NUL byte: no path holds one).
void check_planned_path(const std::string& path, std::string_view what, std::string_view field) {
  if (path.empty() || path.front() != '/' || path.find('\0') != std::string::npos) {
    fail_input("{}: {} {} is not an absolute path", what, field, excerpt(path));
  }
}

// The recorded path of a plan in the older format: its text was json_text()
// of the bytes, exact unless json_text wrote a \xNN, and a backslash may be
// such an escape or the path's own byte: refused rather than guessed.
std::string v2_path(const std::string& text, std::string_view what, std::string_view field) {
  if (text.find('\\') != std::string::npos) {
    fail(ErrorKind::Usage,
         "{}: a plan in the format {} of an earlier mx2nv, whose {} {} may not be recorded exactly (a backslash); run "
         "mx2nv plan again",
         what, kPlanFormatV2, field, excerpt(text));
  }
  return text;
}

// Each row's fields against each other and the plan's options; whether the
// row is SRC's is for the step to check (convert/planned.cpp).
void check_row(const ModulePlan& m, const PlanFile& p, const std::string& name, std::string_view what) {
  // ModelOpt stores an exact module's 1/global, exact for its power of two; a
  // requantized row holds the stored F32 itself (ModulePlan::divisor).
  if (p.format == TargetFormat::ModelOpt && m.treatment == Treatment::Exact && !std::isnormal(1.0f / m.divisor)) {
    fail_input("{}: module \"{}\" has a global (divisor {}) whose reciprocal, its weight_scale_2, is no normal float",
               what, excerpt(name), m.divisor);
  }
  if (p.kind == PlanKind::Requantize) {
    // Every module requantized under its layout's quantizer's second-level
    // scale, whatever the window: no window was fitted, so every count a row
    // carries is 0 (the counts are summed into the report and finished.json).
    if (m.treatment != Treatment::Requantized || m.m != 0 || m.zero_scales || !std::isnormal(m.divisor) ||
        m.divisor <= 0) {
      fail_input("{}: module \"{}\" is not requantized with a positive normal second-level scale ({}) in a "
                 "requantize plan",
                 what, excerpt(name), m.divisor);
    }
    if (m.span != 0 || m.groups_outside != 0 || m.canonical_zero_groups != 0 || m.marlin_zeroed_groups != 0) {
      fail_input("{}: module \"{}\" of a requantize plan carries window counts (span {}, {} groups outside, {} "
                 "canonicalised, {} Marlin-zeroed); a requantize plan fits no window",
                 what, excerpt(name), m.span, m.groups_outside, m.canonical_zero_groups, m.marlin_zeroed_groups);
    }
    return;
  }
  switch (m.treatment) {
    case Treatment::Exact: {
      // The global of an exact transcode is 2^-m, and m lies in the window's
      // global range (the plan never chooses another, verify accepts no other).
      const WindowLimits limits = window_limits(p.window);
      const auto divisor = global_divisor_for(m.m);
      if (m.m < limits.global_min || m.m > limits.global_max || !divisor ||
          std::bit_cast<std::uint32_t>(*divisor) != std::bit_cast<std::uint32_t>(m.divisor)) {
        fail_input("{}: module \"{}\" has a global (m {}, divisor {}) the {} window does not allow", what,
                   excerpt(name), m.m, m.divisor, window_name(p.window));
      }
      return;
    }
    case Treatment::Requantized:
      if (p.over_span_choice != OverSpanChoice::Requantize || m.m != 0 || m.zero_scales || !std::isnormal(m.divisor) ||
          m.divisor <= 0 || !global_multiplier_fits(p.window, multiplier_of_stored(p.format, m.divisor))) {
        fail_input("{}: module \"{}\" is requantized with a second-level scale ({}) or in a plan (--overspan {}) that "
                   "does not allow it",
                   what, excerpt(name), m.divisor, choice_name(p.over_span_choice));
      }
      return;
    case Treatment::Bf16:
      if (p.over_span_choice != OverSpanChoice::Bf16 || m.m != 0 || m.zero_scales ||
          std::bit_cast<std::uint32_t>(m.divisor) != std::bit_cast<std::uint32_t>(1.0f)) {
        fail_input("{}: module \"{}\" is BF16 in a plan (--overspan {}) that does not write it so", what,
                   excerpt(name), choice_name(p.over_span_choice));
      }
      return;
  }
}

// The plan's top-level members.
enum Top : unsigned {
  kFingerprint, kFormat, kToolVersion, kWindow, kOverspan, kSource, kTarget, kSourceBytes, kTargetBytes,
  kShards, kModules, kColumns, kKind, kOutputFormat, kTopCount
};
constexpr std::array<std::string_view, kTopCount> kTopNames = {
    "fingerprint", "format", "tool_version", "window", "overspan", "source", "target", "source_bytes",
    "target_bytes", "shards", "modules", "module_columns", "kind", "output_format"};

// Every string member is a name, a version or a path (hex or text): longer
// than any path can be is refused as it is read, whatever it holds.
std::size_t string_cap(Top at) {
  return (at == kSourceBytes || at == kTargetBytes) ? 2 * kMaxPlanPathBytes
         : (at == kSource || at == kTarget)         ? 4 * kMaxPlanPathBytes
                                                    : 256;
}

// What a reader found at the top level: which members, and the strings.
struct TopMembers {
  std::array<bool, kTopCount> seen{};
  std::array<std::optional<std::string>, kTopCount> strings;
};

// The checks of a plan whose text held together (its checksum, if read as
// a stream, already matched): the members present and known, the paths, the
// shards, every row. Fills the plan's options from the strings. What is
// left to the reader: that the canonical text of what was read has the
// checksum the plan records (no field ignored, none read differently).
void complete_plan(PlanFile& p, const TopMembers& top, const std::vector<std::string>& columns,
                   std::string_view what) {
  const auto& format = top.strings[kFormat];
  const bool v2 = format && *format == kPlanFormatV2;
  for (const Top required : {kToolVersion, kWindow, kOverspan, kSource, kTarget, kShards, kModules, kColumns}) {
    if (!top.seen[required]) fail_input("{}: \"{}\" is missing", what, kTopNames[required]);
  }
  p.tool_version = *top.strings[kToolVersion];
  const auto window = parse_window(*top.strings[kWindow]);
  if (!window) fail_input("{}: unknown window \"{}\"", what, excerpt(*top.strings[kWindow]));
  p.window = *window;
  const auto overspan = parse_choice<OverSpanChoice>(*top.strings[kOverspan]);
  if (!overspan) fail_input("{}: unknown overspan choice \"{}\"", what, excerpt(*top.strings[kOverspan]));
  p.over_span_choice = *overspan;
  if (top.seen[kKind]) {
    if (!top.strings[kKind] || *top.strings[kKind] != kRequantizeKind || v2) {
      fail_input("{}: \"kind\" is not \"{}\"", what, kRequantizeKind);
    }
    if (p.over_span_choice != OverSpanChoice::Fail) fail_input("{}: a requantize plan with --overspan", what);
    p.kind = PlanKind::Requantize;
  }
  if (top.seen[kOutputFormat]) {
    const auto& text = top.strings[kOutputFormat];
    const auto output = text ? parse_choice<TargetFormat>(*text) : std::nullopt;
    // The default is never spelled (a plan's text is one canonical text).
    if (!output || *output == TargetFormat::CompressedTensors || v2) {
      fail_input("{}: unknown output_format {}", what,
                 text ? fmt::format("\"{}\"", excerpt(*text)) : "(not a string)");
    }
    p.format = *output;
  }
  const std::string& source_text = *top.strings[kSource];
  const std::string& target_text = *top.strings[kTarget];
  if (v2) {
    if (top.seen[kSourceBytes] || top.seen[kTargetBytes]) {
      fail_input("{}: fields other than a plan's, or spelled otherwise; run mx2nv plan again", what);
    }
    p.source = v2_path(source_text, what, "SRC");
    p.target = v2_path(target_text, what, "DST");
  } else {
    for (const Top required : {kSourceBytes, kTargetBytes}) {
      if (!top.seen[required]) fail_input("{}: \"{}\" is missing", what, kTopNames[required]);
    }
    const auto source = from_hex(*top.strings[kSourceBytes]);
    const auto target = from_hex(*top.strings[kTargetBytes]);
    if (!source || !target) fail_input("{}: source_bytes or target_bytes is not lower-case hex", what);
    p.source = *source;
    p.target = *target;
    // The display text is derived from the bytes: one more place a damaged
    // or edited plan shows.
    if (json_text(p.source) != source_text || json_text(p.target) != target_text) {
      fail_input("{}: \"source\"/\"target\" do not spell source_bytes/target_bytes", what);
    }
  }
  for (const auto* path : {&p.source, &p.target}) {
    if (path->size() > kMaxPlanPathBytes) {
      fail_input("{}: {} is a path of {} bytes, longer than a path can be ({})", what,
                 path == &p.source ? "SRC" : "DST", path->size(), kMaxPlanPathBytes);
    }
  }
  check_planned_path(p.source, what, "SRC");
  check_planned_path(p.target, what, "DST");
  if (p.shards.empty()) fail_input("{}: \"shards\" is not a non-empty list", what);
  std::set<std::string_view> files;
  for (const auto& s : p.shards) {
    if (!is_confined_relative_path(s.file)) {
      fail_input("{}: shard {} is not a plain relative path", what, excerpt(s.file));
    }
    if (!files.insert(s.file).second) fail_input("{}: shard {} is planned twice", what, excerpt(s.file));
  }
  if (columns.size() != kModuleColumns.size()) {
    fail_input("{}: \"module_columns\" are not a plan's; run mx2nv plan again", what);
  }
  for (std::size_t i = 0; i < p.modules.size(); ++i) check_row(p.modules[i], p, p.module_names[i], what);
}

// One JSON scalar as the parser gave it: the kind decides what it may be
// read as (a negative number is never read as unsigned, 1.5 never as 1).
struct Scalar {
  enum class Kind { Null, Bool, Signed, Unsigned, Float, String, Container } kind = Kind::Null;
  std::int64_t i = 0;
  std::uint64_t u = 0;
};

// The plan, from JSON events. What it keeps is the PlanFile being built and
// at most one row or shard in progress: never the text or a DOM of it. The
// document is also written out again as it streams by, compact and without
// "fingerprint", into a hash: the checksum of the document as it is (so
// damage anywhere is named as such, before any field is judged), and, once
// the fields are read, compared with the checksum of the canonical text of
// what was read (so nothing was ignored or read differently).
//
// Errors: the caps, duplicate and unknown members stop the parse at once;
// a wrong type or value is recorded (the first one) and reported only once
// the checksum has been found intact.
class PlanReader final : public StrictSax {
 public:
  explicit PlanReader(std::string_view what) : StrictSax(what), echo_([this](std::string_view s) { hash_.update(s); }) {}

  PlanFile finish();

  bool null() override { return scalar({Scalar::Kind::Null}, nullptr, "null"); }
  bool boolean(bool v) override { return scalar({Scalar::Kind::Bool}, nullptr, v ? "true" : "false"); }
  bool number_integer(number_integer_t v) override {
    Scalar s{Scalar::Kind::Signed};
    s.i = v;
    return scalar(s, nullptr, fmt::format("{}", v));
  }
  bool number_unsigned(number_unsigned_t v) override {
    Scalar s{Scalar::Kind::Unsigned};
    s.u = v;
    return scalar(s, nullptr, fmt::format("{}", v));
  }
  bool number_float(number_float_t v, const string_t&) override {
    return scalar({Scalar::Kind::Float}, nullptr, Json(v).dump());
  }
  bool string(string_t& v) override { return scalar({Scalar::Kind::String}, &v, json_string(v)); }
  bool start_object(std::size_t) override { return open(false); }
  bool start_array(std::size_t) override { return open(true); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override;

 private:
  enum class Section { Top, Shards, Shard, Modules, Row, Columns, Ignored };
  struct Frame {
    Section section;
    bool array;
    bool first = true;
  };

  template <typename... Args>
  void wrong(fmt::format_string<Args...> format, Args&&... args) {
    if (first_error_.empty()) first_error_ = fmt::format(format, std::forward<Args>(args)...);
  }
  // The next value's separator in the echo, and whether it is echoed at all.
  void before_value() {
    if (!stack_.empty() && stack_.back().array) {
      if (!stack_.back().first) emit(",");
      stack_.back().first = false;
    }
  }
  void emit(std::string_view s) {
    if (skip_depth_ == 0) echo_.raw(s);
  }
  bool scalar(Scalar v, std::string* text, std::string_view echoed);
  bool open(bool array);
  bool close();
  void shard_value(const Scalar& v, std::string* text);
  void end_row();
  std::uint64_t as_u64(const Scalar& v, std::string_view field) {
    if (v.kind != Scalar::Kind::Unsigned) wrong("{}: {} is not a non-negative integer", what(), field);
    return v.u;
  }
  std::int64_t as_i64(const Scalar& v, std::string_view field) {
    if (v.kind == Scalar::Kind::Unsigned && v.u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      return static_cast<std::int64_t>(v.u);
    }
    if (v.kind == Scalar::Kind::Signed) return v.i;
    wrong("{}: {} is not a 64-bit integer", what(), field);
    return 0;
  }
  int as_int(const Scalar& v, std::string_view field, std::int64_t lo, std::int64_t hi) {
    const std::int64_t x = as_i64(v, field);
    if (x < lo || x > hi) {
      wrong("{}: {} is {}, outside [{}, {}]", what(), field, x, lo, hi);
      return 0;
    }
    return static_cast<int>(x);
  }

  HashState hash_;
  JsonOut echo_;  // the canonical text as it streams by (raw), into hash_
  std::vector<Frame> stack_;
  std::size_t skip_depth_ = 0;  // >0: inside the "fingerprint" member, which the checksum leaves out
  bool top_is_object_ = false;
  std::optional<Top> top_key_;  // the top-level member whose value comes next
  std::array<bool, kTopCount> seen_{};
  std::array<std::optional<std::string>, kTopCount> strings_;  // the top-level string members
  std::string first_error_;
  PlanFile p_;
  std::uint64_t name_bytes_ = 0;
  std::vector<std::string> columns_;
  // The shard in progress.
  PlannedShard shard_;
  std::optional<std::size_t> shard_key_;
  std::array<bool, kShardKeys.size()> shard_seen_{};
  // The module row in progress.
  std::size_t row_columns_ = 0;
  std::string row_name_;
  std::array<Scalar, 9> row_{};
};

bool PlanReader::key(string_t& k) {
  Frame& f = stack_.back();
  if (f.section == Section::Top) {
    const auto it = std::find(kTopNames.begin(), kTopNames.end(), k);
    if (it == kTopNames.end()) {
      fail_input("{}: \"{}\" is not a field of a plan (edited or damaged?); run mx2nv plan again", what(), excerpt(k, 80));
    }
    const auto at = static_cast<Top>(it - kTopNames.begin());
    if (seen_[at]) fail_input("{}: duplicate JSON key \"{}\"", what(), k);
    seen_[at] = true;
    top_key_ = at;
    if (at == kFingerprint) {
      skip_depth_ = 1;  // its value is not summed; nor is the key (nor the separator: `first` stays)
      return true;
    }
  } else if (f.section == Section::Shard) {
    const auto it = std::find(kShardKeys.begin(), kShardKeys.end(), k);
    if (it == kShardKeys.end()) {
      fail_input("{}: \"{}\" is not a field of a planned shard (edited or damaged?); run mx2nv plan again", what(),
                 excerpt(k, 80));
    }
    const auto at = static_cast<std::size_t>(it - kShardKeys.begin());
    if (shard_seen_[at]) fail_input("{}: duplicate JSON key \"{}\"", what(), k);
    shard_seen_[at] = true;
    shard_key_ = at;
  } else {
    // Objects nested where a plan has none: wrong, named once the checksum holds.
    wrong("{}: an object where a plan has none", what());
  }
  emit(f.first ? "" : ",");
  f.first = false;
  emit(json_string(k));
  emit(":");
  return true;
}

bool PlanReader::scalar(Scalar v, std::string* text, std::string_view echoed) {
  if (stack_.empty()) {
    // A document that is a single scalar is no plan.
    emit(echoed);
    return true;
  }
  before_value();
  const bool fingerprint = skip_depth_ == 1 && stack_.back().section == Section::Top;
  emit(echoed);
  const Frame& f = stack_.back();
  switch (f.section) {
    case Section::Top: {
      const Top at = *top_key_;
      if (fingerprint) skip_depth_ = 0;
      if (at == kShards || at == kModules || at == kColumns) {
        wrong("{}: \"{}\" is not a list", what(), kTopNames[at]);
      } else if (v.kind != Scalar::Kind::String) {
        wrong("{}: {} is not a string", what(), kTopNames[at]);
      } else {
        const std::size_t cap = string_cap(at);
        if (text->size() > cap) {
          fail_input("{}: \"{}\" is {} bytes, longer than a plan writes it (at most {})", what(), kTopNames[at],
                     text->size(), cap);
        }
        strings_[at] = std::move(*text);
      }
      break;
    }
    case Section::Shards:
      wrong("{}: a shard is not an object", what());
      break;
    case Section::Shard:
      shard_value(v, text);
      break;
    case Section::Modules:
      wrong("{}: a module row is not a list of 9 columns", what());
      break;
    case Section::Row: {
      const std::size_t column = row_columns_++;
      if (column == 0) {
        if (v.kind != Scalar::Kind::String) {
          wrong("{}: a module name is not a string", what());
        } else {
          name_bytes_ += text->size();
          if (name_bytes_ > kMaxPlanNameBytes) {
            fail_input("{}: module names of more than {} bytes in all (no checkpoint's index holds more)", what(),
                       kMaxPlanNameBytes);
          }
          row_name_ = std::move(*text);
        }
      } else if (column < row_.size()) {
        row_[column] = v;
      }
      break;
    }
    case Section::Columns:
      if (v.kind != Scalar::Kind::String || columns_.size() >= kModuleColumns.size() ||
          *text != kModuleColumns[columns_.size()]) {
        wrong("{}: \"module_columns\" are not a plan's", what());
        columns_.assign(kModuleColumns.size() + 1, "");  // stays wrong
      } else {
        columns_.push_back(std::move(*text));
      }
      break;
    case Section::Ignored:
      break;
  }
  return true;
}

void PlanReader::shard_value(const Scalar& v, std::string* text) {
  const std::string_view field = kShardKeys[*shard_key_];
  switch (*shard_key_) {
    case 0:  // file
      if (v.kind != Scalar::Kind::String) {
        wrong("{}: a shard's file is not a string", what());
      } else if (text->size() > kMaxPlanPathBytes) {
        fail_input("{}: a shard's file name of {} bytes, longer than a path can be ({})", what(), text->size(),
                   kMaxPlanPathBytes);
      } else {
        shard_.file = std::move(*text);
      }
      break;
    case 1: shard_.output_data_bytes = as_u64(v, field); break;
    case 2: shard_.output_tensors = as_u64(v, field); break;
    case 3: shard_.plan_hash = as_u64(v, field); break;
    case 4: shard_.source_header_hash = as_u64(v, field); break;
    case 5: shard_.source_mtime_ns = as_i64(v, field); break;
    case 6: shard_.source_size = as_u64(v, field); break;
    default: break;
  }
}

bool PlanReader::open(bool array) {
  enter();
  Section section = Section::Ignored;
  if (stack_.empty()) {
    top_is_object_ = !array;
    section = array ? Section::Ignored : Section::Top;
  } else {
    before_value();
    if (skip_depth_ > 0) {
      ++skip_depth_;  // a fingerprint that is not a string: left out of the sum, and wrong
      if (skip_depth_ == 2) wrong("{}: fingerprint is not a string", what());
    }
    const Frame& parent = stack_.back();
    switch (parent.section) {
      case Section::Top: {
        const Top at = *top_key_;
        if (at == kShards && array) {
          section = Section::Shards;
        } else if (at == kModules && array) {
          section = Section::Modules;
        } else if (at == kColumns && array) {
          section = Section::Columns;
        } else if (at != kFingerprint) {
          wrong("{}: {} is not {}", what(), kTopNames[at],
                at == kShards || at == kModules || at == kColumns ? "a list" : "a string");
        }
        break;
      }
      case Section::Shards:
        if (array) {
          wrong("{}: a shard is not an object", what());
        } else {
          if (p_.shards.size() >= kMaxPlanShards) {
            fail_input("{}: more than {} shards (no checkpoint has more)", what(), kMaxPlanShards);
          }
          section = Section::Shard;
          shard_ = PlannedShard{};
          shard_seen_ = {};
        }
        break;
      case Section::Modules:
        if (!array) {
          wrong("{}: a module row is not a list of 9 columns", what());
        } else {
          if (p_.modules.size() >= kMaxPlanModules) {
            fail_input("{}: more than {} module rows (no checkpoint's index holds more modules)", what(),
                       kMaxPlanModules);
          }
          section = Section::Row;
          row_columns_ = 0;
          row_name_.clear();
          row_ = {};
        }
        break;
      case Section::Row:
        ++row_columns_;
        wrong("{}: a module row holds a list or object", what());
        break;
      case Section::Shard:
        wrong("{}: a shard's {} is not a {}", what(), kShardKeys[*shard_key_],
              *shard_key_ == 0 ? "string" : "number");
        break;
      case Section::Columns:
        wrong("{}: \"module_columns\" are not a plan's", what());
        break;
      case Section::Ignored:
        break;
    }
  }
  emit(array ? "[" : "{");
  stack_.push_back({section, array});
  return true;
}

bool PlanReader::close() {
  const Frame f = stack_.back();
  stack_.pop_back();
  leave();
  emit(f.array ? "]" : "}");
  if (skip_depth_ > 1 && --skip_depth_ == 1) skip_depth_ = 0;  // the end of a non-string fingerprint
  if (f.section == Section::Shard) {
    for (std::size_t k = 0; k < kShardKeys.size(); ++k) {
      if (!shard_seen_[k]) wrong("{}: \"{}\" is missing from a shard", what(), kShardKeys[k]);
    }
    p_.shards.push_back(std::move(shard_));
  } else if (f.section == Section::Row) {
    end_row();
  }
  return true;
}

void PlanReader::end_row() {
  if (row_columns_ != kModuleColumns.size()) {
    wrong("{}: a module row is not a list of 9 columns", what());
    return;
  }
  ModulePlan m;
  constexpr std::int64_t kIntMin = std::numeric_limits<int>::min(), kIntMax = std::numeric_limits<int>::max();
  m.m = as_int(row_[1], "m", kIntMin, kIntMax);
  const std::uint64_t bits = as_u64(row_[2], "divisor_bits");
  if (bits > std::numeric_limits<std::uint32_t>::max()) wrong("{}: divisor_bits {} is not 32 bits", what(), bits);
  m.divisor = std::bit_cast<float>(static_cast<std::uint32_t>(bits));
  m.zero_scales = as_int(row_[3], "zero_scales", 0, 1) != 0;
  m.span = as_int(row_[4], "span", kIntMin, kIntMax);
  m.groups_outside = as_u64(row_[5], "groups_outside");
  m.canonical_zero_groups = as_u64(row_[6], "canonical_zero_groups");
  m.marlin_zeroed_groups = as_u64(row_[7], "marlin_zeroed_groups");
  const int treatment = as_int(row_[8], "treatment", 0, 255);
  if (treatment > static_cast<int>(Treatment::Bf16)) {
    wrong("{}: module \"{}\" has an unknown treatment {}", what(), excerpt(row_name_), treatment);
  }
  m.treatment = static_cast<Treatment>(std::min(treatment, static_cast<int>(Treatment::Bf16)));
  p_.module_names.push_back(std::move(row_name_));
  p_.modules.push_back(m);
}

PlanFile PlanReader::finish() {
  StrictSax::finish();
  echo_.finish();
  const auto& format = strings_[kFormat];
  const bool v2 = format && *format == kPlanFormatV2;
  if (!top_is_object_ || !format || (*format != kPlanFormat && !v2)) {
    fail_input("{}: not an mx2nv plan ({} expected)", what(), kPlanFormat);
  }
  // The checksum first, over the document as it is: damage is named as
  // such, whatever field it hit. (It detects damage, not forgery: whoever
  // edits a plan can recompute it. What a step trusts a plan for, and what
  // it checks against SRC, is in convert/planned.cpp.)
  if (!seen_[kFingerprint]) fail_input("{}: \"fingerprint\" is missing", what());
  if (!strings_[kFingerprint]) fail_input("{}: fingerprint is not a string", what());
  p_.fingerprint = hash_.digest();
  if (*strings_[kFingerprint] != fmt::format("{:016x}", p_.fingerprint)) {
    fail_input("{}: checksum mismatch (the plan was edited or damaged); run mx2nv plan again", what());
  }
  if (!first_error_.empty()) throw Error(ErrorKind::InvalidInput, first_error_);
  complete_plan(p_, TopMembers{seen_, std::move(strings_)}, columns_, what());
  // What was read is what was checked: the canonical text of the values
  // read spells the document (no field ignored, none read differently).
  if (checksum(p_, v2 ? kPlanFormatV2 : kPlanFormat) != p_.fingerprint) {
    fail_input("{}: fields other than a plan's, or spelled otherwise; run mx2nv plan again", what());
  }
  return std::move(p_);
}

// The fast path: the text plan_file_to_text writes, read a line at a time.
//
// Every step reads the whole plan (K3's: ~250k rows, ~24 MB), and through
// nlohmann's lexer (a character at a time) and an event per value that
// cost more than a step's own work on metadata. A plan is nearly always
// exactly the text `mx2nv plan` wrote: a line per top-level member, module
// row and shard, the rows and shards compact. This reader takes only that
// text, with strings of printable ASCII and no escapes, and accepts only
// when PlanReader would accept the same plan: the values it read, written
// again (emit, pretty), are the file byte for byte, so the file is the
// canonical text of those values, which PlanReader reads back as they are
// (a plan file's round trip); and they pass the same checks (complete_plan)
// and the checksum. It declines, keeping nothing, on anything
// else: another layout, an escape, a value PlanReader would find wrong, a
// cap reached, any refusal. The streaming reader then gives the verdict and
// its message, so an edited or damaged plan is refused exactly as before.
//
// Memory: a window of kFastPlanWindow bytes (a longer line declines), a
// chunk for the comparison, and the plan being built, which PlanReader
// builds too; the caps hold before anything is kept.
constexpr std::size_t kFastPlanWindow = 1 << 20;

// The file's lines, through a window that slides over it.
class PlanLines {
 public:
  PlanLines(const ByteSource& source, std::uint64_t size)
      : source_(source),
        size_(size),
        window_(static_cast<std::size_t>(std::min<std::uint64_t>(kFastPlanWindow, size))) {}
  enum class Next { Line, End, Decline };
  // The next line, without its '\n'. End: the text ended after a '\n'.
  // Decline: a line longer than the window, or text after the last '\n'.
  Next next(std::string_view& line) {
    for (;;) {
      if (const void* nl = end_ > begin_ ? std::memchr(window_.data() + begin_, '\n', end_ - begin_) : nullptr) {
        const auto at = static_cast<std::size_t>(static_cast<const char*>(nl) - window_.data());
        line = std::string_view(window_.data() + begin_, at - begin_);
        begin_ = at + 1;
        return Next::Line;
      }
      if (read_ == size_) return begin_ == end_ ? Next::End : Next::Decline;
      std::memmove(window_.data(), window_.data() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
      if (end_ == window_.size()) return Next::Decline;
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(window_.size() - end_, size_ - read_));
      source_.read_at(read_, std::as_writable_bytes(std::span(window_.data() + end_, n)));
      read_ += n;
      end_ += n;
    }
  }

 private:
  const ByteSource& source_;
  std::uint64_t size_, read_ = 0;
  std::vector<char> window_;
  std::size_t begin_ = 0, end_ = 0;
};

// A cursor over one line; each read is false where the text is not what
// the canonical text would hold there.
struct LineCursor {
  const char* at;
  const char* end;
  explicit LineCursor(std::string_view line) : at(line.data()), end(line.data() + line.size()) {}
  bool done() const { return at == end; }
  bool eat(char ch) {
    if (at == end || *at != ch) return false;
    ++at;
    return true;
  }
  bool eat(std::string_view s) {
    if (static_cast<std::size_t>(end - at) < s.size() || std::memcmp(at, s.data(), s.size()) != 0) return false;
    at += s.size();
    return true;
  }
  // A string of printable ASCII without escapes: its bytes are its value.
  bool string(std::string_view& out) {
    if (!eat('"')) return false;
    const char* first = at;
    for (; at != end; ++at) {
      const char c = *at;
      if (c == '"') {
        out = std::string_view(first, static_cast<std::size_t>(at - first));
        ++at;
        return true;
      }
      if (c < 0x20 || c >= 0x7F || c == '\\') return false;
    }
    return false;
  }
  template <typename T>
  bool number(T& out) {
    const auto r = std::from_chars(at, end, out);
    if (r.ec != std::errc()) return false;
    at = r.ptr;
    return true;
  }
  // The trailing comma of an item that is not its container's last (whether
  // it belongs there, the comparison with the written text decides).
  void comma() {
    if (at != end && end[-1] == ',') --end;
  }
};

// One module row: ["name",m,divisor_bits,zero_scales,span,groups_outside,
// canonical_zero_groups,marlin_zeroed_groups,treatment], with PlanReader's
// conversions; false where it would find a value wrong.
bool fast_row(LineCursor c, std::string_view& name, ModulePlan& m) {
  constexpr std::int64_t kIntMin = std::numeric_limits<int>::min(), kIntMax = std::numeric_limits<int>::max();
  std::int64_t mm = 0, zero = 0, span = 0, treatment = 0;
  std::uint64_t bits = 0;
  c.comma();
  if (!c.eat("  [") || !c.string(name) || !c.eat(',') || !c.number(mm) || !c.eat(',') || !c.number(bits) ||
      !c.eat(',') || !c.number(zero) || !c.eat(',') || !c.number(span) || !c.eat(',') ||
      !c.number(m.groups_outside) || !c.eat(',') || !c.number(m.canonical_zero_groups) || !c.eat(',') ||
      !c.number(m.marlin_zeroed_groups) || !c.eat(',') || !c.number(treatment) || !c.eat(']') || !c.done()) {
    return false;
  }
  if (mm < kIntMin || mm > kIntMax || span < kIntMin || span > kIntMax || zero < 0 || zero > 1 ||
      bits > std::numeric_limits<std::uint32_t>::max() || treatment < 0 ||
      treatment > static_cast<int>(Treatment::Bf16)) {
    return false;
  }
  m.m = static_cast<int>(mm);
  m.divisor = std::bit_cast<float>(static_cast<std::uint32_t>(bits));
  m.zero_scales = zero != 0;
  m.span = static_cast<int>(span);
  m.treatment = static_cast<Treatment>(treatment);
  return true;
}

// One shard: {"file":...,"output_data_bytes":...,...,"source_size":...}.
bool fast_shard(LineCursor c, PlannedShard& s) {
  std::string_view file;
  c.comma();
  if (!c.eat("  {\"file\":") || !c.string(file) || file.size() > kMaxPlanPathBytes ||
      !c.eat(",\"output_data_bytes\":") || !c.number(s.output_data_bytes) || !c.eat(",\"output_tensors\":") ||
      !c.number(s.output_tensors) || !c.eat(",\"plan_hash\":") || !c.number(s.plan_hash) ||
      !c.eat(",\"source_header_hash\":") || !c.number(s.source_header_hash) || !c.eat(",\"source_mtime_ns\":") ||
      !c.number(s.source_mtime_ns) || !c.eat(",\"source_size\":") || !c.number(s.source_size) || !c.eat('}') ||
      !c.done()) {
    return false;
  }
  s.file = std::string(file);
  return true;
}

// Whether bytes [0, size) of `source` are exactly `p`'s text as
// plan_file_to_text writes it (with `fingerprint`, in `format`), and the
// compact text of `p` (the checksum's) has that checksum: the file is the
// canonical text of `p`, undamaged.
bool spells(const ByteSource& source, std::uint64_t size, const PlanFile& p, std::string_view format,
            std::uint64_t fingerprint) {
  struct Differs {};
  std::uint64_t at = 0;
  std::vector<char> chunk;
  HashState hash;
  try {
    emit(
        p, format, fingerprint,
        [&](std::string_view text) {
          if (text.size() > size - at) throw Differs{};
          chunk.resize(text.size());
          source.read_at(at, std::as_writable_bytes(std::span(chunk)));
          if (std::memcmp(chunk.data(), text.data(), text.size()) != 0) throw Differs{};
          at += text.size();
        },
        [&](std::string_view text) { hash.update(text); });
  } catch (const Differs&) {
    return false;
  }
  return at == size && hash.digest() == fingerprint;
}

std::optional<PlanFile> read_canonical_plan(const ByteSource& source, std::uint64_t size, std::string_view what) {
  PlanLines lines(source, size);
  std::string_view line;
  if (lines.next(line) != PlanLines::Next::Line || line != "{") return std::nullopt;
  PlanFile p;
  TopMembers top;
  std::vector<std::string> columns;
  std::uint64_t name_bytes = 0;
  enum class In { Top, Modules, Shards } in = In::Top;
  for (;;) {
    if (lines.next(line) != PlanLines::Next::Line) return std::nullopt;
    if (in == In::Modules || in == In::Shards) {
      if (line == " ]" || line == " ],") {
        in = In::Top;
      } else if (in == In::Modules) {
        std::string_view name;
        ModulePlan m;
        if (p.modules.size() >= kMaxPlanModules || !fast_row(LineCursor(line), name, m)) return std::nullopt;
        name_bytes += name.size();
        if (name_bytes > kMaxPlanNameBytes) return std::nullopt;
        p.module_names.emplace_back(name);
        p.modules.push_back(m);
      } else {
        PlannedShard s;
        if (p.shards.size() >= kMaxPlanShards || !fast_shard(LineCursor(line), s)) return std::nullopt;
        p.shards.push_back(std::move(s));
      }
      continue;
    }
    if (line == "}") break;
    LineCursor c(line);
    c.comma();
    std::string_view key;
    if (!c.eat(' ') || !c.string(key) || !c.eat(": ")) return std::nullopt;
    const auto it = std::find(kTopNames.begin(), kTopNames.end(), key);
    if (it == kTopNames.end()) return std::nullopt;
    const auto at = static_cast<Top>(it - kTopNames.begin());
    if (top.seen[at]) return std::nullopt;
    top.seen[at] = true;
    if (at == kModules || at == kShards) {
      const std::string_view rest(c.at, static_cast<std::size_t>(c.end - c.at));
      if (rest == "[") {
        in = at == kModules ? In::Modules : In::Shards;
      } else if (rest != "[]") {
        return std::nullopt;
      }
    } else if (at == kColumns) {
      if (!c.eat('[')) return std::nullopt;
      for (std::string_view column; !c.eat(']');) {
        if ((!columns.empty() && !c.eat(',')) || !c.string(column) || columns.size() >= kModuleColumns.size() ||
            column != kModuleColumns[columns.size()]) {
          return std::nullopt;
        }
        columns.emplace_back(column);
      }
      if (!c.done()) return std::nullopt;
    } else {
      std::string_view text;
      if (!c.string(text) || !c.done() || text.size() > string_cap(at)) return std::nullopt;
      top.strings[at] = std::string(text);
    }
  }
  if (lines.next(line) != PlanLines::Next::End) return std::nullopt;
  const auto& format = top.strings[kFormat];
  const auto& fingerprint = top.strings[kFingerprint];
  if (!format || (*format != kPlanFormat && *format != kPlanFormatV2) || !fingerprint || fingerprint->size() != 16 ||
      !from_hex(*fingerprint)) {
    return std::nullopt;
  }
  std::from_chars(fingerprint->data(), fingerprint->data() + fingerprint->size(), p.fingerprint, 16);
  const std::string format_read = *format;
  try {
    complete_plan(p, top, columns, what);
  } catch (const Error&) {
    return std::nullopt;
  }
  if (!spells(source, size, p, format_read, p.fingerprint)) return std::nullopt;
  return p;
}

}  // namespace

std::string plan_file_to_text(PlanFile& p) {
  p.fingerprint = checksum(p, kPlanFormat);
  std::string text;
  emit(p, kPlanFormat, p.fingerprint, [&](std::string_view s) { text.append(s); }, {});
  return text;
}

PlanFile plan_file_from_source(const ByteSource& source, std::uint64_t size, std::string_view what) {
  if (size > kMaxPlanBytes) {
    fail_input("{}: {} bytes, more than the {} a plan may have (Kimi K3's is ~24 MB); was it made by mx2nv plan?",
               what, size, kMaxPlanBytes);
  }
  if (auto plan = plan_file_as_written(source, size, what)) return std::move(*plan);
  return plan_file_streamed(source, size, what);
}

std::optional<PlanFile> plan_file_as_written(const ByteSource& source, std::uint64_t size, std::string_view what) {
  if (size > kMaxPlanBytes) return std::nullopt;
  return read_canonical_plan(source, size, what);
}

PlanFile plan_file_streamed(const ByteSource& source, std::uint64_t size, std::string_view what) {
  if (size > kMaxPlanBytes) {
    fail_input("{}: {} bytes, more than the {} a plan may have (Kimi K3's is ~24 MB); was it made by mx2nv plan?",
               what, size, kMaxPlanBytes);
  }
  PlanReader reader(what);
  parse_json_stream(source, 0, size, reader, what);
  return reader.finish();
}

PlanFile plan_file_from_text(std::string_view text, std::string_view what) {
  const MemorySource source(text);
  return plan_file_from_source(source, text.size(), what);
}

Plan plan_for_modules(const PlanFile& file, const std::vector<std::string_view>& module_names) {
  if (!std::equal(module_names.begin(), module_names.end(), file.module_names.begin(), file.module_names.end())) {
    fail(ErrorKind::Usage, "the plan was made for other quantized modules than SRC holds now ({} planned, {} found); "
                           "SRC changed since: run mx2nv plan again",
         file.module_names.size(), module_names.size());
  }
  Plan plan;
  plan.kind = file.kind;
  plan.window = file.window;
  plan.format = file.format;
  plan.over_span_choice = file.over_span_choice;
  plan.modules = file.modules;
  return plan;
}

}  // namespace mx2nv

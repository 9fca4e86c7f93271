#include "plan/plan_file.hpp"

#include "common/error.hpp"
#include "common/printable.hpp"
#include "json/strict_json.hpp"
#include "plan/overspan.hpp"
#include "safetensors/index.hpp"

#include <xxhash.h>

#include <bit>
#include <charconv>
#include <cmath>
#include <limits>
#include <set>

namespace mx2nv {
namespace {

// The format before paths were recorded byte for byte: read when its paths are
// unambiguous (below), never written.
constexpr std::string_view kPlanFormatV2 = "mx2nv-plan/2";

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

Json content_json(const PlanFile& p, std::string_view format) {
  Json shards = Json::array();
  for (const auto& s : p.shards) {
    shards.push_back({{"file", s.file},
                      {"source_size", s.source_size},
                      {"source_mtime_ns", s.source_mtime_ns},
                      {"source_header_hash", s.source_header_hash},
                      {"plan_hash", s.plan_hash},
                      {"output_data_bytes", s.output_data_bytes},
                      {"output_tensors", s.output_tensors}});
  }
  // Modules as rows of numbers, not objects: a plan has one per module.
  Json modules = Json::array();
  for (std::size_t i = 0; i < p.modules.size(); ++i) {
    const ModulePlan& m = p.modules[i];
    modules.push_back(Json::array({p.module_names[i], m.m, std::bit_cast<std::uint32_t>(m.divisor),
                                   m.zero_scales ? 1 : 0, m.span, m.groups_outside, m.canonical_zero_groups,
                                   m.marlin_zeroed_groups, static_cast<int>(m.treatment)}));
  }
  Json j = {{"format", format},
            {"tool_version", p.tool_version},
            {"window", window_name(p.window)},
            {"overspan", overspan_name(p.overspan)},
            {"source", json_text(p.source)},
            {"target", json_text(p.target)},
            {"shards", shards},
            {"module_columns", {"name", "m", "divisor_bits", "zero_scales", "span", "groups_outside",
                                "canonical_zero_groups", "marlin_zeroed_groups", "treatment"}},
            {"modules", modules}};
  if (format != kPlanFormatV2) {
    // Paths are bytes on Linux: "source"/"target" are for people (json_text:
    // invalid UTF-8 as \xNN, which a real path may also spell); these are
    // what a step opens.
    j["source_bytes"] = to_hex(p.source);
    j["target_bytes"] = to_hex(p.target);
  }
  return j;
}

std::uint64_t checksum(const Json& content) {
  const std::string text = dump_json(content, -1);
  return XXH3_64bits(text.data(), text.size());
}

// Typed reads that refuse what nlohmann's get<>() would convert silently (a
// negative number read as unsigned, 2^40 read as int, 1.5 read as 1).
std::uint64_t get_u64(const Json& j, std::string_view what, std::string_view field) {
  if (!j.is_number_unsigned()) fail_input("{}: {} is not a non-negative integer", what, field);
  return j.get<std::uint64_t>();
}

std::int64_t get_i64(const Json& j, std::string_view what, std::string_view field) {
  if (j.is_number_unsigned() && j.get<std::uint64_t>() <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return static_cast<std::int64_t>(j.get<std::uint64_t>());
  }
  if (j.is_number_integer() && !j.is_number_unsigned()) return j.get<std::int64_t>();
  fail_input("{}: {} is not a 64-bit integer", what, field);
}

int get_int(const Json& j, std::string_view what, std::string_view field, int lo, int hi) {
  const std::int64_t v = get_i64(j, what, field);
  if (v < lo || v > hi) fail_input("{}: {} is {}, outside [{}, {}]", what, field, v, lo, hi);
  return static_cast<int>(v);
}

const std::string& get_string(const Json& j, std::string_view what, std::string_view field) {
  if (!j.is_string()) fail_input("{}: {} is not a string", what, field);
  return j.get_ref<const std::string&>();
}

const Json& member(const Json& object, std::string_view what, std::string_view key) {
  const auto it = object.find(key);
  if (it == object.end()) fail_input("{}: \"{}\" is missing", what, key);
  return *it;
}

// A planned SRC or DST: the absolute path `mx2nv plan` recorded, which a step
// opens as it is (no NUL byte: no path holds one).
void check_planned_path(const std::string& path, std::string_view what, std::string_view field) {
  if (path.empty() || path.front() != '/' || path.find('\0') != std::string::npos) {
    fail_input("{}: {} {} is not an absolute path", what, field, printable(path));
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
         what, kPlanFormatV2, field, printable(text));
  }
  return text;
}

// Each row's fields against each other and the plan's options; whether the
// row is SRC's is for the step to check (convert/planned.cpp).
void check_row(const ModulePlan& m, const PlanFile& p, const Json& name, std::string_view what) {
  switch (m.treatment) {
    case Treatment::Exact: {
      // The global of an exact transcode is 2^-m, and m lies in the window's
      // global range (the plan never chooses another, verify accepts no other).
      const WindowLimits limits = window_limits(p.window);
      const auto divisor = global_divisor_for(m.m);
      if (m.m < limits.global_min || m.m > limits.global_max || !divisor ||
          std::bit_cast<std::uint32_t>(*divisor) != std::bit_cast<std::uint32_t>(m.divisor)) {
        fail_input("{}: module {} has a global (m {}, divisor {}) the {} window does not allow", what, name.dump(), m.m,
                   m.divisor, window_name(p.window));
      }
      return;
    }
    case Treatment::Requantized:
      if (p.overspan != OverSpanChoice::Requantize || m.m != 0 || m.zero_scales || !std::isfinite(m.divisor) ||
          m.divisor <= 0 || !global_multiplier_fits(p.window, 1.0 / static_cast<double>(m.divisor))) {
        fail_input("{}: module {} is requantized with a global (divisor {}) or in a plan (--overspan {}) that does not "
                   "allow it",
                   what, name.dump(), m.divisor, overspan_name(p.overspan));
      }
      return;
    case Treatment::Bf16:
      if (p.overspan != OverSpanChoice::Bf16 || m.m != 0 || m.zero_scales ||
          std::bit_cast<std::uint32_t>(m.divisor) != std::bit_cast<std::uint32_t>(1.0f)) {
        fail_input("{}: module {} is BF16 in a plan (--overspan {}) that does not write it so", what, name.dump(),
                   overspan_name(p.overspan));
      }
      return;
  }
}

// SRC and DST: the bytes (hex) in the current format, checked against their
// display text; the text itself in mx2nv-plan/2.
void read_paths(const Json& j, bool v2, std::string_view what, PlanFile& p) {
  const std::string& source_text = get_string(member(j, what, "source"), what, "source");
  const std::string& target_text = get_string(member(j, what, "target"), what, "target");
  if (v2) {
    p.source = v2_path(source_text, what, "SRC");
    p.target = v2_path(target_text, what, "DST");
  } else {
    const auto source = from_hex(get_string(member(j, what, "source_bytes"), what, "source_bytes"));
    const auto target = from_hex(get_string(member(j, what, "target_bytes"), what, "target_bytes"));
    if (!source || !target) fail_input("{}: source_bytes or target_bytes is not lower-case hex", what);
    p.source = *source;
    p.target = *target;
    // The display text is derived from the bytes: one more place a damaged
    // or edited plan shows.
    if (json_text(p.source) != source_text || json_text(p.target) != target_text) {
      fail_input("{}: \"source\"/\"target\" do not spell source_bytes/target_bytes", what);
    }
  }
  check_planned_path(p.source, what, "SRC");
  check_planned_path(p.target, what, "DST");
}

void read_shards(const Json& shards, std::string_view what, PlanFile& p) {
  if (!shards.is_array() || shards.empty()) fail_input("{}: \"shards\" is not a non-empty list", what);
  std::set<std::string_view> files;
  for (const Json& s : shards) {
    if (!s.is_object()) fail_input("{}: a shard is not an object", what);
    PlannedShard ps;
    ps.file = get_string(member(s, what, "file"), what, "a shard's file");
    if (!is_confined_relative_path(ps.file)) {
      fail_input("{}: shard {} is not a plain relative path", what, printable(ps.file));
    }
    ps.source_size = get_u64(member(s, what, "source_size"), what, "source_size");
    ps.source_mtime_ns = get_i64(member(s, what, "source_mtime_ns"), what, "source_mtime_ns");
    ps.source_header_hash = get_u64(member(s, what, "source_header_hash"), what, "source_header_hash");
    ps.plan_hash = get_u64(member(s, what, "plan_hash"), what, "plan_hash");
    ps.output_data_bytes = get_u64(member(s, what, "output_data_bytes"), what, "output_data_bytes");
    ps.output_tensors = get_u64(member(s, what, "output_tensors"), what, "output_tensors");
    p.shards.push_back(std::move(ps));
  }
  for (const auto& s : p.shards) {
    if (!files.insert(s.file).second) fail_input("{}: shard {} is planned twice", what, printable(s.file));
  }
}

// One module row (its name, column 0, is read by the caller), checked
// against the plan's window and choice.
ModulePlan read_row(const Json& row, const PlanFile& p, std::string_view what) {
  ModulePlan m;
  m.m = get_int(row[1], what, "m", std::numeric_limits<int>::min(), std::numeric_limits<int>::max());
  const std::uint64_t bits = get_u64(row[2], what, "divisor_bits");
  if (bits > std::numeric_limits<std::uint32_t>::max()) fail_input("{}: divisor_bits {} is not 32 bits", what, bits);
  m.divisor = std::bit_cast<float>(static_cast<std::uint32_t>(bits));
  m.zero_scales = get_int(row[3], what, "zero_scales", 0, 1) != 0;
  m.span = get_int(row[4], what, "span", std::numeric_limits<int>::min(), std::numeric_limits<int>::max());
  m.groups_outside = get_u64(row[5], what, "groups_outside");
  m.canonical_zero_groups = get_u64(row[6], what, "canonical_zero_groups");
  m.marlin_zeroed_groups = get_u64(row[7], what, "marlin_zeroed_groups");
  const int treatment = get_int(row[8], what, "treatment", 0, 255);
  if (treatment > static_cast<int>(Treatment::Bf16)) {
    fail_input("{}: module {} has an unknown treatment {}", what, row[0].dump(), treatment);
  }
  m.treatment = static_cast<Treatment>(treatment);
  check_row(m, p, row[0], what);
  return m;
}

}  // namespace

std::string plan_file_to_text(PlanFile& p) {
  Json j = content_json(p, kPlanFormat);
  p.fingerprint = checksum(j);
  j["fingerprint"] = fmt::format("{:016x}", p.fingerprint);
  return dump_json(j, 1) + "\n";
}

PlanFile plan_file_from_text(std::string_view text, std::string_view what) {
  Json j = parse_strict_json(text, what).value;
  PlanFile p;
  try {
    const Json* format = j.is_object() && j.contains("format") ? &j.at("format") : nullptr;
    const bool v2 = format && *format == kPlanFormatV2;
    if (!format || (*format != kPlanFormat && !v2)) {
      fail_input("{}: not an mx2nv plan ({} expected)", what, kPlanFormat);
    }
    // The checksum first, over the document as it is: damage is named as
    // such, whatever field it hit. (It detects damage, not forgery: whoever
    // edits a plan can recompute it. What a step trusts a plan for, and what
    // it checks against SRC, is in convert/planned.cpp.)
    const std::string stored = get_string(member(j, what, "fingerprint"), what, "fingerprint");
    j.erase("fingerprint");  // the rest is what it sums
    p.fingerprint = checksum(j);
    if (stored != fmt::format("{:016x}", p.fingerprint)) {
      fail_input("{}: checksum mismatch (the plan was edited or damaged); run mx2nv plan again", what);
    }
    p.tool_version = get_string(member(j, what, "tool_version"), what, "tool_version");
    const auto window = parse_window(get_string(member(j, what, "window"), what, "window"));
    if (!window) fail_input("{}: unknown window {}", what, j.at("window").dump());
    p.window = *window;
    const auto overspan = parse_overspan(get_string(member(j, what, "overspan"), what, "overspan"));
    if (!overspan) fail_input("{}: unknown overspan choice {}", what, j.at("overspan").dump());
    p.overspan = *overspan;
    read_paths(j, v2, what, p);
    read_shards(member(j, what, "shards"), what, p);
    const Json& modules = member(j, what, "modules");
    if (!modules.is_array()) fail_input("{}: \"modules\" is not a list", what);
    for (const Json& row : modules) {
      if (!row.is_array() || row.size() != 9) fail_input("{}: a module row is not 9 columns", what);
      p.module_names.push_back(get_string(row[0], what, "a module name"));
      p.modules.push_back(read_row(row, p, what));
    }
    // What was read is what was checked: the canonical text of the values
    // read spells the document (no field ignored, none read differently).
    if (checksum(content_json(p, v2 ? kPlanFormatV2 : kPlanFormat)) != p.fingerprint) {
      fail_input("{}: fields other than a plan's, or spelled otherwise; run mx2nv plan again", what);
    }
  } catch (const Json::exception& e) {
    fail_input("{}: malformed plan: {}", what, e.what());
  }
  return p;
}

Plan plan_for_modules(const PlanFile& file, const std::vector<std::string>& module_names) {
  if (module_names != file.module_names) {
    fail(ErrorKind::Usage, "the plan was made for other quantized modules than SRC holds now ({} planned, {} found); "
                           "SRC changed since: run mx2nv plan again",
         file.module_names.size(), module_names.size());
  }
  Plan plan;
  plan.window = file.window;
  plan.overspan = file.overspan;
  plan.modules = file.modules;
  return plan;
}

}  // namespace mx2nv

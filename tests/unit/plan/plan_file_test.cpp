// The plan file (plan/plan_file.hpp) on its own: written and read without a
// DOM, its checksum still the one every earlier mx2nv computed (XXH3-64 of
// nlohmann's compact dump of the document without "fingerprint"), members
// the reader does not know refused, caps applied as it streams; the line
// reader of the text mx2nv writes agreeing with the streaming reader on
// every plan and every damage.
#include "common/error.hpp"
#include "numerics/formats.hpp"
#include "plan/plan_file.hpp"
#include "common/printable.hpp"
#include "json/json_stream.hpp"
#include "json/strict_json.hpp"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <fmt/format.h>

#include <bit>
#include <optional>
#include <string>
#include <vector>

namespace mx2nv {
namespace {

// A plan with what is hard to spell: non-UTF-8 path bytes, quotes,
// backslashes, controls, C1 and bidi characters, DEL in names.
PlanFile awkward_plan() {
  PlanFile f;
  f.tool_version = MX2NV_VERSION;
  f.source = std::string("/data/src\xff\x1b\"q\\");
  f.target = "/data/dst \xc3\xa9";
  f.shards.push_back({"model-00001-of-00002.safetensors", 10, -5, 7, 9, 100, 4});
  f.shards.push_back({"sub/model-00002-of-00002.safetensors", 11, 1700000000000000000, ~std::uint64_t{0}, 1, 2, 3});
  for (const std::string name : {"layers.0.w1", "layers.0.w\xc2\x9b" "3", "layers.1.\x7f\xe2\x80\xae", "q\"\\"}) {
    ModulePlan m;
    m.m = 3;
    m.divisor = *global_divisor_for(3);
    m.span = -2;
    m.groups_outside = 5;
    m.canonical_zero_groups = ~std::uint64_t{0};
    f.module_names.push_back(name);
    f.modules.push_back(m);
  }
  return f;
}

std::string what_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "accepted";
  return "";
}

TEST(PlanFile, TheChecksumIsTheCompactDumpOfTheDocumentAsEver) {
  PlanFile f = awkward_plan();
  const std::string text = plan_file_to_text(f);
  Json j = Json::parse(text);
  EXPECT_EQ(j["fingerprint"], fmt::format("{:016x}", f.fingerprint));
  j.erase("fingerprint");
  const std::string canonical = dump_json(j, -1);
  EXPECT_EQ(XXH3_64bits(canonical.data(), canonical.size()), f.fingerprint);
  // And it reads back as written.
  const PlanFile back = plan_file_from_text(text, "plan");
  EXPECT_EQ(back.source, f.source);
  EXPECT_EQ(back.target, f.target);
  EXPECT_EQ(back.module_names, f.module_names);
  ASSERT_EQ(back.shards.size(), 2u);
  EXPECT_EQ(back.shards[0].source_mtime_ns, -5);
  EXPECT_EQ(back.shards[1].source_header_hash, ~std::uint64_t{0});
  EXPECT_EQ(back.modules[1].canonical_zero_groups, ~std::uint64_t{0});
  EXPECT_EQ(back.fingerprint, f.fingerprint);
  // A plan as nlohmann lays it out (as earlier mx2nv wrote it) reads too.
  Json again = Json::parse(text);
  EXPECT_EQ(plan_file_from_text(dump_json(again, 1), "nlohmann").fingerprint, f.fingerprint);
}

TEST(PlanFile, DamageIsNamedAsSuchBeforeAnyField) {
  PlanFile f = awkward_plan();
  const std::string text = plan_file_to_text(f);
  // A number become a string, a float, a negative: the checksum speaks first.
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"source_size\":10", "\"source_size\":\"10\""},
           {"\"source_size\":10", "\"source_size\":10.0"},
           {"\"source_size\":10", "\"source_size\":-10"},
           {"\"window\": \"marlin\"", "\"window\": \"e4m3\""}}) {
    std::string t = text;
    const auto at = t.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    t.replace(at, from.size(), to);
    EXPECT_NE(what_of([&] { plan_file_from_text(t, "p"); }).find("checksum mismatch"), std::string::npos) << to;
  }
  // Members moved out of the order mx2nv writes them: edited.
  Json j = Json::parse(text);
  std::string moved = "{\"window\": " + dump_json(j["window"], -1) + ",";
  j.erase("window");
  moved += dump_json(j, 1).substr(1);
  EXPECT_NE(what_of([&] { plan_file_from_text(moved, "p"); }).find("checksum mismatch"), std::string::npos);
}

TEST(PlanFile, MembersItDoesNotKnowAreRefusedWithAnExcerptOfTheirName) {
  PlanFile f = awkward_plan();
  const std::string text = plan_file_to_text(f);
  std::string t = text;
  t.insert(1, "\"" + std::string(100000, 'k') + "\": 1,");
  const std::string what = what_of([&] { plan_file_from_text(t, "p"); });
  EXPECT_NE(what.find("is not a field of a plan"), std::string::npos);
  EXPECT_LT(what.size(), 400u);
  t = text;
  t.insert(1, "\"window\": \"marlin\",");
  EXPECT_NE(what_of([&] { plan_file_from_text(t, "p"); }).find("duplicate JSON key"), std::string::npos);
  t = text;
  const auto shard = t.find("{\"file\"");
  t.insert(shard + 1, "\"extra\":1,");
  EXPECT_NE(what_of([&] { plan_file_from_text(t, "p"); }).find("not a field of a planned shard"), std::string::npos);
}

TEST(PlanFile, CapsApplyAsItStreams) {
  PlanFile f = awkward_plan();
  f.target = "/" + std::string(kMaxPlanPathBytes, 'x');
  const std::string what = what_of([&] { plan_file_from_text(plan_file_to_text(f), "p"); });
  EXPECT_NE(what.find("longer than"), std::string::npos) << what;
  EXPECT_LT(what.size(), 400u);
  f = awkward_plan();
  f.shards.front().file = std::string(kMaxPlanPathBytes + 1, 'f');
  EXPECT_NE(what_of([&] { plan_file_from_text(plan_file_to_text(f), "p"); }).find("longer than a path"),
            std::string::npos);
  const struct : ByteSource {
    void read_at(std::uint64_t, std::span<std::byte>) const override { ADD_FAILURE() << "read past the cap"; }
  } never_read;
  EXPECT_NE(what_of([&] { plan_file_from_source(never_read, kMaxPlanBytes + 1, "p"); }).find("a plan may have"),
            std::string::npos);
}

// A requantize plan (mx2nv plan --requantize): "kind" recorded and read
// back; a conversion's plan has no such member; rows must all be requantized
// under a positive global, whatever the window; "kind" can spell nothing else.
TEST(PlanFile, ARequantizePlanSaysSoAndHoldsOnlyRequantizedRows) {
  PlanFile convert = awkward_plan();
  EXPECT_EQ(plan_file_to_text(convert).find("\"kind\""), std::string::npos);
  PlanFile f = awkward_plan();
  f.kind = PlanKind::Requantize;
  for (ModulePlan& m : f.modules) m = ModulePlan{Treatment::Requantized, 0, 1e-30f};  // far outside any window
  const std::string text = plan_file_to_text(f);
  EXPECT_NE(text.find("\"kind\": \"requantize\""), std::string::npos);
  const PlanFile back = plan_file_from_text(text, "plan");
  EXPECT_EQ(back.kind, PlanKind::Requantize);
  EXPECT_EQ(plan_for_modules(back, {f.module_names.begin(), f.module_names.end()}).kind, PlanKind::Requantize);
  EXPECT_EQ(plan_file_from_text(plan_file_to_text(convert), "plan").kind, PlanKind::Convert);
  // The same rows in a conversion's plan are refused (no --overspan requantize, outside the window).
  PlanFile unmarked = f;
  unmarked.kind = PlanKind::Convert;
  EXPECT_NE(what_of([&] { plan_file_from_text(plan_file_to_text(unmarked), "p"); }).find("requantized"),
            std::string::npos);
  // An exact row, or a global that is not positive, in a requantize plan.
  PlanFile exact = f;
  exact.modules[1] = convert.modules[1];
  EXPECT_NE(what_of([&] { plan_file_from_text(plan_file_to_text(exact), "p"); }).find("requantize plan"),
            std::string::npos);
  PlanFile negative = f;
  negative.modules[0].divisor = -1.0f;
  EXPECT_NE(what_of([&] { plan_file_from_text(plan_file_to_text(negative), "p"); }).find("requantize plan"),
            std::string::npos);
  // Window counts in a requantize plan's row: summed into the report and finished.json, so refused.
  for (std::size_t field = 0; field < 4; ++field) {
    PlanFile counted = f;
    ModulePlan& m = counted.modules[field % counted.modules.size()];
    if (field == 0) m.span = 3;
    if (field == 1) m.groups_outside = 1;
    if (field == 2) m.canonical_zero_groups = std::uint64_t{1} << 63;
    if (field == 3) m.marlin_zeroed_groups = 2;
    EXPECT_NE(what_of([&] { plan_file_from_text(plan_file_to_text(counted), "p"); }).find("window counts"),
              std::string::npos)
        << field;
  }
  // "kind" spelled otherwise, with the checksum made to agree: still refused.
  Json j = Json::parse(text);
  j["kind"] = "convert";
  j.erase("fingerprint");
  const std::string canonical = dump_json(j, -1);
  j["fingerprint"] = fmt::format("{:016x}", XXH3_64bits(canonical.data(), canonical.size()));
  EXPECT_NE(what_of([&] { plan_file_from_text(dump_json(j, 1), "p"); }).find("\"kind\" is not"), std::string::npos);
}

TEST(PlanFile, TheOutputFormatIsSpelledOnlyWhenItIsNotTheDefault) {
  PlanFile f = awkward_plan();
  EXPECT_EQ(plan_file_to_text(f).find("output_format"), std::string::npos);
  f.format = TargetFormat::ModelOpt;
  const std::string text = plan_file_to_text(f);
  EXPECT_NE(text.find("\"output_format\": \"modelopt\""), std::string::npos);
  const PlanFile back = plan_file_from_text(text, "plan");
  EXPECT_EQ(back.format, TargetFormat::ModelOpt);
  EXPECT_EQ(plan_for_modules(back, {f.module_names.begin(), f.module_names.end()}).format, TargetFormat::ModelOpt);
  // A requantized row in a ModelOpt plan holds ModelOpt's weight_scale_2 as it
  // is (a multiplier, no power of two): read back bit for bit; one that is no
  // positive normal float is refused.
  PlanFile lossy = f;
  lossy.kind = PlanKind::Requantize;
  for (ModulePlan& m : lossy.modules) m = ModulePlan{Treatment::Requantized, 0, 6.0f / 2688.0f};
  const PlanFile lossy_back = plan_file_from_text(plan_file_to_text(lossy), "p");
  ASSERT_EQ(lossy_back.modules.size(), lossy.modules.size());
  EXPECT_EQ(std::bit_cast<std::uint32_t>(lossy_back.modules[0].divisor), std::bit_cast<std::uint32_t>(6.0f / 2688.0f));
  for (const float bad : {0x1p-140f, 0.0f, -1.0f}) {
    for (ModulePlan& m : lossy.modules) m = ModulePlan{Treatment::Requantized, 0, bad};
    EXPECT_NE(what_of([&] { plan_file_from_text(plan_file_to_text(lossy), "p"); }).find("positive normal"),
              std::string::npos)
        << bad;
  }
  // Spelled otherwise (the default, another case, not a string), the checksum made to agree: refused.
  for (const Json& bad : {Json("compressed-tensors"), Json("ModelOpt"), Json(1)}) {
    Json j = Json::parse(text);
    j["output_format"] = bad;
    j.erase("fingerprint");
    const std::string canonical = dump_json(j, -1);
    j["fingerprint"] = fmt::format("{:016x}", XXH3_64bits(canonical.data(), canonical.size()));
    EXPECT_NE(what_of([&] { plan_file_from_text(dump_json(j, 1), "p"); }).find("output_format"), std::string::npos)
        << bad.dump();
  }
}

// A plan whose strings are all printable ASCII (what the line reader takes),
// with rows of every kind of value.
PlanFile plain_plan() {
  PlanFile f;
  f.tool_version = MX2NV_VERSION;
  f.source = "/data/src";
  f.target = "/data/dst";
  f.shards.push_back({"model-00001-of-00003.safetensors", 10, -5, 7, 9, 100, 4});
  f.shards.push_back({"model-00002-of-00003.safetensors", 11, 1700000000000000000, ~std::uint64_t{0}, 1, 2, 3});
  f.shards.push_back({"model-00003-of-00003.safetensors", 0, 0, 0, 0, 0, 0});
  for (int i = 0; i < 6; ++i) {
    ModulePlan m;
    m.m = -13 + i;
    m.divisor = *global_divisor_for(m.m);
    m.zero_scales = i % 2 == 1;
    m.span = i - 2;
    m.groups_outside = static_cast<std::uint64_t>(i);
    m.canonical_zero_groups = i == 5 ? ~std::uint64_t{0} : 0;
    m.marlin_zeroed_groups = 3;
    f.module_names.push_back(fmt::format("model.layers.{}.mlp.experts.{}.w{}", i / 3, i, 1 + i % 3));
    f.modules.push_back(m);
  }
  return f;
}

// What a reader made of a text: the plan, or the refusal (kind and message).
struct Outcome {
  std::optional<PlanFile> plan;
  std::optional<ErrorKind> kind;
  std::string message;
};

Outcome outcome_of(const std::function<PlanFile()>& read) {
  Outcome o;
  try {
    o.plan = read();
  } catch (const Error& e) {
    o.kind = e.kind();
    o.message = e.what();
  }
  return o;
}

void expect_same_plan(const PlanFile& a, const PlanFile& b, const std::string& context) {
  EXPECT_EQ(a.kind, b.kind) << context;
  EXPECT_EQ(a.tool_version, b.tool_version) << context;
  EXPECT_EQ(a.window, b.window) << context;
  EXPECT_EQ(a.over_span_choice, b.over_span_choice) << context;
  EXPECT_EQ(a.format, b.format) << context;
  EXPECT_EQ(a.source, b.source) << context;
  EXPECT_EQ(a.target, b.target) << context;
  EXPECT_EQ(a.fingerprint, b.fingerprint) << context;
  EXPECT_EQ(a.module_names, b.module_names) << context;
  ASSERT_EQ(a.shards.size(), b.shards.size()) << context;
  for (std::size_t s = 0; s < a.shards.size(); ++s) {
    const PlannedShard& x = a.shards[s];
    const PlannedShard& y = b.shards[s];
    EXPECT_TRUE(x.file == y.file && x.source_size == y.source_size && x.source_mtime_ns == y.source_mtime_ns &&
                x.source_header_hash == y.source_header_hash && x.plan_hash == y.plan_hash &&
                x.output_data_bytes == y.output_data_bytes && x.output_tensors == y.output_tensors)
        << context << ": shard " << s;
  }
  ASSERT_EQ(a.modules.size(), b.modules.size()) << context;
  for (std::size_t i = 0; i < a.modules.size(); ++i) {
    const ModulePlan& x = a.modules[i];
    const ModulePlan& y = b.modules[i];
    EXPECT_TRUE(x.treatment == y.treatment && x.m == y.m &&
                std::bit_cast<std::uint32_t>(x.divisor) == std::bit_cast<std::uint32_t>(y.divisor) &&
                x.zero_scales == y.zero_scales && x.span == y.span && x.groups_outside == y.groups_outside &&
                x.canonical_zero_groups == y.canonical_zero_groups && x.marlin_zeroed_groups == y.marlin_zeroed_groups)
        << context << ": row " << i;
  }
}

// Reading `text` as every step does gives the streaming reader's verdict:
// the same plan, or the same refusal and message. Returns whether the line
// reader took it.
bool expect_one_verdict(const std::string& text, const std::string& context) {
  const MemorySource source(text);
  const Outcome both = outcome_of([&] { return plan_file_from_text(text, "p"); });
  const Outcome streamed = outcome_of([&] { return plan_file_streamed(source, text.size(), "p"); });
  std::optional<PlanFile> lines;
  try {
    lines = plan_file_as_written(source, text.size(), "p");
  } catch (const Error& e) {
    ADD_FAILURE() << context << ": the line reader refused instead of declining: " << e.what();
  }
  EXPECT_EQ(both.kind, streamed.kind) << context << "\n" << both.message << "\n" << streamed.message;
  EXPECT_EQ(both.message, streamed.message) << context;
  if (both.plan && streamed.plan) expect_same_plan(*both.plan, *streamed.plan, context);
  if (lines) {
    EXPECT_TRUE(streamed.plan.has_value()) << context << ": the line reader took what the stream refuses: "
                                           << streamed.message;
    if (streamed.plan) expect_same_plan(*lines, *streamed.plan, context + " (line reader)");
  }
  return lines.has_value();
}

TEST(PlanFile, TheLineReaderTakesTheTextMx2nvWritesAndAgreesWithTheStream) {
  std::vector<std::pair<std::string, PlanFile>> plans;
  plans.emplace_back("plain", plain_plan());
  PlanFile e4m3 = plain_plan();
  e4m3.window = Window::E4M3;
  plans.emplace_back("e4m3", e4m3);
  PlanFile modelopt = plain_plan();
  modelopt.format = TargetFormat::ModelOpt;
  plans.emplace_back("modelopt", modelopt);
  PlanFile bf16 = plain_plan();
  bf16.over_span_choice = OverSpanChoice::Bf16;
  bf16.modules[2] = ModulePlan{Treatment::Bf16, 0, 1.0f, false, 15, 0, 0, 0};
  plans.emplace_back("bf16", bf16);
  PlanFile requantize = plain_plan();
  requantize.kind = PlanKind::Requantize;
  for (ModulePlan& m : requantize.modules) m = ModulePlan{Treatment::Requantized, 0, 3.0f};
  plans.emplace_back("requantize", requantize);
  PlanFile no_rows = plain_plan();
  no_rows.modules.clear();
  no_rows.module_names.clear();
  plans.emplace_back("no rows", no_rows);
  for (auto& [name, plan] : plans) {
    const std::string text = plan_file_to_text(plan);
    EXPECT_TRUE(expect_one_verdict(text, name)) << name << ": declined\n" << text;
    const MemorySource source(text);
    const auto lines = plan_file_as_written(source, text.size(), "p");
    ASSERT_TRUE(lines.has_value()) << name;
    expect_same_plan(*lines, plan, name + " as written");
  }
  // Strings it does not take as they stand (non-ASCII, escapes): the stream
  // reads them, with the same result.
  PlanFile awkward = awkward_plan();
  EXPECT_FALSE(expect_one_verdict(plan_file_to_text(awkward), "awkward"));
  // A line longer than the line reader's window (a name of 2 MiB, which a
  // plan may hold): the stream reads it.
  PlanFile long_name = plain_plan();
  long_name.module_names[1] = std::string(2 << 20, 'n');
  EXPECT_FALSE(expect_one_verdict(plan_file_to_text(long_name), "a 2 MiB name"));
  // The layout nlohmann writes (earlier mx2nv): read by the stream.
  PlanFile plain = plain_plan();
  EXPECT_FALSE(expect_one_verdict(dump_json(Json::parse(plan_file_to_text(plain)), 1), "nlohmann's layout"));
}

TEST(PlanFile, EveryDamageOrEditGetsTheStreamingReadersVerdict) {
  PlanFile f = plain_plan();
  const std::string text = plan_file_to_text(f);
  // Each byte replaced, removed and doubled: the checksum, the syntax, an
  // escape, a separator, a row's value, whitespace: one verdict, one message.
  int taken = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    for (const char c : std::string("0 -9\"\\,]}\nx")) {
      if (c == text[i]) continue;
      std::string t = text;
      t[i] = c;
      taken += expect_one_verdict(t, fmt::format("byte {} as {:?}", i, c));
    }
    std::string removed = text;
    removed.erase(i, 1);
    taken += expect_one_verdict(removed, fmt::format("byte {} removed", i));
    std::string doubled = text;
    doubled.insert(i, 1, text[i]);
    taken += expect_one_verdict(doubled, fmt::format("byte {} doubled", i));
  }
  EXPECT_EQ(taken, 0) << "a damaged plan read as if it were whole";
  // Lines removed, repeated and swapped; text after the end; a truncated file.
  std::vector<std::string> lines;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t nl = text.find('\n', at);
    lines.push_back(text.substr(at, nl + 1 - at));
    at = nl + 1;
  }
  const auto join = [](const std::vector<std::string>& v) {
    std::string out;
    for (const auto& l : v) out += l;
    return out;
  };
  for (std::size_t i = 0; i < lines.size(); ++i) {
    std::vector<std::string> v = lines;
    v.erase(v.begin() + static_cast<std::ptrdiff_t>(i));
    expect_one_verdict(join(v), fmt::format("line {} removed", i));
    v = lines;
    v.insert(v.begin() + static_cast<std::ptrdiff_t>(i), lines[i]);
    expect_one_verdict(join(v), fmt::format("line {} repeated", i));
    if (i + 1 < lines.size()) {
      v = lines;
      std::swap(v[i], v[i + 1]);
      expect_one_verdict(join(v), fmt::format("lines {} and {} swapped", i, i + 1));
    }
  }
  for (const std::string tail : {"", " ", "\n", "x", "{}"}) expect_one_verdict(text + tail, "tail " + tail);
  for (std::size_t cut = 0; cut < text.size(); cut += 7) expect_one_verdict(text.substr(0, cut), "truncated");
  // Edits in the text mx2nv writes, the checksum made to agree (the file is
  // canonical, the plan is not one mx2nv makes): refused by the same checks.
  std::vector<std::pair<std::string, std::function<void(PlanFile&)>>> edits = {
      {"m outside the window", [](PlanFile& p) { p.modules[0].m = 40; }},
      {"global not 2^-m", [](PlanFile& p) { p.modules[1].divisor = 3.0f; }},
      {"treatment BF16 in a plan that fails", [](PlanFile& p) { p.modules[2].treatment = Treatment::Bf16; }},
      {"a shard twice", [](PlanFile& p) { p.shards[1].file = p.shards[0].file; }},
      {"a shard outside SRC", [](PlanFile& p) { p.shards[1].file = "../x.safetensors"; }},
      {"no shards", [](PlanFile& p) { p.shards.clear(); }},
      {"a relative DST", [](PlanFile& p) { p.target = "dst"; }},
      {"another tool version", [](PlanFile& p) { p.tool_version = "0.0.1"; }},
  };
  for (auto& [name, edit] : edits) {
    PlanFile edited = plain_plan();
    edit(edited);
    expect_one_verdict(plan_file_to_text(edited), name);
  }
}

TEST(Excerpt, CutsLongTextAtACharacterAndSaysHowLongItWas) {
  EXPECT_EQ(excerpt("short"), "short");
  EXPECT_EQ(excerpt(std::string(300, 'a'), 10), "aaaaaaaaaa... (300 bytes)");
  // "é" is two bytes: a cut inside it moves back before it.
  EXPECT_EQ(excerpt("abcdefghi\xc3\xa9xyz", 10), "abcdefghi... (14 bytes)");
  EXPECT_EQ(excerpt("\x1b[2Jxyz", 4), "\\x1b[2J... (7 bytes)");
}

}  // namespace
}  // namespace mx2nv

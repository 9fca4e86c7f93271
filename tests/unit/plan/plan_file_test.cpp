// The plan file (plan/plan_file.hpp) on its own: written and read without a
// DOM, its checksum still the one every earlier mx2nv computed (XXH3-64 of
// nlohmann's compact dump of the document without "fingerprint"), members
// the reader does not know refused, caps applied as it streams.
#include "common/error.hpp"
#include "numerics/formats.hpp"
#include "plan/plan_file.hpp"
#include "common/printable.hpp"
#include "json/strict_json.hpp"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <fmt/format.h>

#include <bit>
#include <string>

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
  // A requantized row in a ModelOpt plan (its global would be written as an inexact reciprocal): refused.
  PlanFile lossy = f;
  lossy.kind = PlanKind::Requantize;
  for (ModulePlan& m : lossy.modules) m = ModulePlan{Treatment::Requantized, 0, 3.0f};
  EXPECT_NE(what_of([&] { plan_file_from_text(plan_file_to_text(lossy), "p"); }).find("modelopt"), std::string::npos);
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

TEST(Excerpt, CutsLongTextAtACharacterAndSaysHowLongItWas) {
  EXPECT_EQ(excerpt("short"), "short");
  EXPECT_EQ(excerpt(std::string(300, 'a'), 10), "aaaaaaaaaa... (300 bytes)");
  // "é" is two bytes: a cut inside it moves back before it.
  EXPECT_EQ(excerpt("abcdefghi\xc3\xa9xyz", 10), "abcdefghi... (14 bytes)");
  EXPECT_EQ(excerpt("\x1b[2Jxyz", 4), "\\x1b[2J... (7 bytes)");
}

}  // namespace
}  // namespace mx2nv

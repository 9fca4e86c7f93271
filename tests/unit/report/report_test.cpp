// write_report_json streams the per-module arrays row by row; its text must
// be dump_json(report_to_json(r)) byte for byte, whatever the rows hold.
#include "common/printable.hpp"
#include "report/report.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include <limits>
#include <string>

namespace mx2nv {
namespace {

std::string streamed(const Report& r) {
  std::string out;
  write_report_json(r, [&](std::string_view piece) { out += piece; });
  return out;
}

Report report_of(Command command) {
  Report r;
  r.command = command;
  r.provenance.source = "src";
  r.provenance.tool_version = "0.1.0";
  return r;
}

TEST(ReportJson, StreamedTextIsTheDocumentsDump) {
  for (const Command c : {Command::Convert, Command::Verify, Command::Requantize, Command::Inspect}) {
    Report r = report_of(c);
    EXPECT_EQ(streamed(r), dump_json(report_to_json(r))) << command_name(c);  // empty arrays, no rows
    // Names a hostile checkpoint may hold: quotes, a newline, DEL, the marker
    // text itself, non-ASCII, a C1 control.
    const std::string names[] = {"plain.w1", "q\"uote", "new\nline", "del\x7f", "\n  \"requantized\": []",
                                 "\xc3\xa9t\xc3\xa9", "c1\xc2\x85"};
    for (int i = 0; i < 7; ++i) {
      r.refused_spans.push_back({names[i], 20 + i, 17, static_cast<std::uint64_t>(i)});
      if (c == Command::Requantize || c == Command::Convert) {
        r.requantized.push_back({names[i], 448.0f * static_cast<float>(i), 2048u * static_cast<unsigned>(i), i ? 0.01 / i : 0.0,
                                 1.0 - 1e-6 * i, i == 3 ? std::numeric_limits<double>::infinity() : 0.5 * i,
                                 static_cast<std::uint64_t>(i)});
      }
    }
    r.differences = {"a difference", "another"};
    EXPECT_EQ(streamed(r), dump_json(report_to_json(r))) << command_name(c);
  }
}

TEST(ReportJson, GatheredTextIsTheSame) {
  Report r = report_of(Command::Requantize);
  r.requantized.push_back({"m", 1.0f, 16, 0.1, 0.9, 0.2, 0});
  EXPECT_EQ(report_json_text(r), dump_json(report_to_json(r)));
}


// A report with every member its writer may write.
Report full_report(Command c) {
  Report r = report_of(c);
  r.provenance.target = "/dst/\xff";
  r.provenance.revision = "abc";
  r.modules = 48;
  r.scale_groups = 32;
  r.shards = 4;
  r.zero_groups = 0;
  r.source_tensor_bytes = 1000;
  r.target_tensor_bytes = 1049;
  r.values_compared = 123;
  r.mismatches = 0;
  r.max_abs_error = std::numeric_limits<double>::infinity();
  r.copy_mode = CopyMode::Auto;
  r.copied_bytes = 5;
  r.refused_spans = {{"m.w1", 20, 17, 3}, {"q\"uote\x7f", 18, 17, 1}};
  r.resolved_spans = r.refused_spans;
  r.global_conflicts = {{"a+b", 3, -12, -5, 2, -8, 10}};
  r.unrepresentable_globals = {"a+b"};
  r.requantized = {{"m.w1", 0.1f, 2048, 0.01, 0.99, std::nan(""), 4}, {"m.w2", 448.0f, 16, 0, 1, 0.25, 0}};
  r.over_span_choice = OverSpanChoice::Requantize;
  r.bf16_layers = {{"model.layers.1", {"m.w1"}, {"m.w1", "m.w3"}, 100, 300}};
  r.requantized_marlin_zeroed_blocks = 4;
  r.fingerprint = Fingerprint{"xxh3-128:" + std::string(32, 'a'), "xxh3-128:" + std::string(32, 'b'), 7, 9};
  r.differences = {"one", "two"};
  r.shard_subset = "1/3";
  r.resolved_source = "/src";
  r.resolved_target = "/dst";
  r.merged_parts = 3;
  r.seconds = 1.23456;
  return r;
}

TEST(ReportJson, ReadBackAndWrittenAgainTheTextIsTheSame) {
  for (const Command c : {Command::Convert, Command::Verify, Command::Requantize, Command::Inspect, Command::Plan}) {
    for (Report r : {report_of(c), full_report(c)}) {
      const std::string text = report_json_text(r);
      const Report back = report_from_text(text, "r.json", 1 << 20, 1 << 16);
      EXPECT_EQ(report_json_text(back), text) << command_name(c);
      r.set_error(Error(ErrorKind::Usage, "bad \x01 call"));
      const std::string failed = report_json_text(r);
      EXPECT_EQ(report_json_text(report_from_text(failed, "r.json", 1 << 20, 1 << 16)), failed);
    }
  }
}

std::string read_error(Json j) {
  try {
    report_from_json(j, "r.json");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
    return e.what();
  }
  return "no error";
}

TEST(ReportJson, ReadingRefusesWrongTypesUnknownKeysAndContradictions) {
  const Json good = report_to_json(full_report(Command::Verify));
  Json j = good;
  j["counts"]["modules"] = "48";
  EXPECT_EQ(read_error(j), "r.json: \"counts.modules\" must be an unsigned integer, not a string");
  j = good;
  j["requantized"][1]["global_scale"] = 0.1;  // not a float
  EXPECT_EQ(read_error(j), "r.json: \"requantized[1].global_scale\" must be a single-precision number");
  j = good;
  j["overspan"]["extra"] = 1;
  EXPECT_EQ(read_error(j), "r.json: \"overspan.extra\" is not a key of a report");
  j = good;
  j.erase("window");
  EXPECT_EQ(read_error(j), "r.json: \"window\" is missing");
  j = good;
  j["exit_code"] = 3;
  EXPECT_EQ(read_error(j), "r.json: \"exit_code\" is 3, which contradicts the rest of the report (0)");
  j = good;
  j["counts"]["global_conflicts"] = 2;
  EXPECT_EQ(read_error(j), "r.json: \"counts.global_conflicts\" is 2, which contradicts the rest of the report (1)");
  j = good;
  j["error"] = "x";
  EXPECT_EQ(read_error(j), "r.json: \"error\" is present, where the rest of the report says it is absent");
  j = good;
  j["overspan"]["bf16_layers"][0]["bf16_bytes"] = 18446744073709551615ull;
  EXPECT_EQ(read_error(j), "r.json: \"overspan.bf16_layers[0].bf16_bytes\" is 18446744073709551615, out of range");
  j = good;
  j["window"] = "wide";
  EXPECT_EQ(read_error(j), "r.json: \"window\" is \"wide\", not one mx2nv writes");
  j = good;
  j["differences"] = Json::array();
  for (int i = 0; i < 300; ++i) j["differences"].push_back("d");
  EXPECT_EQ(read_error(j), "r.json: \"differences\" has 300 items, more than 202");
  EXPECT_EQ(read_error(Json::array()), "r.json: the document must be an object, not an array");
  // Distances are never negative; a cosine may be.
  j = good;
  j["max_abs_error"] = -0.5;
  EXPECT_EQ(read_error(j), "r.json: \"max_abs_error\" must be a non-negative number or \"inf\", not -0.5");
  j = good;
  j["requantized"][0]["relative_rmse"] = -1;
  EXPECT_EQ(read_error(j), "r.json: \"requantized[0].relative_rmse\" must be a non-negative number or \"inf\", not -1");
  j = good;
  j["requantized"][0]["cosine"] = -0.25;
  EXPECT_EQ(report_from_json(j, "r.json").requantized[0].cosine, -0.25);
  // A span or a limit is a count of binades.
  j = good;
  j["over_span"][0]["span"] = -1;
  EXPECT_EQ(read_error(j), "r.json: \"over_span[0].span\" is -1, outside [0, 2147483647]");
}

// size_change_percent is derived from the two sizes; null is the figure
// withheld (read back as withheld, written null again), any other value must
// be the derived one.
TEST(ReportJson, SizeChangeIsDerivedOrWithheld) {
  const Json good = report_to_json(full_report(Command::Verify));
  ASSERT_TRUE(good["size_change_percent"].is_number());
  EXPECT_FALSE(report_from_json(good, "r.json").size_change_withheld);
  Json j = good;
  j["size_change_percent"] = nullptr;
  const Report withheld = report_from_json(j, "r.json");
  EXPECT_TRUE(withheld.size_change_withheld);
  EXPECT_FALSE(withheld.size_change_percent().has_value());
  EXPECT_EQ(report_to_json(withheld), j);
  j["size_change_percent"] = 1.5;
  EXPECT_NE(read_error(j).find("\"size_change_percent\" is 1.5, which contradicts the rest of the report"), std::string::npos);
  // Not computable (a size not computed): null is what the writer gives.
  j = good;
  j["source_tensor_bytes"] = nullptr;
  j["size_change_percent"] = nullptr;
  const Report unknown = report_from_json(j, "r.json");
  EXPECT_FALSE(unknown.size_change_withheld);
  EXPECT_EQ(report_to_json(unknown), j);
}

}  // namespace
}  // namespace mx2nv

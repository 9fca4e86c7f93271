// write_report_json streams the per-module arrays row by row; its text must
// be dump_json(report_to_json(r)) byte for byte, whatever the rows hold.
#include "common/printable.hpp"
#include "report/report.hpp"

#include <gtest/gtest.h>

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
      r.over_span.push_back({names[i], 20 + i, 17, static_cast<std::uint64_t>(i)});
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

}  // namespace
}  // namespace mx2nv

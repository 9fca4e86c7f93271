// The runtime probe's answer is another program's output: only the
// protocol is accepted, every string is capped, and agreement with gate's
// scheme rule is decided for every combination.
#include "common/error.hpp"
#include "gate/opinion.hpp"

#include <gtest/gtest.h>

namespace mx2nv {
namespace {

const std::vector<Runtime> kBoth = {Runtime::Vllm, Runtime::Sglang};

std::string answer(const std::string& runtimes) {
  return R"({"probe": 1, "python": "3.11.7", "layer": "m.experts", "projections": ["w1", "w3", "w2"], "runtimes": [)" +
         runtimes + "]}";
}

std::string entry(const std::string& runtime, const std::string& outcome, const std::string& selected = "null",
                  const std::string& version = "0.34.0", const std::string& reason = "") {
  return R"({"runtime": ")" + runtime + R"(", "installed": true, "version": ")" + version +
         R"(", "pinned": "x", "outcome": ")" + outcome + R"(", "selected": )" + selected + R"(, "reason": ")" +
         reason + R"("})";
}

TEST(RuntimeOpinion, ParsesEachOutcome) {
  const ProbeAnswer a = parse_probe_answer(
      answer(entry("vllm", "selected", R"({"class": "CompressedTensorsW4A4Nvfp4MoEMethod", "args": {"use_a16": true}})") +
             "," + entry("sglang", "refused", "null", "0.5.24", "ValueError: no")),
      kBoth);
  EXPECT_EQ(a.python_version, "3.11.7");
  ASSERT_EQ(a.runtimes.size(), 2u);
  EXPECT_EQ(a.runtimes[0].runtime, Runtime::Vllm);
  EXPECT_EQ(a.runtimes[0].answer, RuntimeOpinion::Answer::Selected);
  EXPECT_EQ(a.runtimes[0].selected, "CompressedTensorsW4A4Nvfp4MoEMethod(use_a16=True)");
  EXPECT_TRUE(a.runtimes[0].selects_nvfp4a16);
  EXPECT_EQ(a.runtimes[0].pinned, "0.34.0");  // ours, not the probe's "x"
  EXPECT_FALSE(a.runtimes[0].version_differs());
  EXPECT_EQ(a.runtimes[1].answer, RuntimeOpinion::Answer::Refused);
  EXPECT_EQ(a.runtimes[1].reason, "ValueError: no");
  EXPECT_TRUE(a.runtimes[1].version_differs());  // 0.5.24 is not the pinned 0.5.23
}

TEST(RuntimeOpinion, AnswersInTheOrderAskedAndFillsTheMissing) {
  const ProbeAnswer a = parse_probe_answer(answer(entry("sglang", "not-installed", "null", "")), kBoth);
  ASSERT_EQ(a.runtimes.size(), 2u);
  EXPECT_EQ(a.runtimes[0].runtime, Runtime::Vllm);
  EXPECT_EQ(a.runtimes[0].answer, RuntimeOpinion::Answer::CouldNotAsk);
  EXPECT_NE(a.runtimes[0].reason.find("no entry"), std::string::npos);
  EXPECT_EQ(a.runtimes[1].answer, RuntimeOpinion::Answer::NotInstalled);
  EXPECT_FALSE(a.runtimes[1].version_differs());  // unknown version: no claim
}

TEST(RuntimeOpinion, RefusesWhatIsNotTheProtocol) {
  const std::string sel = R"({"class": "C", "args": {}})";
  const std::vector<std::string> bad = {
      "",
      "Traceback (most recent call last):",
      "[]",
      R"({"probe": 2, "python": "3", "runtimes": []})",
      R"({"python": "3", "runtimes": []})",
      R"({"probe": 1, "python": 3, "runtimes": []})",
      R"({"probe": 1, "python": "3", "runtimes": {}})",
      R"({"probe": 1, "python": "3", "python": "3", "runtimes": []})",  // duplicate key
      answer("1"),
      answer(entry("trtllm", "selected", sel)),                              // not asked
      answer(entry("vllm", "selected", sel) + "," + entry("vllm", "refused")),  // twice
      answer(entry("vllm", "maybe")),                                        // unknown outcome
      answer(entry("vllm", "selected")),                                     // selected without a selection
      answer(entry("vllm", "selected", R"({"class": "C"})")),
      answer(entry("vllm", "selected", R"({"class": "C", "args": {"x": [1]}})")),  // not a scalar
      answer(entry("vllm", "selected", R"({"class": 7, "args": {}})")),
      answer(R"({"runtime": "vllm", "outcome": "refused"})"),  // no version, no reason
      answer(entry("vllm", "refused")) + "trailing",
  };
  for (const auto& text : bad) {
    try {
      parse_probe_answer(text, kBoth);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidInput) << text;
    }
  }
}

TEST(RuntimeOpinion, CapsEveryString) {
  const std::string huge(100'000, 'x');
  const ProbeAnswer a = parse_probe_answer(
      answer(entry("vllm", "refused", "null", huge, huge) + "," +
             entry("sglang", "selected", R"({"class": ")" + huge + R"(", "args": {}})")),
      kBoth);
  EXPECT_LE(a.runtimes[0].version.size(), 2003u);
  EXPECT_LE(a.runtimes[0].reason.size(), 2003u);
  EXPECT_LE(a.runtimes[1].selected.size(), 2003u);
  // A cap never splits a UTF-8 character (reports stay valid JSON).
  std::string utf8;
  for (int i = 0; i < 1500; ++i) utf8 += "\xc3\xa9";
  const ProbeAnswer b = parse_probe_answer(answer(entry("vllm", "refused", "null", "1", utf8)), {Runtime::Vllm});
  const std::string& r = b.runtimes[0].reason;
  EXPECT_EQ(r.substr(r.size() - 3), "...");
  EXPECT_EQ(static_cast<unsigned char>(r[r.size() - 4]), 0xa9);
}

TEST(RuntimeOpinion, Nvfp4a16IsTheWeightOnlyMethodOnly) {
  const Json a16 = {{"use_a16", true}}, a4 = {{"use_a16", false}}, none = Json::object();
  EXPECT_TRUE(selects_nvfp4a16(Runtime::Vllm, "CompressedTensorsW4A4Nvfp4MoEMethod", a16));
  EXPECT_FALSE(selects_nvfp4a16(Runtime::Vllm, "CompressedTensorsW4A4Nvfp4MoEMethod", a4));
  EXPECT_FALSE(selects_nvfp4a16(Runtime::Vllm, "CompressedTensorsW4A4Nvfp4MoEMethod", none));
  EXPECT_FALSE(selects_nvfp4a16(Runtime::Vllm, "CompressedTensorsW4A4Nvfp4MoEMethod", Json{{"use_a16", "True"}}));
  EXPECT_FALSE(selects_nvfp4a16(Runtime::Vllm, "UnquantizedFusedMoEMethod", none));
  EXPECT_FALSE(selects_nvfp4a16(Runtime::Vllm, "CompressedTensorsW4A16Nvfp4MoE", none));
  EXPECT_TRUE(selects_nvfp4a16(Runtime::Sglang, "CompressedTensorsW4A16Nvfp4MoE", none));
  EXPECT_TRUE(selects_nvfp4a16(Runtime::Sglang, "CompressedTensorsW4A16Nvfp4MoE", Json{{"has_input_global_scale", false}}));
  // A W4A4 checkpoint served weight-only below sm100 is not its own scheme.
  EXPECT_FALSE(selects_nvfp4a16(Runtime::Sglang, "CompressedTensorsW4A16Nvfp4MoE", Json{{"has_input_global_scale", true}}));
  EXPECT_FALSE(selects_nvfp4a16(Runtime::Sglang, "CompressedTensorsW4A4Nvfp4MoEMethod", a16));
  EXPECT_FALSE(parse_choice<Runtime>("trtllm").has_value());  // no opinion can name another runtime
}

TEST(RuntimeOpinion, AgreementForEveryCombination) {
  using O = RuntimeOpinion::Answer;
  for (const O given : {O::NotInstalled, O::Selected, O::Refused, O::CouldNotAsk}) {
    for (const bool runtime_selects : {false, true}) {
      for (const bool gate_selects : {false, true}) {
        RuntimeOpinion o;
        o.answer = given;
        o.selects_nvfp4a16 = runtime_selects;
        Agreement want = Agreement::NoOpinion;
        if (given == O::Selected) want = runtime_selects == gate_selects ? Agreement::Agrees : Agreement::Disagrees;
        if (given == O::Refused) want = gate_selects ? Agreement::Disagrees : Agreement::Agrees;
        EXPECT_EQ(agreement(o, gate_selects), want)
            << answer_name(given) << " runtime " << runtime_selects << " gate " << gate_selects;
      }
    }
  }
}

TEST(RuntimeOpinion, CouldNotAskNamesEveryRuntime) {
  const auto all = could_not_ask(kBoth, "python3 could not be started: No such file or directory");
  ASSERT_EQ(all.size(), 2u);
  for (const auto& o : all) {
    EXPECT_EQ(o.answer, RuntimeOpinion::Answer::CouldNotAsk);
    EXPECT_EQ(agreement(o, true), Agreement::NoOpinion);
    EXPECT_NE(o.reason.find("No such file"), std::string::npos);
  }
  EXPECT_EQ(all[1].pinned, "0.5.23");
}

}  // namespace
}  // namespace mx2nv

// Every library choice table (common/choice.hpp; the CLI's --progress is
// checked by the CLI tests): each enumerator exactly once, a
// distinct lower-case name and a help line, names round-trip, and a name
// outside the table (another case, a prefix, empty) is not taken.
#include "common/choice.hpp"
#include "fixture/fixture.hpp"
#include "gate/ask.hpp"
#include "gate/runtime.hpp"
#include "numerics/window.hpp"
#include "model/target_format.hpp"
#include "plan/plan.hpp"
#include "sys/copy_engine.hpp"

#include <gtest/gtest.h>

#include <cctype>
#include <set>
#include <string>
#include <vector>

namespace mx2nv {
namespace {

template <class E>
void expect_table(const std::vector<E>& every, E default_value) {
  const auto table = choices<E>();
  ASSERT_EQ(table.size(), every.size());
  EXPECT_EQ(table.front().value, default_value) << "the default is listed first";
  std::set<std::string_view> names;
  for (const E value : every) {
    const Choice<E>& c = choice_of(value);
    EXPECT_EQ(c.value, value) << c.name << " is missing from its table";
    EXPECT_FALSE(c.name.empty());
    EXPECT_FALSE(c.help.empty()) << c.name;
    for (const char ch : c.name) EXPECT_FALSE(std::isupper(static_cast<unsigned char>(ch))) << c.name;
    EXPECT_TRUE(names.insert(c.name).second) << c.name << " twice";
    EXPECT_EQ(parse_choice<E>(c.name), value);
    std::string upper(c.name);
    for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    EXPECT_FALSE(parse_choice<E>(upper).has_value()) << upper;
    EXPECT_FALSE(parse_choice<E>(c.name.substr(0, c.name.size() - 1)).has_value()) << c.name;
  }
  EXPECT_FALSE(parse_choice<E>("").has_value());
  EXPECT_EQ(choice_names<E>().size(), every.size());
}

TEST(Choice, EveryTableIsComplete) {
  expect_table<Window>({Window::Marlin, Window::E4M3}, Window::Marlin);
  expect_table<OverSpanChoice>({OverSpanChoice::Fail, OverSpanChoice::Bf16, OverSpanChoice::Requantize},
                               OverSpanChoice::Fail);
  expect_table<CopyMode>({CopyMode::Auto, CopyMode::Reflink, CopyMode::Copy}, CopyMode::Auto);
  expect_table<FixtureLayout>({FixtureLayout::K3, FixtureLayout::Flat}, FixtureLayout::K3);
  expect_table<Runtime>({Runtime::Vllm, Runtime::Sglang}, Runtime::Vllm);
  expect_table<Backend>({Backend::Marlin, Backend::Humming, Backend::CuteDsl}, Backend::Marlin);
  expect_table<PlanKind>({PlanKind::Convert, PlanKind::Requantize}, PlanKind::Convert);
  expect_table<TargetFormat>({TargetFormat::CompressedTensors, TargetFormat::ModelOpt}, TargetFormat::CompressedTensors);
  expect_table<ActivationDtype>({ActivationDtype::Fp16, ActivationDtype::Bf16}, ActivationDtype::Fp16);
  expect_table<AskRuntimes>({AskRuntimes::Auto, AskRuntimes::Never}, AskRuntimes::Auto);
}

TEST(Choice, WindowTableAndChoiceTableAgree) {
  for (const WindowInfo& w : windows()) {
    EXPECT_EQ(choice_name(w.window), w.name);
    EXPECT_EQ(choice_of(w.window).help, w.summary);
  }
}

TEST(Choice, ListReadsAsProse) {
  EXPECT_EQ(choice_list<OverSpanChoice>(), "fail, bf16 or requantize");
  EXPECT_EQ(choice_list<Window>(), "marlin or e4m3");
}

}  // namespace
}  // namespace mx2nv

// The card's byte-level rules (card/card_text.hpp), SRC card reading
// (card/source_card.hpp), SHA-256 and repo ids. The values expected here are
// PyYAML's and Python's own (tests/conformance/test_card.py checks whole
// cards with huggingface_hub).
#include "card/card.hpp"
#include "card/card_text.hpp"
#include "card/sha256.hpp"
#include "card/source_card.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace mx2nv {
namespace {

TEST(CardText, YamlQuotedIsAsciiDoubleQuoted) {
  EXPECT_EQ(yaml_quoted("mit"), "\"mit\"");
  EXPECT_EQ(yaml_quoted("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(yaml_quoted("d\xC3\xA9mo"), "\"d\\xE9mo\"");
  EXPECT_EQ(yaml_quoted("\xE2\x98\x83"), "\"\\u2603\"");
  EXPECT_EQ(yaml_quoted("\xF0\x9F\x8E\x89"), "\"\\U0001F389\"");
  EXPECT_EQ(yaml_quoted(std::string("a\x01\x7f", 3)), "\"a\\x01\\x7F\"");
  EXPECT_EQ(yaml_quoted("---"), "\"---\"");
}

TEST(CardText, CodeSpansCannotBeEscaped) {
  EXPECT_EQ(code_span("x"), "`x`");
  EXPECT_EQ(code_span("a`b"), "``a`b``");
  EXPECT_EQ(code_span("`x"), "`` `x ``");
  EXPECT_EQ(code_span("a|b", true), "`a\\|b`");
  EXPECT_EQ(code_span("a|b"), "`a|b`");
  EXPECT_EQ(code_span(std::string("\x1b[31m", 5)), "`\\x1B[31m`");
  EXPECT_EQ(code_span("\xE2\x80\xA8"), "`\\u2028`");
  EXPECT_EQ(code_span("\xff"), "`\\xFF`");
  EXPECT_EQ(code_span("<script>"), "`<script>`");
}

TEST(CardText, FloatsAsPythonRepr) {
  EXPECT_EQ(python_float(0.0), "0.0");
  EXPECT_EQ(python_float(4.9815), "4.9815");
  EXPECT_EQ(python_float(-0.5), "-0.5");
  EXPECT_EQ(python_float(1.0), "1.0");
  EXPECT_EQ(python_float(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(python_float(1e16), "1e+16");
  EXPECT_EQ(python_float(1234567890123456.0), "1234567890123456.0");
  EXPECT_EQ(python_float(0.0001), "0.0001");
  EXPECT_EQ(python_float(0.00001), "1e-05");
  EXPECT_EQ(python_float(1.5e-7), "1.5e-07");
  EXPECT_EQ(python_float(0.021328315973167495), "0.021328315973167495");
  EXPECT_EQ(python_float(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(python_float(1e300), "1e+300");
}

TEST(CardText, Sha256KnownValues) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(CardText, RepoIds) {
  EXPECT_TRUE(valid_repo_id("example-org/K3-demo-MXFP4"));
  EXPECT_TRUE(valid_repo_id("gpt2"));
  EXPECT_FALSE(valid_repo_id("a--b/c"));
  EXPECT_FALSE(valid_repo_id("a/b/c"));
  EXPECT_FALSE(valid_repo_id("-a/b"));
  EXPECT_FALSE(valid_repo_id("a/b.git"));
  EXPECT_FALSE(valid_repo_id("a/b..c"));
  EXPECT_FALSE(valid_repo_id(""));
  EXPECT_FALSE(valid_repo_id("a/" + std::string(97, 'x')));
  EXPECT_FALSE(valid_repo_id("a b/c"));
}

std::string value(const SourceCard& c, const std::string& key) {
  for (const auto& [k, v] : c.inherited) {
    if (k == key) return std::holds_alternative<std::string>(v) ? std::get<std::string>(v) : "<list>";
  }
  return "<absent>";
}

TEST(SourceCard, InheritsStringsAsPyYamlReadsThem) {
  const SourceCard c = read_source_card(
      "---\nlicense: mit\nlicense_name: 'it''s'\nlibrary_name: \"tr\\x61nsformers\" # comment\npipeline_tag: no\n"
      "language:\n- en\n- \"zh\"\nwidget:\n- text: \"Hello: world\"\n  output:\n    x: 1\nmodel-index:\n- name: m\n"
      "  results: []\ngated: true\n---\n# Body\n");
  EXPECT_EQ(c.problem, "");
  EXPECT_EQ(value(c, "license"), "mit");
  EXPECT_EQ(value(c, "license_name"), "it's");
  EXPECT_EQ(value(c, "library_name"), "transformers");
  EXPECT_EQ(value(c, "pipeline_tag"), "<absent>");  // YAML 1.1: false
  EXPECT_EQ(c.not_inherited, std::vector<std::string>{"pipeline_tag"});
  EXPECT_EQ(value(c, "language"), "<list>");
  EXPECT_EQ(c.dropped, (std::vector<std::string>{"gated", "model-index", "widget"}));
  EXPECT_EQ(c.gating, std::vector<std::string>{"gated"});
}

TEST(SourceCard, HostileFrontMatterIsUnusable) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"---\nlicense: [mit\n---\n", "front matter is not valid YAML"},
      {"---\nlicense: \"mit\n---\nb\"\n---\n", "front matter is not valid YAML"},
      {"---\nlanguage:\n\t- en\n---\n", "front matter is not valid YAML"},
      {"---\na: &x 1\nb: *x\n---\n", "front matter uses YAML anchors or aliases"},
      {"---\nlicense: !mine mit\n---\n", "front matter uses the YAML tag"},
      {"---\n<<: {a: 1}\n---\n", "front matter uses YAML merge keys"},
      {"---\n- a\n---\n", "front matter is not a mapping"},
      {"---\n1: x\n---\n", "front matter has a key that is not a string"},
      {"---\nlicense: mit\n", "no front matter"},
      {"---\n---\n", "no front matter"},
      {"---\nlicense: m\xffit\n---\n", "README.md is not UTF-8"},
      {"---\nlicense: \"a\x01\"\n---\n", "front matter is not valid YAML"},
      {"---\nlicense: mit\n  bad: indent\n---\n", "front matter is not valid YAML"},
      {"---\nlicense: mit\t\n---\n", "front matter is not valid YAML"},  // PyYAML refuses the trailing tab
      {"---\nlicense: mit\nx: a\tb\n---\n", "front matter is not valid YAML"},
      {"---\nlicense: !!python/name:os.system\n---\n", "front matter is not valid YAML"},
  };
  for (const auto& [text, problem] : cases) {
    const SourceCard c = read_source_card(text);
    EXPECT_EQ(c.problem.rfind(problem, 0), 0u) << text << " -> " << c.problem;
    EXPECT_TRUE(c.inherited.empty()) << text;
  }
}

TEST(SourceCard, PlainScalarsThatAreStrings) {
  const SourceCard c = read_source_card(
      "---\nlicense: -x\nlicense_name: \xC3\xA9mo\nlicense_link: !!str 1.5\nlibrary_name: 1.5\npipeline_tag: .inf\n---\n");
  EXPECT_EQ(value(c, "license"), "-x");
  EXPECT_EQ(value(c, "license_name"), "\xC3\xA9mo");
  EXPECT_EQ(value(c, "license_link"), "1.5");
  EXPECT_EQ(c.not_inherited, (std::vector<std::string>{"library_name", "pipeline_tag"}));
}

TEST(SourceCard, DelimitersAsTheHubRegexFindsThem) {
  EXPECT_EQ(value(read_source_card("\xEF\xBB\xBF\n---\r\nlicense: mit\r\n---\r\nx"), "license"), "mit");
  EXPECT_EQ(value(read_source_card("---\rlicense: mit\r---"), "license"), "mit");
  EXPECT_EQ(read_source_card("---\rlicense: mit\r---\rx").problem, "no front matter");
  EXPECT_EQ(value(read_source_card("---\nlicense_name: \"x --- y\"\nlicense: a\n---   \n"), "license_name"), "x --- y");
  EXPECT_EQ(value(read_source_card("---\nd: |\n  a\n  ---\nlicense: mit\n...\n---\n"), "license"), "mit");
}

// What YAML (PyYAML's safe_load) or huggingface_hub refuses, and what the
// reader does not implement: nothing inherited, whatever comes first
// (tests/conformance/test_card_front_matter.py checks many more against
// PyYAML itself).
TEST(SourceCard, WhatYamlOrTheHubRefusesInheritsNothing) {
  for (const std::string shape :
       {"widget: - x", "x: =", "x: <<", "x: }", "x: |x\n  a", "x: |\n    a\n  b", "x: a\n# c\n  b", "x: 1\n...\ny: 2",
        "x: 2023-02-30", "x: 0x_", "x: a: b", "x: [a, b", "tags: 5", "self: x", "ignore_metadata_errors: true",
        "model-index:\n- name: x", "eval_results: [x]", "x: |2\n  a", "x: a\n  b", "%YAML 1.1"}) {
    const SourceCard c = read_source_card("---\nlicense: mit\n" + shape + "\n---\n");
    EXPECT_FALSE(c.problem.empty()) << shape;
    EXPECT_TRUE(c.inherited.empty()) << shape;
  }
}

TEST(SourceCard, WhatTheReaderReadsIsPyYamls) {
  const SourceCard c = read_source_card(
      "---\nlicense: mit\nd: 2024-02-29\nn: 1_0.5\nb: |-\n  text\n\n  more\nlanguage:\n  - en\n  - 'zh'\n"
      "model-index:\n- name: m\n  results:\n  - task:\n      type: t\n    dataset:\n      type: d\n      name: n\n"
      "    metrics:\n    - type: acc\n      value: 0.5\n...\n# after the end\n---\n");
  EXPECT_EQ(c.problem, "");
  EXPECT_EQ(value(c, "license"), "mit");
  EXPECT_EQ(value(c, "language"), "<list>");
  EXPECT_EQ(c.dropped, (std::vector<std::string>{"b", "d", "model-index", "n"}));
}

}  // namespace
}  // namespace mx2nv

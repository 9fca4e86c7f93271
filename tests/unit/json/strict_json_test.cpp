#include "common/error.hpp"
#include "json/strict_json.hpp"

#include <gtest/gtest.h>

namespace mx2nv {
namespace {

ErrorKind kind_of(std::string_view text) {
  try {
    parse_strict_json(text, "t.json");
  } catch (const Error& e) {
    return e.kind();
  }
  ADD_FAILURE() << "accepted: " << text;
  return ErrorKind::Io;
}

TEST(StrictJson, KeepsTopLevelKeyOrder) {
  const auto doc = parse_strict_json(R"({"b":1,"a":{"z":1,"y":2},"c":[1,{"k":null}]})", "t");
  EXPECT_EQ(doc.top_level_keys, (std::vector<std::string>{"b", "a", "c"}));
  EXPECT_EQ(doc.value["c"][1]["k"], nullptr);
}

TEST(StrictJson, RefusesDuplicateKeysAtAnyDepth) {
  EXPECT_EQ(kind_of(R"({"a":1,"a":2})"), ErrorKind::InvalidInput);
  EXPECT_EQ(kind_of(R"({"x":{"a":1,"a":1}})"), ErrorKind::InvalidInput);
  EXPECT_EQ(kind_of(R"([{"a":1,"b":2,"a":3}])"), ErrorKind::InvalidInput);
  // Same key in sibling objects is fine.
  EXPECT_NO_THROW(parse_strict_json(R"([{"a":1},{"a":2}])", "t"));
}

TEST(StrictJson, RefusesDeepNesting) {
  std::string deep(kMaxJsonDepth + 1, '[');
  deep += std::string(kMaxJsonDepth + 1, ']');
  EXPECT_EQ(kind_of(deep), ErrorKind::InvalidInput);
  std::string ok(kMaxJsonDepth, '[');
  ok += std::string(kMaxJsonDepth, ']');
  EXPECT_NO_THROW(parse_strict_json(ok, "t"));
}

TEST(StrictJson, RefusesInvalidUtf8AndGarbage) {
  EXPECT_EQ(kind_of("{\"a\":\"\xff\"}"), ErrorKind::InvalidInput);
  EXPECT_EQ(kind_of("{\"a\":1} x"), ErrorKind::InvalidInput);
  EXPECT_EQ(kind_of("{\"a\":"), ErrorKind::InvalidInput);
  EXPECT_EQ(kind_of(""), ErrorKind::InvalidInput);
}

TEST(StrictJson, MessageNamesFileAndOffset) {
  try {
    parse_strict_json("{\"a\":1,}", "shard-7.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shard-7.safetensors"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("byte"), std::string::npos);
  }
}

}  // namespace
}  // namespace mx2nv

#include "common/printable.hpp"

namespace mx2nv {
namespace {

TEST(Printable, EscapesControlBytesAndInvalidUtf8KeepsValidText) {
  EXPECT_EQ(printable("layers.0.w1"), "layers.0.w1");
  EXPECT_EQ(printable("a\x1b[2Jb"), "a\\x1b[2Jb");
  EXPECT_EQ(printable("caf\xc3\xa9"), "caf\xc3\xa9");
  EXPECT_EQ(printable("x\xff\xc3"), "x\\xff\\xc3");
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a UTF-16 surrogate is not UTF-8
  EXPECT_EQ(printable(std::string_view("a\0b", 3)), "a\\x00b");
}

}  // namespace
}  // namespace mx2nv

namespace mx2nv {
namespace {

// config.json and every other DOM-parsed document: a BOM, a NUL anywhere and
// any bytes after a NUL are refused, never silently cut off.
TEST(StrictJson, RefusesBomAndNulAnywhere) {
  const std::string nul(1, '\0');
  for (const std::string& text : {std::string("\xEF\xBB\xBF{}"), "{}" + nul, "{}" + nul + "{\"x\":1}",
                                  "{\"a\":\"b" + nul + "\"}", nul + "{}"}) {
    try {
      parse_strict_json(text, "config.json");
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
      const std::string what = e.what();
      EXPECT_TRUE(what.find("NUL byte") != std::string::npos || what.find("byte order mark") != std::string::npos)
          << what;
    }
  }
}

}  // namespace
}  // namespace mx2nv

// JsonFields reads a document by name and expected type; every error is
// InvalidInput naming the file and the key's path. JsonOut writes
// dump_json's text.
#include "common/error.hpp"
#include "common/printable.hpp"
#include "json/json_fields.hpp"
#include "json/json_writer.hpp"

#include <gtest/gtest.h>

#include <string>

namespace mx2nv {
namespace {

Json doc() {
  return Json::parse(R"({"format": "x", "shards": [{"plan_hash": 7}, {"plan_hash": 8}, {"plan_hash": 9},
                         {"plan_hash": "nine"}], "n": -3, "big": 18446744073709551615, "neg0": -0,
                         "f": 1.5, "b": true, "z": null, "o": {"inner": {"deep": [1, [2, "x"]]}}})");
}

// The message of the InvalidInput `f` throws.
template <typename F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(JsonFields, ReadsEachTypeByName) {
  const Json j = doc();
  const JsonFields f(j, "plan.json");
  EXPECT_EQ(f.string("format"), "x");
  EXPECT_EQ(f.int64("n"), -3);
  EXPECT_EQ(f.uint("big"), 18446744073709551615ull);
  EXPECT_EQ(f.uint("neg0"), 0u);
  EXPECT_EQ(f.number("f"), 1.5);
  EXPECT_TRUE(f.boolean("b"));
  EXPECT_EQ(f.uint_or_null("z"), std::nullopt);
  EXPECT_FALSE(f.optional("absent").has_value());
  const JsonValue shards = f.required("shards");
  ASSERT_EQ(shards.array_size(4), 4u);
  EXPECT_EQ(shards.item(2).as_object().uint("plan_hash"), 9u);
}

TEST(JsonFields, AWrongTypeNamesTheFileTheNestedPathAndBothTypes) {
  const Json j = doc();
  const JsonFields f(j, "plan.json");
  EXPECT_EQ(message_of([&] { f.required("shards").item(3).as_object().uint("plan_hash"); }),
            "plan.json: \"shards[3].plan_hash\" must be an unsigned integer, not a string");
  EXPECT_EQ(message_of([&] { f.uint("n"); }), "plan.json: \"n\" must be an unsigned integer, not -3");
  EXPECT_EQ(message_of([&] { f.int64("big"); }), "plan.json: \"big\" is 18446744073709551615, out of range");
  EXPECT_EQ(message_of([&] { f.string("f"); }), "plan.json: \"f\" must be a string, not a number with a fraction or exponent");
  EXPECT_EQ(message_of([&] { f.boolean("z"); }), "plan.json: \"z\" must be true or false, not null");
  EXPECT_EQ(message_of([&] { f.object("format"); }), "plan.json: \"format\" must be an object, not a string");
  EXPECT_EQ(message_of([&] { f.object("o").object("inner").required("deep").item(1).item(1).as_int(); }),
            "plan.json: \"o.inner.deep[1][1]\" must be an integer, not a string");
  EXPECT_EQ(message_of([&] { f.required("n").as_int_in(0, 10); }), "plan.json: \"n\" is -3, outside [0, 10]");
  EXPECT_EQ(message_of([] { JsonFields(Json::array(), "r.json"); }), "r.json: the document must be an object, not an array");
}

TEST(JsonFields, AMissingKeyIsNamedWithItsPath) {
  const Json j = doc();
  const JsonFields f(j, "plan.json");
  EXPECT_EQ(message_of([&] { f.uint("nope"); }), "plan.json: \"nope\" is missing");
  EXPECT_EQ(message_of([&] { f.object("o").object("inner").string("gone"); }), "plan.json: \"o.inner.gone\" is missing");
  EXPECT_EQ(message_of([&] { f.only({"format", "shards"}, "a plan"); }).substr(0, 10), "plan.json:");
}

TEST(JsonFields, CapsAreCheckedBeforeTheItemsAreRead) {
  const Json j = doc();
  const JsonFields f(j, "plan.json");
  EXPECT_EQ(message_of([&] { f.required("shards").array_size(3); }), "plan.json: \"shards\" has 4 items, more than 3");
  EXPECT_EQ(message_of([&] { f.required("format").as_string(0); }), "plan.json: \"format\" is a string of 1 bytes, more than 0");
  EXPECT_EQ(message_of([&] { f.required("o").array_size(10); }), "plan.json: \"o\" must be an array, not an object");
  // A hostile key is quoted in part.
  const Json long_key = {{std::string(500, 'k'), 1}};
  const std::string m = message_of([&] { JsonFields(long_key, "r.json").only({}, "a report"); });
  EXPECT_LT(m.size(), 200u);
}

TEST(JsonOut, WritesDumpJsonsTextInBlockLayoutAndTheCompactOneInline) {
  const Json j = Json::parse(R"({"a": [], "b": {}, "c": [1, -2, 2.5, "s\u007f\n\"", null, true, {"x": [[]]}],
                                 "d": {"e": 1e300, "f": "\u00e9\u2028"}})");
  for (const int indent : {2, -1}) {
    std::string text;
    JsonOut out([&](std::string_view piece) { text += piece; }, indent);
    out.value(j);
    out.finish();
    EXPECT_EQ(text, dump_json(j, indent));
  }
}

}  // namespace
}  // namespace mx2nv

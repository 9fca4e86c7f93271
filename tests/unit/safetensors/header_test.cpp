// The safetensors validator: one test per corruption class.
#include "common/error.hpp"
#include "json/json_stream.hpp"
#include "safetensors/header.hpp"

#include <gtest/gtest.h>

namespace mx2nv {
namespace {

std::string with_length(const std::string& json, std::uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + json;
}

std::string make_file(const std::string& json, std::size_t data_bytes) {
  return with_length(json, json.size()) + std::string(data_bytes, '\x01');
}

ShardHeader parse_file(const std::string& file) {
  const auto n = ShardHeader::parse_header_length(std::as_bytes(std::span(file.data(), std::min<std::size_t>(8, file.size()))),
                                                  file.size(), "f.safetensors");
  return ShardHeader::parse(std::string_view(file).substr(8, static_cast<std::size_t>(n)), file.size(), "f.safetensors");
}

void expect_invalid(const std::string& file, const std::string& fragment) {
  try {
    parse_file(file);
    ADD_FAILURE() << "accepted; expected: " << fragment;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

const std::string kGood =
    R"({"__metadata__":{"format":"pt"},"b":{"dtype":"U8","shape":[2,3],"data_offsets":[4,10]},)"
    R"("a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})";

TEST(Safetensors, ParsesValidHeaderKeepingOrder) {
  const ShardHeader h = parse_file(make_file(kGood, 10));
  ASSERT_EQ(h.tensors().size(), 2u);
  EXPECT_EQ(h.tensors()[0].name, "b");
  EXPECT_EQ(h.offset_order(), (std::vector<std::size_t>{1, 0}));
  EXPECT_EQ(h.metadata()->at("format"), "pt");
  EXPECT_EQ(h.data_size(), 10u);
  EXPECT_EQ(h.find("a")->dtype, Dtype::F16);
}

TEST(Safetensors, SerializeThenParseRoundTrips) {
  std::vector<TensorInfo> t = {{"x", Dtype::F8_E4M3, {4, 2}, 0, 8}, {"y", Dtype::F32, {1}, 8, 12},
                               {"empty", Dtype::BF16, {0, 5}, 12, 12}, {"s", Dtype::F4, {2, 4}, 12, 16}};
  const std::string header = serialize_header(std::map<std::string, std::string>{{"format", "pt"}}, t);
  EXPECT_EQ((header.size() - 8) % 8, 0u);  // data section 8-byte aligned
  const ShardHeader h = parse_file(header + std::string(16, '\0'));
  ASSERT_EQ(h.tensors().size(), 4u);
  for (std::size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(h.tensors()[i].name, t[i].name);
    EXPECT_EQ(h.tensors()[i].shape, t[i].shape);
    EXPECT_EQ(h.tensors()[i].begin, t[i].begin);
  }
}

TEST(Safetensors, AcceptsWhitespacePadding) {
  EXPECT_NO_THROW(parse_file(make_file(kGood + "    ", 10)));
}

TEST(Safetensors, WhitespaceRunsOutsideStringsChangeNothingAndSpacesInsideNamesSurvive) {
  // The stream hands the lexer one character of each whitespace run outside
  // strings (json_stream.cpp); a name's own spaces are its bytes.
  const std::string pad(100'000, ' ');
  const std::string json = "{" + pad + R"("a  b" :)" + pad + "\n\t\r" + pad +
                           R"({"dtype":"U8",  "shape":[ 2 ,  1 ],"data_offsets":[0,)" + pad + "2]}" + pad + "}" + pad;
  const ShardHeader h = parse_file(make_file(json, 2));
  ASSERT_EQ(h.tensors().size(), 1u);
  EXPECT_EQ(h.tensors()[0].name, "a  b");
  EXPECT_EQ(h.tensors()[0].shape, (std::vector<std::uint64_t>{2, 1}));
  EXPECT_EQ(h.header_length(), json.size());
}

TEST(SafetensorsCorrupt, ErrorOffsetsCountTheWhitespaceTheLexerDidNotSee) {
  // The same error after 1 or 100,000 padding spaces is reported 99,999 bytes apart.
  const auto offset_of_error = [](std::size_t spaces) {
    const std::string json = "{" + std::string(spaces, ' ') + R"("a": nul})";
    try {
      parse_file(make_file(json, 0));
    } catch (const Error& e) {
      const std::string m = e.what();
      const auto at = m.find("at byte ");
      EXPECT_NE(at, std::string::npos) << m;
      return std::stoull(m.substr(at + 8));
    }
    ADD_FAILURE() << "accepted";
    return 0ull;
  };
  EXPECT_EQ(offset_of_error(100'000), offset_of_error(1) + 99'999);
}

TEST(SafetensorsCorrupt, TokenLongerThanTheCap) {
  const std::string name(kMaxJsonTokenBytes + 1, 'n');
  expect_invalid(make_file("{\"" + name + R"(":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1),
                 "longer than");
  expect_invalid(make_file(R"({"a":{"dtype":"U8","shape":[)" + std::string(kMaxJsonTokenBytes + 1, '1') +
                               R"(],"data_offsets":[0,1]}})", 1),
                 "longer than");
}

TEST(SafetensorsCorrupt, FileTooSmall) { expect_invalid("abc", "too small"); }
TEST(SafetensorsCorrupt, HeaderLengthOverCap) { expect_invalid(with_length("{}", 200'000'000) + "{}", "limit"); }
TEST(SafetensorsCorrupt, HeaderLengthPastEof) { expect_invalid(with_length("{}", 50) + "{}", "past the end"); }
TEST(SafetensorsCorrupt, InvalidJson) { expect_invalid(make_file("{\"a\":", 0), "invalid JSON"); }
TEST(SafetensorsCorrupt, NotAnObject) { expect_invalid(make_file("[1,2]", 0), "not a JSON object"); }
TEST(SafetensorsCorrupt, InvalidUtf8) { expect_invalid(make_file("{\"\xc3\x28\":1}", 0), "invalid JSON"); }
TEST(SafetensorsCorrupt, DuplicateKey) {
  expect_invalid(make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1),
                 "duplicate");
}
TEST(SafetensorsCorrupt, UnknownDtype) {
  expect_invalid(make_file(R"({"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", 1), "unknown dtype");
}
TEST(SafetensorsCorrupt, ShapeNotArray) {
  expect_invalid(make_file(R"({"a":{"dtype":"U8","shape":1,"data_offsets":[0,1]}})", 1), "shape is not an array");
}
TEST(SafetensorsCorrupt, NegativeDimension) {
  expect_invalid(make_file(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", 1), "non-negative");
}
TEST(SafetensorsCorrupt, FractionalDimension) {
  expect_invalid(make_file(R"({"a":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})", 1), "non-negative");
}
TEST(SafetensorsCorrupt, HugeDimensionBeyondU64) {
  expect_invalid(make_file(R"({"a":{"dtype":"U8","shape":[99999999999999999999999],"data_offsets":[0,1]}})", 1),
                 "below 2^64");
}
TEST(SafetensorsCorrupt, ShapeProductOverflows) {
  expect_invalid(make_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,1]}})", 1),
                 "overflows");
}
TEST(SafetensorsCorrupt, RankTooHigh) {
  expect_invalid(make_file(R"({"a":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}})", 1),
                 "rank");
}
TEST(SafetensorsCorrupt, SubByteSizeNotWhole) {
  expect_invalid(make_file(R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}})", 1), "whole bytes");
}
TEST(SafetensorsCorrupt, OffsetsWrongArity) {
  expect_invalid(make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", 1), "[begin, end]");
}
TEST(SafetensorsCorrupt, EndBeforeBegin) {
  expect_invalid(make_file(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[2,1]}})", 1), "before begin");
}
TEST(SafetensorsCorrupt, SizeDisagreesWithShape) {
  expect_invalid(make_file(R"({"a":{"dtype":"U16","shape":[2],"data_offsets":[0,3]}})", 3), "needs 4");
}
TEST(SafetensorsCorrupt, Hole) {
  expect_invalid(make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"U8","shape":[1],"data_offsets":[2,3]}})", 3),
                 "hole");
}
TEST(SafetensorsCorrupt, Overlap) {
  expect_invalid(make_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})", 3),
                 "overlap");
}
TEST(SafetensorsCorrupt, NotStartingAtZero) {
  expect_invalid(make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", 2), "hole");
}
TEST(SafetensorsCorrupt, TrailingBytes) {
  expect_invalid(make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 2), "trailing");
}
TEST(SafetensorsCorrupt, Truncated) {
  expect_invalid(make_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 2), "truncated");
}
TEST(SafetensorsCorrupt, MetadataNotStrings) {
  expect_invalid(make_file(R"({"__metadata__":{"format":1}})", 0), "not a string");
}
TEST(SafetensorsCorrupt, UnknownTensorField) {
  expect_invalid(make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}})", 1), "unknown field");
}
TEST(SafetensorsCorrupt, MissingField) {
  expect_invalid(make_file(R"({"a":{"dtype":"U8","shape":[1]}})", 1), "needs dtype");
}
TEST(SafetensorsCorrupt, DeepNesting) {
  // Refused as JSON first (nesting), before the header's schema is applied.
  std::string json = "{\"__metadata__\":" + std::string(100, '[') + std::string(100, ']') + "}";
  expect_invalid(make_file(json, 0), "nested deeper");
  json = "{\"t\":{\"dtype\":\"U8\",\"shape\":" + std::string(100, '[') + std::string(100, ']') + "}}";
  expect_invalid(make_file(json, 0), "nested deeper");
  // Not too deep: the schema error.
  json = "{\"t\":{\"dtype\":\"U8\",\"shape\":[[1]],\"data_offsets\":[0,1]}}";
  expect_invalid(make_file(json, 1), "shape must hold non-negative integers");
}

// The one entry point over a byte source agrees with parsing the JSON alone.
TEST(Safetensors, ReadFromByteSourceEqualsParse) {
  const std::string file = make_file(kGood, 10);
  const MemorySource source(file);
  const ShardHeader a = ShardHeader::read(source, file.size(), "f");
  const ShardHeader b = parse_file(file);
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (std::size_t i = 0; i < a.tensors().size(); ++i) {
    EXPECT_EQ(a.tensors()[i].name, b.tensors()[i].name);
    EXPECT_EQ(a.tensors()[i].begin, b.tensors()[i].begin);
    EXPECT_EQ(a.tensors()[i].shape, b.tensors()[i].shape);
  }
  EXPECT_EQ(a.metadata(), b.metadata());
  EXPECT_EQ(a.data_start(), b.data_start());
  EXPECT_NE(a.find("a"), nullptr);
  EXPECT_EQ(a.find("c"), nullptr);
}

// nlohmann's lexer ends the input at a NUL and skips a BOM; both are refused,
// wherever the NUL is (inside a string, after the document, past the first
// read chunk), and the bytes after a NUL are never ignored.
TEST(SafetensorsCorrupt, BomAndNulAnywhere) {
  expect_invalid(make_file("\xEF\xBB\xBF" + kGood, 10), "byte order mark");
  const std::string nul(1, '\0');
  expect_invalid(make_file(kGood + nul, 10), "NUL byte");
  expect_invalid(make_file(kGood + nul + "garbage", 10), "NUL byte");
  std::string inside = kGood;
  inside.insert(inside.find("pt") + 1, nul);
  expect_invalid(make_file(inside, 10), "NUL byte");
  const std::string padded = kGood + std::string(kJsonChunkBytes + 100, ' ') + nul;
  expect_invalid(make_file(padded, 10), "NUL byte at byte " + std::to_string(padded.size() - 1));
}

TEST(SafetensorsCorrupt, DuplicateFieldsAndTensors) {
  expect_invalid(make_file(R"({"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1), "duplicate");
  expect_invalid(make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", 2),
                 "duplicate");
  expect_invalid(make_file(R"({"__metadata__":{},"__metadata__":{}})", 0), "duplicate");
  expect_invalid(make_file(R"({"__metadata__":{"k":"a","k":"b"}})", 0), "duplicate");
  expect_invalid(make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})", 1), "[begin, end]");
  expect_invalid(make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", 1), "[begin, end]");
  expect_invalid(make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,-1]}})", 1), "non-negative");
  expect_invalid(make_file(R"({"a":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})", 1), "non-negative");
  expect_invalid(make_file(R"({"a":{"dtype":"U8","shape":[1]}})", 1), "needs dtype, shape and data_offsets");
  expect_invalid(make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}})", 1), "unknown field");
}

}  // namespace
}  // namespace mx2nv

#include "common/error.hpp"
#include "json/json_stream.hpp"
#include "safetensors/index.hpp"

#include <gtest/gtest.h>

namespace mx2nv {
namespace {

TEST(ConfinedPath, AcceptsPlainRelativeNames) {
  EXPECT_TRUE(is_confined_relative_path("model-00001-of-00002.safetensors"));
  EXPECT_TRUE(is_confined_relative_path("sub/dir/x.safetensors"));
}

TEST(ConfinedPath, RefusesEscapes) {
  for (const char* bad : {"", "/etc/passwd", "../x", "a/../../x", "a/./b", "a//b", "./a", "a\\b", "a/", ".."}) {
    EXPECT_FALSE(is_confined_relative_path(bad)) << bad;
  }
  EXPECT_FALSE(is_confined_relative_path(std::string_view("a\0b", 3)));
}

ErrorKind index_error(const std::string& text, const std::string& fragment) {
  try {
    parse_shard_index(text, "model.safetensors.index.json");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    return e.kind();
  }
  ADD_FAILURE() << "accepted " << text;
  return ErrorKind::Io;
}

TEST(ShardIndex, RefusesBadDocuments) {
  EXPECT_EQ(index_error("[]", "not a JSON object"), ErrorKind::InvalidInput);
  EXPECT_EQ(index_error("{}", "no weight_map"), ErrorKind::InvalidInput);
  EXPECT_EQ(index_error(R"({"weight_map":{}})", "empty"), ErrorKind::InvalidInput);
  EXPECT_EQ(index_error(R"({"weight_map":{"a":1}})", "not a string"), ErrorKind::InvalidInput);
  EXPECT_EQ(index_error(R"({"weight_map":{"a":"../x.safetensors"}})", "not a plain relative path"),
            ErrorKind::InvalidInput);
  EXPECT_EQ(index_error(R"({"weight_map":{"a":"/abs.safetensors"}})", "not a plain relative path"),
            ErrorKind::InvalidInput);
  EXPECT_EQ(index_error(R"({"weight_map":{"a":"x","a":"y"}})", "duplicate"), ErrorKind::InvalidInput);
  EXPECT_EQ(index_error(R"({"metadata":3,"weight_map":{"a":"x"}})", "metadata"), ErrorKind::InvalidInput);
  // The fast path finds repeats only once the whole weight_map is in (bulk
  // loading): a repeat far from the first is still refused, by name.
  std::string many = R"({"weight_map":{)";
  for (int i = 0; i < 3000; ++i) many += "\"t" + std::to_string(i) + "\":\"s.safetensors\",";
  EXPECT_EQ(index_error(many + R"("t17":"s.safetensors"}})", "duplicate JSON key \"t17\""), ErrorKind::InvalidInput);
}

ShardHeader header_with(const std::vector<std::string>& names) {
  std::vector<TensorInfo> t;
  for (std::size_t i = 0; i < names.size(); ++i) t.push_back({names[i], Dtype::U8, {1}, i, i + 1});
  const std::string file = serialize_header(std::nullopt, t) + std::string(names.size(), '\0');
  return ShardHeader::parse(std::string_view(file).substr(8, file.size() - 8 - names.size()), file.size(), "s");
}

void check_index_matches_shards(const ShardIndex& index, const std::vector<const ShardHeader*>& headers) {
  IndexCoverage coverage(index);
  for (std::size_t s = 0; s < headers.size(); ++s) coverage.add_shard(s, *headers[s]);
  coverage.finish();
}

TEST(ShardIndex, MatchesShardsExactly) {
  const ShardIndex index = parse_shard_index(R"({"weight_map":{"a":"s1","b":"s2","c":"s2"}})", "i");
  ASSERT_EQ(index.shard_files, (std::vector<std::string>{"s1", "s2"}));
  const ShardHeader s1 = header_with({"a"}), s2 = header_with({"b", "c"});
  EXPECT_NO_THROW(check_index_matches_shards(index, {&s1, &s2}));

  const ShardHeader s2_extra = header_with({"b", "c", "d"});
  EXPECT_THROW(check_index_matches_shards(index, {&s1, &s2_extra}), Error);  // tensor not indexed
  const ShardHeader s2_missing = header_with({"b"});
  EXPECT_THROW(check_index_matches_shards(index, {&s1, &s2_missing}), Error);  // indexed tensor missing
  const ShardHeader s1_dup = header_with({"a", "b"});
  EXPECT_THROW(check_index_matches_shards(index, {&s1_dup, &s2}), Error);  // stored twice
}

TEST(ShardIndex, RenderSetsTotalSizeAndKeepsOtherMetadata) {
  const ShardIndex index = parse_shard_index(R"({"metadata":{"total_size":1,"note":"x"},"weight_map":{"a":"s1"}})", "i");
  const std::string out = render_shard_index(index.other, {{"a", "", "s1"}, {"a", "_g", "s1"}}, 99);
  const Json doc = Json::parse(out);
  EXPECT_EQ(doc["metadata"]["total_size"], 99);
  EXPECT_EQ(doc["metadata"]["note"], "x");
  EXPECT_EQ(doc["weight_map"].size(), 2u);
}

// The streamed rendering is byte for byte what nlohmann's dump(2) of the
// whole document gives (the format transformers writes), including the sort
// of names split into name + suffix.
TEST(ShardIndex, RenderEqualsDomDump) {
  const Json other = {{"metadata", {{"note", "x\ny"}, {"z", {1, 2}}}}, {"alpha", true}, {"zeta", {{"weight_map", 1}}}};
  const std::vector<IndexEntry> entries = {{"a.w1", ".weight_global_scale", "s2"},
                                           {"a.w1.weight_packed", "", "s1"},
                                           {"a.w1", "", "s1"},
                                           {"a.w", "1.x", "s1"},
                                           {"\u00e9", "", "s3"},
                                           {"b\"q", "", "s1"},
                                           {"a", ".w1.weight_scale", "s1"}};
  Json doc = other;
  doc["metadata"]["total_size"] = 42;
  for (const auto& e : entries) doc["weight_map"][std::string(e.name) + std::string(e.suffix)] = e.shard;
  EXPECT_EQ(render_shard_index(other, entries, 42), doc.dump(2) + "\n");
  EXPECT_EQ(render_shard_index(Json::object(), {}, 0), Json({{"metadata", {{"total_size", 0}}}, {"weight_map", Json::object()}}).dump(2) + "\n");
}

TEST(ShardIndex, StreamingParseKeepsEverythingButWeightMapAsJson) {
  const ShardIndex index = parse_shard_index(
      R"({"metadata":{"total_size":5,"deep":[{"a":[1,{"b":null}]}]},"extra":"v","n":1.5,"weight_map":{"t1":"s/b","t0":"a"}})", "i");
  EXPECT_EQ(index.other, Json::parse(R"({"metadata":{"total_size":5,"deep":[{"a":[1,{"b":null}]}]},"extra":"v","n":1.5})"));
  EXPECT_EQ(index.shard_files, (std::vector<std::string>{"a", "s/b"}));
  EXPECT_EQ(index.shard_for("t1"), "s/b");
  EXPECT_EQ(index.shard_for("t0"), "a");
  EXPECT_EQ(index.shard_for("t2"), "");
}

// Rules nlohmann's lexer alone does not enforce, for every document kind.
TEST(ShardIndex, RefusesBomNulAndTrailingBytesAfterNul) {
  const std::string good = R"({"weight_map":{"a":"x"}})";
  EXPECT_EQ(index_error("\xEF\xBB\xBF" + good, "byte order mark"), ErrorKind::InvalidInput);
  EXPECT_EQ(index_error(good + std::string(1, '\0'), "NUL byte"), ErrorKind::InvalidInput);
  EXPECT_EQ(index_error(good + std::string(1, '\0') + "garbage", "NUL byte"), ErrorKind::InvalidInput);
  EXPECT_EQ(index_error(R"({"weight_map":{"a":"x)" + std::string(1, '\0') + R"("}})", "NUL byte"), ErrorKind::InvalidInput);
  EXPECT_EQ(index_error(R"({"weight_map":{"a":"x"},"weight_map":{"b":"y"}})", "duplicate"), ErrorKind::InvalidInput);
  EXPECT_EQ(index_error(R"({"metadata":{"k":1,"k":2},"weight_map":{"a":"x"}})", "duplicate"), ErrorKind::InvalidInput);
  EXPECT_EQ(index_error(R"({"weight_map":{"a":"x"}} {})", "invalid JSON"), ErrorKind::InvalidInput);
  EXPECT_EQ(index_error(std::string(200, '[') + std::string(200, ']'), "nested deeper"), ErrorKind::InvalidInput);
  EXPECT_EQ(index_error("[[]]", "not a JSON object"), ErrorKind::InvalidInput);
  // JSON errors come before schema errors, wherever they are.
  EXPECT_EQ(index_error(R"({"weight_map":{"a":1},"x":)", "invalid JSON"), ErrorKind::InvalidInput);
  EXPECT_EQ(index_error(R"({"x":)" + std::string(100, '[') + std::string(100, ']') + "}", "nested deeper"),
            ErrorKind::InvalidInput);
}

TEST(ShardIndex, MembersOutsideWeightMapAreCapped) {
  // Strings each under the token cap (json_stream.hpp), together over the member cap.
  const std::string big = "\"" + std::string(static_cast<std::size_t>(kMaxJsonTokenBytes) - 16, 'x') + "\"";
  std::string note = "[" + big;
  for (std::uint64_t n = big.size(); n <= kMaxIndexOtherBytes; n += big.size()) note += "," + big;
  EXPECT_EQ(index_error(R"({"note":)" + note + R"(],"weight_map":{"a":"x"}})", "outside weight_map"),
            ErrorKind::InvalidInput);
}

}  // namespace
}  // namespace mx2nv

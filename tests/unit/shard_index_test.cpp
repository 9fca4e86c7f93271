#include "core/error.hpp"
#include "core/shard_index.hpp"

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
}

ShardHeader header_with(const std::vector<std::string>& names) {
  std::vector<TensorInfo> t;
  for (std::size_t i = 0; i < names.size(); ++i) t.push_back({names[i], Dtype::U8, {1}, i, i + 1});
  const std::string file = serialize_header(std::nullopt, t) + std::string(names.size(), '\0');
  return ShardHeader::parse(std::string_view(file).substr(8, file.size() - 8 - names.size()), file.size(), "s");
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
  const std::string out = render_shard_index(index.document, {{"a", "s1"}, {"a_g", "s1"}}, 99);
  const Json doc = Json::parse(out);
  EXPECT_EQ(doc["metadata"]["total_size"], 99);
  EXPECT_EQ(doc["metadata"]["note"], "x");
  EXPECT_EQ(doc["weight_map"].size(), 2u);
}

}  // namespace
}  // namespace mx2nv

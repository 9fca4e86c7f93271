// Malformed checkpoints at the directory level: each refused as invalid input
// (exit 3) with a message naming the problem, and nothing written to DST.
#include "common/error.hpp"
#include "convert/convert.hpp"
#include "e2e_support.hpp"
#include "fixture/fixture.hpp"
#include "safetensors/index.hpp"

#include <nlohmann/json.hpp>

#include <functional>

namespace mx2nv::e2e {
namespace {

using nlohmann::json;

struct Case {
  const char* name;
  std::function<void(const fs::path&)> damage;
  const char* fragment;
};

void rewrite_json(const fs::path& p, const std::function<void(json&)>& edit) {
  json j = json::parse(read_file(p));
  edit(j);
  write_file(p, j.dump(2));
}

const fs::path kIndex = std::string(kIndexFileName);

class BrokenCheckpoint : public ::testing::TestWithParam<Case> {};

TEST_P(BrokenCheckpoint, IsInvalidInputAndLeavesNothing) {
  ScratchDir d;
  FixtureSpec spec = tiny_spec();
  spec.experts = 2;
  spec.shards = 2;
  write_fixture(d / "src", spec);
  GetParam().damage(d / "src");
  try {
    convert_checkpoint({d / "src", d / "dst", Window::Marlin, 2});
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput) << e.what();
    EXPECT_NE(std::string(e.what()).find(GetParam().fragment), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(d / "dst"));
}

const std::string kShard1 = "model-00001-of-00002.safetensors";

INSTANTIATE_TEST_SUITE_P(
    Cases, BrokenCheckpoint,
    ::testing::Values(
        Case{"NoConfig", [](const fs::path& s) { fs::remove(s / "config.json"); }, "no config.json"},
        Case{"NoQuantConfig",
             [](const fs::path& s) { rewrite_json(s / "config.json", [](json& j) { j["text_config"].erase("quantization_config"); }); },
             "no quantization_config"},
        Case{"ActivationQuantized",
             [](const fs::path& s) {
               rewrite_json(s / "config.json", [](json& j) {
                 j["text_config"]["quantization_config"]["config_groups"]["group_0"]["input_activations"] = {{"num_bits", 8}};
               });
             },
             "input activations"},
        Case{"NoIndexNoShard",
             [](const fs::path& s) {
               fs::remove(s / kIndex);
             },
             "neither"},
        Case{"IndexNamesMissingShard",
             [](const fs::path& s) { rewrite_json(s / kIndex, [](json& j) { j["weight_map"]["x"] = "nope.safetensors"; }); },
             "does not exist"},
        Case{"IndexPathTraversal",
             [](const fs::path& s) { rewrite_json(s / kIndex, [](json& j) { j["weight_map"]["x"] = "../evil.safetensors"; }); },
             "not a plain relative path"},
        Case{"IndexAbsolutePath",
             [](const fs::path& s) { rewrite_json(s / kIndex, [](json& j) { j["weight_map"]["x"] = "/etc/passwd"; }); },
             "not a plain relative path"},
        Case{"TensorMissingFromIndex",
             [](const fs::path& s) { rewrite_json(s / kIndex, [](json& j) { j["weight_map"].erase("language_model.lm_head.weight"); }); },
             "not in the index"},
        Case{"TensorIndexedToWrongShard",
             [](const fs::path& s) {
               rewrite_json(s / kIndex, [](json& j) {
                 j["weight_map"]["language_model.model.embed_tokens.weight"] = "model-00002-of-00002.safetensors";
               });
             },
             "indexed to shard"},
        Case{"IndexedTensorMissing",
             [](const fs::path& s) { rewrite_json(s / kIndex, [](json& j) { j["weight_map"]["ghost.weight"] = "model-00001-of-00002.safetensors"; }); },
             "missing from shard"},
        Case{"TruncatedShard",
             [](const fs::path& s) { fs::resize_file(s / kShard1, fs::file_size(s / kShard1) - 1); },
             "truncated"},
        Case{"TrailingBytes",
             [](const fs::path& s) { write_file(s / kShard1, read_file(s / kShard1) + "x"); },
             "trailing bytes"},
        Case{"HeaderLengthHuge",
             [](const fs::path& s) {
               std::string b = read_file(s / kShard1);
               b[7] = '\x7f';
               write_file(s / kShard1, b);
             },
             "exceeds"},
        Case{"TemporaryFileInSource",
             [](const fs::path& s) { write_file(s / ".mx2nv-tmp.0.model.safetensors", "x"); },
             "interrupted"}),
    [](const auto& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace mx2nv::e2e

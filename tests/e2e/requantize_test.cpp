// mx2nv requantize end to end on generated checkpoints: the output has
// convert's structure, everything but the experts is copied, gate/up pairs
// share one global, the output is deterministic, the report's error table
// covers every module, over-span modules are accepted, and NaN scales are
// refused before anything is written. (Bit-exactness against
// compressed-tensors is the conformance suite's job.)
#include "common/error.hpp"
#include "convert/convert.hpp"
#include "requantize/requantize.hpp"
#include "e2e_support.hpp"
#include "fixture/fixture.hpp"
#include "safetensors/index.hpp"

#include <nlohmann/json.hpp>

#include <cstring>

namespace mx2nv::e2e {
namespace {

using nlohmann::json;

json header_of(const fs::path& shard) {
  const std::string all = read_file(shard);
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t(static_cast<unsigned char>(all[static_cast<std::size_t>(i)])) << (8 * i);
  json h = json::parse(all.substr(8, n));
  for (auto& [name, t] : h.items()) {
    if (name != "__metadata__") t.erase("data_offsets");
  }
  return h;
}

float global_of(const fs::path& shard, const std::string& module) {
  const std::string b = tensor_bytes(shard, module + ".weight_global_scale");
  float g = 0;
  std::memcpy(&g, b.data(), 4);
  return g;
}

TEST(Requantize, ConvertsStructureCopiesTheRestAndReportsEveryModule) {
  ScratchDir d;
  const FixtureSpec spec = spec_with_over_span();
  write_fixture(d / "src", spec);
  // convert refuses this checkpoint; requantize takes it.
  ASSERT_EQ(convert_checkpoint({d / "src", d / "refused", Window::Marlin, 2}).result, Outcome::Refused);
  const Report r = requantize_checkpoint({d / "src", d / "dst", 2});
  ASSERT_EQ(r.result, Outcome::Ok);
  EXPECT_EQ(r.modules, 18u);
  ASSERT_EQ(r.requantized.size(), 18u);
  for (const auto& m : r.requantized) {
    EXPECT_EQ(m.values, 128u * 64u) << m.module;  // w1/w3 [64, 128], w2 [128, 64]
    EXPECT_GE(m.relative_rmse, 0.0);
    EXPECT_LT(m.relative_rmse, 1.0) << m.module;
    EXPECT_GT(m.cosine, 0.5) << m.module;
    EXPECT_LE(m.cosine, 1.0 + 1e-12) << m.module;
    EXPECT_GT(m.global_scale, 0.0f);
  }

  // Same tensor names, dtypes and shapes as a lossless conversion of an in-window twin.
  ScratchDir twin;
  FixtureSpec fits = spec;
  fits.overrides.clear();
  write_fixture(twin / "src", fits);
  ASSERT_EQ(convert_checkpoint({twin / "src", twin / "dst", Window::Marlin, 2}).result, Outcome::Ok);
  const json index = json::parse(read_file(d / "dst" / std::string(kIndexFileName)));
  EXPECT_EQ(index, json::parse(read_file(twin / "dst" / std::string(kIndexFileName))));
  for (const auto& shard : {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                            "model-00003-of-00003.safetensors"}) {
    EXPECT_EQ(header_of(d / "dst" / shard), header_of(twin / "dst" / shard)) << shard;
  }
  EXPECT_EQ(read_file(d / "dst" / "config.json"), read_file(twin / "dst" / "config.json"));

  // Pass-through tensors are byte for byte; gate/up pairs share one global equal to the report's.
  for (const auto& [name, shard] : index["weight_map"].items()) {
    const fs::path file = d / "dst" / shard.get<std::string>();
    if (name.find(".experts.") == std::string::npos) {
      EXPECT_EQ(tensor_bytes(file, name),
                tensor_bytes(d / "src" / json::parse(read_file(d / "src" / std::string(kIndexFileName)))["weight_map"][name]
                                     .get<std::string>(),
                             name))
          << name;
    }
  }
  for (unsigned layer = 0; layer < spec.layers; ++layer) {
    for (unsigned e = 0; e < spec.experts; ++e) {
      const std::string w1 = fixture_module_name(spec, layer, e, 0), w3 = fixture_module_name(spec, layer, e, 1);
      const float g1 = global_of(d / "dst" / index["weight_map"][w1 + ".weight_global_scale"].get<std::string>(), w1);
      const float g3 = global_of(d / "dst" / index["weight_map"][w3 + ".weight_global_scale"].get<std::string>(), w3);
      EXPECT_EQ(g1, g3) << w1;
      for (const auto& m : r.requantized) {
        if (m.module == w1) {
          EXPECT_EQ(m.global_scale, g1);
        }
      }
    }
  }
  EXPECT_EQ(snapshot(d / "dst").count(".mx2nv/finished.json"), 1u);
}

TEST(Requantize, SameInputGivesByteIdenticalOutputWhateverTheThreads) {
  ScratchDir d;
  write_fixture(d / "src", spec_with_over_span());
  const Report a = requantize_checkpoint({d / "src", d / "one", 1});
  const Report b = requantize_checkpoint({d / "src", d / "four", 4});
  EXPECT_EQ(snapshot(d / "one"), snapshot(d / "four"));
  ASSERT_EQ(a.requantized.size(), b.requantized.size());
  for (std::size_t i = 0; i < a.requantized.size(); ++i) {
    EXPECT_EQ(a.requantized[i].relative_rmse, b.requantized[i].relative_rmse);
    EXPECT_EQ(a.requantized[i].cosine, b.requantized[i].cosine);
  }
}

TEST(Requantize, NaNScaleIsInvalidInputAndWritesNothing) {
  ScratchDir d;
  FixtureSpec spec = spec_with_over_span();
  spec.overrides[fixture_module_name(spec, 0, 1, 2)].nan_scale = true;
  write_fixture(d / "src", spec);
  try {
    requantize_checkpoint({d / "src", d / "dst", 2});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
    EXPECT_NE(std::string(e.what()).find("0xFF"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(d / "dst"));
}

TEST(Requantize, CliPrintsTheErrorSummaryAndWritesTheTable) {
  ScratchDir d;
  write_fixture(d / "src", spec_with_over_span());
  const CliResult r = run_cli("requantize " + (d / "src").string() + " " + (d / "dst").string() + " --threads 2 --report " +
                              (d / "report.json").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("LOSSY"), std::string::npos) << r.out;
  const json report = json::parse(read_file(d / "report.json"));
  EXPECT_EQ(report["command"], "requantize");
  EXPECT_EQ(report["requantized"].size(), 18u);
  EXPECT_TRUE(report["requantized"][0].contains("relative_rmse"));
  // A non-empty DST is a usage error, as for convert.
  EXPECT_EQ(run_cli("requantize " + (d / "src").string() + " " + (d / "dst").string()).exit_code, 2);
}

}  // namespace
}  // namespace mx2nv::e2e

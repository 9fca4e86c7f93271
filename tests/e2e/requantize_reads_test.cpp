// How requantize reads its source. A scale group's largest |value| is found
// from its scales and a few groups (scale_group_amax): it must equal what
// every value gives, also where the scales force a whole read (extreme
// all-zero groups, all-zero modules, scale bytes that can overflow float32),
// and it must read far less than the packed bytes where the scales allow.
// A requantization then reads SRC's bytes about once: the packed codes and
// the scales of a module come from one pass.
#include "checkpoint/reader.hpp"
#include "common/error.hpp"
#include "numerics/formats.hpp"
#include "numerics/nvfp4_quantizer.hpp"
#include "requantize/requantize.hpp"
#include "plan/plan.hpp"
#include "scan/overspan_values.hpp"
#include "scan/requantizer.hpp"
#include "e2e_support.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <vector>

namespace mx2nv::e2e {
namespace {

// Gate/up [512, 1024]: a pair of 512 KiB of packed bytes (read from its
// scales); down [1024, 512]: 256 KiB (read whole).
FixtureSpec large_modules() {
  FixtureSpec s;
  s.layers = 1;
  s.experts = 3;
  s.hidden = 1024;
  s.intermediate = 512;
  s.shards = 2;
  s.out_of_window_zero_groups = false;
  return s;
}

// A module tensor's bytes, read from SRC: `extent` is m.packed or m.scale of
// the module's `shard`.
std::vector<std::byte> source_tensor(const SourceCheckpoint& s, std::size_t shard, const TensorExtent& extent) {
  std::vector<std::byte> bytes(extent.nbytes());
  s.checkpoint.files->open(shard)->read_at(s.checkpoint.shards[shard].data_start + extent.begin, bytes);
  return bytes;
}

// Every value of the scale group decoded from its raw bytes; nullopt when
// one is beyond float32 or a scale is NaN.
std::optional<float> amax_of_every_value(const SourceCheckpoint& s, std::size_t sg) {
  float amax = 0;
  for (const std::size_t module : s.modules.scale_groups[sg]) {
    const QuantModule& m = s.modules.modules[module];
    const std::vector<std::byte> packed = source_tensor(s, m.packed_shard, m.packed);
    const std::vector<std::byte> scales = source_tensor(s, m.scale_shard, m.scale);
    for (std::size_t g = 0; g < scales.size(); ++g) {
      const auto e8m0 = std::to_integer<std::uint8_t>(scales[g]);
      if (e8m0 == kE8M0NaN) return std::nullopt;
      const auto v = mxfp4_group_amax(std::span<const std::byte, 16>(packed.data() + 16 * g, 16), e8m0);
      if (!v) return std::nullopt;
      amax = std::max(amax, *v);
    }
  }
  return amax;
}

// Bytes this process has read through system calls (/proc/self/io rchar).
std::uint64_t bytes_read_so_far() {
  std::ifstream io("/proc/self/io");
  std::string key;
  std::uint64_t value = 0;
  while (io >> key >> value) {
    if (key == "rchar:") return value;
  }
  return 0;
}

void expect_amax_of_every_value(const FixtureSpec& spec, const std::string& what) {
  ScratchDir d;
  write_fixture(d / "src", spec);
  const SourceCheckpoint s = open_source_checkpoint(d / "src");
  const auto sparse = s.checkpoint.files->pool_for(CacheUse::Passing);
  for (std::size_t sg = 0; sg < s.modules.scale_groups.size(); ++sg) {
    const std::optional<float> expected = amax_of_every_value(s, sg);
    if (!expected) {
      EXPECT_THROW(scale_group_amax(s, sg, *sparse), Error) << what << " group " << sg;
      continue;
    }
    const float got = scale_group_amax(s, sg, *sparse);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(got), std::bit_cast<std::uint32_t>(*expected)) << what << " group " << sg;
  }
}

// Rewrites, in place, a few groups of each module of scale group 0 (a
// gate/up pair) to lie `levels` scale bytes above the module's largest,
// five a byte, holding only 0.5 x 2^k: the largest value then lies
// `levels` scale bytes below the largest scale byte.
void raise_small_groups(const fs::path& root, int levels) {
  const SourceCheckpoint s = open_source_checkpoint(root);
  ASSERT_EQ(s.modules.scale_groups[0].size(), 2u);
  for (const std::size_t module : s.modules.scale_groups[0]) {
    const QuantModule& m = s.modules.modules[module];
    const auto& packed_shard = s.checkpoint.shards[m.packed_shard];
    const auto& scale_shard = s.checkpoint.shards[m.scale_shard];
    const std::vector<std::byte> scales = source_tensor(s, m.scale_shard, m.scale);
    const auto top = std::to_integer<int>(*std::max_element(scales.begin(), scales.end()));
    std::fstream packed(root / packed_shard.file, std::ios::in | std::ios::out | std::ios::binary);
    std::fstream scale(root / scale_shard.file, std::ios::in | std::ios::out | std::ios::binary);
    const std::string halves(16, '\x11');
    for (int g = 0; g < 5 * levels; ++g) {
      const auto group = static_cast<std::streamoff>(100 + 97 * g);
      packed.seekp(static_cast<std::streamoff>(packed_shard.data_start + m.packed.begin) + 16 * group);
      packed.write(halves.data(), 16);
      const char byte = static_cast<char>(top + 1 + g / 5);
      scale.seekp(static_cast<std::streamoff>(scale_shard.data_start + m.scale.begin) + group);
      scale.write(&byte, 1);
    }
  }
}

TEST(RequantizeReads, LargestValueBelowTheLargestScales) {
  for (const int levels : {1, 2}) {
    ScratchDir d;
    write_fixture(d / "src", large_modules());
    raise_small_groups(d / "src", levels);
    const SourceCheckpoint s = open_source_checkpoint(d / "src");
    const auto sparse = s.checkpoint.files->pool_for(CacheUse::Passing);
    const std::optional<float> expected = amax_of_every_value(s, 0);
    ASSERT_TRUE(expected);
    const std::uint64_t before = bytes_read_so_far();
    EXPECT_EQ(scale_group_amax(s, 0, *sparse), *expected) << levels;
    // From the scales and a few groups, not read whole.
    const std::uint64_t scale_bytes = 2 * s.modules.modules[s.modules.scale_groups[0][0]].group_count();
    EXPECT_LE(bytes_read_so_far() - before, scale_bytes + 64 * kGroupBytes) << levels;
  }
}

TEST(RequantizeReads, LargestValueFromTheScalesIsEveryValuesLargest) {
  FixtureSpec plain = large_modules();
  expect_amax_of_every_value(plain, "plain");
  for (std::uint64_t seed = 2; seed < 5; ++seed) {
    FixtureSpec wide = large_modules();
    wide.seed = seed;
    wide.span = 40;
    wide.zero_group_percent = 30;
    expect_amax_of_every_value(wide, "wide, seed " + std::to_string(seed));
  }
  // All-zero groups whose scales lie far above the module's values: every
  // scale byte down to the values' must be looked at, or read whole.
  FixtureSpec extreme = large_modules();
  extreme.out_of_window_zero_groups = true;
  extreme.zero_group_percent = 20;
  expect_amax_of_every_value(extreme, "extreme zero scales");
  FixtureSpec zeros = large_modules();
  zeros.overrides[fixture_module_name(zeros, 0, 0, 0)].all_zero = true;
  zeros.overrides[fixture_module_name(zeros, 0, 1, 0)].all_zero = true;
  zeros.overrides[fixture_module_name(zeros, 0, 1, 1)].all_zero = true;
  expect_amax_of_every_value(zeros, "all-zero modules");
  // Scale bytes 251-254: the largest values float32 holds, and beyond it.
  for (const int k_max : {124, 125, 126, 127}) {
    FixtureSpec high = large_modules();
    high.overrides[fixture_module_name(high, 0, 0, 1)].k_max = k_max;
    high.overrides[fixture_module_name(high, 0, 2, 0)].k_max = k_max;
    expect_amax_of_every_value(high, "k_max " + std::to_string(k_max));
  }
  FixtureSpec low = large_modules();
  low.k_max = -120;
  low.span = 7;
  expect_amax_of_every_value(low, "smallest scales");
}

TEST(RequantizeReads, LargestValueOfALargePairReadsItsScalesAndAFewGroups) {
  ScratchDir d;
  const FixtureSpec spec = large_modules();
  write_fixture(d / "src", spec);
  const SourceCheckpoint s = open_source_checkpoint(d / "src");
  const auto sparse = s.checkpoint.files->pool_for(CacheUse::Passing);
  std::size_t pairs = 0;
  for (std::size_t sg = 0; sg < s.modules.scale_groups.size(); ++sg) {
    if (s.modules.scale_groups[sg].size() != 2) continue;
    ++pairs;
    std::uint64_t scale_bytes = 0;
    for (const std::size_t m : s.modules.scale_groups[sg]) scale_bytes += s.modules.modules[m].group_count();
    const std::uint64_t before = bytes_read_so_far();
    scale_group_amax(s, sg, *sparse);
    const std::uint64_t read = bytes_read_so_far() - before;
    EXPECT_GE(read, scale_bytes) << sg;
    EXPECT_LE(read, scale_bytes + 64 * kGroupBytes) << sg;  // the scales and at most 64 groups
  }
  EXPECT_EQ(pairs, 3u);
}

TEST(RequantizeReads, RequantizeReadsItsSourceAboutOnce) {
  ScratchDir d;
  FixtureSpec spec = large_modules();
  spec.intermediate = 1024;  // every module above the size read whole
  write_fixture(d / "src", spec);
  std::uint64_t source_bytes = 0;
  for (const auto& e : fs::recursive_directory_iterator(d / "src")) {
    if (e.is_regular_file()) source_bytes += e.file_size();
  }
  const std::uint64_t before = bytes_read_so_far();
  ASSERT_EQ(requantize_checkpoint({d / "src", d / "dst", 2}).result, Outcome::Ok);
  const std::uint64_t read = bytes_read_so_far() - before;
  // SRC once, its scales (1/17 of the experts' bytes) again for the plan,
  // the block scales written read back from DST (2/17), a few groups,
  // headers and companions.
  EXPECT_LT(static_cast<double>(read), 1.2 * static_cast<double>(source_bytes)) << read << " of " << source_bytes;
  EXPECT_GT(read, source_bytes);
}

// Modules of 16 MiB (a million groups): their block scales are written
// ahead in several pieces at increasing offsets, and the pair's scales are
// too many to hold, so its amax reads it whole. Every tensor must equal the
// two passes of the value-by-value streams.
TEST(RequantizeReads, LargeModulesWrittenInOnePassEqualTheTwoPasses) {
  ScratchDir d;
  FixtureSpec spec = large_modules();
  spec.experts = 1;
  spec.hidden = 8192;
  spec.intermediate = 4096;
  spec.shards = 1;
  write_fixture(d / "src", spec);
  ASSERT_EQ(requantize_checkpoint({d / "src", d / "dst", 2}).result, Outcome::Ok);
  const SourceCheckpoint s = open_source_checkpoint(d / "src");
  const Plan plan = requantize_plan(s, 2, TargetFormat::CompressedTensors);
  ASSERT_EQ(s.modules.modules.size(), 3u);
  for (std::size_t i = 0; i < s.modules.modules.size(); ++i) {
    const QuantModule& m = s.modules.modules[i];
    ASSERT_GT(m.group_count(), kCopyBufferBytes / 2);  // more than one piece of written scales
    const SecondLevel level = requantized_level(plan.format, plan.modules[i]);
    std::string packed, scales;
    const auto append = [](std::string& to) {
      return [&to](std::uint64_t offset, std::span<const std::byte> bytes) {
        EXPECT_EQ(offset, to.size());
        to.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      };
    };
    ErrorStats stats;
    stream_requantized_packed(s, i, level, append(packed), stats);
    stream_requantized_scales(s, i, level, append(scales));
    const fs::path shard = d / "dst" / "model.safetensors";
    EXPECT_TRUE(tensor_bytes(shard, m.packed_name()) == packed) << m.name;
    EXPECT_TRUE(tensor_bytes(shard, m.scale_name()) == scales) << m.name;
  }
}

}  // namespace
}  // namespace mx2nv::e2e

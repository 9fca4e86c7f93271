// The requantization numerics and the exact BF16 encoding, exhaustively where
// the domain is small (every E4M3 byte, every E2M1 code, every E8M0 byte).
#include "numerics/bf16.hpp"
#include "numerics/formats.hpp"
#include "numerics/nvfp4_quantizer.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace mx2nv {
namespace {

SecondLevel ct(float global) { return {Recipe::CompressedTensors, global}; }
SecondLevel mo(float weight_scale_2) { return {Recipe::ModelOpt, weight_scale_2}; }

// Every finite E4M3 value, ascending, non-negative.
std::vector<double> e4m3_positive_values() {
  std::vector<double> v;
  for (int b = 0; b < 0x7F; ++b) v.push_back(e4m3_value(static_cast<std::uint8_t>(b)));
  return v;
}

TEST(E4M3Round, EveryByteRoundTrips) {
  for (int b = 0; b < 256; ++b) {
    const auto byte = static_cast<std::uint8_t>(b);
    if ((byte & 0x7F) == 0x7F) continue;  // NaN
    EXPECT_EQ(e4m3_round(static_cast<float>(e4m3_value(byte))), byte) << b;
  }
}

TEST(E4M3Round, MidpointsTieToEvenAndNeighboursRoundToNearest) {
  const auto v = e4m3_positive_values();
  for (std::size_t i = 0; i + 1 < v.size(); ++i) {
    const double mid = (v[i] + v[i + 1]) / 2;  // exact in float: E4M3 has 3 mantissa bits
    const std::uint8_t even = (i % 2 == 0) ? static_cast<std::uint8_t>(i) : static_cast<std::uint8_t>(i + 1);
    EXPECT_EQ(e4m3_round(static_cast<float>(mid)), even) << mid;
    EXPECT_EQ(e4m3_round(std::nextafter(static_cast<float>(mid), 0.0f)), i) << mid;
    EXPECT_EQ(e4m3_round(std::nextafter(static_cast<float>(mid), 1000.0f)), i + 1) << mid;
  }
  EXPECT_EQ(e4m3_round(-2.0f), 0x80 | e4m3_round(2.0f));
}

TEST(E4M3Round, RandomFloatsRoundToANearestValue) {
  const auto v = e4m3_positive_values();
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> exponent(-14, 8.8);
  for (int i = 0; i < 100000; ++i) {
    const auto x = static_cast<float>(std::pow(2.0, exponent(rng)));
    if (x > 448) continue;
    const double got = e4m3_value(e4m3_round(x));
    double best = std::numeric_limits<double>::infinity();
    for (const double c : v) best = std::min(best, std::fabs(c - x));
    EXPECT_EQ(std::fabs(got - x), best) << x;
  }
}

TEST(E2M1Code, EveryCodeRoundTripsAndTiesGoToEven) {
  for (std::uint8_t c = 0; c < 16; ++c) {
    const auto x = static_cast<float>(e2m1_value(c));
    // -0.0 is +0 for compressed-tensors (it multiplies by sign(x), and sign(-0.0) is 0).
    EXPECT_EQ(nvfp4_code(x, 1.0f, 1.0f), c == 0x8 ? 0 : c) << int(c);
  }
  // Midpoints between consecutive magnitudes go to the even code (0, 1, 2, 4 are codes 0, 2, 4, 6).
  const std::array<float, 7> mids{0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const std::array<std::uint8_t, 7> even{0, 2, 2, 4, 4, 6, 6};
  for (std::size_t i = 0; i < mids.size(); ++i) {
    EXPECT_EQ(nvfp4_code(mids[i], 1.0f, 1.0f), even[i]) << mids[i];
    EXPECT_EQ(nvfp4_code(-mids[i], 1.0f, 1.0f), 0x8 | even[i]) << mids[i];
  }
  EXPECT_EQ(nvfp4_code(-0.1f, 1.0f, 1.0f), 0x8);  // a negative rounding to zero keeps its sign
  EXPECT_EQ(nvfp4_code(100.0f, 1.0f, 1.0f), 7);    // clamped to 6
  EXPECT_EQ(nvfp4_code(3.0f, 2.0f, 4.0f), 7);      // 3 / (2 / 4) = 6
}

TEST(GlobalScale, FollowsGenerateGparam) {
  EXPECT_EQ(nvfp4_global_scale(6.0f), 448.0f);
  EXPECT_EQ(nvfp4_global_scale(-6.0f), 448.0f);
  EXPECT_EQ(nvfp4_global_scale(3.0f), 896.0f);
  EXPECT_EQ(nvfp4_global_scale(0.0f), 1.0f);        // 2688 / FLT_MIN overflows: 1.0
  EXPECT_EQ(nvfp4_global_scale(1e-37f), 1.0f);
  EXPECT_EQ(nvfp4_global_scale(1.0f), 2688.0f);
}

TEST(BlockScale, RoundsToE4M3AndReplacesZeroByEpsilon) {
  const BlockScale full = nvfp4_block_scale(6.0f, 448.0f);
  EXPECT_EQ(full.byte, 0x7E);
  EXPECT_EQ(full.value, 448.0f);
  const BlockScale none = nvfp4_block_scale(0.0f, 448.0f);
  EXPECT_EQ(none.byte, 0x20);
  EXPECT_EQ(none.value, 0.125f);
  const BlockScale clamped = nvfp4_block_scale(7.0f, 448.0f);  // 522.7 clamps to 448
  EXPECT_EQ(clamped.byte, 0x7E);
}

std::array<std::byte, 16> pack(const std::array<std::uint8_t, 32>& codes) {
  std::array<std::byte, 16> out{};
  for (std::size_t j = 0; j < 16; ++j) out[j] = static_cast<std::byte>(codes[2 * j] | (codes[2 * j + 1] << 4));
  return out;
}

// ModelOpt's steps (nvidia-modelopt 0.47.0 NVFP4QTensor), against bit
// patterns computed with numpy float32 arithmetic in the same order.
TEST(ModelOptQuantizer, WeightScale2IsAmaxOver2688InFloat32) {
  const auto bits = [](float amax) { return std::bit_cast<std::uint32_t>(modelopt_weight_scale_2(amax)); };
  EXPECT_EQ(bits(6.0f), 0x3b124925u);
  EXPECT_EQ(bits(-6.0f), 0x3b124925u);
  EXPECT_EQ(bits(3.0f), 0x3a924925u);
  EXPECT_EQ(bits(0.5f), 0x39430c31u);
  EXPECT_EQ(bits(0x1p-7f), 0x36430c31u);
  EXPECT_EQ(bits(1.5f * 0x1p127f), 0x79924925u);
  EXPECT_EQ(bits(0x1p-128f), 0x0000030cu);  // subnormal: refused by the plan, never written
  EXPECT_EQ(bits(0.0f), bits(6.0f));        // the deliberate deviation: an all-zero module as amax 6
  EXPECT_TRUE(second_level_for(Recipe::ModelOpt, 6.0f).same_as(mo(modelopt_weight_scale_2(6.0f))));
  EXPECT_TRUE(second_level_for(Recipe::CompressedTensors, 6.0f).same_as(ct(448.0f)));
  EXPECT_FALSE(ct(448.0f).same_as(mo(448.0f)));
  // Never a power of two for any amax an MXFP4 module can have: verify tells
  // a requantized module from an exact one by that.
  for (int k = -127; k <= 127; ++k) {
    for (const float code : {0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f}) {
      const float amax = std::ldexp(code, k);
      if (!std::isfinite(amax) || amax == 0) continue;
      int e = 0;
      EXPECT_NE(std::frexp(modelopt_weight_scale_2(amax), &e), 0.5f) << amax;
    }
  }
}

TEST(ModelOptQuantizer, BlockScalesFloorAt2ToTheMinus9AndTakeOneForZero) {
  const float w = modelopt_weight_scale_2(6.0f);
  EXPECT_EQ(modelopt_block_scale(6.0f, w).byte, 0x7E);  // 447.99997 rounds to 448
  EXPECT_EQ(modelopt_block_scale(0.0f, w).byte, 0x38);  // an all-zero block: 1.0, not compressed-tensors' 0.125
  EXPECT_EQ(modelopt_block_scale(0.0f, w).value, 1.0f);
  // 6 x 2^-10 / (6w) = 448 x 2^-10 / 6 ... far below 2^-9: the floor, where
  // compressed-tensors rounds to 0 and takes 0.125 (0x20).
  EXPECT_EQ(modelopt_block_scale(0x1p-20f, w).byte, 0x01);
  EXPECT_EQ(nvfp4_block_scale(0x1p-20f, nvfp4_global_scale(6.0f)).byte, 0x20);
  // The exact tie s = 2^-10 lies below the floor too.
  const float w1 = modelopt_weight_scale_2(448.0f * 6.0f);  // 6w = 6: s = b / 6
  EXPECT_EQ(modelopt_block_scale(6.0f * 0x1p-10f, w1).byte, 0x01);
  // A subnormal 6w: the quotient passes 448 and is clamped.
  const float tiny = modelopt_weight_scale_2(0x1p-128f);
  EXPECT_EQ(modelopt_block_scale(0x1p-128f, tiny).byte, 0x7E);
  // A quotient that underflows to 0 is taken as 1.0, as a zero block's.
  const float huge = modelopt_weight_scale_2(1.5f * 0x1p127f);
  EXPECT_EQ(modelopt_block_scale(0x1p-128f, huge).byte, 0x38);
}

TEST(ModelOptQuantizer, CodesDivideOnceByTheProductAndKeepTheSignOfTheQuotient) {
  // The product first, then one division: 2^-18 / fl(0.75 w) is 1.7499999
  // (code 3), where (2^-18 / 0.75) / w would be the tie 1.75 (code 4).
  const float w = modelopt_weight_scale_2(0x1p-7f);
  EXPECT_EQ(modelopt_code(0x1p-18f, 0.75f, w), 3);
  EXPECT_EQ(modelopt_code(-0x1p-18f, 0.75f, w), 0x8 | 3);
  // Thresholds and ties (S w = 1): the same as compressed-tensors'.
  const float one = 1.0f;
  const struct {
    float t;
    std::uint8_t code;
  } cases[] = {{0.25f, 0}, {0.75f, 2}, {1.25f, 2}, {1.75f, 4}, {2.5f, 4}, {3.5f, 6}, {5.0f, 6}, {5.5f, 7},
               {std::nextafter(0.25f, 1.0f), 1}, {std::nextafter(0.75f, 0.0f), 1}, {std::nextafter(1.25f, 2.0f), 3},
               {std::nextafter(1.75f, 0.0f), 3}, {std::nextafter(2.5f, 3.0f), 5}, {std::nextafter(3.5f, 0.0f), 5},
               {std::nextafter(5.0f, 6.0f), 7}, {100.0f, 7}, {std::numeric_limits<float>::infinity(), 7}};
  for (const auto& c : cases) {
    EXPECT_EQ(modelopt_code(c.t, 1.0f, one), c.code) << c.t;
    EXPECT_EQ(modelopt_code(-c.t, 1.0f, one), 0x8 | c.code) << c.t;
  }
  EXPECT_EQ(modelopt_code(-0.0f, 1.0f, one), 0x0);   // _cast_fp4: -0.0 < 0 is false
  EXPECT_EQ(modelopt_code(-0.1f, 1.0f, one), 0x8);   // a small negative keeps its sign bit
}

TEST(ModelOptQuantizer, AGroupAtTheModuleMaximumIsReproducedExactly) {
  std::array<std::uint8_t, 32> codes{};
  for (std::size_t i = 0; i < 32; ++i) codes[i] = static_cast<std::uint8_t>(i % 16 == 0 ? 7 : i % 16);
  std::array<std::byte, 16> src{};
  for (std::size_t j = 0; j < 16; ++j) src[j] = static_cast<std::byte>(codes[2 * j] | (codes[2 * j + 1] << 4));
  const std::uint8_t e8m0 = 127 + 3;  // amax 48
  const SecondLevel level = second_level_for(Recipe::ModelOpt, *mxfp4_group_amax(src, e8m0));
  std::array<std::byte, 16> out{};
  std::array<std::uint8_t, 2> scales{};
  ErrorStats stats;
  ASSERT_TRUE(requantize_group(src, e8m0, level, out, scales, stats));
  EXPECT_EQ(scales[0], 0x7E);
  EXPECT_EQ(scales[1], 0x7E);
  // 448 x fl(48 / 2688) is not 8 exactly: values move, by less than half a step.
  EXPECT_EQ(stats.values, 32u);
  EXPECT_GT(stats.max_abs, 0.0);
  EXPECT_LT(stats.max_abs, 48.0 * 1e-6);
  for (std::size_t j = 0; j < 16; ++j) {
    const auto b = std::to_integer<std::uint8_t>(src[j]);
    const auto lo = static_cast<std::uint8_t>((b & 0xF) == 0x8 ? 0 : b & 0xF);
    const auto hi = static_cast<std::uint8_t>((b >> 4) == 0x8 ? 0 : b >> 4);
    EXPECT_EQ(std::to_integer<std::uint8_t>(out[j]), lo | (hi << 4)) << j;
  }
}

TEST(RequantizeGroup, AGroupAtTheModuleMaximumIsReproducedExactly) {
  std::array<std::uint8_t, 32> codes{};
  for (std::size_t i = 0; i < 32; ++i) codes[i] = static_cast<std::uint8_t>(i % 16 == 0 ? 7 : i % 16);
  const auto src = pack(codes);
  const std::uint8_t e8m0 = 127 + 3;  // 2^3: amax 48
  const float global = nvfp4_global_scale(*mxfp4_group_amax(src, e8m0));
  EXPECT_EQ(global, 2688.0f / 48.0f);
  std::array<std::byte, 16> out{};
  std::array<std::uint8_t, 2> scales{};
  ErrorStats stats;
  ASSERT_TRUE(requantize_group(src, e8m0, ct(global), out, scales, stats));
  // Both blocks hold a 6: scale 448, effective scale 448 / (2688 / 48) = 8 = 2^3.
  EXPECT_EQ(scales[0], 0x7E);
  EXPECT_EQ(scales[1], 0x7E);
  for (std::size_t j = 0; j < 16; ++j) {
    // -0 (0x8) becomes +0; everything else is unchanged.
    const auto expect = static_cast<std::uint8_t>(std::to_integer<std::uint8_t>(src[j]));
    const auto lo = static_cast<std::uint8_t>((expect & 0xF) == 0x8 ? 0 : expect & 0xF);
    const auto hi = static_cast<std::uint8_t>((expect >> 4) == 0x8 ? 0 : expect >> 4);
    EXPECT_EQ(std::to_integer<std::uint8_t>(out[j]), lo | (hi << 4)) << j;
  }
  EXPECT_EQ(stats.values, 32u);
  EXPECT_EQ(stats.max_abs, 0.0);
  EXPECT_EQ(stats.relative_rmse(), 0.0);
  EXPECT_DOUBLE_EQ(stats.cosine(), 1.0);
}

TEST(RequantizeGroup, ASmallGroupUnderALargeGlobalLosesPrecisionMeasurably) {
  std::array<std::uint8_t, 32> codes{};
  codes.fill(3);  // 1.5
  const auto src = pack(codes);
  // The module's maximum is 6 x 2^20; this group is 1.5 x 2^0: scale 448 x 1.5/6/2^20 = 1.07e-4, below E4M3's range.
  const float global = nvfp4_global_scale(std::ldexp(6.0f, 20));
  std::array<std::byte, 16> out{};
  std::array<std::uint8_t, 2> scales{};
  ErrorStats stats;
  ASSERT_TRUE(requantize_group(src, 127, ct(global), out, scales, stats));
  // The scale rounds to 0 and becomes 0.125: the effective scale 0.125 / global = 292.6 sends every value to 0.
  EXPECT_EQ(scales[0], 0x20);
  EXPECT_EQ(scales[1], 0x20);
  for (const auto b : out) EXPECT_EQ(std::to_integer<int>(b), 0);
  EXPECT_EQ(stats.max_abs, 1.5);
  EXPECT_EQ(stats.relative_rmse(), 1.0);
  EXPECT_EQ(stats.cosine(), 0.0);
}

TEST(RequantizeGroup, ValuesBeyondFloat32AreRefused) {
  std::array<std::uint8_t, 32> codes{};
  codes[5] = 7;  // 6 x 2^127 overflows float32
  const auto src = pack(codes);
  std::array<std::byte, 16> out{};
  std::array<std::uint8_t, 2> scales{};
  ErrorStats stats;
  EXPECT_FALSE(requantize_group(src, 254, ct(1.0f), out, scales, stats));
  EXPECT_FALSE(requantize_group(src, 254, mo(1.0f), out, scales, stats));
  EXPECT_FALSE(mxfp4_group_amax(src, 254).has_value());
  EXPECT_EQ(stats.values, 0u);
  codes[5] = 1;  // 0.5 x 2^127 is fine
  EXPECT_TRUE(mxfp4_group_amax(pack(codes), 254).has_value());
}

TEST(RequantizeGroup, ScalesOnlyPathAgreesWithTheFullPathForEveryScaleByte) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> nibble(0, 15);
  for (int b = 0; b < 255; ++b) {
    std::array<std::uint8_t, 32> codes{};
    for (auto& c : codes) c = static_cast<std::uint8_t>(nibble(rng));
    if (b % 3 == 0) std::fill(codes.begin() + 16, codes.end(), std::uint8_t{0x8});  // an all -0 block
    const auto src = pack(codes);
    for (const SecondLevel level : {ct(1.0f), ct(448.0f), ct(nvfp4_global_scale(std::ldexp(6.0f, b - 127))), ct(3e30f),
                                    mo(1.0f), mo(modelopt_weight_scale_2(std::ldexp(6.0f, b - 127))), mo(3e-30f)}) {
      std::array<std::byte, 16> out{};
      std::array<std::uint8_t, 2> full{}, only{};
      ErrorStats stats;
      const bool ok = requantize_group(src, static_cast<std::uint8_t>(b), level, out, full, stats);
      EXPECT_EQ(GroupRequantizer(level).scales(src, static_cast<std::uint8_t>(b), only), ok) << b;
      if (ok) {
        EXPECT_EQ(full, only) << b << " " << level.stored;
      }
    }
  }
}

// The quantizer's steps value by value, as the file comment of
// numerics/nvfp4_quantizer.hpp states them: the reference the block-wise
// implementations (requantize_group, GroupRequantizer) must equal in every
// byte and every statistic, bit for bit.
bool reference_group(std::span<const std::byte, 16> packed, std::uint8_t e8m0, SecondLevel level,
                     std::array<std::byte, 16>& out, std::array<std::uint8_t, 2>& scales, ErrorStats& stats) {
  const bool modelopt = level.recipe == Recipe::ModelOpt;
  const float global = level.stored;
  std::array<float, 32> x{};
  if (!mxfp4_group_values_f32(packed, e8m0, x)) return false;
  std::array<std::uint8_t, 32> codes{};
  for (std::size_t block = 0; block < 2; ++block) {
    float amax = 0;
    for (std::size_t i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(x[block * 16 + i]));
    const BlockScale scale = modelopt ? modelopt_block_scale(amax, global) : nvfp4_block_scale(amax, global);
    scales[block] = scale.byte;
    if ((scale.byte & 0x78) == 0 && (scale.byte & 0x07) != 0) ++stats.marlin_zeroed_blocks;
    for (std::size_t i = block * 16; i < block * 16 + 16; ++i) {
      codes[i] = modelopt ? modelopt_code(x[i], scale.value, global) : nvfp4_code(x[i], scale.value, global);
      const double scaled = e2m1_value(codes[i]) * static_cast<double>(scale.value);
      stats.add(static_cast<double>(x[i]),
                modelopt ? scaled * static_cast<double>(global) : scaled / static_cast<double>(global));
    }
  }
  for (std::size_t j = 0; j < 16; ++j) out[j] = static_cast<std::byte>(codes[2 * j] | (codes[2 * j + 1] << 4));
  return true;
}

void expect_same_stats(const ErrorStats& a, const ErrorStats& b) {
  EXPECT_EQ(std::bit_cast<std::uint64_t>(a.sum_err2), std::bit_cast<std::uint64_t>(b.sum_err2));
  EXPECT_EQ(std::bit_cast<std::uint64_t>(a.sum_ref2), std::bit_cast<std::uint64_t>(b.sum_ref2));
  EXPECT_EQ(std::bit_cast<std::uint64_t>(a.sum_q2), std::bit_cast<std::uint64_t>(b.sum_q2));
  EXPECT_EQ(std::bit_cast<std::uint64_t>(a.sum_dot), std::bit_cast<std::uint64_t>(b.sum_dot));
  EXPECT_EQ(std::bit_cast<std::uint64_t>(a.max_abs), std::bit_cast<std::uint64_t>(b.max_abs));
  EXPECT_EQ(a.values, b.values);
  EXPECT_EQ(a.marlin_zeroed_blocks, b.marlin_zeroed_blocks);
}

// The run form of GroupRequantizer::requantize over `e8m0s.size()` groups,
// in runs of `piece` groups (the stats carried from run to run), checked
// against `out_ref`/`sc_ref`/`s_ref`: bytes, scale-only bytes, and every
// statistic bit for bit. Returns the requantizer's counts of block sums
// added whole and of groups added by whole runs.
struct WholeCounts {
  std::uint64_t block_sums = 0, run_groups = 0;
};
WholeCounts expect_runs_equal(SecondLevel global, std::span<const std::byte> packed, std::span<const std::byte> e8m0s,
                                std::span<const std::byte> out_ref, std::span<const std::uint8_t> sc_ref,
                                const ErrorStats& s_ref, std::size_t piece) {
  GroupRequantizer runs(global);
  const std::size_t n = e8m0s.size();
  std::vector<std::byte> out(16 * n);
  std::vector<std::uint8_t> sc(2 * n), sc_only(2 * n);
  ErrorStats stats;
  for (std::size_t first = 0; first < n; first += piece) {
    const std::size_t k = std::min(piece, n - first);
    EXPECT_EQ(runs.requantize(packed.subspan(16 * first, 16 * k), e8m0s.subspan(first, k),
                              std::span(out).subspan(16 * first, 16 * k), std::span(sc).subspan(2 * first, 2 * k), &stats),
              k);
    EXPECT_EQ(runs.requantize(packed.subspan(16 * first, 16 * k), e8m0s.subspan(first, k), {},
                              std::span(sc_only).subspan(2 * first, 2 * k), nullptr),
              k);
  }
  EXPECT_TRUE(std::equal(out.begin(), out.end(), out_ref.begin(), out_ref.end())) << global.stored << " " << piece;
  EXPECT_TRUE(std::equal(sc.begin(), sc.end(), sc_ref.begin(), sc_ref.end())) << global.stored << " " << piece;
  EXPECT_TRUE(std::equal(sc_only.begin(), sc_only.end(), sc_ref.begin(), sc_ref.end())) << global.stored << " " << piece;
  expect_same_stats(stats, s_ref);
  return {runs.blocks_summed_whole(), runs.groups_in_whole_runs()};
}

// Every E8M0 byte, blocks of every largest magnitude (all-zero and all -0
// blocks too), globals from tiny to huge: one GroupRequantizer per global
// across all of them (its blocks computed once, then looked up), the
// uncached requantize_group, the run form (whole and in pieces) and the
// value-by-value reference agree on every output byte, on refusals, and on
// the statistics accumulated over the run, bit for bit.
TEST(GroupRequantizer, EqualsTheValueByValueStepsForEveryScaleByteAndBlockMaximum) {
  std::mt19937 rng(29);
  std::uniform_int_distribution<int> nibble(0, 15);
  for (const SecondLevel global :
       {ct(1.0f), ct(448.0f), ct(2688.0f), ct(nvfp4_global_scale(6.0f * 0x1p-100f)), ct(3e30f), ct(1e-30f),
        ct(nvfp4_global_scale(5.0f)), ct(nvfp4_global_scale(1.5f * 0x1p20f)), mo(1.0f), mo(modelopt_weight_scale_2(6.0f)),
        mo(modelopt_weight_scale_2(6.0f * 0x1p-100f)), mo(modelopt_weight_scale_2(5.0f)),
        mo(modelopt_weight_scale_2(1.5f * 0x1p20f)), mo(3e-30f)}) {
    GroupRequantizer cached(global);
    ErrorStats s_ref, s_one, s_cached;
    std::size_t refused = 0;
    std::vector<std::byte> run_packed, run_e8m0s, run_out;  // the groups requantized, for the run form
    std::vector<std::uint8_t> run_scales;
    std::array<std::byte, 16> refused_group{};
    std::byte refused_e8m0{};
    for (int rep = 0; rep < 24; ++rep) {
      for (int b = 0; b < 255; ++b) {
        std::array<std::uint8_t, 32> codes{};
        const unsigned top0 = static_cast<unsigned>(rep % 8), top1 = static_cast<unsigned>((rep / 3) % 8);  // each block's largest magnitude
        for (std::size_t i = 0; i < 32; ++i) {
          const unsigned top = i < 16 ? top0 : top1;
          codes[i] = static_cast<std::uint8_t>((static_cast<unsigned>(nibble(rng)) % (top + 1)) |
                                               (static_cast<unsigned>(nibble(rng)) & 0x8u));
        }
        codes[rng() % 16] = static_cast<std::uint8_t>(top0 | (rng() & 0x8u));
        codes[16 + rng() % 16] = static_cast<std::uint8_t>(top1 | (rng() & 0x8u));
        if (rep == 5) std::fill(codes.begin(), codes.begin() + 16, std::uint8_t{0x8});  // an all -0 block
        const auto src = pack(codes);
        const auto e8m0 = static_cast<std::uint8_t>(b);
        std::array<std::byte, 16> out_ref{}, out_one{}, out_cached{};
        std::array<std::uint8_t, 2> sc_ref{}, sc_one{}, sc_cached{}, sc_only{};
        const bool ok = reference_group(src, e8m0, global, out_ref, sc_ref, s_ref);
        ASSERT_EQ(requantize_group(src, e8m0, global, out_one, sc_one, s_one), ok) << b;
        ASSERT_EQ(cached.requantize(src, e8m0, out_cached, sc_cached, s_cached), ok) << b;
        ASSERT_EQ(cached.scales(src, e8m0, sc_only), ok) << b;
        if (!ok) {
          ++refused;
          refused_group = src;
          refused_e8m0 = static_cast<std::byte>(e8m0);
          continue;
        }
        run_packed.insert(run_packed.end(), src.begin(), src.end());
        run_e8m0s.push_back(static_cast<std::byte>(e8m0));
        run_out.insert(run_out.end(), out_ref.begin(), out_ref.end());
        run_scales.insert(run_scales.end(), sc_ref.begin(), sc_ref.end());
        ASSERT_EQ(out_one, out_ref) << b << " " << global.stored;
        ASSERT_EQ(out_cached, out_ref) << b << " " << global.stored;
        ASSERT_EQ(sc_one, sc_ref) << b << " " << global.stored;
        ASSERT_EQ(sc_cached, sc_ref) << b << " " << global.stored;
        ASSERT_EQ(sc_only, sc_ref) << b << " " << global.stored;
      }
    }
    expect_same_stats(s_one, s_ref);
    expect_same_stats(s_cached, s_ref);
    EXPECT_GT(s_ref.values, 0u);
    EXPECT_GT(refused, 0u);  // scale bytes 253 and 254 with a large code: beyond float32
    for (const std::size_t piece : {std::size_t{1}, std::size_t{7}, run_e8m0s.size()}) {
      expect_runs_equal(global, run_packed, run_e8m0s, run_out, run_scales, s_ref, piece);
    }

    // A run stops at the first group it cannot requantize (a value beyond
    // float32, a NaN scale byte), writing and counting only the groups before.
    for (const std::byte stop : {refused_e8m0, std::byte{kE8M0NaN}}) {
      std::vector<std::byte> packed(run_packed.begin(), run_packed.begin() + 16 * 100);
      std::vector<std::byte> e8m0s(run_e8m0s.begin(), run_e8m0s.begin() + 100);
      packed.insert(packed.end(), refused_group.begin(), refused_group.end());
      e8m0s.push_back(stop);
      packed.insert(packed.end(), run_packed.begin(), run_packed.begin() + 16);
      e8m0s.push_back(run_e8m0s[0]);
      std::vector<std::byte> out(16 * e8m0s.size());
      std::vector<std::uint8_t> sc(2 * e8m0s.size());
      ErrorStats stats, first_100;
      GroupRequantizer runs(global);
      EXPECT_EQ(runs.requantize(packed, e8m0s, out, sc, &stats), 100u);
      EXPECT_EQ(runs.requantize(packed, e8m0s, {}, sc, nullptr), 100u);
      runs.requantize(std::span(packed).first(1600), std::span(e8m0s).first(100), out, sc, &first_100);
      expect_same_stats(stats, first_100);
    }
  }
}

// A module-sized run (K3's expert rows: a narrow range of scale bytes, all
// codes): the block sums go whole once the sums are large (the proof at
// SumRun), yet every statistic equals the value-by-value reference's bit for
// bit, under globals with full-precision products (2688 / amax) and with
// exact small ones (powers of two: ties are likeliest there), whole and in
// pieces of a chunk's size and of odd sizes.
TEST(GroupRequantizer, ARunAddsWholeBlocksAndKeepsEveryStatisticBitForBit) {
  std::mt19937 rng(41);
  std::uniform_int_distribution<int> nibble(0, 15), scale(118, 127);
  constexpr std::size_t kGroups = 150000;
  std::vector<std::byte> packed(16 * kGroups), e8m0s(kGroups);
  for (std::size_t g = 0; g < kGroups; ++g) {
    std::array<std::uint8_t, 32> codes{};
    const int shape = static_cast<int>(g % 97);
    for (std::size_t i = 0; i < 32; ++i) {
      codes[i] = static_cast<std::uint8_t>(nibble(rng));
      if (shape < 10) codes[i] &= 0xB;   // smaller magnitudes: other blocks
      if (shape == 11) codes[i] = 0x8;   // all -0
    }
    const auto bytes = pack(codes);
    std::copy(bytes.begin(), bytes.end(), packed.begin() + static_cast<std::ptrdiff_t>(16 * g));
    e8m0s[g] = static_cast<std::byte>(g % 5000 == 17 ? 3 : scale(rng));  // now and then a far smaller scale
  }
  for (const SecondLevel global : {ct(nvfp4_global_scale(6.0f)), ct(nvfp4_global_scale(5.0f * 0x1p-3f)), ct(1.0f),
                                   ct(512.0f), mo(modelopt_weight_scale_2(6.0f)), mo(modelopt_weight_scale_2(5.0f * 0x1p-3f)),
                                   mo(0x1p-9f)}) {
    std::vector<std::byte> out_ref(16 * kGroups);
    std::vector<std::uint8_t> sc_ref(2 * kGroups);
    ErrorStats s_ref;
    for (std::size_t g = 0; g < kGroups; ++g) {
      std::array<std::byte, 16> out{};
      std::array<std::uint8_t, 2> sc{};
      ASSERT_TRUE(reference_group(std::span<const std::byte, 16>(packed.data() + 16 * g, 16),
                                  std::to_integer<std::uint8_t>(e8m0s[g]), global, out, sc, s_ref));
      std::copy(out.begin(), out.end(), out_ref.begin() + static_cast<std::ptrdiff_t>(16 * g));
      sc_ref[2 * g] = sc[0];
      sc_ref[2 * g + 1] = sc[1];
    }
    for (const std::size_t piece : {kGroups, std::size_t{65536}, std::size_t{1237}}) {
      const WholeCounts whole = expect_runs_equal(global, packed, e8m0s, out_ref, sc_ref, s_ref, piece);
      // Both ways taken: most block sums whole, the first ones value by
      // value; groups by whole runs, not all (a run stops at a block not met
      // before, at one whose units tie for a sum, at a sum leaving its
      // binade, at a piece's end). Under compressed-tensors' levels most
      // groups go by runs; ModelOpt's products tie often enough in q x's
      // units that runs stay short there.
      EXPECT_GT(whole.block_sums, 4 * 2 * kGroups / 2) << global.stored << " " << piece;
      EXPECT_LT(whole.block_sums, 4 * 2 * kGroups) << global.stored << " " << piece;
      EXPECT_GT(whole.run_groups, global.recipe == Recipe::CompressedTensors ? kGroups / 2 : 0) << global.stored << " " << piece;
      EXPECT_LT(whole.run_groups, kGroups) << global.stored << " " << piece;
    }
  }
}

// The run form of the largest |value| equals mxfp4_group_amax group by
// group, for every scale byte, and stops where it has none.
TEST(GroupsAmax, EqualsTheOneGroupFormAndStopsAtTheFirstGroupWithoutOne) {
  std::mt19937 rng(13);
  std::vector<std::byte> packed, e8m0s;
  float expected = 0;
  for (int b = 0; b < 255; ++b) {
    std::array<std::uint8_t, 32> codes{};
    const auto top = static_cast<unsigned>(b % 8);
    for (auto& c : codes) c = static_cast<std::uint8_t>((rng() % (top + 1)) | (rng() & 0x8u));
    const auto bytes = pack(codes);
    const auto one = mxfp4_group_amax(bytes, static_cast<std::uint8_t>(b));
    float amax = 0;
    const std::size_t done = mxfp4_groups_amax(bytes, std::array{static_cast<std::byte>(b)}, amax);
    EXPECT_EQ(done, one ? 1u : 0u) << b;
    if (!one) continue;
    EXPECT_EQ(std::bit_cast<std::uint32_t>(amax), std::bit_cast<std::uint32_t>(*one)) << b;
    expected = std::max(expected, *one);
    packed.insert(packed.end(), bytes.begin(), bytes.end());
    e8m0s.push_back(static_cast<std::byte>(b));
  }
  float amax = 0;
  EXPECT_EQ(mxfp4_groups_amax(packed, e8m0s, amax), e8m0s.size());
  EXPECT_EQ(std::bit_cast<std::uint32_t>(amax), std::bit_cast<std::uint32_t>(expected));
  e8m0s[10] = std::byte{kE8M0NaN};
  amax = 0;
  EXPECT_EQ(mxfp4_groups_amax(packed, e8m0s, amax), 10u);

  // Scale bytes below 253 only (no group can fail, groups that cannot raise
  // the maximum are skipped), in an order where the maximum rises late,
  // raised from a starting maximum: the same largest value.
  for (const float start : {0.0f, 1.0f, 0x1p100f}) {
    std::vector<std::byte> some_packed, some_e8m0s;
    float some = start;
    for (std::size_t g = 0; g < 253 && g < packed.size() / 16; ++g) {
      const std::size_t at = (g * 101) % 253;  // a permutation of 0..252
      const auto e = static_cast<std::uint8_t>(at);
      const auto one = mxfp4_group_amax(std::span<const std::byte, 16>(packed.data() + 16 * at, 16), e);
      ASSERT_TRUE(one.has_value());
      some = std::max(some, *one);
      some_packed.insert(some_packed.end(), packed.begin() + static_cast<std::ptrdiff_t>(16 * at),
                         packed.begin() + static_cast<std::ptrdiff_t>(16 * at + 16));
      some_e8m0s.push_back(static_cast<std::byte>(e));
    }
    float got = start;
    EXPECT_EQ(mxfp4_groups_amax(some_packed, some_e8m0s, got), some_e8m0s.size());
    EXPECT_EQ(std::bit_cast<std::uint32_t>(got), std::bit_cast<std::uint32_t>(some)) << start;
  }
}

TEST(GroupValues, EqualTheOneValueDecoderForEveryScaleByteOrAreRefusedWithIt) {
  std::mt19937 rng(11);
  for (int b = 0; b < 255; ++b) {
    std::array<std::byte, 16> packed{};
    for (auto& x : packed) x = static_cast<std::byte>(rng() & 0xFF);
    packed[0] = std::byte{0x70};  // code 7 (6.0) at element 1: the largest value each scale can give
    std::array<float, 32> values{};
    const bool ok = mxfp4_group_values_f32(packed, static_cast<std::uint8_t>(b), values);
    bool all = true;
    for (std::size_t i = 0; i < 32; ++i) {
      const auto byte = std::to_integer<std::uint8_t>(packed[i / 2]);
      const auto code = static_cast<std::uint8_t>(i % 2 == 0 ? (byte & 0xF) : (byte >> 4));
      const auto one = mxfp4_value_f32(code, e8m0_exponent(static_cast<std::uint8_t>(b)));
      all = all && one.has_value();
      if (ok) {
        ASSERT_TRUE(one.has_value());
        EXPECT_EQ(std::bit_cast<std::uint32_t>(values[i]), std::bit_cast<std::uint32_t>(*one)) << b << " " << i;
      }
    }
    EXPECT_EQ(ok, all) << b;
  }
}

TEST(ErrorStats, FormulasOnAHandExample) {
  ErrorStats s;
  s.add(1.0, 1.5);
  s.add(-2.0, -2.0);
  s.add(0.0, 0.5);
  EXPECT_DOUBLE_EQ(s.relative_rmse(), std::sqrt((0.25 + 0.25) / 5.0));
  EXPECT_DOUBLE_EQ(s.cosine(), (1.5 + 4.0) / std::sqrt(5.0 * (2.25 + 4 + 0.25)));
  EXPECT_EQ(s.max_abs, 0.5);
  ErrorStats zero;
  zero.add(0, 0);
  EXPECT_EQ(zero.relative_rmse(), 0.0);
  EXPECT_EQ(zero.cosine(), 1.0);
  ErrorStats merged;
  merged.merge(s);
  merged.merge(zero);
  EXPECT_EQ(merged.values, 4u);
  EXPECT_DOUBLE_EQ(merged.relative_rmse(), s.relative_rmse());
}

TEST(Bf16, EveryMxfp4ValueIsExactOrBeyondBf16sRange) {
  const double bf16_max = bf16_value(0x7F7F);
  int refused = 0;
  for (int b = 0; b < 255; ++b) {
    for (std::uint8_t c = 0; c < 16; ++c) {
      const double v = e2m1_value(c) * e8m0_value(static_cast<std::uint8_t>(b));
      const auto bits = bf16_exact(v);
      if (std::fabs(v) > bf16_max) {
        EXPECT_FALSE(bits.has_value()) << v;
        ++refused;
        continue;
      }
      ASSERT_TRUE(bits.has_value()) << v;
      EXPECT_EQ(bf16_value(*bits), v);
      EXPECT_EQ(std::signbit(bf16_value(*bits)), std::signbit(v));
    }
  }
  // 4 and 6 x 2^126, 2, 3, 4 and 6 x 2^127 (>= 2^128), both signs.
  EXPECT_EQ(refused, 12);
  EXPECT_FALSE(bf16_exact(1.0 + 1.0 / 1024).has_value());  // needs more than 7 mantissa bits
  EXPECT_FALSE(bf16_exact(std::nan("")).has_value());
}

}  // namespace
}  // namespace mx2nv

#include "numerics/formats.hpp"
#include "verify/value_compare.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace mx2nv {
namespace {

struct Groups {
  std::vector<std::byte> src_packed, src_scale, dst_packed, dst_scale;
};

// n groups, random codes, source scale 2^k, target the exact image with global 2^-m.
Groups exact_groups(std::size_t n, int m, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Groups g;
  for (std::size_t i = 0; i < n; ++i) {
    for (int b = 0; b < 16; ++b) g.src_packed.push_back(static_cast<std::byte>(rng() & 0xFF));
    const int k = m + static_cast<int>(rng() % 15) - 6;  // k - m in [-6, 8]
    g.src_scale.push_back(static_cast<std::byte>(k + 127));
    const auto e = e4m3_encode_pow2(k - m).value();
    g.dst_scale.push_back(static_cast<std::byte>(e));
    g.dst_scale.push_back(static_cast<std::byte>(e));
  }
  g.dst_packed = g.src_packed;
  return g;
}

CompareTally compare(const Groups& g, double divisor) {
  CompareTally t;
  compare_groups(g.src_packed, g.src_scale, g.dst_packed, g.dst_scale, divisor, 0, 4, t);
  return t;
}

TEST(ValueCompare, ExactImageHasNoMismatch) {
  const Groups g = exact_groups(64, -10, 1);
  const CompareTally t = compare(g, std::ldexp(1.0, 10));
  EXPECT_EQ(t.values, 64u * 32u);
  EXPECT_EQ(t.mismatches, 0u);
  EXPECT_EQ(t.max_abs_error, 0.0);
  EXPECT_EQ(t.packed_bytes_differing, 0u);
}

TEST(ValueCompare, WrongGlobalIsCaught) {
  const Groups g = exact_groups(8, -10, 2);
  EXPECT_GT(compare(g, std::ldexp(1.0, 11)).mismatches, 0u);
}

TEST(ValueCompare, EveryFlippedBitIsCaught) {
  const Groups base = exact_groups(4, 0, 3);
  for (std::size_t byte = 0; byte < base.dst_packed.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      Groups g = base;
      g.dst_packed[byte] ^= static_cast<std::byte>(1 << bit);
      const CompareTally t = compare(g, 1.0);
      EXPECT_EQ(t.packed_bytes_differing, 1u);  // a -0/+0 flip changes no value but is still a byte difference
    }
  }
  for (std::size_t byte = 0; byte < base.dst_scale.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      Groups g = base;
      g.dst_scale[byte] ^= static_cast<std::byte>(1 << bit);
      EXPECT_GT(compare(g, 1.0).mismatches, 0u) << byte << " " << bit;
    }
  }
}

TEST(ValueCompare, ZeroHalfToleratesAnyFiniteScaleButNotNaN) {
  Groups g = exact_groups(1, 0, 4);
  for (int b = 0; b < 8; ++b) g.src_packed[static_cast<std::size_t>(b)] = std::byte{0x80};  // first half: -0, +0
  g.dst_packed = g.src_packed;
  g.dst_scale[0] = std::byte{0x00};
  EXPECT_EQ(compare(g, 1.0).mismatches, 0u);
  g.dst_scale[0] = std::byte{0x7F};  // NaN: NaN x 0 is NaN
  const CompareTally t = compare(g, 1.0);
  EXPECT_EQ(t.mismatches, 16u);
  EXPECT_TRUE(std::isinf(t.max_abs_error));
}

TEST(ValueCompare, CountsGroupsMarlinWouldFlush) {
  Groups g = exact_groups(3, 0, 5);
  g.src_scale[1] = static_cast<std::byte>(127 - 8);
  g.dst_scale[2] = g.dst_scale[3] = static_cast<std::byte>(e4m3_encode_pow2(-8).value());
  for (int b = 16; b < 32; ++b) g.src_packed[static_cast<std::size_t>(b)] = g.dst_packed[static_cast<std::size_t>(b)] = std::byte{0x11};
  const CompareTally t = compare(g, 1.0);
  EXPECT_EQ(t.mismatches, 0u);
  EXPECT_EQ(t.marlin_zeroed_groups, 1u);
}

TEST(ValueCompare, MismatchNamesRowGroupElement) {
  Groups g = exact_groups(9, 0, 6);
  g.src_packed[16 * 6 + 2] = std::byte{0x10};
  g.dst_packed[16 * 6 + 2] = std::byte{0x20};
  const CompareTally t = compare(g, 1.0);
  ASSERT_FALSE(t.first_mismatches.empty());
  EXPECT_EQ(t.first_mismatches[0].row, 1u);    // position 6, 4 groups per row
  EXPECT_EQ(t.first_mismatches[0].group, 2u);
  EXPECT_EQ(t.first_mismatches[0].element, 5u);  // high nibble of byte 2
}

}  // namespace
}  // namespace mx2nv

#include "verify/value_compare.hpp"

#include "numerics/formats.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

namespace mx2nv {
namespace {

std::uint8_t code_at(const std::byte* group16, unsigned element) {
  const auto b = std::to_integer<std::uint8_t>(group16[element / 2]);
  return element % 2 == 0 ? (b & 0x0F) : (b >> 4);  // even element in the low nibble
}

void record(CompareTally& t, std::uint64_t position, std::uint64_t groups_per_row, unsigned element, double expected,
            double actual) {
  ++t.mismatches;
  const double error = std::isnan(actual) || std::isnan(expected) ? std::numeric_limits<double>::infinity()
                                                                  : std::fabs(expected - actual);
  if (error > t.max_abs_error) t.max_abs_error = error;
  if (t.first_mismatches.size() < kMaxRecordedMismatches) {
    t.first_mismatches.push_back({position / groups_per_row, position % groups_per_row, element, expected, actual});
  }
}

}  // namespace

void compare_groups(std::span<const std::byte> src_packed, std::span<const std::byte> src_scales,
                    std::span<const std::byte> dst_packed, std::span<const std::byte> dst_scales, double divisor,
                    std::uint64_t first_group, std::uint64_t groups_per_row, CompareTally& t) {
  // Factors per scale byte, from the general decoders (never the transcoder's tables).
  std::array<double, 256> src_factor{}, dst_factor{}, dst_scale{};
  for (int b = 0; b < 256; ++b) {
    src_factor[static_cast<std::size_t>(b)] = e8m0_value(static_cast<std::uint8_t>(b));
    dst_scale[static_cast<std::size_t>(b)] = e4m3_value(static_cast<std::uint8_t>(b));
    dst_factor[static_cast<std::size_t>(b)] = dst_scale[static_cast<std::size_t>(b)] / divisor;
  }
  const double min_marlin = std::ldexp(1.0, kE4M3MinNormalPow2);
  constexpr std::uint64_t kMagnitudes = 0x7777777777777777ULL;
  const std::size_t count = src_scales.size();
  t.values += 32 * static_cast<std::uint64_t>(count);
  for (std::size_t g = 0; g < count; ++g) {
    const std::byte* sp = src_packed.data() + 16 * g;
    const std::byte* dp = dst_packed.data() + 16 * g;
    std::uint64_t s_lo = 0, s_hi = 0, d_lo = 0, d_hi = 0;
    std::memcpy(&s_lo, sp, 8);
    std::memcpy(&s_hi, sp + 8, 8);
    std::memcpy(&d_lo, dp, 8);
    std::memcpy(&d_hi, dp + 8, 8);
    const bool bytes_equal = s_lo == d_lo && s_hi == d_hi;
    const auto src_byte = std::to_integer<std::uint8_t>(src_scales[g]);
    const double a = src_factor[src_byte];
    const auto b0 = std::to_integer<std::uint8_t>(dst_scales[2 * g]);
    const auto b1 = std::to_integer<std::uint8_t>(dst_scales[2 * g + 1]);
    if (((s_lo | s_hi) & kMagnitudes) != 0) {
      ++t.active_groups;
      t.max_active_scale = std::max(t.max_active_scale, static_cast<int>(src_byte));  // E8M0 orders as its bytes
    } else {
      ++t.zero_groups;
      if (b0 == 0 && b1 == 0) ++t.canonical_zero_groups;
    }
    // The common case: same codes, same factor for both halves, both scales
    // in Marlin's range. Everything else is examined half by half.
    if (bytes_equal && a == dst_factor[b0] && a == dst_factor[b1] && dst_scale[b0] >= min_marlin &&
        dst_scale[b1] >= min_marlin) {
      continue;
    }
    if (!bytes_equal) {
      for (int i = 0; i < 16; ++i) t.packed_bytes_differing += sp[i] != dp[i] ? 1 : 0;
    }
    const std::uint64_t dst_half[2] = {d_lo, d_hi};
    bool zeroed_by_marlin = false;
    for (unsigned h = 0; h < 2; ++h) {
      const auto sb = h == 0 ? b0 : b1;
      const double d = dst_factor[sb];
      const bool dst_half_active = (dst_half[h] & kMagnitudes) != 0;
      if (dst_half_active && dst_scale[sb] > 0 && dst_scale[sb] < min_marlin) zeroed_by_marlin = true;
      if (bytes_equal && (dst_half_active ? (a == d) : !std::isnan(d))) continue;
      for (unsigned e = 16 * h; e < 16 * h + 16; ++e) {
        const double expected = e2m1_value(code_at(sp, e)) * a;
        const double actual = e2m1_value(code_at(dp, e)) * d;
        if (!(expected == actual)) record(t, first_group + g, groups_per_row, e, expected, actual);
      }
    }
    if (zeroed_by_marlin) ++t.marlin_zeroed_groups;
  }
}

}  // namespace mx2nv

#include "core/value_compare.hpp"

#include "core/numerics.hpp"

#include <cmath>
#include <cstring>
#include <limits>

namespace mx2nv {
namespace {

bool half_has_value(const std::byte* bytes8) {
  for (int i = 0; i < 8; ++i) {
    const auto b = std::to_integer<std::uint8_t>(bytes8[i]);
    if ((b & 0x07) != 0 || (b & 0x70) != 0) return true;
  }
  return false;
}

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
  const std::size_t count = src_scales.size();
  const double min_marlin = std::ldexp(1.0, kE4M3MinNormalPow2);
  for (std::size_t g = 0; g < count; ++g) {
    const std::byte* sp = src_packed.data() + 16 * g;
    const std::byte* dp = dst_packed.data() + 16 * g;
    const std::uint64_t position = first_group + g;
    const double a = e8m0_value(std::to_integer<std::uint8_t>(src_scales[g]));
    const bool bytes_equal = std::memcmp(sp, dp, 16) == 0;
    if (!bytes_equal) {
      for (int i = 0; i < 16; ++i) t.packed_bytes_differing += sp[i] != dp[i] ? 1 : 0;
    }
    const bool src_active = half_has_value(sp) || half_has_value(sp + 8);
    src_active ? ++t.active_groups : ++t.zero_groups;
    bool zeroed_by_marlin = false;
    for (unsigned h = 0; h < 2; ++h) {
      const double s = e4m3_value(std::to_integer<std::uint8_t>(dst_scales[2 * g + h]));
      const double d = s / divisor;
      const bool dst_half_active = half_has_value(dp + 8 * h);
      if (dst_half_active && s > 0 && s < min_marlin) zeroed_by_marlin = true;
      t.values += 16;
      if (bytes_equal) {
        const bool equal = dst_half_active ? (a == d) : !std::isnan(d);
        if (equal) continue;
      }
      for (unsigned e = 16 * h; e < 16 * h + 16; ++e) {
        const double expected = e2m1_value(code_at(sp, e)) * a;
        const double actual = e2m1_value(code_at(dp, e)) * d;
        if (!(expected == actual)) record(t, position, groups_per_row, e, expected, actual);
      }
    }
    if (zeroed_by_marlin) ++t.marlin_zeroed_groups;
  }
}

}  // namespace mx2nv

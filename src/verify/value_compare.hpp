// Verify's value comparison: decodes source (E2M1 x E8M0) and target
// (E2M1 x E4M3 / global) values with the general bit-field decoders and
// compares them exactly. Shares no code with the transcoder's scale mapping.
//
// Fast path, and why it equals comparing every value: within a 16-value half
// whose packed bytes are identical, every value is code_i x a (source) and
// code_i x d (target) for one source factor a and one target factor d, both
// finite or NaN. If a == d (so neither is NaN), every value is equal. If the
// half holds a non-zero code, code x a == code x d for all codes iff a == d.
// If every code is +-0, the values are +-0 x d, equal to the source's +-0 iff
// d is not NaN (E4M3 has no infinity). Anything else takes the per-value path,
// which decodes and compares all 16 values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace mx2nv {

struct ValueMismatch {
  std::uint64_t row = 0;
  std::uint64_t group = 0;    // 32-group within the row
  unsigned element = 0;       // 0..31 within the group
  double expected = 0;        // source value
  double actual = 0;          // target value
};

struct CompareTally {
  std::uint64_t values = 0;
  std::uint64_t mismatches = 0;
  std::uint64_t packed_bytes_differing = 0;
  std::uint64_t active_groups = 0;           // in the source
  std::uint64_t zero_groups = 0;
  std::uint64_t marlin_zeroed_groups = 0;    // target groups Marlin would flush (active half, scale < 2^-6)
  std::uint64_t canonical_zero_groups = 0;   // source zero groups whose two target scale bytes are 0x00
  int max_active_scale = -1;                 // largest source E8M0 byte of an active group; -1: none
  double max_abs_error = 0;
  std::vector<ValueMismatch> first_mismatches;  // capped at kMaxRecordedMismatches
};

inline constexpr std::size_t kMaxRecordedMismatches = 20;

// Compares `count` consecutive 32-groups: src_packed/dst_packed hold 16 bytes
// per group, src_scales one E8M0 byte per group, dst_scales two E4M3 bytes per
// group. `first_group` is the position of the first group in the module and
// `groups_per_row` converts positions to (row, group) for reports.
void compare_groups(std::span<const std::byte> src_packed, std::span<const std::byte> src_scales,
                    std::span<const std::byte> dst_packed, std::span<const std::byte> dst_scales, double divisor,
                    std::uint64_t first_group, std::uint64_t groups_per_row, CompareTally& tally);

}  // namespace mx2nv

// What the plan needs to know about a module's scales, read cheaply.
//
// A group is *active* when one of its 32 codes is non-zero (code & 7 != 0);
// only active groups constrain the global. Deciding activity needs the packed
// bytes, which are 16x the scale bytes, so the scanner works from the scale
// histogram and reads packed bytes only where an answer depends on them:
//   * k_max / k_min: walk scale bytes from the top (bottom) and probe the
//     16 packed bytes of groups carrying that byte until one is active;
//   * counts of active groups in an exponent range: probe each such group.
// Groups with a scale byte outside [k_min, k_max] are zero groups by
// definition, so in a checkpoint that fits the window no group is probed
// beyond the first hits. When probes would cost more than a sequential read
// (budget below), the scanner classifies every group in one streaming pass.
// Every answer is exact either way; only the cost differs.
#pragma once

#include "common/byte_source.hpp"
#include "model/modules.hpp"

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mx2nv {

using ByteHistogram = std::array<std::uint64_t, 256>;

struct ModuleLocation {
  // The same object when both tensors are in one file: a small module's two
  // tensors are then read together.
  const ByteSource* packed = nullptr;
  std::uint64_t packed_offset = 0;  // absolute file offset of weight_packed's first byte
  const ByteSource* scale = nullptr;
  std::uint64_t scale_offset = 0;
  std::string scale_file;  // for error messages
};

// The bytes a small module's packed and scale tensors span together when
// they are in one file: ModuleScanner then reads them with one read (packed
// bytes at most 64 KiB, at most 4 KiB between the tensors). nullopt otherwise.
struct ModuleSpan {
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};
std::optional<ModuleSpan> small_module_span(const QuantModule& module, std::uint64_t packed_offset,
                                            std::uint64_t scale_offset);

// True when the 16 packed bytes of a 32-group hold a non-zero magnitude.
bool group_is_active(const std::byte* group16);

class ModuleScanner {
 public:
  ModuleScanner(const QuantModule& module, const ModuleLocation& where);

  // Pass over the scale bytes: histogram, and NaN (0xFF) refusal naming the
  // first row and group that holds one.
  void read_histogram();
  const ByteHistogram& histogram() const { return histogram_; }
  // Reuses a histogram from an earlier read_histogram() of the same module.
  void use_histogram(const ByteHistogram& h) { histogram_ = h; }

  // Exponents k = byte - 127 of the highest / lowest active group, if any.
  std::optional<int> active_k_max();
  std::optional<int> active_k_min();

  // Number of active groups whose exponent lies in [k_lo, k_hi].
  std::uint64_t count_active(int k_lo, int k_hi);

  std::uint64_t probes() const { return probes_; }
  bool classified_fully() const { return full_.has_value(); }

 private:
  bool any_active_with_byte(std::uint8_t b);
  void classify_all();
  template <typename Visit>
  void for_each_scale(Visit&& visit);  // visit(position, byte) -> bool continue
  bool probe(std::uint64_t position);
  bool read_small_module_at_once();
  bool over_budget(std::uint64_t more) const;

  const QuantModule& module_;
  ModuleLocation where_;
  ByteHistogram histogram_{};
  std::optional<ByteHistogram> full_;  // active groups per scale byte, once classified
  std::vector<std::byte> kept_scales_;  // a small module's scale bytes, once read
  std::vector<std::byte> kept_packed_;  // a small module's packed bytes, once probed
  std::uint64_t probes_ = 0;
  std::uint64_t scale_passes_ = 0;
};

}  // namespace mx2nv

#include "model/scale_scan.hpp"

#include "common/error.hpp"
#include "numerics/formats.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

namespace mx2nv {
namespace {

constexpr std::uint64_t kScaleChunk = 1 << 20;      // scale bytes per read
constexpr std::uint64_t kClassifyGroups = 1 << 18;  // groups per read when classifying (4 MiB packed)
constexpr std::uint64_t kMaxScalePasses = 8;        // extra scale passes before classifying instead
constexpr std::uint64_t kSmallPackedBytes = 64 << 10;  // read whole at the first probe
constexpr std::uint64_t kSmallModuleGap = 4 << 10;     // bytes between a small module's tensors read with them
// Probes of one scale byte's groups before concluding they are probably all
// zero and reading the module sequentially instead: an active group is
// usually found at the first probe, and a byte whose first 64 groups are all
// zero rarely turns out otherwise, so probing on would only add random reads.
constexpr std::uint64_t kProbesPerByte = 64;

}  // namespace

bool group_is_active(const std::byte* group16) {
  std::uint64_t lo = 0, hi = 0;
  std::memcpy(&lo, group16, 8);
  std::memcpy(&hi, group16 + 8, 8);
  // Each nibble's magnitude is its low three bits; the sign bit (0x8) alone is -0.
  constexpr std::uint64_t kMagnitudes = 0x7777777777777777ULL;
  return ((lo | hi) & kMagnitudes) != 0;
}

ModuleScanner::ModuleScanner(const QuantModule& module, const ModuleLocation& where)
    : module_(module), where_(where) {}

template <typename Visit>
void ModuleScanner::for_each_scale(Visit&& visit) {
  const std::uint64_t total = module_.group_count();
  // A scale tensor that fits one chunk (every real expert's: N x K/32 bytes)
  // is read once and kept for the later passes, so a module costs one scale
  // read, not one per pass.
  if (total <= kScaleChunk) {
    if (kept_scales_.size() != total && !read_small_module_at_once()) {
      kept_scales_.resize(static_cast<std::size_t>(total));
      where_.scale->read_at(where_.scale_offset, kept_scales_);
    }
    for (std::uint64_t i = 0; i < total; ++i) {
      if (!visit(i, std::to_integer<std::uint8_t>(kept_scales_[static_cast<std::size_t>(i)]))) return;
    }
    return;
  }
  std::vector<std::byte> buffer(static_cast<std::size_t>(std::min(total, kScaleChunk)));
  for (std::uint64_t start = 0; start < total; start += kScaleChunk) {
    const std::uint64_t n = std::min(kScaleChunk, total - start);
    where_.scale->read_at(where_.scale_offset + start, {buffer.data(), static_cast<std::size_t>(n)});
    for (std::uint64_t i = 0; i < n; ++i) {
      if (!visit(start + i, std::to_integer<std::uint8_t>(buffer[static_cast<std::size_t>(i)]))) return;
    }
  }
}

void ModuleScanner::read_histogram() {
  histogram_.fill(0);
  for_each_scale([&](std::uint64_t position, std::uint8_t b) {
    if (b == kE8M0NaN) {
      fail_input("{}: tensor \"{}\" row {} group {}: scale byte 0xFF is NaN in E8M0", where_.scale_file,
                 module_.scale_name(), position / module_.groups, position % module_.groups);
    }
    ++histogram_[b];
    return true;
  });
}

std::optional<ModuleSpan> small_module_span(const QuantModule& module, std::uint64_t packed_offset,
                                            std::uint64_t scale_offset) {
  const std::uint64_t scale_bytes = module.group_count();
  const std::uint64_t packed_bytes = scale_bytes * kGroupBytes;
  if (packed_bytes > kSmallPackedBytes) return std::nullopt;
  const std::uint64_t begin = std::min(packed_offset, scale_offset);
  const std::uint64_t end = std::max(packed_offset + packed_bytes, scale_offset + scale_bytes);
  if (end - begin > packed_bytes + scale_bytes + kSmallModuleGap) return std::nullopt;
  return ModuleSpan{begin, end};
}

bool ModuleScanner::read_small_module_at_once() {
  // A small module's packed bytes are almost always probed, and checkpoints
  // write a module's tensors side by side: one read then serves both, a
  // system call saved per module. Only when the bytes between them are few.
  if (where_.packed != where_.scale) return false;
  const auto span = small_module_span(module_, where_.packed_offset, where_.scale_offset);
  if (!span) return false;
  std::vector<std::byte> both(static_cast<std::size_t>(span->end - span->begin));
  where_.packed->read_at(span->begin, both);
  const auto at = [&](std::uint64_t offset) { return both.begin() + static_cast<std::ptrdiff_t>(offset - span->begin); };
  const std::uint64_t scale_bytes = module_.group_count();
  kept_packed_.assign(at(where_.packed_offset), at(where_.packed_offset + scale_bytes * kGroupBytes));
  kept_scales_.assign(at(where_.scale_offset), at(where_.scale_offset + scale_bytes));
  return true;
}

bool ModuleScanner::probe(std::uint64_t position) {
  ++probes_;
  // A small module's packed bytes are read whole at its first probe: one
  // read instead of one per probe (a pread costs a system call whatever its
  // size, and a checkpoint of many small experts probes each a few times).
  const std::uint64_t packed_bytes = module_.group_count() * kGroupBytes;
  if (packed_bytes <= kSmallPackedBytes) {
    if (kept_packed_.size() != packed_bytes) {
      kept_packed_.resize(static_cast<std::size_t>(packed_bytes));
      where_.packed->read_at(where_.packed_offset, kept_packed_);
    }
    return group_is_active(kept_packed_.data() + position * kGroupBytes);
  }
  std::byte group[kGroupBytes];
  where_.packed->read_at(where_.packed_offset + position * kGroupBytes, group);
  return group_is_active(group);
}

bool ModuleScanner::over_budget(std::uint64_t more) const {
  // A probe costs a random read; past 1/256 of the groups (about one probe per
  // 4 KiB page of packed data) a sequential pass is cheaper.
  const std::uint64_t budget = std::max<std::uint64_t>(256, module_.group_count() / 256);
  return probes_ + more > budget || scale_passes_ >= kMaxScalePasses;
}

void ModuleScanner::classify_all() {
  ByteHistogram active{};
  const std::uint64_t total = module_.group_count();
  const std::uint64_t chunk = std::min(total, kClassifyGroups);
  std::vector<std::byte> scales(static_cast<std::size_t>(chunk));
  std::vector<std::byte> packed(static_cast<std::size_t>(chunk * kGroupBytes));
  for (std::uint64_t start = 0; start < total; start += chunk) {
    const std::uint64_t n = std::min(chunk, total - start);
    where_.scale->read_at(where_.scale_offset + start, {scales.data(), static_cast<std::size_t>(n)});
    where_.packed->read_at(where_.packed_offset + start * kGroupBytes,
                           {packed.data(), static_cast<std::size_t>(n * kGroupBytes)});
    for (std::uint64_t i = 0; i < n; ++i) {
      if (group_is_active(packed.data() + i * kGroupBytes)) ++active[std::to_integer<std::uint8_t>(scales[i])];
    }
  }
  full_ = active;
}

bool ModuleScanner::any_active_with_byte(std::uint8_t b) {
  if (full_) return (*full_)[b] > 0;
  if (over_budget(1)) classify_all();
  if (full_) return (*full_)[b] > 0;
  ++scale_passes_;
  bool found = false;
  std::uint64_t seen = 0;
  for_each_scale([&](std::uint64_t position, std::uint8_t byte) {
    if (byte != b) return true;
    ++seen;
    if (probe(position)) {
      found = true;
      return false;
    }
    // Every group with this byte may be zero; stop probing when that gets costly.
    return !(seen < histogram_[b] && (seen >= kProbesPerByte || over_budget(1)));
  });
  if (!found && seen < histogram_[b]) {
    classify_all();
    return (*full_)[b] > 0;
  }
  return found;
}

std::optional<int> ModuleScanner::active_k_max() {
  for (int b = 254; b >= 0; --b) {
    const auto byte = static_cast<std::uint8_t>(b);
    if (histogram_[byte] > 0 && any_active_with_byte(byte)) return e8m0_exponent(byte);
  }
  return std::nullopt;
}

std::optional<int> ModuleScanner::active_k_min() {
  for (int b = 0; b <= 254; ++b) {
    const auto byte = static_cast<std::uint8_t>(b);
    if (histogram_[byte] > 0 && any_active_with_byte(byte)) return e8m0_exponent(byte);
  }
  return std::nullopt;
}

std::uint64_t ModuleScanner::count_active(int k_lo, int k_hi) {
  const int b_lo = std::max(0, k_lo + kE8M0Bias);
  const int b_hi = std::min(254, k_hi + kE8M0Bias);
  if (b_lo > b_hi) return 0;
  std::uint64_t candidates = 0;
  for (int b = b_lo; b <= b_hi; ++b) candidates += histogram_[static_cast<std::size_t>(b)];
  if (candidates == 0) return 0;
  if (!full_ && over_budget(candidates)) classify_all();
  std::uint64_t active = 0;
  if (full_) {
    for (int b = b_lo; b <= b_hi; ++b) active += (*full_)[static_cast<std::size_t>(b)];
    return active;
  }
  ++scale_passes_;
  for_each_scale([&](std::uint64_t position, std::uint8_t byte) {
    if (byte >= b_lo && byte <= b_hi && probe(position)) ++active;
    return true;
  });
  return active;
}

}  // namespace mx2nv

#include "scan/requantizer.hpp"

#include "common/cancel.hpp"
#include "common/error.hpp"
#include "numerics/bf16.hpp"
#include "numerics/formats.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

namespace mx2nv {
namespace {

// Groups per read: 1 MiB of packed bytes and 64 KiB of scales.
constexpr std::uint64_t kChunkGroups = kCopyBufferBytes / kGroupBytes;

[[noreturn]] void group_failure(const QuantModule& m, std::uint64_t group, std::string_view why) {
  fail(ErrorKind::InvalidInput, "{}: row {} group {}: {}", m.name, group / m.groups, group % m.groups, why);
}

// A NaN scale byte, in the words convert's scan refuses it with (one message
// whichever command meets it first).
[[noreturn]] void nan_failure(const SourceCheckpoint& source, const QuantModule& m, std::uint64_t group) {
  fail_input("{}: tensor \"{}\" row {} group {}: scale byte 0xFF is NaN in E8M0",
             source.checkpoint.shards[m.scale_shard].file, m.scale_name(), group / m.groups, group % m.groups);
}

// visit(packed, scales, first_group) over a module's groups in file order.
template <typename Visit>
void for_each_chunk(const SourceCheckpoint& source, const QuantModule& m, Visit&& visit) {
  const Checkpoint& ck = source.checkpoint;
  const auto packed_file = ck.files->open(m.packed_shard);
  const auto scale_file = ck.files->open(m.scale_shard);
  const std::uint64_t total = m.group_count();
  // Buffers of the module's size when it is smaller than a chunk: zeroing a
  // whole chunk per module would cost more than reading K3's small modules.
  const auto chunk = static_cast<std::size_t>(std::min(kChunkGroups, total));
  std::vector<std::byte> packed(chunk * kGroupBytes);
  std::vector<std::byte> scales(chunk);
  for (std::uint64_t first = 0; first < total; first += kChunkGroups) {
    const auto n = static_cast<std::size_t>(std::min(kChunkGroups, total - first));
    packed_file->read_at(ck.shards[m.packed_shard].data_start + m.packed.begin + first * kGroupBytes,
                         {packed.data(), n * kGroupBytes});
    scale_file->read_at(ck.shards[m.scale_shard].data_start + m.scale.begin + first, {scales.data(), n});
    visit(std::span<const std::byte>(packed.data(), n * kGroupBytes), std::span<const std::byte>(scales.data(), n), first);
    throw_if_stopped();
  }
}

std::span<const std::byte, 16> group_bytes(std::span<const std::byte> packed, std::size_t g) {
  return std::span<const std::byte, 16>(packed.data() + g * kGroupBytes, 16);
}

// The GroupRequantizer of `level`, kept across the modules this thread
// requantizes: a requantizer's blocks are the same for every module of one
// second-level scale, and modules share few (a function of amax, where most
// amaxes are 6 x 2^k), so K3's 247k small modules reuse blocks instead of
// recomputing them. At most kKeptLevels are kept (the least recently used
// goes), so memory stays bounded whatever the scales.
GroupRequantizer& requantizer_for(SecondLevel level) {
  constexpr std::size_t kKeptLevels = 8;
  thread_local std::vector<std::unique_ptr<GroupRequantizer>> kept;  // most recently used last
  for (auto it = kept.begin(); it != kept.end(); ++it) {
    if (!(*it)->level().same_as(level)) continue;
    std::rotate(it, it + 1, kept.end());
    return *kept.back();
  }
  if (kept.size() == kKeptLevels) kept.erase(kept.begin());
  kept.push_back(std::make_unique<GroupRequantizer>(level));
  return *kept.back();
}

// The failure of the group a run stopped at.
[[noreturn]] void run_failure(const SourceCheckpoint& source, const QuantModule& m, std::uint64_t group,
                              std::byte e8m0) {
  if (std::to_integer<std::uint8_t>(e8m0) == kE8M0NaN) nan_failure(source, m, group);
  group_failure(m, group, "a value is beyond float32's range");
}

// Requantizes every group of a module a chunk at a time: out(packed, scales)
// with the chunk's requantized bytes (16 and 2 a group; a span is empty when
// not asked for), its values added to *stats in order when stats is not null.
template <typename Out>
void requantize_module(const SourceCheckpoint& source, std::size_t module, SecondLevel level, bool want_packed,
                       bool want_scales, ErrorStats* stats, Out&& out) {
  const QuantModule& m = source.modules.modules[module];
  GroupRequantizer& requantizer = requantizer_for(level);
  std::vector<std::byte> packed_out;
  std::vector<std::uint8_t> scales_out;
  for_each_chunk(source, m, [&](std::span<const std::byte> packed, std::span<const std::byte> scales, std::uint64_t first) {
    const std::size_t n = scales.size();
    if (want_packed) packed_out.resize(n * kGroupBytes);
    if (want_scales) scales_out.resize(2 * n);
    const std::size_t done = requantizer.requantize(packed, scales, packed_out, scales_out, stats);
    if (done != n) run_failure(source, m, first + done, scales[done]);
    out(std::span<const std::byte>(packed_out), std::as_bytes(std::span(scales_out)));
  });
}

// Output buffer that flushes to `emit` in chunks of at most 1 MiB.
class ChunkedEmit {
 public:
  explicit ChunkedEmit(const TensorEmit& emit) : emit_(emit) {}
  void add(std::span<const std::byte> bytes) {
    if (buffer_.size() + bytes.size() > kCopyBufferBytes) flush();
    if (buffer_.empty() && bytes.size() == kCopyBufferBytes) {  // a whole chunk: handed on as it is
      emit_(offset_, bytes);
      offset_ += bytes.size();
      return;
    }
    buffer_.insert(buffer_.end(), bytes.begin(), bytes.end());
  }
  void flush() {
    if (buffer_.empty()) return;
    emit_(offset_, buffer_);
    offset_ += buffer_.size();
    buffer_.clear();
  }

 private:
  const TensorEmit& emit_;
  std::vector<std::byte> buffer_;
  std::uint64_t offset_ = 0;
};

// Below this many packed bytes a scale group is read whole: one read a
// tensor, as cheap as reading its scales alone.
constexpr std::uint64_t kReadWholeBelow = 256 << 10;
// The most scale bytes a thread holds to find a scale group's largest
// scales, as much as the whole read's buffers (a gate/up pair of K3's real
// shapes holds 688 KB); a larger group is read whole.
constexpr std::uint64_t kHeldScaleBytes = kCopyBufferBytes;
// Groups read one at a time before the rest is read whole instead.
constexpr std::size_t kMaxProbedGroups = 64;

// The largest |value| from every group: each module's packed bytes and
// scales read in full, the first group with a NaN scale or a value beyond
// float32 refused, in file order.
float amax_read_whole(const SourceCheckpoint& source, std::size_t scale_group) {
  float amax = 0;
  for (const std::size_t module : source.modules.scale_groups[scale_group]) {
    const QuantModule& m = source.modules.modules[module];
    for_each_chunk(source, m, [&](std::span<const std::byte> packed, std::span<const std::byte> scales, std::uint64_t first) {
      const std::size_t done = mxfp4_groups_amax(packed, scales, amax);
      if (done != scales.size()) run_failure(source, m, first + done, scales[done]);
    });
  }
  return amax;
}

// The same largest |value| from the scales and a few groups: a group of
// E8M0 byte e holds no value above 6 x 2^(e-127), so groups are taken by
// scale byte from the largest down, and a scale byte whose bound does not
// exceed the largest value found so far, and every smaller one, cannot
// raise it. nullopt where reading the group whole is the better way or the
// only exact one: a small group, scales beyond kHeldScaleBytes, more than
// kMaxProbedGroups groups to read, or a scale byte of 253-255 (a NaN or a
// value beyond float32 may be there, named by amax_read_whole in file order).
std::optional<float> amax_from_largest_scales(const SourceCheckpoint& source, const ShardFiles& files,
                                              std::size_t scale_group) {
  const Checkpoint& ck = source.checkpoint;
  const ScaleGroup& members = source.modules.scale_groups[scale_group];
  std::uint64_t groups = 0;
  for (const std::size_t module : members) groups += source.modules.modules[module].group_count();
  if (groups * kGroupBytes <= kReadWholeBelow || groups > kHeldScaleBytes) return std::nullopt;
  std::vector<std::vector<std::byte>> scales(members.size());
  std::array<std::uint64_t, 256> count{};
  for (std::size_t k = 0; k < members.size(); ++k) {
    const QuantModule& m = source.modules.modules[members[k]];
    scales[k].resize(static_cast<std::size_t>(m.group_count()));
    files.open(m.scale_shard)->read_at(ck.shards[m.scale_shard].data_start + m.scale.begin, scales[k]);
    for (const std::byte b : scales[k]) ++count[std::to_integer<std::uint8_t>(b)];
  }
  if (count[253] + count[254] + count[kE8M0NaN] != 0) return std::nullopt;
  float amax = 0;
  std::size_t probed = 0;
  std::array<std::byte, 16> packed{};
  for (int e = 252; e >= 0; --e) {
    if (count[static_cast<std::size_t>(e)] == 0) continue;
    const auto e8m0 = static_cast<std::uint8_t>(e);
    const float bound = *mxfp4_value_f32(7, e8m0_exponent(e8m0));  // 6 x 2^k: finite below byte 253
    if (!(bound > amax)) break;
    for (std::size_t k = 0; k < members.size() && bound > amax; ++k) {
      const QuantModule& m = source.modules.modules[members[k]];
      const auto file = files.open(m.packed_shard);
      const std::byte* at = scales[k].data();
      const std::byte* const end = at + scales[k].size();
      while (bound > amax && (at = std::find(at, end, std::byte{e8m0})) != end) {
        if (++probed > kMaxProbedGroups) return std::nullopt;
        const auto g = static_cast<std::uint64_t>(at - scales[k].data());
        file->read_at(ck.shards[m.packed_shard].data_start + m.packed.begin + g * kGroupBytes, packed);
        amax = std::max(amax, *mxfp4_group_amax(packed, e8m0));
        ++at;
      }
    }
  }
  return amax;
}

}  // namespace

float scale_group_amax(const SourceCheckpoint& source, std::size_t scale_group) {
  return scale_group_amax(source, scale_group, *source.checkpoint.files);
}

float scale_group_amax(const SourceCheckpoint& source, std::size_t scale_group, const ShardFiles& sparse_reads) {
  if (const auto amax = amax_from_largest_scales(source, sparse_reads, scale_group)) return *amax;
  return amax_read_whole(source, scale_group);
}

void stream_requantized_packed(const SourceCheckpoint& source, std::size_t module, SecondLevel level,
                               const TensorEmit& emit, ErrorStats& stats) {
  ChunkedEmit sink(emit);
  requantize_module(source, module, level, true, false, &stats,
                    [&](std::span<const std::byte> packed, std::span<const std::byte>) { sink.add(packed); });
  sink.flush();
}

void stream_requantized_scales(const SourceCheckpoint& source, std::size_t module, SecondLevel level,
                               const TensorEmit& emit) {
  ChunkedEmit sink(emit);
  requantize_module(source, module, level, false, true, nullptr,
                    [&](std::span<const std::byte>, std::span<const std::byte> scales) { sink.add(scales); });
  sink.flush();
}

void stream_requantized(const SourceCheckpoint& source, std::size_t module, SecondLevel level,
                        const TensorEmit& emit_packed, const TensorEmit& emit_scales, ErrorStats& stats) {
  ChunkedEmit packed_sink(emit_packed);
  ChunkedEmit scale_sink(emit_scales);
  requantize_module(source, module, level, true, true, &stats,
                    [&](std::span<const std::byte> packed, std::span<const std::byte> scales) {
                      packed_sink.add(packed);
                      scale_sink.add(scales);
                    });
  packed_sink.flush();
  scale_sink.flush();
}

namespace {

// The BF16 bytes of one decoded 32-group (64 bytes, little-endian).
void bf16_group(const SourceCheckpoint& source, const QuantModule& m, std::uint64_t group,
                std::span<const std::byte, 16> packed, std::uint8_t e8m0,
                std::span<std::byte, 64> out) {
  if (e8m0 == kE8M0NaN) nan_failure(source, m, group);
  const int k = e8m0_exponent(e8m0);
  for (std::size_t i = 0; i < 32; ++i) {
    const auto b = std::to_integer<std::uint8_t>(packed[i / 2]);
    const auto code = static_cast<std::uint8_t>(i % 2 == 0 ? (b & 0xF) : (b >> 4));
    const auto bits = bf16_exact(std::ldexp(e2m1_value(code), k));
    if (!bits) group_failure(m, group, "a value is beyond BF16's range");
    out[2 * i] = static_cast<std::byte>(*bits & 0xFF);
    out[2 * i + 1] = static_cast<std::byte>(*bits >> 8);
  }
}

}  // namespace

void stream_bf16_weight(const SourceCheckpoint& source, std::size_t module, const TensorEmit& emit) {
  ChunkedEmit sink(emit);
  const QuantModule& m = source.modules.modules[module];
  std::array<std::byte, 64> values{};
  for_each_chunk(source, m, [&](std::span<const std::byte> packed, std::span<const std::byte> scales, std::uint64_t first) {
    for (std::size_t g = 0; g < scales.size(); ++g) {
      bf16_group(source, m, first + g, group_bytes(packed, g), std::to_integer<std::uint8_t>(scales[g]), values);
      sink.add(values);
    }
  });
  sink.flush();
}

RequantizedCheck check_requantized(const SourceCheckpoint& source, std::size_t module, SecondLevel level,
                                   const TensorRead& read_packed, const TensorRead& read_scales) {
  RequantizedCheck check;
  std::vector<std::byte> theirs;
  const auto compare = [&](const TensorRead& read, std::uint64_t& differing) {
    return TensorEmit([&](std::uint64_t offset, std::span<const std::byte> ours) {
      theirs.resize(ours.size());
      read(offset, theirs);
      for (std::size_t i = 0; i < ours.size(); ++i) differing += ours[i] != theirs[i] ? 1u : 0u;
    });
  };
  stream_requantized(source, module, level, compare(read_packed, check.packed_bytes_differing),
                     compare(read_scales, check.scale_bytes_differing), check.error);
  return check;
}

std::uint64_t count_bf16_differences(const SourceCheckpoint& source, std::size_t module, const TensorRead& read_weight) {
  std::uint64_t differing = 0;
  std::vector<std::byte> theirs;
  stream_bf16_weight(source, module, [&](std::uint64_t offset, std::span<const std::byte> ours) {
    theirs.resize(ours.size());
    read_weight(offset, theirs);
    for (std::size_t i = 0; i + 1 < ours.size(); i += 2) {
      differing += (ours[i] != theirs[i] || ours[i + 1] != theirs[i + 1]) ? 1u : 0u;
    }
  });
  return differing;
}

}  // namespace mx2nv

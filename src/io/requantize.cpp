#include "io/requantize.hpp"


#include "core/bf16.hpp"
#include "core/error.hpp"
#include "core/numerics.hpp"
#include "core/quant_config.hpp"
#include "core/shard_index.hpp"
#include "core/target_layout.hpp"
#include "io/cancel.hpp"
#include "io/destination.hpp"
#include "io/parallel.hpp"
#include "io/shard_writer.hpp"
#include "io/stream_hash.hpp"

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

namespace mx2nv {
namespace {

// Groups per read: 1 MiB of packed bytes and 64 KiB of scales.
constexpr std::uint64_t kChunkGroups = kCopyBufferBytes / kGroupBytes;

[[noreturn]] void group_failure(const QuantModule& m, std::uint64_t group, std::string_view why) {
  fail(ErrorKind::InvalidInput, "{}: row {} group {}: {}", m.name, group / m.groups, group % m.groups, why);
}

// visit(packed, scales, first_group) over a module's groups in file order.
template <typename Visit>
void for_each_chunk(const SourceCheckpoint& source, const QuantModule& m, Visit&& visit) {
  const Checkpoint& ck = source.checkpoint;
  const auto packed_file = ck.files->open(m.packed_shard);
  const auto scale_file = ck.files->open(m.scale_shard);
  std::vector<std::byte> packed(kChunkGroups * kGroupBytes);
  std::vector<std::byte> scales(kChunkGroups);
  const std::uint64_t total = m.group_count();
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

// Requantizes every group of a module, handing each group's output to `out`.
template <typename Out>
void requantize_module(const SourceCheckpoint& source, std::size_t module, float global, ErrorStats& stats, Out&& out) {
  const QuantModule& m = source.modules.modules[module];
  for_each_chunk(source, m, [&](std::span<const std::byte> packed, std::span<const std::byte> scales, std::uint64_t first) {
    for (std::size_t g = 0; g < scales.size(); ++g) {
      const auto e8m0 = std::to_integer<std::uint8_t>(scales[g]);
      if (e8m0 == kE8M0NaN) group_failure(m, first + g, "NaN scale (E8M0 0xFF)");
      std::array<std::byte, 16> q{};
      std::array<std::uint8_t, 2> s{};
      if (!requantize_group(group_bytes(packed, g), e8m0, global, q, s, stats)) {
        group_failure(m, first + g, "a value is beyond float32's range");
      }
      out(g, q, s);
    }
  });
}

// Output buffer that flushes to `emit` in chunks of at most 1 MiB.
class ChunkedEmit {
 public:
  explicit ChunkedEmit(const TensorEmit& emit) : emit_(emit) { buffer_.reserve(kCopyBufferBytes); }
  void add(std::span<const std::byte> bytes) {
    if (buffer_.size() + bytes.size() > kCopyBufferBytes) flush();
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

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct ShardOutcome {
  std::uint64_t target_bytes = 0;
  std::uint64_t passthrough_tensors = 0;
  std::uint64_t output_size = 0;
};

// One output shard: convert's layout, requantized contents.
ShardOutcome write_requantized_shard(const SourceCheckpoint& source, std::size_t shard, const std::vector<float>& globals,
                                     std::vector<ErrorStats>& stats, Destination& out) {
  const OpenShard in = source.checkpoint.read_shard(shard);  // its header, read again (not kept)
  const TargetLayout layout = make_target_layout(in.header, shard, source.modules);
  const std::string header = serialize_target_header(layout);  // convert's header, padding included

  Destination::Pending target = out.begin(in.summary->file);
  target.file.write_at(0, std::as_bytes(std::span(header)));
  const std::uint64_t data_start = header.size();
  ShardOutcome result;
  result.target_bytes = layout.data_size;
  result.output_size = data_start + layout.data_size;
  std::vector<std::byte> buffer(kCopyBufferBytes);
  for (const std::size_t index : layout.data_order) {
    const TargetTensor& t = layout.tensors[index];
    const std::uint64_t dst = data_start + t.info.begin;
    const TensorEmit emit = [&](std::uint64_t offset, std::span<const std::byte> bytes) {
      target.file.write_at(dst + offset, bytes);
    };
    switch (t.role) {
      case TensorRole::Global: {
        const float g = globals[t.module];
        std::byte le[4];
        std::memcpy(le, &g, 4);  // host is little-endian (safetensors.hpp)
        emit(0, le);
        break;
      }
      case TensorRole::Bf16Weight:  // not in a layout made without a plan
        stream_bf16_weight(source, t.module, emit);
        break;
      case TensorRole::Packed:
      case TensorRole::Requantized:
        // Each module's packed tensor is written exactly once: its stats slot is this thread's.
        stream_requantized_packed(source, t.module, globals[t.module], emit, stats[t.module]);
        break;
      case TensorRole::Scale:
        stream_requantized_scales(source, t.module, globals[t.module], emit);
        break;
      case TensorRole::PassThrough: {
        ++result.passthrough_tensors;
        const TensorInfo& s = in.header.tensors()[t.source];
        read_in_chunks(in.handle, in.header.data_start() + s.begin, s.nbytes(), buffer,
                       [&](std::span<const std::byte> chunk, std::uint64_t done) {
                         emit(done, chunk);
                         throw_if_stopped();
                       });
        break;
      }
    }
  }
  out.commit(target);
  return result;
}

void copy_companion(const fs::path& from, Destination& out, const std::string& relative) {
  const File in = File::open_read(from);
  Destination::Pending target = out.begin(relative);
  std::vector<std::byte> buffer(kCopyBufferBytes);
  read_in_chunks(in, 0, in.size(), buffer, [&](std::span<const std::byte> chunk, std::uint64_t done) {
    target.file.write_at(done, chunk);
    throw_if_stopped();
  });
  out.commit(target);
}

std::uint64_t text_hash(std::string_view text) { return XXH3_64bits(text.data(), text.size()); }

}  // namespace

float scale_group_amax(const SourceCheckpoint& source, std::size_t scale_group) {
  float amax = 0;
  for (const std::size_t module : source.modules.scale_groups[scale_group]) {
    const QuantModule& m = source.modules.modules[module];
    for_each_chunk(source, m, [&](std::span<const std::byte> packed, std::span<const std::byte> scales, std::uint64_t first) {
      for (std::size_t g = 0; g < scales.size(); ++g) {
        const auto e8m0 = std::to_integer<std::uint8_t>(scales[g]);
        if (e8m0 == kE8M0NaN) group_failure(m, first + g, "NaN scale (E8M0 0xFF)");
        const auto a = mxfp4_group_amax(group_bytes(packed, g), e8m0);
        if (!a) group_failure(m, first + g, "a value is beyond float32's range");
        amax = std::max(amax, *a);
      }
    });
  }
  return amax;
}

void stream_requantized_packed(const SourceCheckpoint& source, std::size_t module, float global, const TensorEmit& emit,
                               ErrorStats& stats) {
  ChunkedEmit sink(emit);
  requantize_module(source, module, global, stats,
                    [&](std::size_t, const std::array<std::byte, 16>& q, const std::array<std::uint8_t, 2>&) {
                      sink.add(q);
                    });
  sink.flush();
}

void stream_requantized_scales(const SourceCheckpoint& source, std::size_t module, float global, const TensorEmit& emit) {
  ChunkedEmit sink(emit);
  const QuantModule& m = source.modules.modules[module];
  for_each_chunk(source, m, [&](std::span<const std::byte> packed, std::span<const std::byte> scales, std::uint64_t first) {
    for (std::size_t g = 0; g < scales.size(); ++g) {
      const auto e8m0 = std::to_integer<std::uint8_t>(scales[g]);
      if (e8m0 == kE8M0NaN) group_failure(m, first + g, "NaN scale (E8M0 0xFF)");
      std::array<std::uint8_t, 2> s{};
      if (!requantize_group_scales(group_bytes(packed, g), e8m0, global, s)) {
        group_failure(m, first + g, "a value is beyond float32's range");
      }
      sink.add(std::as_bytes(std::span(s)));
    }
  });
  sink.flush();
}

namespace {

// The BF16 bytes of one decoded 32-group (64 bytes, little-endian).
void bf16_group(const QuantModule& m, std::uint64_t group, std::span<const std::byte, 16> packed, std::uint8_t e8m0,
                std::span<std::byte, 64> out) {
  if (e8m0 == kE8M0NaN) group_failure(m, group, "NaN scale (E8M0 0xFF)");
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
      bf16_group(m, first + g, group_bytes(packed, g), std::to_integer<std::uint8_t>(scales[g]), values);
      sink.add(values);
    }
  });
  sink.flush();
}

RequantizedCheck check_requantized(const SourceCheckpoint& source, std::size_t module, float global,
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
  stream_requantized_packed(source, module, global, compare(read_packed, check.packed_bytes_differing), check.error);
  stream_requantized_scales(source, module, global, compare(read_scales, check.scale_bytes_differing));
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

Report requantize_checkpoint(const RequantizeOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  Destination out(options.source, options.target, /*resume=*/false);
  Report report = start_report("requantize", Window::Marlin, options.source, &options.target);

  const SourceCheckpoint source = open_source_checkpoint(options.source, 1, IndexNames::KeepIfSmall);
  const Checkpoint& ck = source.checkpoint;
  const ModuleSet& set = source.modules;
  report.shards = ck.shards.size();
  report.modules = set.modules.size();
  report.scale_groups = set.scale_groups.size();
  report.companion_files = ck.companions.size();
  report.source_tensor_bytes = ck.tensor_bytes();

  // Pass 1: one global per scale group, from the group's absolute max.
  std::vector<float> globals(set.modules.size(), 1.0f);
  parallel_for(set.scale_groups.size(), options.threads, [&](std::size_t sg) {
    const float global = nvfp4_global_scale(scale_group_amax(source, sg));
    for (const std::size_t module : set.scale_groups[sg]) globals[module] = global;
  });
  throw_if_stopped();

  // Pass 2: every shard, in parallel.
  std::set<std::string> files(ck.companions.begin(), ck.companions.end());
  files.insert(std::string(kConfigFileName));
  if (ck.index) files.insert(std::string(kIndexFileName));
  for (const auto& s : ck.shards) files.insert(s.file);
  // Without --resume, a DST finished meanwhile is refused (exit 2), never "opened".
  if (!out.open_for_writing(files)) fail(ErrorKind::Usage, "DST {} changed meanwhile", options.target.string());
  std::vector<ErrorStats> stats(set.modules.size());
  std::vector<ShardOutcome> shards(ck.shards.size());
  parallel_for(ck.shards.size(), options.threads,
               [&](std::size_t s) { shards[s] = write_requantized_shard(source, s, globals, stats, out); });

  // Finalize: companions, config, the finished record, the index last.
  FinishedRecord finished;
  finished.tool_version = MX2NV_VERSION;
  finished.window = "requantize";
  for (std::size_t s = 0; s < ck.shards.size(); ++s) {
    ShardRecord r = source_identity(ck, s);
    r.output_size = shards[s].output_size;
    r.target_bytes = shards[s].target_bytes;
    r.passthrough_tensors = shards[s].passthrough_tensors;
    report.target_tensor_bytes += shards[s].target_bytes;
    report.passthrough_tensors += shards[s].passthrough_tensors;
    finished.shards.push_back(r);
  }
  for (const auto& rel : ck.companions) {
    copy_companion(ck.root / rel, out, rel);
    const auto stamp = out.stamp(rel);
    if (!stamp) fail(ErrorKind::Io, "{}: vanished after it was written", (out.root() / rel).string());
    finished.companions.push_back(*stamp);
  }
  const std::string config = rewrite_config_text(ck.config_text, source.quant);
  finished.config_hash = text_hash(config);
  if (!ck.index) {
    out.finish(finished, std::string(kConfigFileName), config);
  } else {
    out.write_file(std::string(kConfigFileName), config);
    // The index streams to its temporary file and its hash, then commits (as convert's).
    Destination::Pending index = out.begin(std::string(kIndexFileName));
    StreamHash hash;
    std::uint64_t written = 0;
    render_target_index(source, {}, report.target_tensor_bytes, [&](std::string_view piece) {
      index.file.write_at(written, std::as_bytes(std::span(piece)));
      hash.update(std::as_bytes(std::span(piece)));
      written += piece.size();
    });
    finished.index_hash = hash.digest();
    out.finish(finished, index);
  }

  for (std::size_t i = 0; i < set.modules.size(); ++i) {
    const ErrorStats& e = stats[i];
    report.requantized.push_back(
        {std::string(set.modules[i].name), globals[i], e.values, e.relative_rmse(), e.cosine(), e.max_abs, e.marlin_zeroed_blocks});
    report.values_compared += e.values;
    report.max_abs_error = std::max(report.max_abs_error, e.max_abs);
  }
  report.seconds = seconds_since(started);
  return report;
}

}  // namespace mx2nv

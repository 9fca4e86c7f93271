#include "io/shard_writer.hpp"

#include "core/scale_map.hpp"
#include "core/scale_scan.hpp"
#include "core/target_layout.hpp"
#include "io/cancel.hpp"
#include "io/stream_hash.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

namespace mx2nv {

ShardWriteResult write_shard(const SourceCheckpoint& source, const Plan& plan, std::size_t shard, Destination& out) {
  const OpenShard& in = source.checkpoint.shards[shard];
  const TargetLayout layout = make_target_layout(in.header, shard, source.modules);
  std::vector<TensorInfo> header_order;
  header_order.reserve(layout.tensors.size());
  for (const auto& t : layout.tensors) header_order.push_back(t.info);
  const std::string header = serialize_header(layout.metadata, header_order);

  Destination::Pending target = out.begin(in.file);
  in.handle.advise_sequential();
  // Tensors are written in offset order, contiguously after the header, so
  // hashing each write in turn hashes the file.
  StreamHash hash;
  std::uint64_t unflushed_from = 0;
  const auto emit = [&](std::uint64_t offset, std::span<const std::byte> bytes) {
    target.file.write_at(offset, bytes);
    hash.update(bytes);
    if (offset + bytes.size() - unflushed_from >= kWritebackBytes) {
      target.file.start_writeback(unflushed_from, offset + bytes.size() - unflushed_from);
      unflushed_from = offset + bytes.size();
    }
  };
  emit(0, std::as_bytes(std::span(header)));
  const std::uint64_t data_start = header.size();

  ShardWriteResult result;
  result.target_bytes = layout.data_size;
  std::vector<std::byte> buffer(kCopyBufferBytes);
  std::vector<std::byte> mapped;
  for (const std::size_t index : layout.data_order) {
    const TargetTensor& t = layout.tensors[index];
    const std::uint64_t dst = data_start + t.info.begin;
    if (t.role == TensorRole::Global) {
      const float divisor = plan.modules[t.module].divisor;
      std::byte le[4];
      std::memcpy(le, &divisor, 4);  // host is little-endian (safetensors.hpp)
      emit(dst, le);
      continue;
    }
    const TensorInfo& s = in.header.tensors()[t.source];
    const std::uint64_t src = in.header.data_start() + s.begin;
    if (t.role == TensorRole::Scale) {
      const ModulePlan& mp = plan.modules[t.module];
      const ScaleLut lut = make_scale_lut(mp.m, mp.zero_scales);
      const std::uint64_t chunk = kCopyBufferBytes / 2;
      mapped.resize(kCopyBufferBytes);
      for (std::uint64_t done = 0; done < s.nbytes(); done += chunk) {
        const auto n = static_cast<std::size_t>(std::min(chunk, s.nbytes() - done));
        in.handle.read_at(src + done, {buffer.data(), n});
        map_scales(lut, {buffer.data(), n}, {mapped.data(), 2 * n});
        emit(dst + 2 * done, {mapped.data(), 2 * n});
        throw_if_stopped();
      }
      continue;
    }
    // Pass-through and packed bytes are copied unchanged; packed bytes are
    // also counted by group for the report (groups never straddle a chunk:
    // the buffer is a multiple of 16 and tensors start group-aligned).
    if (t.role == TensorRole::PassThrough) ++result.passthrough_tensors;
    read_in_chunks(in.handle, src, s.nbytes(), buffer, [&](std::span<const std::byte> chunk, std::uint64_t done) {
      if (t.role == TensorRole::Packed) {
        for (std::size_t g = 0; g + kGroupBytes <= chunk.size(); g += kGroupBytes) {
          if (!group_is_active(chunk.data() + g)) ++result.zero_groups;
          ++result.groups;
        }
      }
      emit(dst + done, chunk);
      throw_if_stopped();
    });
  }
  result.output_size = data_start + layout.data_size;
  result.output_hash = hash.digest();
  out.commit(target);
  return result;
}

}  // namespace mx2nv

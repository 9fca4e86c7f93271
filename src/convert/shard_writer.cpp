#include "convert/shard_writer.hpp"

#include "common/cancel.hpp"
#include "common/stream_hash.hpp"
#include "convert/scale_map.hpp"
#include "model/scale_scan.hpp"
#include "requantize/requantizer.hpp"
#include "sys/batched_io.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace mx2nv {

ShardWriteResult write_shard(const SourceCheckpoint& source, const Plan& plan, const OpenShard& in,
                             const TargetLayout& layout, Destination& out, CopyEngine& engine,
                             ProgressTracker& progress) {
  const std::string header = serialize_target_header(layout);
  const std::uint64_t data_start = header.size();

  ShardWriteResult result;
  result.target_bytes = layout.data_size;
  result.output_size = data_start + layout.data_size;
  Destination::Pending target = out.begin(in.summary->file);
  // Sized first: shared ranges may land beyond what has been written so far.
  target.file.set_size(result.output_size);
  in.handle.advise_sequential();
  // Everything goes out in file order; new bytes are hashed for the resume
  // record, copied ones kick asynchronous writeback as they go.
  StreamHash hash;
  std::uint64_t unflushed_from = 0;
  const auto written_up_to = [&](std::uint64_t end) {
    if (end > unflushed_from && end - unflushed_from >= kWritebackBytes) {
      target.file.start_writeback(unflushed_from, end - unflushed_from);
      unflushed_from = end;
    }
  };
  // Small tensors are gathered into large writes and read in batches
  // (sys/batched_io.hpp): at K3's half a million tensors a system call per
  // tensor would cost more than the bytes.
  CoalescingWriter output(target.file, kCopyBufferBytes, written_up_to);
  const auto emit = [&](std::uint64_t offset, std::span<const std::byte> bytes) {
    output.write(offset, bytes);
    hash.update(bytes);
    result.written_bytes += bytes.size();
  };
  emit(0, std::as_bytes(std::span(header)));

  // Which source reads are batched, decided once for the shard (the engine
  // may fall back while it runs): exact scales and the unchanged tensors the
  // engine would not share anyway.
  const auto& sources = in.header.tensors();
  const bool engine_shares = engine.method() == CopyMethod::Clone;
  const auto batched = [&](const TargetTensor& t) {
    if (t.role == TensorRole::Scale) {
      return plan.modules[t.module].treatment != Treatment::Requantized &&
             sources[t.source].nbytes() <= kMaxBatchedRead;
    }
    if (!is_unchanged(t.role)) return false;
    // A tensor under two blocks shares at most a block; below that it is
    // copied whatever the method.
    const std::uint64_t n = sources[t.source].nbytes();
    return engine_shares ? n < 2 * kShareBlock : n <= kMaxBatchedRead;
  };
  std::vector<bool> is_batched(layout.data_order.size());
  std::vector<ByteRange> batch;
  for (std::size_t i = 0; i < layout.data_order.size(); ++i) {
    const TargetTensor& t = layout.tensors[layout.data_order[i]];
    if (t.role == TensorRole::Global || !batched(t)) continue;
    is_batched[i] = true;
    batch.push_back({in.header.data_start() + sources[t.source].begin, sources[t.source].nbytes()});
  }
  BatchedReader small_reads(in.handle, std::move(batch));

  const auto count_groups = [&](std::span<const std::byte> packed) {
    for (std::size_t g = 0; g + kGroupBytes <= packed.size(); g += kGroupBytes) {
      if (!group_is_active(packed.data() + g)) ++result.zero_groups;
      ++result.groups;
    }
  };
  // Not zeroed: every byte is written before it is read (4 MiB a shard
  // zeroed for nothing showed in profiles at K3's 96 shards).
  const auto buffer_bytes = std::make_unique_for_overwrite<std::byte[]>(kCopyBufferBytes);
  const std::span<std::byte> buffer(buffer_bytes.get(), kCopyBufferBytes);
  std::unique_ptr<std::byte[]> mapped;  // at the first scale tensor, kCopyBufferBytes
  ScaleLut lut{};
  std::optional<std::pair<int, bool>> lut_for;
  for (std::size_t i = 0; i < layout.data_order.size(); ++i) {
    const TargetTensor& t = layout.tensors[layout.data_order[i]];
    const std::uint64_t dst = data_start + t.info.begin;
    if (t.role == TensorRole::Global) {
      const float divisor = plan.modules[t.module].divisor;
      std::byte le[4];
      std::memcpy(le, &divisor, 4);  // host is little-endian (safetensors.hpp)
      emit(dst, le);
      continue;
    }
    // convert --overspan: modules recomputed from their decoded values.
    const TensorEmit to_target = [&](std::uint64_t offset, std::span<const std::byte> bytes) {
      emit(dst + offset, bytes);
      throw_if_stopped();
    };
    if (t.role == TensorRole::Requantized) {
      ErrorStats unused;  // the plan step measured the error
      stream_requantized_packed(source, t.module, plan.modules[t.module].divisor, to_target, unused);
      continue;
    }
    if (t.role == TensorRole::Scale && plan.modules[t.module].treatment == Treatment::Requantized) {
      stream_requantized_scales(source, t.module, plan.modules[t.module].divisor, to_target);
      continue;
    }
    if (t.role == TensorRole::Bf16Weight) {
      stream_bf16_weight(source, t.module, to_target);
      continue;
    }
    const TensorInfo& s = sources[t.source];
    const std::uint64_t src = in.header.data_start() + s.begin;
    if (t.role == TensorRole::Scale) {
      const ModulePlan& mp = plan.modules[t.module];
      if (!lut_for || lut_for->first != mp.m || lut_for->second != mp.zero_scales) {
        lut = make_scale_lut(mp.m, mp.zero_scales);  // neighbouring modules mostly share m
        lut_for = std::pair(mp.m, mp.zero_scales);
      }
      const std::uint64_t chunk = kCopyBufferBytes / 2;
      if (!mapped) mapped = std::make_unique_for_overwrite<std::byte[]>(kCopyBufferBytes);
      if (is_batched[i]) {  // the whole tensor: at most kMaxBatchedRead <= chunk
        const std::span<const std::byte> scales = small_reads.next();
        map_scales(lut, scales, {mapped.get(), 2 * scales.size()});
        emit(dst, {mapped.get(), 2 * scales.size()});
        progress.add_bytes(scales.size());
        continue;
      }
      for (std::uint64_t done = 0; done < s.nbytes(); done += chunk) {
        const auto n = static_cast<std::size_t>(std::min(chunk, s.nbytes() - done));
        in.handle.read_at(src + done, {buffer.data(), n});
        map_scales(lut, {buffer.data(), n}, {mapped.get(), 2 * n});
        emit(dst + 2 * done, {mapped.get(), 2 * n});
        progress.add_bytes(n);
        throw_if_stopped();
      }
      continue;
    }
    // Unchanged bytes. Read through mx2nv, packed bytes are also counted by
    // group for the report (groups never straddle a chunk: the buffer is a
    // multiple of 16 and tensors start group-aligned); shared or copied by
    // the kernel, they are never seen.
    if (t.role == TensorRole::PassThrough) ++result.passthrough_tensors;
    if (is_batched[i]) {
      const std::span<const std::byte> bytes = small_reads.next();
      if (t.role == TensorRole::Packed) count_groups(bytes);
      output.write(dst, bytes);
      result.copied_bytes += bytes.size();
      progress.add_bytes(bytes.size());
      throw_if_stopped();
      continue;
    }
    if (engine.method() != CopyMethod::Stream) {
      output.flush();  // the engine's writeback accounting follows file order
      TransferTally tally;
      engine.transfer(in.handle, src, target.file, dst, s.nbytes(), buffer, tally);
      result.shared_bytes += tally.shared;
      result.copied_bytes += tally.copied;
      if (t.role == TensorRole::Packed) result.groups_counted = false;
      if (tally.copied > 0) written_up_to(dst + s.nbytes());
      progress.add_bytes(s.nbytes());
      continue;
    }
    read_in_chunks(in.handle, src, s.nbytes(), buffer, [&](std::span<const std::byte> chunk, std::uint64_t done) {
      if (t.role == TensorRole::Packed) count_groups(chunk);
      output.write(dst + done, chunk);
      result.copied_bytes += chunk.size();
      progress.add_bytes(chunk.size());
      throw_if_stopped();
    });
  }
  output.flush();
  if (!result.groups_counted) result.zero_groups = result.groups = 0;
  result.written_hash = hash.digest();
  result.output = std::move(target);
  return result;
}

std::uint64_t hash_written_bytes(const File& output, const TargetLayout& layout, std::uint64_t data_start) {
  StreamHash hash;
  std::vector<std::byte> buffer(kCopyBufferBytes);
  const auto add = [&](std::uint64_t offset, std::uint64_t length) {
    read_in_chunks(output, offset, length, buffer, [&](std::span<const std::byte> chunk, std::uint64_t) {
      hash.update(chunk);
      throw_if_stopped();
    });
  };
  add(0, data_start);
  for (const std::size_t index : layout.data_order) {
    const TargetTensor& t = layout.tensors[index];
    if (!is_unchanged(t.role)) add(data_start + t.info.begin, t.info.nbytes());
  }
  return hash.digest();
}

}  // namespace mx2nv

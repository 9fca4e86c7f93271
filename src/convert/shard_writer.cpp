#include "convert/shard_writer.hpp"

#include "common/cancel.hpp"
#include "common/error.hpp"
#include "common/stream_hash.hpp"
#include "convert/scale_map.hpp"
#include "model/scale_scan.hpp"
#include "scan/requantizer.hpp"
#include "sys/batched_io.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace mx2nv {

namespace {

// The smallest requantized module whose scales are written with its packed
// codes (scales_following).
constexpr std::uint64_t kWriteAheadBytes = 64 << 10;

// Which source reads go through one BatchedReader, decided once for the shard
// (the engine may fall back while it runs): exact scales, and the unchanged
// tensors the engine would not share anyway. `is_batched` is per position
// in data_order; the ranges come in `order`, the order they are read in.
std::vector<ByteRange> batched_reads(const Plan& plan, const OpenShard& in, const TargetLayout& layout,
                                     std::span<const std::size_t> order, bool engine_shares,
                                     std::vector<bool>& is_batched) {
  const auto& sources = in.header.tensors();
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
  is_batched.assign(layout.data_order.size(), false);
  std::vector<ByteRange> batch;
  for (const std::size_t i : order) {
    const TargetTensor& t = layout.tensors[layout.data_order[i]];
    if (t.role == TensorRole::Global || !batched(t)) continue;
    is_batched[i] = true;
    batch.push_back({in.header.data_start() + sources[t.source].begin, sources[t.source].nbytes()});
  }
  return batch;
}

// The order the writer takes the tensors in (positions in data_order). Where
// the unchanged bytes are copied, the order that reads the source once,
// front to back (source_read_order). Where they are shared they are not
// read, and what is (the scales, the partial blocks at a tensor's ends) is a
// few KiB to a few hundred here and there: taken in source order those reads
// would follow each other closely enough for the kernel to read ahead into
// the cloned tensors between them, so there the target's own order keeps
// them apart.
std::vector<std::size_t> write_order(const OpenShard& in, const TargetLayout& layout, bool engine_shares) {
  if (!engine_shares) return source_read_order(in.header, layout);
  std::vector<std::size_t> order(layout.data_order.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  return order;
}

// Whether this shard's unchanged bytes will be shared. Until a clone has
// succeeded, DST is asked (an unnamed temporary file in it, one block
// cloned); a refusal moves the engine on for good, so later shards do not
// ask. Where the question cannot be answered, the engine finds out at its
// first clone, as it always did.
bool will_share(CopyEngine& engine, const Destination& out, const File& in, const File& target) {
  if (engine.method() != CopyMethod::Clone) return false;
  if (engine.has_shared()) return true;
  switch (out.probe_sharing(in)) {
    case CopyEngine::Sharing::No:
      engine.sharing_refused(target);
      return false;
    case CopyEngine::Sharing::Yes:
    case CopyEngine::Sharing::Unknown:
      break;
  }
  return true;
}

// One shard written: the header, then each tensor of the target layout by
// its role, in write_order.
// New bytes (header, scales, globals, rewritten modules) are hashed for the
// resume record; unchanged ones are shared or copied, and what is written
// kicks asynchronous writeback as it goes.
class ShardWriter {
 public:
  ShardWriter(const SourceCheckpoint& source, const Plan& plan, const OpenShard& in, const TargetLayout& layout,
              Destination& out, CopyEngine& engine, ProgressTracker& progress, std::vector<ErrorStats>* errors)
      : source_(source),
        plan_(plan),
        in_(in),
        layout_(layout),
        engine_(engine),
        progress_(progress),
        errors_(errors),
        header_(serialize_target_header(layout)),
        data_start_(header_.size()),
        target_(out.begin(in.summary->file)),
        // Small tensors are gathered into large writes and read in batches
        // (sys/batched_io.hpp): a system call per tensor would cost more than
        // the bytes of a checkpoint of many small tensors.
        order_(write_order(in, layout, will_share(engine, out, in.handle, target_.file))),
        output_(target_.file, kCopyBufferBytes,
                [this](std::uint64_t offset, std::uint64_t length) { written(offset, length); }),
        scales_follow_(scales_following(source, plan, layout, order_)) {
    result_.target_bytes = layout.data_size;
    result_.output_size = data_start_ + layout.data_size;
    // Sized first: shared ranges may land beyond what has been written so far.
    target_.file.set_size(result_.output_size);
    in.handle.advise_sequential();
  }

  ShardWriteResult run() && {
    emit(0, std::as_bytes(std::span(header_)));
    small_reads_.emplace(in_.handle, batched_reads(plan_, in_, layout_, order_,
                                                   engine_.method() == CopyMethod::Clone, is_batched_));
    // Not zeroed: every byte is written before it is read.
    buffer_bytes_ = std::make_unique_for_overwrite<std::byte[]>(kCopyBufferBytes);
    buffer_ = {buffer_bytes_.get(), kCopyBufferBytes};
    for (const std::size_t i : order_) write_tensor(i);
    output_.flush();
    if (!result_.groups_counted) result_.zero_groups = result_.groups = 0;
    result_.written_hash = hash_.digest();
    result_.output = std::move(target_);
    return std::move(result_);
  }

 private:
  // Writeback starts over the span of what was written since it last
  // started, once that is kWritebackBytes: the two runs the writer writes
  // (source_read_order) are both in it, the unwritten bytes between cost nothing.
  void written(std::uint64_t offset, std::uint64_t length) {
    unkicked_from_ = std::min(unkicked_from_, offset);
    unkicked_to_ = std::max(unkicked_to_, offset + length);
    unkicked_bytes_ += length;
    if (unkicked_bytes_ >= kWritebackBytes) {
      target_.file.start_writeback(unkicked_from_, unkicked_to_ - unkicked_from_);
      unkicked_from_ = std::numeric_limits<std::uint64_t>::max();
      unkicked_to_ = unkicked_bytes_ = 0;
    }
  }

  // New bytes: written, hashed and counted.
  void emit(std::uint64_t offset, std::span<const std::byte> bytes) {
    output_.write(offset, bytes);
    hash_.update(bytes);
    result_.written_bytes += bytes.size();
  }

  void write_tensor(std::size_t i) {
    const TargetTensor& t = layout_.tensors[layout_.data_order[i]];
    const std::uint64_t dst = data_start_ + t.info.begin;
    if (t.role == TensorRole::Global) {
      const float stored = written_second_level(plan_.format, plan_.modules[t.module]);
      std::byte le[4];
      std::memcpy(le, &stored, 4);  // host is little-endian (safetensors.hpp)
      emit(dst, le);
    } else if (rewritten(t)) {
      write_rewritten(t, dst);
    } else if (t.role == TensorRole::Scale) {
      write_scales(i, t, dst);
    } else {
      copy_unchanged(i, t, dst);
    }
  }

  // The requantized modules of at least kWriteAheadBytes whose scale tensor
  // is written after their packed one (a requantize layout puts every scale
  // after every packed tensor), with that scale tensor's offset: both are
  // computed in one pass over the source's bytes and the scales written at
  // once, ahead of their turn in the resume hash's order (the target's).
  // Smaller modules take a second pass over bytes just read (a few KiB at
  // K3's structure): cheaper than the writes and read-back a module costs.
  static std::unordered_map<std::size_t, std::uint64_t> scales_following(const SourceCheckpoint& source,
                                                                          const Plan& plan, const TargetLayout& layout,
                                                                          std::span<const std::size_t> order) {
    std::unordered_set<std::size_t> packed_seen;
    std::unordered_map<std::size_t, std::uint64_t> follow;
    for (const std::size_t i : order) {
      const TargetTensor& t = layout.tensors[layout.data_order[i]];
      if (t.role == TensorRole::Requantized && source.modules.modules[t.module].packed.nbytes() >= kWriteAheadBytes) {
        packed_seen.insert(t.module);
      }
      if (t.role == TensorRole::Scale && plan.modules[t.module].treatment == Treatment::Requantized &&
          packed_seen.contains(t.module)) {
        follow.emplace(t.module, t.info.begin);
      }
    }
    return follow;
  }

  // Scale bytes written ahead, at their turn: read back from DST into the
  // resume hash. They must still be what was written (`expected`, their
  // hash then): the record vouches for DST's bytes.
  void hash_written_ahead(std::uint64_t dst, std::uint64_t length, std::uint64_t expected) {
    output_.flush();
    StreamHash again;
    read_in_chunks(target_.file, dst, length, buffer_, [&](std::span<const std::byte> chunk, std::uint64_t) {
      hash_.update(chunk);
      again.update(chunk);
      throw_if_stopped();
    });
    if (again.digest() != expected) {
      fail(ErrorKind::Io, "{}: bytes written at offset {} changed before the shard was finished",
           target_.file.path().string(), dst);
    }
  }

  // convert --overspan: modules recomputed from their decoded values.
  bool rewritten(const TargetTensor& t) const {
    return t.role == TensorRole::Requantized || t.role == TensorRole::Bf16Weight ||
           (t.role == TensorRole::Scale && plan_.modules[t.module].treatment == Treatment::Requantized);
  }

  void write_rewritten(const TargetTensor& t, std::uint64_t dst) {
    const TensorEmit to_target = [&](std::uint64_t offset, std::span<const std::byte> bytes) {
      emit(dst + offset, bytes);
      throw_if_stopped();
    };
    const SecondLevel level = requantized_level(plan_.format, plan_.modules[t.module]);
    if (t.role == TensorRole::Requantized) {
      ErrorStats unused;  // not asked for: the caller measures apart (measure_requantized)
      ErrorStats& stats = errors_ ? (*errors_)[t.module] : unused;
      const auto later = scales_follow_.find(t.module);
      if (later == scales_follow_.end()) {
        stream_requantized_packed(source_, t.module, level, to_target, stats);
        return;
      }
      // The scales are written now, at their place, and hashed at their turn.
      const std::uint64_t scale_dst = data_start_ + later->second;
      StreamHash scales_hash;
      const TensorEmit ahead = [&](std::uint64_t offset, std::span<const std::byte> bytes) {
        output_.write(scale_dst + offset, bytes);
        scales_hash.update(bytes);
        result_.written_bytes += bytes.size();
      };
      stream_requantized(source_, t.module, level, to_target, ahead, stats);
      written_ahead_.emplace(t.module, scales_hash.digest());
    } else if (t.role == TensorRole::Scale) {
      const auto ahead = written_ahead_.find(t.module);
      if (ahead == written_ahead_.end()) {
        stream_requantized_scales(source_, t.module, level, to_target);
        return;
      }
      hash_written_ahead(dst, t.info.nbytes(), ahead->second);
      written_ahead_.erase(ahead);
    } else {
      stream_bf16_weight(source_, t.module, to_target);
    }
  }

  // Exact block scales: E8M0 bytes mapped to E4M3 pairs by the module's global exponent.
  void write_scales(std::size_t i, const TargetTensor& t, std::uint64_t dst) {
    const ModulePlan& mp = plan_.modules[t.module];
    if (!lut_for_ || lut_for_->first != mp.m || lut_for_->second != mp.zero_scales) {
      lut_ = make_scale_lut(mp.m, mp.zero_scales);  // neighbouring modules mostly share m
      lut_for_ = std::pair(mp.m, mp.zero_scales);
    }
    const std::uint64_t chunk = kCopyBufferBytes / 2;
    if (!mapped_) mapped_ = std::make_unique_for_overwrite<std::byte[]>(kCopyBufferBytes);
    if (is_batched_[i]) {  // the whole tensor: at most kMaxBatchedRead <= chunk
      const std::span<const std::byte> scales = small_reads_->next();
      map_scales(lut_, scales, {mapped_.get(), 2 * scales.size()});
      emit(dst, {mapped_.get(), 2 * scales.size()});
      progress_.add_bytes(scales.size());
      return;
    }
    const TensorInfo& s = in_.header.tensors()[t.source];
    const std::uint64_t src = in_.header.data_start() + s.begin;
    for (std::uint64_t done = 0; done < s.nbytes(); done += chunk) {
      const auto n = static_cast<std::size_t>(std::min(chunk, s.nbytes() - done));
      in_.handle.read_at(src + done, {buffer_.data(), n});
      map_scales(lut_, {buffer_.data(), n}, {mapped_.get(), 2 * n});
      emit(dst + 2 * done, {mapped_.get(), 2 * n});
      progress_.add_bytes(n);
      throw_if_stopped();
    }
  }

  // Unchanged bytes. Read through mx2nv, packed bytes are also counted by
  // group for the report (groups never straddle a chunk: the buffer is a
  // multiple of 16 and tensors start group-aligned); shared or copied by the
  // kernel, they are never seen.
  void copy_unchanged(std::size_t i, const TargetTensor& t, std::uint64_t dst) {
    const bool packed = t.role == TensorRole::Packed;
    if (t.role == TensorRole::PassThrough) ++result_.passthrough_tensors;
    if (is_batched_[i]) {
      const std::span<const std::byte> bytes = small_reads_->next();
      if (packed) count_groups(bytes);
      output_.write(dst, bytes);
      result_.copied_bytes += bytes.size();
      progress_.add_bytes(bytes.size());
      throw_if_stopped();
      return;
    }
    const TensorInfo& s = in_.header.tensors()[t.source];
    const std::uint64_t src = in_.header.data_start() + s.begin;
    if (engine_.method() != CopyMethod::Stream) {
      output_.flush();  // the buffered bytes go first: the engine writes past them
      TransferTally tally;
      engine_.transfer(in_.handle, src, target_.file, dst, s.nbytes(), buffer_, tally);
      result_.shared_bytes += tally.shared;
      result_.copied_bytes += tally.copied;
      if (packed) result_.groups_counted = false;
      if (tally.copied > 0) written(dst, s.nbytes());
      progress_.add_bytes(s.nbytes());
      return;
    }
    read_in_chunks(in_.handle, src, s.nbytes(), buffer_, [&](std::span<const std::byte> chunk, std::uint64_t done) {
      if (packed) count_groups(chunk);
      output_.write(dst + done, chunk);
      result_.copied_bytes += chunk.size();
      progress_.add_bytes(chunk.size());
      throw_if_stopped();
    });
  }

  void count_groups(std::span<const std::byte> packed) {
    for (std::size_t g = 0; g + kGroupBytes <= packed.size(); g += kGroupBytes) {
      if (!group_is_active(packed.data() + g)) ++result_.zero_groups;
      ++result_.groups;
    }
  }

  const SourceCheckpoint& source_;
  const Plan& plan_;
  const OpenShard& in_;
  const TargetLayout& layout_;
  CopyEngine& engine_;
  ProgressTracker& progress_;
  std::vector<ErrorStats>* errors_;
  const std::string header_;
  const std::uint64_t data_start_;
  ShardWriteResult result_;
  Destination::Pending target_;
  StreamHash hash_;
  std::uint64_t unkicked_from_ = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t unkicked_to_ = 0;
  std::uint64_t unkicked_bytes_ = 0;
  const std::vector<std::size_t> order_;  // positions in data_order, in the order written (write_order)
  CoalescingWriter output_;
  std::vector<bool> is_batched_;  // per position in data_order, with small_reads_
  std::optional<BatchedReader> small_reads_;
  std::unique_ptr<std::byte[]> buffer_bytes_;
  std::span<std::byte> buffer_;
  std::unique_ptr<std::byte[]> mapped_;  // at the first scale tensor, kCopyBufferBytes
  // scales_following: module -> its scale tensor's offset in the data section.
  const std::unordered_map<std::size_t, std::uint64_t> scales_follow_;
  // Modules whose scales were written with their packed codes -> the hash of
  // those scale bytes, until they are hashed into the resume record.
  std::unordered_map<std::size_t, std::uint64_t> written_ahead_;
  ScaleLut lut_{};
  std::optional<std::pair<int, bool>> lut_for_;
};

}  // namespace

ShardWriteResult write_shard(const SourceCheckpoint& source, const Plan& plan, const OpenShard& in,
                             const TargetLayout& layout, Destination& out, CopyEngine& engine,
                             ProgressTracker& progress, std::vector<ErrorStats>* errors) {
  return ShardWriter(source, plan, in, layout, out, engine, progress, errors).run();
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

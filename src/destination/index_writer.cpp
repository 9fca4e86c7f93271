#include "destination/index_writer.hpp"

#include "common/error.hpp"
#include "common/stream_hash.hpp"
#include "model/modules.hpp"
#include "plan/target_layout.hpp"
#include "safetensors/file_names.hpp"
#include "safetensors/index.hpp"
#include "sys/file.hpp"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

namespace mx2nv {

namespace {

// SRC's index with its names: as kept, or (convert drops the names of an
// index too large to keep while it writes shards, IndexNames::KeepIfSmall)
// read again into `reread`, refused if it is not the one planned from.
const ShardIndex& index_with_names(const SourceCheckpoint& source, std::optional<ShardIndex>& reread) {
  if (source.checkpoint.index.value().tensors.size() == 0) {
    const File file = File::open_read(source.checkpoint.root / std::string(kIndexFileName));
    if (file.size() > kMaxIndexBytes) fail_input("{}: changed while mx2nv was reading it", kIndexFileName);
    reread = read_shard_index(FileSource(file), file.size(), kIndexFileName, IndexParser::Streaming);
    reread->tensors.drop_lookup();
    if (reread->fingerprint != source.checkpoint.index->fingerprint ||
        reread->shard_files != source.checkpoint.index->shard_files) {
      fail_input("{}: changed while mx2nv was reading it", kIndexFileName);
    }
  }
  return reread ? *reread : source.checkpoint.index.value();
}

}  // namespace

void for_each_source_tensor(const SourceCheckpoint& source, const std::function<void(std::string_view)>& visit) {
  if (!source.checkpoint.index) {
    for (std::size_t s = 0; s < source.checkpoint.shards.size(); ++s) {
      const OpenShard shard = source.checkpoint.read_shard(s);
      for (const TensorInfo& t : shard.header.tensors()) visit(t.name);
    }
    return;
  }
  std::optional<ShardIndex> reread;
  const ShardIndex& index = index_with_names(source, reread);
  for (std::size_t i = 0; i < index.tensors.size(); ++i) visit(index.tensors.name(static_cast<NameTable::Id>(i)));
}

void render_target_index(const SourceCheckpoint& source, std::span<const ModulePlan> plan, std::uint64_t total_size,
                         const TextSink& sink, TargetFormat format) {
  std::optional<ShardIndex> reread;
  const ShardIndex& index = index_with_names(source, reread);
  const auto& set = source.modules;
  const auto& modules = set.modules;
  const std::size_t indexed = index.tensors.size();
  const auto bf16 = [&](std::size_t m) { return !plan.empty() && plan[m].treatment == Treatment::Bf16; };
  const FormatNames& names = format_names(format);
  // Packed tensors keep their name in compressed-tensors' layout; a BF16
  // module's (any layout) and every module's under ModelOpt's are renamed.
  bool any_bf16 = false;
  for (std::size_t m = 0; m < modules.size(); ++m) any_bf16 = any_bf16 || bf16(m);
  const bool renamed = any_bf16 || names.packed != kPackedSuffix;
  // The sort in render_shard_index asks for an entry O(n log n) times, so an
  // entry is never a name lookup: the fate of each indexed tensor is worked
  // out once here (a bit per tensor), and only when some tensor is renamed.
  std::vector<bool> packed_of_bf16(renamed ? indexed : 0), packed_of_module(renamed ? indexed : 0),
      scale_of_bf16(renamed ? indexed : 0);
  for (std::size_t i = 0; renamed && i < indexed; ++i) {
    const std::string_view name = index.tensors.name(static_cast<NameTable::Id>(i));
    if (const auto m = set.module_of(name, kPackedSuffix)) {
      packed_of_module[i] = true;
      packed_of_bf16[i] = bf16(*m);
    }
    if (const auto m = set.module_of(name, kScaleSuffix); m && bf16(*m)) scale_of_bf16[i] = true;
  }
  const auto entry = [&](std::size_t i) -> IndexEntry {
    if (i < indexed) {
      const auto id = static_cast<NameTable::Id>(i);
      const std::string_view name = index.tensors.name(id);
      const std::string_view shard = index.shard_files[index.shard_of[id]];
      // A BF16 module's packed tensor becomes its weight, under the module's name.
      if (renamed && packed_of_module[i]) {
        return {name.substr(0, name.size() - kPackedSuffix.size()), packed_of_bf16[i] ? kBf16WeightSuffix : names.packed,
                shard};
      }
      return {name, {}, shard};
    }
    const QuantModule& m = modules[i - indexed];
    return {m.name, names.global, source.checkpoint.shards[m.scale_shard].file};
  };
  // The entries, the index's (those kept) then the globals (of modules kept),
  // merged by name: an index written sorted (transformers sorts its keys)
  // and the name-sorted module table then need n comparisons, not n log n
  // (render_shard_index sorts only what is not yet sorted).
  std::vector<std::uint32_t> kept;
  kept.reserve(indexed + modules.size());
  for (std::size_t i = 0; i < indexed; ++i) {
    if (!renamed || !scale_of_bf16[i]) kept.push_back(static_cast<std::uint32_t>(i));
  }
  const auto from_index = static_cast<std::ptrdiff_t>(kept.size());
  for (std::size_t m = 0; m < modules.size(); ++m) {
    if (!bf16(m)) kept.push_back(static_cast<std::uint32_t>(indexed + m));
  }
  std::inplace_merge(kept.begin(), kept.begin() + from_index, kept.end(),
                     [&](std::uint32_t a, std::uint32_t b) { return full_name_less(entry(a), entry(b)); });
  render_shard_index(index.other, kept.size(), [&](std::size_t k) { return entry(kept[k]); }, total_size, sink);
}


WrittenIndex write_target_index(const SourceCheckpoint& source, const Plan& plan, std::uint64_t total_size,
                                Destination& out) {
  WrittenIndex w{out.begin(std::string(kIndexFileName)), 0, 0, total_size};
  StreamHash hash;
  render_target_index(
      source, plan.modules, total_size,
      [&](std::string_view piece) {
        w.file.file.write_at(w.bytes, std::as_bytes(std::span(piece)));
        hash.update(std::as_bytes(std::span(piece)));
        w.bytes += piece.size();
      },
      plan.format);
  w.hash = hash.digest();
  return w;
}

std::optional<std::uint64_t> early_index_total(const SourceCheckpoint& source, const Plan& plan) {
  const Checkpoint& ck = source.checkpoint;
  if (!ck.index || ck.index->tensors.size() == 0) return std::nullopt;  // none, or its names were dropped
  if (std::any_of(plan.modules.begin(), plan.modules.end(),
                  [](const ModulePlan& m) { return m.treatment == Treatment::Bf16; })) {
    return std::nullopt;
  }
  return target_totals(ck.tensor_bytes(), ck.tensor_count(), source.modules).tensor_bytes;
}

BackgroundIndex::BackgroundIndex(const SourceCheckpoint& source, const Plan& plan, std::uint64_t total_size,
                                 Destination& out)
    : thread_([this, &source, &plan, total_size, &out] {
        try {
          result_ = write_target_index(source, plan, total_size, out);
        } catch (...) {
          error_ = std::current_exception();
        }
      }) {}

BackgroundIndex::~BackgroundIndex() {
  if (thread_.joinable()) thread_.join();
}

WrittenIndex BackgroundIndex::take() {
  if (thread_.joinable()) thread_.join();
  if (error_) std::rethrow_exception(error_);
  return std::move(*result_);
}

}  // namespace mx2nv

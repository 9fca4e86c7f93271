// Execute step of a conversion for one shard: write the source shard in its
// target layout. Unchanged tensors go through the copy engine (shared with
// SRC where the file system allows it); the header, scales and globals are
// written. Independent per shard, so shards run in parallel (and, later, on
// other machines). Memory: one fixed buffer, whatever the shard size.
#pragma once

#include "checkpoint/reader.hpp"
#include "common/progress.hpp"
#include "destination/destination.hpp"
#include "numerics/nvfp4_quantizer.hpp"
#include "plan/plan.hpp"
#include "plan/target_layout.hpp"
#include "sys/copy_engine.hpp"

#include <cstdint>
#include <vector>

namespace mx2nv {

// Written bytes between asynchronous writeback kicks.
inline constexpr std::uint64_t kWritebackBytes = 16 << 20;

struct ShardWriteResult {
  std::uint64_t target_bytes = 0;       // tensor data
  std::uint64_t zero_groups = 0;        // 32-groups whose packed codes are all +-0
  std::uint64_t groups = 0;
  bool groups_counted = true;           // false when packed bytes bypassed mx2nv (shared, kernel copy)
  std::uint64_t passthrough_tensors = 0;
  std::uint64_t output_size = 0;        // whole file
  std::uint64_t shared_bytes = 0;       // unchanged bytes shared with SRC (reflink)
  std::uint64_t copied_bytes = 0;       // unchanged bytes copied (kernel or mx2nv)
  std::uint64_t written_bytes = 0;      // new bytes: header, scales, globals
  std::uint64_t written_hash = 0;       // XXH3-64 of the new bytes, in file order
  // The output, written under its temporary name and not yet committed: the
  // caller commits it (destination/commit_queue.hpp: the fsync need not hold up the
  // next shard).
  Destination::Pending output;
};

// Writes shard `in` (read by Checkpoint::read_shard) in its target layout
// (make_target_layout). Source bytes consumed are counted into `progress`.
// `errors` (parallel to the modules, or nullptr): each requantized module
// whose packed tensor this shard holds adds its error to its own slot (a
// packed tensor is in one shard, so shards written in parallel never share one).
ShardWriteResult write_shard(const SourceCheckpoint& source, const Plan& plan, const OpenShard& in,
                             const TargetLayout& layout, Destination& out, CopyEngine& engine,
                             ProgressTracker& progress, std::vector<ErrorStats>* errors = nullptr);

// XXH3-64 of the bytes a shard writer writes itself (header, then the
// changed tensors in file order), read back from a finished output file: what
// --resume checks instead of re-reading the unchanged, possibly shared bytes.
std::uint64_t hash_written_bytes(const File& output, const TargetLayout& layout, std::uint64_t data_start);

}  // namespace mx2nv

// Execute step of a conversion for one shard: stream the source shard into
// its target layout. Independent per shard, so shards run in parallel (and,
// later, on other machines). Memory: one fixed buffer, whatever the shard size.
#pragma once

#include "core/plan.hpp"
#include "io/checkpoint_reader.hpp"
#include "io/destination.hpp"

#include <cstdint>

namespace mx2nv {

// 1 MiB keeps the buffer in cache between the read and the write (measured
// against 8 MiB in bench/benchmark.py: faster at two threads).
inline constexpr std::size_t kCopyBufferBytes = 1 << 20;
// Written bytes between asynchronous writeback kicks.
inline constexpr std::uint64_t kWritebackBytes = 16 << 20;

struct ShardWriteResult {
  std::uint64_t target_bytes = 0;       // tensor data written
  std::uint64_t zero_groups = 0;        // 32-groups whose packed codes are all +-0
  std::uint64_t groups = 0;
  std::uint64_t passthrough_tensors = 0;
  std::uint64_t output_size = 0;        // whole file
  std::uint64_t output_hash = 0;        // XXH3-64 of the whole file
};

ShardWriteResult write_shard(const SourceCheckpoint& source, const Plan& plan, std::size_t shard, Destination& out);

}  // namespace mx2nv

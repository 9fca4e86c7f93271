// Which shards a step works on: `--shard I` (exactly shard I) or `--shards
// I/N` (shards I, I+N, I+2N, ...), for planned convert steps and verify in
// parts. I and N come from a command line or a job scheduler's index, so
// every arithmetic on them is checked.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace mx2nv {

// --shard I (exactly shard I) or --shards I/N (shards I, I+N, I+2N, ...).
struct ShardSelection {
  std::size_t index = 0;
  std::size_t stride = 0;  // 0: the one shard `index`
};
// "I/N" -> selection; throws Error(Usage).
ShardSelection parse_shard_selection(std::string_view text);
// "I" -> the one shard I; throws Error(Usage).
ShardSelection parse_shard_index(std::string_view text);
// The shard indices selected out of `total`; throws Error(Usage) when an
// explicit --shard is out of range. Any I and N (up to 2^64 - 1) select
// exactly I, I+N, ... below `total`: the stride never wraps.
std::vector<std::size_t> selected_shards(const ShardSelection& selection, std::size_t total);

}  // namespace mx2nv

// model.safetensors.index.json: which shard holds which tensor. Shard names
// come from an untrusted file and become paths, so they are confined to the
// checkpoint directory here, before the I/O layer ever sees them.
//
// A large MoE checkpoint's index has hundreds of thousands of entries, so it
// is parsed as a stream (json_stream.hpp) into interned names and flat
// arrays; only the members outside weight_map are kept as JSON, under a cap.
// Caps below bound what a hostile index can make us hold (a fixed record per
// entry plus its name).
#pragma once

#include "common/byte_source.hpp"
#include "json/strict_json.hpp"
#include "safetensors/file_names.hpp"
#include "safetensors/header.hpp"
#include "safetensors/name_table.hpp"

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mx2nv {

// Tensors and name bytes of an index. The caps leave headroom over the
// largest real checkpoints once converted (verify and --resume read DST's
// index under the same caps), and what an index at the caps costs while
// held, with the module table it implies, keeps inspect, convert and verify
// within their memory budget (docs/performance.md, "memory at the caps").
inline constexpr std::size_t kMaxIndexTensors = 1'250'000;
inline constexpr std::uint64_t kMaxIndexNameBytes = 96ull << 20;
inline constexpr std::uint64_t kMaxIndexOtherBytes = 16ull << 20;   // members outside weight_map
inline constexpr std::size_t kMaxShards = 100'000;

// A converted checkpoint's index has one more entry per module (its global):
// refuses a source whose converted index would break the caps above, since
// verify and --resume read it back under them.
void check_converted_index_caps(std::uint64_t tensors, std::uint64_t name_bytes);

// A relative path with no empty, "." or ".." components, no backslashes, no
// NUL, not absolute: it can only name something below the directory.
bool is_confined_relative_path(std::string_view path);

struct ShardIndex {
  Json other = Json::object();       // every top-level member but weight_map (metadata, ...)
  NameTable tensors;                 // weight_map keys
  std::vector<std::uint32_t> shard_of;  // per tensor id: index into shard_files
  std::vector<std::string> shard_files;  // distinct, sorted
  // A hash of the weight_map (names and shards, in document order) and of
  // the other members, to tell that a re-read index is the one read first.
  std::uint64_t fingerprint = 0;
  std::string_view shard_for(std::string_view tensor) const;  // "" when not indexed
  // Drops the tensor names and their shards for a caller done with them;
  // shard_for then finds nothing.
  void forget_tensors();
};

// Streams bytes [0, size) of `source`; `what` names the file in errors.
// `parser`: Fast tries simdjson first (json_fast.hpp: holds the text and its
// structurals while the tables are built); Streaming holds only the tables
// (a re-read while the module table and plan are held).
enum class IndexParser { Fast, Streaming };
ShardIndex read_shard_index(const ByteSource& source, std::uint64_t size, std::string_view what,
                            IndexParser parser = IndexParser::Fast);
ShardIndex parse_shard_index(std::string_view text, std::string_view what);
// The shard the index names for each of `tensors` ("" where none), from the
// index streamed again without keeping its names: for a caller that dropped
// them (verify names where a missing tensor went).
std::vector<std::string> find_indexed_shards(const ByteSource& source, std::uint64_t size, std::string_view what,
                                             const std::vector<std::string>& tensors);

// Checks, one shard at a time, that every tensor of every shard is indexed
// exactly once, to the shard that holds it, and that every indexed tensor
// exists there. Holds one bit per indexed tensor.
class IndexCoverage {
 public:
  explicit IndexCoverage(const ShardIndex& index) : index_(index), seen_(index.tensors.size(), 0) {}
  // `shard` is an index into index.shard_files; called once per shard.
  // Thread-safe for different shards: the index is only read, and a tensor
  // is marked seen only by the shard it is indexed to (checked first), each
  // in a byte of its own (so workers' shards never share a written word).
  void add_shard(std::size_t shard, const ShardHeader& header);
  // After every shard: nothing indexed is missing.
  void finish() const;

 private:
  const ShardIndex& index_;
  std::vector<std::uint8_t> seen_;
  std::atomic<std::size_t> covered_{0};
};

// One weight_map entry of a written index: the tensor name is `name` followed
// by `suffix` (so module globals need no string of their own).
struct IndexEntry {
  std::string_view name;
  std::string_view suffix;
  std::string_view shard;
};

// Orders entries by their full name, name + suffix, bytewise.
bool full_name_less(const IndexEntry& a, const IndexEntry& b);

// The index written for a converted checkpoint: the source document's other
// members with weight_map replaced by `weight_map` and metadata.total_size
// set (sum of tensor bytes, as huggingface_hub computes it). Keys sorted,
// 2-space indent, as transformers writes. Streamed to `sink` in pieces of
// about kJsonChunkBytes, so a large index is never one string.
using TextSink = std::function<void(std::string_view)>;
// `entry(i)` for i in [0, count) gives the entries (in any order; they are
// sorted here by index, 4 bytes each, not copied).
using IndexEntries = std::function<IndexEntry(std::size_t)>;
void render_shard_index(const Json& other, std::size_t count, const IndexEntries& entry, std::uint64_t total_size,
                        const TextSink& sink);
// The same from a list, into a string (small indexes, tests).
std::string render_shard_index(const Json& other, const std::vector<IndexEntry>& weight_map, std::uint64_t total_size);

}  // namespace mx2nv

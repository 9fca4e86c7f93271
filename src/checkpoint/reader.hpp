// Opening a checkpoint directory: config.json, the index (or a single
// model.safetensors), every shard header, the companion files, and the
// quantized modules, all validated before anything else looks at them.
// Symlinks are followed (Hugging Face cache snapshots link into blobs/).
//
// Bounded by design, whatever the shard and tensor counts: headers are
// streamed and validated one shard at a time and then dropped; what stays
// is a summary per shard, the interned index and the module table. Work that
// needs a header again re-reads it (read_shard). Open files are bounded too:
// the pass holds one per worker, and later reads go through ShardFiles, a
// small pool, so no shard count exhausts the descriptor limit. Headers held
// at once are bounded across threads as well (header_budget.hpp).
#pragma once

#include "checkpoint/header_budget.hpp"
#include "model/modules.hpp"
#include "model/quant_config.hpp"
#include "safetensors/header.hpp"
#include "safetensors/index.hpp"
#include "sys/file.hpp"

#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace mx2nv {

inline constexpr std::uint64_t kMaxConfigBytes = 16 << 20;
inline constexpr std::uint64_t kMaxIndexBytes = 512 << 20;
inline constexpr std::size_t kMaxCompanionFiles = 100'000;
// Shard files a ShardFiles pool keeps open between reads.
inline constexpr std::size_t kOpenShardFiles = 16;

// What stays in memory of a shard once its header has been validated.
struct ShardSummary {
  std::string file;  // relative to the checkpoint root
  std::uint64_t size = 0;
  std::uint64_t data_start = 0;  // 8 + header length
  std::uint64_t data_size = 0;
  std::size_t tensors = 0;
};

// A shard read again: its file, open, and its header, re-validated and
// checked to be the one summarised (the file may not change under us).
struct OpenShard {
  HeaderTicket ticket;  // first member: released after the header is freed
  const ShardSummary* summary = nullptr;
  File handle;
  ShardHeader header;
};

// A bounded pool of read-only shard files shared by worker threads; a file
// handed out stays open while its user holds it, even if evicted.
class ShardFiles {
 public:
  ShardFiles(fs::path root, std::vector<std::string> files, std::size_t capacity = kOpenShardFiles,
             CacheUse use = CacheUse::Normal);
  std::shared_ptr<const File> open(std::size_t shard) const;
  // A pool of the same files, opened anew, whose reads use the page cache as
  // `use` says: for the scan, which reads each module's scales and a few of
  // its groups before the conversion reads the shards again.
  std::unique_ptr<ShardFiles> pool_for(CacheUse use) const;

 private:
  fs::path root_;
  std::vector<std::string> files_;
  std::size_t capacity_;
  CacheUse use_;
  mutable std::mutex mutex_;
  mutable std::list<std::pair<std::size_t, std::shared_ptr<const File>>> recent_;  // most recent first
};

struct Checkpoint {
  fs::path root;
  std::string config_text;
  std::optional<ShardIndex> index;     // absent for a single model.safetensors
  std::vector<ShardSummary> shards;    // sorted by file name
  std::vector<std::string> companions;  // every other file, relative, sorted
  std::unique_ptr<ShardFiles> files;   // pooled handles for positional reads
  std::uint64_t tensor_bytes() const;   // sum of data sections
  std::uint64_t tensor_count() const;
  OpenShard read_shard(std::size_t shard) const;
};

// The text of the checkpoint's hf_quant_config.json (ModelOpt's settings) when
// it has one among its companions; capped like config.json.
std::optional<std::string> hf_quant_config_of(const Checkpoint& checkpoint);

// Called once per shard, from any worker but never concurrently, with the
// shard's validated header while it is held.
using ShardVisitor = std::function<void(std::size_t shard, std::string_view file, const ShardHeader& header)>;

// Source: names mx2nv reserves (.mx2nv*) are refused. Target: the finished
// conversion's .mx2nv folder is skipped (it is mx2nv's record, not a companion).
enum class CheckpointRole { Source, Target };

// Opens and validates the container structure (not the quantization config,
// so verify can open a target with the same reader). `threads` workers parse
// shard headers.
// `on_index`, if set, sees the index once it is read, before any header.
Checkpoint open_checkpoint(const fs::path& root, CheckpointRole role, unsigned threads = 1,
                           const ShardVisitor& visit = {},
                           const std::function<void(const ShardIndex&)>& on_index = {});

// Opens a checkpoint and checks it is an MXFP4 source: config and modules.
struct SourceCheckpoint {
  Checkpoint checkpoint;
  SourceQuantConfig quant;
  ModuleSet modules;
};
// Index names: what to keep of the index's tensor names once the shards are
// checked against it. Nothing looks a name up again; convert writes them
// into DST's index at the end (render_target_index, in
// destination/index_writer.hpp, reads them again if dropped). Dropping them
// before the module table is finished keeps the two from peaking together.
// KeepIfSmall keeps them up to kKeptIndexTensors and kKeptIndexNameBytes, set
// above the largest real checkpoint's index (docs/performance.md), so a real
// checkpoint's names cost no second parse, while an index near the caps,
// whose module table alone takes most of the memory budget, is read again.
enum class IndexNames { Keep, Drop, KeepIfSmall };
inline constexpr std::size_t kKeptIndexTensors = 600'000;
inline constexpr std::uint64_t kKeptIndexNameBytes = 48ull << 20;
SourceCheckpoint open_source_checkpoint(const fs::path& root, unsigned threads = 1,
                                        IndexNames index_names = IndexNames::Keep);

}  // namespace mx2nv

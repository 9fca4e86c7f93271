// Opening a checkpoint directory: config.json, the index (or a single
// model.safetensors), every shard header, the companion files, and the
// quantized modules, all validated before anything else looks at them.
// Symlinks are followed (Hugging Face cache snapshots link into blobs/).
#pragma once

#include "core/modules.hpp"
#include "core/report.hpp"
#include "core/quant_config.hpp"
#include "core/safetensors.hpp"
#include "core/shard_index.hpp"
#include "io/file.hpp"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mx2nv {

inline constexpr std::uint64_t kMaxConfigBytes = 16 << 20;
inline constexpr std::uint64_t kMaxIndexBytes = 512 << 20;
inline constexpr std::size_t kMaxCompanionFiles = 100'000;

struct OpenShard {
  std::string file;  // relative to the checkpoint root
  File handle;
  std::uint64_t size = 0;
  ShardHeader header;
};

struct Checkpoint {
  fs::path root;
  std::string config_text;
  std::optional<ShardIndex> index;     // absent for a single model.safetensors
  std::vector<OpenShard> shards;       // sorted by file name
  std::vector<std::string> companions;  // every other file, relative, sorted
  std::vector<ShardTensors> shard_tensors() const;
  std::uint64_t tensor_bytes() const;   // sum of data sections
};

// Source: names mx2nv reserves (.mx2nv*) are refused. Target: the finished
// conversion's .mx2nv folder is skipped (it is mx2nv's record, not a companion).
enum class CheckpointRole { Source, Target };

// Opens and validates the container structure (not the quantization config,
// so verify can open a target with the same reader).
Checkpoint open_checkpoint(const fs::path& root, CheckpointRole role);

// Opens a checkpoint and checks it is an MXFP4 source: config and modules.
struct SourceCheckpoint {
  Checkpoint checkpoint;
  SourceQuantConfig quant;
  ModuleSet modules;
};
SourceCheckpoint open_source_checkpoint(const fs::path& root);

// A report for `command` with its provenance filled in: absolute paths and,
// when SRC is a Hugging Face cache snapshot, its revision.
Report start_report(std::string command, Window window, const fs::path& source, const fs::path* target);

}  // namespace mx2nv

// model.safetensors.index.json: which shard holds which tensor. Shard names
// come from an untrusted file and become paths, so they are confined to the
// checkpoint directory here, before the I/O layer ever sees them.
#pragma once

#include "core/checkpoint_names.hpp"
#include "core/safetensors.hpp"
#include "core/strict_json.hpp"

#include <map>
#include <string>
#include <string_view>
#include <vector>


namespace mx2nv {

// A relative path with no empty, "." or ".." components, no backslashes, no
// NUL, not absolute: it can only name something below the directory.
bool is_confined_relative_path(std::string_view path);

struct ShardIndex {
  Json document;                                   // the whole file, for regeneration
  std::map<std::string, std::string> weight_map;   // tensor -> shard file
  std::vector<std::string> shard_files;            // distinct, sorted
};

ShardIndex parse_shard_index(std::string_view text, std::string_view what);

// Every tensor of every shard is indexed exactly once, to the shard that holds
// it, and every indexed tensor exists there. `headers` parallels shard_files.
void check_index_matches_shards(const ShardIndex& index, const std::vector<const ShardHeader*>& headers);

// The index written for a converted checkpoint: the source document with
// weight_map replaced and metadata.total_size set (sum of tensor bytes, as
// huggingface_hub computes it). Keys sorted, 2-space indent, as transformers writes.
std::string render_shard_index(const Json& source_document, const std::map<std::string, std::string>& weight_map,
                               std::uint64_t total_size);

}  // namespace mx2nv

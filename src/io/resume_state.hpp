// Per-shard records that make --resume safe. A finished shard is reused only
// when its record (written after the shard's rename) still matches: the
// source shard's identity (size, mtime, hash of its header), the plan for that
// shard, and the output file's size and checksum. Anything else is redone.
#pragma once

#include "core/plan.hpp"
#include "core/target_layout.hpp"
#include "io/checkpoint_reader.hpp"
#include "io/output_dir.hpp"

#include <cstdint>
#include <optional>
#include <string>

namespace mx2nv {

struct ShardRecord {
  std::string shard;
  std::uint64_t source_size = 0;
  std::int64_t source_mtime_ns = 0;
  std::uint64_t source_header_hash = 0;
  std::uint64_t plan_hash = 0;
  std::uint64_t output_size = 0;
  std::uint64_t output_hash = 0;
  // What the shard contributed to the report, so a resumed run reports the same.
  std::uint64_t zero_groups = 0;
  std::uint64_t groups = 0;
  std::uint64_t passthrough_tensors = 0;
  std::uint64_t target_bytes = 0;
};

// The record's path relative to DST.
std::string record_relative_path(const std::string& shard);

// Source identity and plan fingerprint of one shard, as the record stores them.
ShardRecord expected_record(const SourceCheckpoint& source, const Plan& plan, std::size_t shard);

std::optional<ShardRecord> read_record(const fs::path& destination, const std::string& shard);
void write_record(OutputDir& out, const ShardRecord& record);

// XXH3-64 of a whole file, streamed.
std::uint64_t hash_file(const fs::path& path);

}  // namespace mx2nv

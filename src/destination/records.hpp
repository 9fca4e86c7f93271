// What DST remembers about a run, so that retrying is safe and cheap.
// - A ShardRecord is written after each output shard's rename: the source
//   shard's identity (size, mtime, hash of its header), the plan for that
//   shard, and the output file's size, identity (inode, ctime) and the
//   checksum of the bytes mx2nv wrote itself (header, scales, globals).
//   `--resume` reuses a finished shard only when its record still matches;
//   anything else is redone.
//   Why the unchanged bytes (most of a shard: the packed ones, possibly
//   shared with SRC) need not be read again: they were copied or shared
//   from the source shard, whose identity
//   the record checks, and the file has not been written since the record
//   was made: every write, truncation or clone into a file sets its ctime to
//   the current time, and no system call sets ctime to a chosen value; a file
//   replaced by another has another inode or ctime. So an unchanged (inode,
//   ctime, size) means the bytes on disk are those that were committed.
// - The FinishedRecord is written when a conversion completes (just before its
//   commit point, the index): every shard record plus the companions' sizes
//   and the config's and index's checksums. `convert --resume` on a finished
//   DST compares it with SRC and DST without reading tensor data. It holds no
//   timestamp of DST's files, so the same input gives a byte-identical DST,
//   this record included.
// Records live in DST, which is untrusted: parsing one that is malformed
// yields nothing (the shard is redone), never an exception.
#pragma once

#include "checkpoint/reader.hpp"
#include "plan/plan.hpp"
#include "plan/target_layout.hpp"

#include <sys/stat.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mx2nv {

struct ShardRecord {
  std::string shard;
  std::uint64_t source_size = 0;
  std::int64_t source_mtime_ns = 0;
  std::uint64_t source_header_hash = 0;
  std::uint64_t plan_hash = 0;
  std::uint64_t output_size = 0;
  std::uint64_t written_hash = 0;  // ShardWriteResult::written_hash
  // What the shard contributed to the report, so a resumed run reports the same.
  std::uint64_t passthrough_tensors = 0;
  std::uint64_t target_bytes = 0;
  // This run's details: in the per-shard record only, not in the finished
  // record (they differ between runs and --copy modes).
  std::uint64_t output_inode = 0;
  std::int64_t output_ctime_ns = 0;
  bool groups_counted = false;  // zero_groups/groups are meaningful
  std::uint64_t zero_groups = 0;
  std::uint64_t groups = 0;
  std::uint64_t shared_bytes = 0;
  std::uint64_t copied_bytes = 0;
  std::uint64_t written_bytes = 0;

  bool same_source(const ShardRecord& other) const {
    return shard == other.shard && source_size == other.source_size && source_mtime_ns == other.source_mtime_ns &&
           source_header_hash == other.source_header_hash;
  }
};

struct FileStamp {
  std::string name;  // relative to DST
  std::uint64_t size = 0;
  std::uint64_t inode = 0;     // not recorded in the finished record
  std::int64_t ctime_ns = 0;   // likewise
};

struct FinishedRecord {
  std::string tool_version;
  std::string window;
  std::vector<ShardRecord> shards;     // in the source's shard order
  std::vector<FileStamp> companions;   // DST's copies, sorted by name
  std::uint64_t config_hash = 0;       // XXH3-64 of DST's config.json
  std::uint64_t quant_config_hash = 0; // of DST's hf_quant_config.json (ModelOpt layout; 0: none, not recorded)
  std::uint64_t index_hash = 0;        // of DST's index (0 for a single-file model)
  std::uint64_t canonicalised_zero_groups = 0;
  std::uint64_t marlin_zeroed_groups = 0;
};

// Which conversion an unfinished DST receives, fixed by its first writer
// (DST/.mx2nv/conversion.json) so that no later command mixes another one
// into it: a resumed convert, a plan, a planned step or finalize with other
// options, another mx2nv or another SRC is refused (exit 2) instead of
// redoing shards of one conversion under another's rules. `mode` is the
// effective one (mode_name(plan_mode(plan)): the window, and the --overspan rewrites the
// plan needed), so an --overspan choice that changes nothing is no
// difference.
struct ConversionIdentity {
  std::string tool_version;
  std::string mode;
  std::uint64_t source_shards = 0;
  std::uint64_t source_digest = 0;  // source_digest() of SRC's shard identities
};
// XXH3-64 over the identity fields (name, size, mtime, header hash) of each
// shard, in order.
std::uint64_t source_digest(const std::vector<ShardRecord>& identities);
std::string conversion_identity_to_text(const ConversionIdentity& identity);
std::optional<ConversionIdentity> conversion_identity_from_text(std::string_view text);
// nullopt when `found` is `wanted`; else what differs, for a message.
std::optional<std::string> identity_difference(const ConversionIdentity& found, const ConversionIdentity& wanted);

// The source shard's identity (no plan): name, size, mtime, header hash.
ShardRecord source_identity(const Checkpoint& source, std::size_t shard);
// The header hash source_identity() records, of any file that starts like a
// safetensors shard (8-byte length, then the header); nullopt when it does
// not (too short, or a length beyond the file).
std::optional<std::uint64_t> shard_header_hash(const fs::path& file);
// Identity plus the plan's fingerprint for this shard: every scale's global
// exponent and mode, the window and the tool version.
ShardRecord expected_record(const SourceCheckpoint& source, const Plan& plan, std::size_t shard);
// The same for a shard already read (Checkpoint::read_shard): its header is parsed once per use.
ShardRecord expected_record(const SourceCheckpoint& source, const Plan& plan, const OpenShard& shard);
// The same with the shard's target layout already made (writers need it too).
ShardRecord expected_record(const SourceCheckpoint& source, const Plan& plan, const OpenShard& shard,
                            const TargetLayout& layout);

std::string shard_record_to_text(const ShardRecord& record);
std::optional<ShardRecord> shard_record_from_text(std::string_view text);
std::string finished_record_to_text(const FinishedRecord& record);
std::optional<FinishedRecord> finished_record_from_text(std::string_view text);

// The record's file name inside DST/.mx2nv/state/ (shard names may hold '/').
std::string record_file_name(const std::string& shard);

std::int64_t mtime_ns(const struct stat& st);
std::int64_t ctime_ns(const struct stat& st);

}  // namespace mx2nv

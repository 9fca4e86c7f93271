#include "io/resume_state.hpp"

#include "core/error.hpp"
#include "core/strict_json.hpp"
#include "io/destination_lock.hpp"
#include "io/stream_hash.hpp"

#include <sys/stat.h>
#include <xxhash.h>

#include <cerrno>
#include <vector>

namespace mx2nv {

std::string record_relative_path(const std::string& shard) {
  // Shard names may hold '/'; the record's name is a hash of it.
  return fmt::format("{}/state/{:016x}.json", kStateDirName, XXH3_64bits(shard.data(), shard.size()));
}

ShardRecord expected_record(const SourceCheckpoint& source, const Plan& plan, std::size_t shard) {
  const OpenShard& s = source.checkpoint.shards[shard];
  ShardRecord r;
  r.shard = s.file;
  r.source_size = s.size;
  struct stat st {};
  const fs::path path = source.checkpoint.root / s.file;
  if (::stat(path.c_str(), &st) != 0) fail_io(path, "stat", errno);
  r.source_mtime_ns = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  std::vector<std::byte> header(static_cast<std::size_t>(s.header.data_start()));
  s.handle.read_at(0, header);
  r.source_header_hash = XXH3_64bits(header.data(), header.size());
  // The plan for this shard: every scale's global exponent and mode, the
  // window and the tool version (a new version may write different bytes).
  std::string fingerprint = fmt::format("{}|{}|", MX2NV_VERSION, window_name(plan.window));
  for (const auto& t : make_target_layout(s.header, shard, source.modules).tensors) {
    if (t.role != TensorRole::Scale) continue;
    const ModulePlan& p = plan.modules[t.module];
    fingerprint += fmt::format("{}:{}:{};", t.info.name, p.m, p.zero_scales ? 1 : 0);
  }
  r.plan_hash = XXH3_64bits(fingerprint.data(), fingerprint.size());
  return r;
}

std::optional<ShardRecord> read_record(const fs::path& destination, const std::string& shard) {
  const fs::path path = destination / record_relative_path(shard);
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  try {
    const Json j = parse_strict_json(read_text_file(path, 1 << 20), path.string()).value;
    ShardRecord r;
    r.shard = j.at("shard").get<std::string>();
    r.source_size = j.at("source_size").get<std::uint64_t>();
    r.source_mtime_ns = j.at("source_mtime_ns").get<std::int64_t>();
    r.source_header_hash = j.at("source_header_hash").get<std::uint64_t>();
    r.plan_hash = j.at("plan_hash").get<std::uint64_t>();
    r.output_size = j.at("output_size").get<std::uint64_t>();
    r.output_hash = j.at("output_hash").get<std::uint64_t>();
    r.zero_groups = j.at("zero_groups").get<std::uint64_t>();
    r.groups = j.at("groups").get<std::uint64_t>();
    r.passthrough_tensors = j.at("passthrough_tensors").get<std::uint64_t>();
    r.target_bytes = j.at("target_bytes").get<std::uint64_t>();
    return r;
  } catch (const Error&) {
    return std::nullopt;  // unreadable record: redo the shard
  } catch (const Json::exception&) {
    return std::nullopt;
  }
}

void write_record(OutputDir& out, const ShardRecord& r) {
  const Json j = {{"shard", r.shard},
                  {"source_size", r.source_size},
                  {"source_mtime_ns", r.source_mtime_ns},
                  {"source_header_hash", r.source_header_hash},
                  {"plan_hash", r.plan_hash},
                  {"output_size", r.output_size},
                  {"output_hash", r.output_hash},
                  {"zero_groups", r.zero_groups},
                  {"groups", r.groups},
                  {"passthrough_tensors", r.passthrough_tensors},
                  {"target_bytes", r.target_bytes}};
  out.write_file(record_relative_path(r.shard), j.dump(2) + "\n");
}

std::uint64_t hash_file(const fs::path& path) {
  const File f = File::open_read(path);
  StreamHash hash;
  std::vector<std::byte> buffer(4 << 20);
  read_in_chunks(f, 0, f.size(), buffer, [&](std::span<const std::byte> chunk, std::uint64_t) { hash.update(chunk); });
  return hash.digest();
}

}  // namespace mx2nv

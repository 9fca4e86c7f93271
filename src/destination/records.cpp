#include "destination/records.hpp"

#include "common/error.hpp"
#include "common/printable.hpp"
#include "common/stream_hash.hpp"
#include "json/strict_json.hpp"
#include "plan/target_layout.hpp"

#include <sys/stat.h>

#include <bit>
#include <charconv>
#include <iterator>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <vector>

namespace mx2nv {
namespace {

Json to_json(const ShardRecord& r, bool with_run_details) {
  Json j = {{"shard", r.shard},
            {"source_size", r.source_size},
            {"source_mtime_ns", r.source_mtime_ns},
            {"source_header_hash", r.source_header_hash},
            {"plan_hash", r.plan_hash},
            {"output_size", r.output_size},
            {"written_hash", r.written_hash},
            {"passthrough_tensors", r.passthrough_tensors},
            {"target_bytes", r.target_bytes}};
  if (with_run_details) {
    j["output_inode"] = r.output_inode;
    j["output_ctime_ns"] = r.output_ctime_ns;
    j["groups_counted"] = r.groups_counted;
    j["zero_groups"] = r.zero_groups;
    j["groups"] = r.groups;
    j["shared_bytes"] = r.shared_bytes;
    j["copied_bytes"] = r.copied_bytes;
    j["written_bytes"] = r.written_bytes;
  }
  return j;
}

// Throws Json::exception on a missing key or a wrong type; callers turn that
// into "no record".
ShardRecord shard_from_json(const Json& j) {
  ShardRecord r;
  r.shard = j.at("shard").get<std::string>();
  r.source_size = j.at("source_size").get<std::uint64_t>();
  r.source_mtime_ns = j.at("source_mtime_ns").get<std::int64_t>();
  r.source_header_hash = j.at("source_header_hash").get<std::uint64_t>();
  r.plan_hash = j.at("plan_hash").get<std::uint64_t>();
  r.output_size = j.at("output_size").get<std::uint64_t>();
  r.written_hash = j.at("written_hash").get<std::uint64_t>();
  r.passthrough_tensors = j.at("passthrough_tensors").get<std::uint64_t>();
  r.target_bytes = j.at("target_bytes").get<std::uint64_t>();
  if (j.contains("output_inode")) {
    r.output_inode = j.at("output_inode").get<std::uint64_t>();
    r.output_ctime_ns = j.at("output_ctime_ns").get<std::int64_t>();
    r.groups_counted = j.at("groups_counted").get<bool>();
    r.zero_groups = j.at("zero_groups").get<std::uint64_t>();
    r.groups = j.at("groups").get<std::uint64_t>();
    r.shared_bytes = j.at("shared_bytes").get<std::uint64_t>();
    r.copied_bytes = j.at("copied_bytes").get<std::uint64_t>();
    r.written_bytes = j.at("written_bytes").get<std::uint64_t>();
  }
  return r;
}

template <typename Parse>
auto parse_record(std::string_view text, Parse&& parse) -> std::optional<decltype(parse(Json()))> {
  try {
    const Json j = parse_strict_json(text, "record").value;
    if (!j.is_object()) return std::nullopt;
    return parse(j);
  } catch (const Error&) {
    return std::nullopt;
  } catch (const Json::exception&) {
    return std::nullopt;
  }
}

}  // namespace

std::int64_t mtime_ns(const struct stat& st) {
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

std::int64_t ctime_ns(const struct stat& st) {
  return static_cast<std::int64_t>(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec;
}

std::string record_file_name(const std::string& shard) {
  return fmt::format("{:016x}.json", XXH3_64bits(shard.data(), shard.size()));
}

ShardRecord source_identity(const Checkpoint& source, std::size_t shard) {
  const ShardSummary& s = source.shards[shard];
  ShardRecord r;
  r.shard = s.file;
  r.source_size = s.size;
  struct stat st {};
  const fs::path path = source.root / s.file;
  if (::stat(path.c_str(), &st) != 0) fail_io(path, "stat", errno);
  r.source_mtime_ns = mtime_ns(st);
  // The header's bytes, hashed as they are read (a header may be 100 MB).
  const File file = File::open_read(path);
  StreamHash hash;
  std::vector<std::byte> buffer(static_cast<std::size_t>(std::min<std::uint64_t>(s.data_start, 1 << 20)));
  read_in_chunks(file, 0, s.data_start, buffer, [&](std::span<const std::byte> chunk, std::uint64_t) { hash.update(chunk); });
  r.source_header_hash = hash.digest();
  return r;
}

std::optional<std::uint64_t> shard_header_hash(const fs::path& path) {
  const File file = File::open_read(path);
  std::byte prefix[8];
  if (file.size() < sizeof prefix) return std::nullopt;
  file.read_at(0, prefix);
  std::uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | std::to_integer<std::uint64_t>(prefix[i]);
  if (length > file.size() - sizeof prefix) return std::nullopt;
  StreamHash hash;
  std::vector<std::byte> buffer(static_cast<std::size_t>(std::min<std::uint64_t>(sizeof prefix + length, 1 << 20)));
  read_in_chunks(file, 0, sizeof prefix + length, buffer,
                 [&](std::span<const std::byte> chunk, std::uint64_t) { hash.update(chunk); });
  return hash.digest();
}

ShardRecord expected_record(const SourceCheckpoint& source, const Plan& plan, std::size_t shard) {
  return expected_record(source, plan, source.checkpoint.read_shard(shard));
}

ShardRecord expected_record(const SourceCheckpoint& source, const Plan& plan, const OpenShard& s) {
  const auto shard = static_cast<std::size_t>(s.summary - source.checkpoint.shards.data());
  return expected_record(source, plan, s, make_target_layout(s.header, shard, source.modules, plan));
}

ShardRecord expected_record(const SourceCheckpoint& source, const Plan& plan, const OpenShard& s,
                            const TargetLayout& layout) {
  const auto shard = static_cast<std::size_t>(s.summary - source.checkpoint.shards.data());
  ShardRecord r = source_identity(source.checkpoint, shard);
  // A new version may write different bytes, hence the version.
  // A requantize plan's shards are another command's: never taken for a conversion's.
  // The layout too, beside the default's (whose fingerprints read as they always have).
  std::string fingerprint = fmt::format("{}|{}{}|", MX2NV_VERSION,
                                        plan.kind == PlanKind::Requantize ? choice_name(PlanKind::Requantize)
                                                                          : window_name(plan.window),
                                        plan.format == TargetFormat::CompressedTensors
                                            ? std::string()
                                            : fmt::format("@{}", choice_name(plan.format)));
  for (const auto& t : layout.tensors) {
    if (t.role == TensorRole::PassThrough || t.role == TensorRole::Packed || t.role == TensorRole::Global) continue;
    const ModulePlan& p = plan.modules[t.module];
    if (t.role == TensorRole::Scale && p.treatment == Treatment::Exact) {
      fmt::format_to(std::back_inserter(fingerprint), "{}:{}:{};", t.info.name, p.m, p.zero_scales ? 1 : 0);
    } else if (t.role == TensorRole::Scale || t.role == TensorRole::Requantized) {
      fmt::format_to(std::back_inserter(fingerprint), "{}:rq:{};", t.info.name, std::bit_cast<std::uint32_t>(p.divisor));
    } else if (t.role == TensorRole::Bf16Weight) {
      fmt::format_to(std::back_inserter(fingerprint), "{}:bf16;", t.info.name);
    }
  }
  r.plan_hash = XXH3_64bits(fingerprint.data(), fingerprint.size());
  return r;
}

std::string shard_record_to_text(const ShardRecord& record) { return dump_json(to_json(record, true)) + "\n"; }

std::optional<ShardRecord> shard_record_from_text(std::string_view text) {
  return parse_record(text, [](const Json& j) { return shard_from_json(j); });
}

std::string finished_record_to_text(const FinishedRecord& f) {
  Json shards = Json::array();
  for (const auto& r : f.shards) shards.push_back(to_json(r, false));
  Json companions = Json::array();
  for (const auto& c : f.companions) {
    companions.push_back({{"name", json_text(c.name)}, {"size", c.size}});
  }
  Json j = {{"tool_version", f.tool_version},
            {"window", f.window},
            {"shards", shards},
            {"companions", companions},
            {"config_hash", f.config_hash},
            {"index_hash", f.index_hash},
            {"canonicalised_zero_groups", f.canonicalised_zero_groups},
            {"marlin_zeroed_groups", f.marlin_zeroed_groups}};
  if (f.quant_config_hash != 0) j["quant_config_hash"] = f.quant_config_hash;
  return dump_json(j) + "\n";
}

std::optional<FinishedRecord> finished_record_from_text(std::string_view text) {
  return parse_record(text, [](const Json& j) {
    FinishedRecord f;
    f.tool_version = j.at("tool_version").get<std::string>();
    f.window = j.at("window").get<std::string>();
    for (const Json& r : j.at("shards")) f.shards.push_back(shard_from_json(r));
    for (const Json& c : j.at("companions")) {
      f.companions.push_back({c.at("name").get<std::string>(), c.at("size").get<std::uint64_t>()});
    }
    f.config_hash = j.at("config_hash").get<std::uint64_t>();
    f.index_hash = j.at("index_hash").get<std::uint64_t>();
    if (j.contains("quant_config_hash")) f.quant_config_hash = j.at("quant_config_hash").get<std::uint64_t>();
    f.canonicalised_zero_groups = j.at("canonicalised_zero_groups").get<std::uint64_t>();
    f.marlin_zeroed_groups = j.at("marlin_zeroed_groups").get<std::uint64_t>();
    return f;
  });
}

std::uint64_t source_digest(const std::vector<ShardRecord>& identities) {
  // Length-prefixed fields: no two lists spell the same text.
  std::string text;
  for (const auto& r : identities) {
    fmt::format_to(std::back_inserter(text), "{}:{}|{}|{}|{};", r.shard.size(), r.shard, r.source_size,
                   r.source_mtime_ns, r.source_header_hash);
  }
  return XXH3_64bits(text.data(), text.size());
}

std::string conversion_identity_to_text(const ConversionIdentity& c) {
  const Json j = {{"tool_version", c.tool_version},
                  {"mode", c.mode},
                  {"source_shards", c.source_shards},
                  {"source_digest", fmt::format("{:016x}", c.source_digest)}};
  return dump_json(j) + "\n";
}

std::optional<ConversionIdentity> conversion_identity_from_text(std::string_view text) {
  return parse_record(text, [](const Json& j) -> std::optional<ConversionIdentity> {
    ConversionIdentity c;
    c.tool_version = j.at("tool_version").get<std::string>();
    c.mode = j.at("mode").get<std::string>();
    if (!j.at("source_shards").is_number_unsigned()) return std::nullopt;
    c.source_shards = j.at("source_shards").get<std::uint64_t>();
    const std::string digest = j.at("source_digest").get<std::string>();
    const auto [end, ec] = std::from_chars(digest.data(), digest.data() + digest.size(), c.source_digest, 16);
    if (ec != std::errc() || end != digest.data() + digest.size() || digest.size() != 16) return std::nullopt;
    return c;
  }).value_or(std::nullopt);
}

std::optional<std::string> identity_difference(const ConversionIdentity& found, const ConversionIdentity& wanted) {
  if (found.tool_version != wanted.tool_version) {
    return fmt::format("it is being written by mx2nv {}, this is mx2nv {}", printable(found.tool_version),
                       printable(wanted.tool_version));
  }
  if (found.mode != wanted.mode) {
    return fmt::format("it is being converted as {}, this conversion is {}", printable(found.mode),
                       printable(wanted.mode));
  }
  if (found.source_shards != wanted.source_shards || found.source_digest != wanted.source_digest) {
    return "it is being converted from another SRC (or SRC's shards changed since: names, sizes, mtimes or headers)";
  }
  return std::nullopt;
}

}  // namespace mx2nv

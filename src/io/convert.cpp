#include "io/convert.hpp"

#include "core/error.hpp"
#include "core/target_layout.hpp"
#include "io/cancel.hpp"
#include "io/checkpoint_reader.hpp"
#include "io/destination_lock.hpp"
#include "io/output_dir.hpp"
#include "io/parallel.hpp"
#include "io/planner.hpp"
#include "io/resume_state.hpp"
#include "io/shard_writer.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <set>
#include <vector>

namespace mx2nv {
namespace {

// The record of an earlier run's shard, if it still describes this shard of
// this plan and the output file on disk.
std::optional<ShardRecord> reusable_record(const fs::path& dst, const ShardRecord& expected) {
  auto record = read_record(dst, expected.shard);
  if (!record) return std::nullopt;
  if (record->shard != expected.shard || record->source_size != expected.source_size ||
      record->source_mtime_ns != expected.source_mtime_ns ||
      record->source_header_hash != expected.source_header_hash || record->plan_hash != expected.plan_hash) {
    return std::nullopt;
  }
  const fs::path out = dst / expected.shard;
  std::error_code ec;
  if (!fs::is_regular_file(out, ec) || fs::file_size(out, ec) != record->output_size) return std::nullopt;
  if (hash_file(out) != record->output_hash) return std::nullopt;
  return record;
}

void copy_companion(const fs::path& from, OutputDir& out, const std::string& relative) {
  const File in = File::open_read(from);
  OutputDir::Pending target = out.begin(relative);
  std::vector<std::byte> buffer(kCopyBufferBytes);
  read_in_chunks(in, 0, in.size(), buffer, [&](std::span<const std::byte> chunk, std::uint64_t done) {
    target.file.write_at(done, chunk);
    throw_if_stopped();
  });
  out.commit(target);
}

// Resuming into a DST that holds files this conversion would never write
// (another model's shards, say) would mix outputs: refuse instead.
void refuse_foreign_files(const fs::path& dst, const Checkpoint& ck) {
  std::set<std::string> expected(ck.companions.begin(), ck.companions.end());
  expected.insert("config.json");
  expected.insert(std::string(kIndexFileName));
  for (const auto& s : ck.shards) expected.insert(s.file);
  for (auto it = fs::recursive_directory_iterator(dst); it != fs::recursive_directory_iterator(); ++it) {
    const std::string rel = it->path().lexically_relative(dst).generic_string();
    if (rel == kStateDirName) {
      it.disable_recursion_pending();
      continue;
    }
    if (it->is_directory() || expected.count(rel)) continue;
    fail(ErrorKind::Usage, "DST {} holds {}, which a conversion of {} would not write; refusing to resume into it",
         dst.string(), rel, ck.root.string());
  }
}

}  // namespace

Report convert_checkpoint(const ConvertOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  check_destination(options.source, options.target, options.resume);

  Report report = start_report("convert", options.window, options.source, &options.target);

  // --- plan: nothing is written until every module has been decided.
  const SourceCheckpoint source = open_source_checkpoint(options.source);
  const Checkpoint& ck = source.checkpoint;
  const ScanResult scan = scan_modules(source, options.threads);
  const Plan plan = plan_conversion(source, scan, options.window);

  report.shards = ck.shards.size();
  report.modules = source.modules.modules.size();
  report.scale_groups = source.modules.scale_groups.size();
  report.companion_files = ck.companions.size();
  report.source_tensor_bytes = ck.tensor_bytes();
  for (const auto& mp : plan.modules) {
    report.canonicalised_zero_groups += mp.canonical_zero_groups;
    report.marlin_zeroed_groups += mp.marlin_zeroed_groups;
  }
  if (plan.refused()) {
    report.result = "refused";
    report.over_span = plan.over_span;
    report.unrepresentable_globals = plan.bad_globals;
    report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    return report;
  }
  throw_if_stopped();

  // --- execute: shards are independent of each other.
  OutputDir out(options.target);
  const bool state_existed = fs::exists(options.target / kStateDirName);  // an interrupted run's records
  std::optional<DestinationLock> lock;
  try {
    lock.emplace(options.target);
    if (!options.resume) {
      // Someone may have written DST between our check and our lock.
      for (const auto& entry : fs::directory_iterator(options.target)) {
        if (entry.path().filename() != kStateDirName) {
          fail(ErrorKind::Usage, "DST {} changed while planning; refusing to mix outputs", options.target.string());
        }
      }
    }
    remove_stale_temporaries(options.target);
    if (options.resume) refuse_foreign_files(options.target, ck);
    const bool complete = ck.index ? fs::exists(options.target / std::string(kIndexFileName))
                                   : fs::exists(options.target / std::string(kSingleShardName)) &&
                                         fs::exists(options.target / "config.json");

    std::vector<ShardRecord> records(ck.shards.size());
    std::atomic<std::uint64_t> resumed{0};
    parallel_for(ck.shards.size(), options.threads, [&](std::size_t s) {
      ShardRecord r = expected_record(source, plan, s);
      if (const auto earlier = options.resume ? reusable_record(options.target, r) : std::nullopt) {
        records[s] = *earlier;
        ++resumed;
        return;
      }
      if (options.resume) out.discard(r.shard);  // a stale or partial output from an earlier run
      const ShardWriteResult w = write_shard(source, plan, s, out);
      r.output_size = w.output_size;
      r.output_hash = w.output_hash;
      r.zero_groups = w.zero_groups;
      r.groups = w.groups;
      r.passthrough_tensors = w.passthrough_tensors;
      r.target_bytes = w.target_bytes;
      write_record(out, r);
      records[s] = r;
    });
    report.resumed_shards = resumed;

    std::uint64_t groups = 0;
    for (const auto& r : records) {
      report.target_tensor_bytes += r.target_bytes;
      report.zero_groups += r.zero_groups;
      report.passthrough_tensors += r.passthrough_tensors;
      groups += r.groups;
    }
    report.active_groups = groups - report.zero_groups;

    // --- finalize: companions and config, then the index, the commit point.
    // (A single-file model's model.safetensors, written above, is its own
    // commit point: config.json is what makes it loadable, so it goes last.)
    if (!complete) {
      for (const auto& rel : ck.companions) copy_companion(ck.root / rel, out, rel);
      out.write_file("config.json", rewrite_config_text(ck.config_text, source.quant));
      if (ck.index) {
        std::map<std::string, std::string> weight_map;
        for (std::size_t s = 0; s < ck.shards.size(); ++s) {
          for (const auto& t : make_target_layout(ck.shards[s].header, s, source.modules).tensors) {
            weight_map.emplace(t.info.name, ck.shards[s].file);
          }
        }
        out.write_file(std::string(kIndexFileName),
                       render_shard_index(ck.index->document, weight_map, report.target_tensor_bytes));
      }
    }
    // Complete: the resume state has served its purpose.
    lock->release_and_remove();
    std::error_code ec;
    fs::remove_all(options.target / kStateDirName, ec);
    fsync_directory(options.target);
    out.keep();
  } catch (...) {
    // Nothing finished: leave DST as we found it (no new lock, no new state;
    // an earlier run's records stay for the next --resume).
    // Only the lock holder may touch the state: a converter that lost the
    // race for the lock must not remove the winner's.
    if (lock && !out.committed_anything() && !state_existed) {
      lock->release_and_remove();
      lock.reset();
      std::error_code ec;
      fs::remove_all(options.target / kStateDirName, ec);
    }
    throw;
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return report;
}

}  // namespace mx2nv

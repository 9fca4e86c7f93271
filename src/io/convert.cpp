#include "io/convert.hpp"

#include "core/error.hpp"
#include "core/target_layout.hpp"
#include "io/checkpoint_reader.hpp"
#include "io/output_dir.hpp"
#include "io/parallel.hpp"
#include "io/planner.hpp"
#include "io/shard_writer.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <vector>

namespace mx2nv {

void copy_companion(const fs::path& from, OutputDir& out, const std::string& relative) {
  const File in = File::open_read(from);
  const std::uint64_t size = in.size();
  OutputDir::Pending target = out.begin(relative);
  std::vector<std::byte> buffer(static_cast<std::size_t>(std::min<std::uint64_t>(size, kCopyBufferBytes)));
  for (std::uint64_t done = 0; done < size; done += buffer.size()) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), size - done));
    in.read_at(done, {buffer.data(), n});
    target.file.write_at(done, {buffer.data(), n});
  }
  out.commit(target);
}

Report convert_checkpoint(const ConvertOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  check_destination(options.source, options.target);

  Report report;
  report.command = "convert";
  report.window = options.window;
  report.provenance.source = fs::absolute(options.source).lexically_normal().string();
  report.provenance.revision = hf_snapshot_revision(report.provenance.source);
  report.provenance.target = fs::absolute(options.target).lexically_normal().string();

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

  // --- execute: shards are independent of each other.
  OutputDir out(options.target);
  std::vector<ShardWriteResult> written(ck.shards.size());
  // Companions and config go first, shards next, the index last: a DST with
  // an index (or, for a single-file model, with model.safetensors) is complete.
  for (const auto& rel : ck.companions) copy_companion(ck.root / rel, out, rel);
  out.write_file("config.json", rewrite_config_text(ck.config_text, source.quant));
  parallel_for(ck.shards.size(), options.threads,
               [&](std::size_t s) { written[s] = write_shard(source, plan, s, out); });

  std::uint64_t groups = 0;
  for (const auto& w : written) {
    report.target_tensor_bytes += w.target_bytes;
    report.zero_groups += w.zero_groups;
    report.passthrough_tensors += w.passthrough_tensors;
    groups += w.groups;
  }
  report.active_groups = groups - report.zero_groups;

  // --- finalize
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
  out.keep();
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return report;
}

}  // namespace mx2nv

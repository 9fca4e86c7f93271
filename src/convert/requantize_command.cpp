#include "convert/requantize_command.hpp"

#include "checkpoint/fingerprint.hpp"

#include "checkpoint/argument_check.hpp"
#include "common/cancel.hpp"
#include "common/error.hpp"
#include "common/parallel.hpp"
#include "common/stopwatch.hpp"
#include "common/stream_hash.hpp"
#include "convert/shard_writer.hpp"
#include "destination/destination.hpp"
#include "destination/index_writer.hpp"
#include "model/quant_config.hpp"
#include "plan/target_layout.hpp"
#include "requantize/requantizer.hpp"
#include "safetensors/index.hpp"
#include "sys/heap.hpp"

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <set>

namespace mx2nv {
namespace {

struct ShardOutcome {
  std::uint64_t target_bytes = 0;
  std::uint64_t passthrough_tensors = 0;
  std::uint64_t output_size = 0;
};

// One output shard: convert's layout, requantized contents.
ShardOutcome write_requantized_shard(const SourceCheckpoint& source, std::size_t shard, const std::vector<float>& globals,
                                     std::vector<ErrorStats>& stats, Destination& out) {
  const OpenShard in = source.checkpoint.read_shard(shard);  // its header, read again (not kept)
  const TargetLayout layout = make_target_layout(in.header, shard, source.modules);
  const std::string header = serialize_target_header(layout);  // convert's header, padding included

  Destination::Pending target = out.begin(in.summary->file);
  target.file.write_at(0, std::as_bytes(std::span(header)));
  const std::uint64_t data_start = header.size();
  ShardOutcome result;
  result.target_bytes = layout.data_size;
  result.output_size = data_start + layout.data_size;
  std::vector<std::byte> buffer(kCopyBufferBytes);
  for (const std::size_t index : layout.data_order) {
    const TargetTensor& t = layout.tensors[index];
    const std::uint64_t dst = data_start + t.info.begin;
    const TensorEmit emit = [&](std::uint64_t offset, std::span<const std::byte> bytes) {
      target.file.write_at(dst + offset, bytes);
    };
    switch (t.role) {
      case TensorRole::Global: {
        const float g = globals[t.module];
        std::byte le[4];
        std::memcpy(le, &g, 4);  // host is little-endian (safetensors.hpp)
        emit(0, le);
        break;
      }
      case TensorRole::Bf16Weight:  // not in a layout made without a plan
        stream_bf16_weight(source, t.module, emit);
        break;
      case TensorRole::Packed:
      case TensorRole::Requantized:
        // Each module's packed tensor is written exactly once: its stats slot is this thread's.
        stream_requantized_packed(source, t.module, globals[t.module], emit, stats[t.module]);
        break;
      case TensorRole::Scale:
        stream_requantized_scales(source, t.module, globals[t.module], emit);
        break;
      case TensorRole::PassThrough: {
        ++result.passthrough_tensors;
        const TensorInfo& s = in.header.tensors()[t.source];
        read_in_chunks(in.handle, in.header.data_start() + s.begin, s.nbytes(), buffer,
                       [&](std::span<const std::byte> chunk, std::uint64_t done) {
                         emit(done, chunk);
                         throw_if_stopped();
                       });
        break;
      }
    }
  }
  out.commit(target);
  return result;
}

void copy_companion(const fs::path& from, Destination& out, const std::string& relative) {
  const File in = File::open_read(from);
  Destination::Pending target = out.begin(relative);
  std::vector<std::byte> buffer(kCopyBufferBytes);
  read_in_chunks(in, 0, in.size(), buffer, [&](std::span<const std::byte> chunk, std::uint64_t done) {
    target.file.write_at(done, chunk);
    throw_if_stopped();
  });
  out.commit(target);
}

std::uint64_t text_hash(std::string_view text) { return XXH3_64bits(text.data(), text.size()); }


}  // namespace

Report requantize_checkpoint(const RequantizeOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  check_source_argument({Command::Requantize, options.source, options.target});
  check_new_destination({Command::Requantize, options.source, options.target});
  Destination out(options.source, options.target, /*resume=*/false);
  Report report = start_report(Command::Requantize, Window::Marlin, options.source, options.target);

  const SourceCheckpoint source = open_source_checkpoint(options.source, 1, IndexNames::KeepIfSmall);
  const Checkpoint& ck = source.checkpoint;
  const ModuleSet& set = source.modules;
  report.shards = ck.shards.size();
  report.modules = set.modules.size();
  report.scale_groups = set.scale_groups.size();
  report.companion_files = ck.companions.size();
  report.source_tensor_bytes = ck.tensor_bytes();

  // Pass 1: one global per scale group, from the group's absolute max.
  std::vector<float> globals(set.modules.size(), 1.0f);
  parallel_for(set.scale_groups.size(), options.threads, [&](std::size_t sg) {
    const float global = nvfp4_global_scale(scale_group_amax(source, sg));
    for (const std::size_t module : set.scale_groups[sg]) globals[module] = global;
  });
  throw_if_stopped();

  // Pass 2: every shard, in parallel.
  std::set<std::string> files(ck.companions.begin(), ck.companions.end());
  files.insert(std::string(kConfigFileName));
  if (ck.index) files.insert(std::string(kIndexFileName));
  for (const auto& s : ck.shards) files.insert(s.file);
  // Without --resume, a DST finished meanwhile is refused (exit 2), never "opened".
  if (!out.open_for_writing(files)) fail(ErrorKind::Usage, "DST {} changed meanwhile", options.target.string());
  std::vector<ErrorStats> stats(set.modules.size());
  std::vector<ShardOutcome> shards(ck.shards.size());
  parallel_for(ck.shards.size(), options.threads,
               [&](std::size_t s) { shards[s] = write_requantized_shard(source, s, globals, stats, out); });

  // Finalize: companions, config, the finished record, the index last.
  FinishedRecord finished;
  finished.tool_version = MX2NV_VERSION;
  finished.window = "requantize";
  for (std::size_t s = 0; s < ck.shards.size(); ++s) {
    ShardRecord r = source_identity(ck, s);
    r.output_size = shards[s].output_size;
    r.target_bytes = shards[s].target_bytes;
    r.passthrough_tensors = shards[s].passthrough_tensors;
    report.target_tensor_bytes += shards[s].target_bytes;
    report.passthrough_tensors += shards[s].passthrough_tensors;
    finished.shards.push_back(r);
  }
  for (const auto& rel : ck.companions) {
    copy_companion(ck.root / rel, out, rel);
    const auto stamp = out.stamp(rel);
    if (!stamp) fail(ErrorKind::Io, "{}: vanished after it was written", (out.root() / rel).string());
    finished.companions.push_back(*stamp);
  }
  const std::string config = rewrite_config_text(ck.config_text, source.quant);
  finished.config_hash = text_hash(config);
  if (!ck.index) {
    out.finish(finished, std::string(kConfigFileName), config);
  } else {
    out.write_file(std::string(kConfigFileName), config);
    // The index streams to its temporary file and its hash, then commits (as convert's).
    Destination::Pending index = out.begin(std::string(kIndexFileName));
    StreamHash hash;
    std::uint64_t written = 0;
    render_target_index(source, {}, report.target_tensor_bytes.value_or(0), [&](std::string_view piece) {
      index.file.write_at(written, std::as_bytes(std::span(piece)));
      hash.update(std::as_bytes(std::span(piece)));
      written += piece.size();
    });
    finished.index_hash = hash.digest();
    out.finish(finished, index);
  }

  // What `mx2nv card --requantize-report` checks the files against. Before
  // the report's rows are built, and the index's names dropped at once:
  // only the files are hashed; the heap they held is handed back after.
  {
    Checkpoint written = open_checkpoint(options.target, CheckpointRole::Target);
    if (written.index) written.index->forget_tensors();
    const FileSetDigest s = checkpoint_fingerprint(ck, CheckpointRole::Source);
    const FileSetDigest t = checkpoint_fingerprint(written, CheckpointRole::Target);
    report.fingerprint = Fingerprint{s.digest, t.digest, s.files, t.files};
  }
  release_free_heap();
  report.values_compared = 0;
  report.max_abs_error = 0;
  for (std::size_t i = 0; i < set.modules.size(); ++i) {
    const ErrorStats& e = stats[i];
    report.requantized.push_back(
        {std::string(set.modules[i].name), globals[i], e.values, e.relative_rmse(), e.cosine(), e.max_abs, e.marlin_zeroed_blocks});
    report.values_compared += e.values;
    report.max_abs_error = std::max(*report.max_abs_error, e.max_abs);
  }
  report.seconds = seconds_since(started);
  return report;
}

}  // namespace mx2nv

#include "convert/steps.hpp"

#include "common/cancel.hpp"
#include "common/error.hpp"
#include "common/parallel.hpp"
#include "common/printable.hpp"
#include "common/stream_hash.hpp"
#include "convert/shard_writer.hpp"
#include "destination/commit_queue.hpp"
#include "destination/modelopt_files.hpp"
#include "plan/target_layout.hpp"
#include "scan/overspan_values.hpp"
#include "scan/planner.hpp"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <numeric>

namespace mx2nv {
namespace {

std::uint64_t text_hash(std::string_view text) { return XXH3_64bits(text.data(), text.size()); }

void copy_companion(const fs::path& from, Destination& out, const std::string& relative, CopyEngine& engine,
                    TransferTally& tally) {
  const File in = File::open_read(from);
  Destination::Pending target = out.begin(relative);
  std::vector<std::byte> buffer(kCopyBufferBytes);
  target.file.set_size(in.size());
  engine.transfer(in, 0, target.file, 0, in.size(), buffer, tally);
  out.commit(target);
}

// Is DST, finished by an earlier run, the conversion of this SRC under this
// window? nullopt when it is; else what differs. Decided from the records DST
// keeps, without reading tensor data: the source shards' identities (size,
// mtime, header hash), the window and tool version (with the source, they
// determine the plan), the output shards' and companions' sizes, the
// config's and index's checksums. (`mx2nv verify` is the full proof.)
std::optional<std::string> finished_mismatch(const Destination& dst, const Checkpoint& ck, Window window,
                                             OverSpanChoice choice, const std::vector<std::uint64_t>* plan_hashes,
                                             PlanKind kind, TargetFormat format) {
  const FinishedRecord& f = *dst.finished();
  if (f.tool_version != MX2NV_VERSION) return fmt::format("it was written by mx2nv {}", printable(f.tool_version));
  const std::optional<ConversionMode> recorded = parse_mode(f.window);
  if (recorded && recorded->format != format) {
    return fmt::format("it holds the {} layout, not {} (--format)", choice_name(recorded->format), choice_name(format));
  }
  if (kind == PlanKind::Requantize && (!recorded || recorded->kind != PlanKind::Requantize)) {
    return fmt::format("it was converted under window {}, not written by mx2nv requantize", printable(f.window));
  }
  if (kind == PlanKind::Convert && (!recorded || !mode_matches(*recorded, window, choice, format))) {
    return fmt::format("it was converted under window {}, not {}{}", printable(f.window), window_name(window),
                       choice == OverSpanChoice::Fail ? "" : fmt::format(" with --overspan {}", choice_name(choice)));
  }
  if (f.shards.size() != ck.shards.size()) return "its shards differ from SRC's";
  for (std::size_t s = 0; s < ck.shards.size(); ++s) {
    const ShardRecord& r = f.shards[s];
    if (!r.same_source(source_identity(ck, s))) return fmt::format("SRC's {} changed since", printable(ck.shards[s].file));
    if (plan_hashes && (s >= plan_hashes->size() || (*plan_hashes)[s] != r.plan_hash)) {
      return fmt::format("its {} was written under another plan", printable(r.shard));
    }
    const auto stamp = dst.stamp(r.shard);
    if (!stamp || stamp->size != r.output_size) return fmt::format("DST's {} changed since", r.shard);
  }
  if (f.companions.size() != ck.companions.size()) return "SRC's companion files changed since";
  // A carded DST (mx2nv card): SRC's README.md is kept as README.source.md,
  // and README.md is the card (docs/reference/model-card.md §7).
  const bool carded = dst.stamp(fmt::format("{}/{}", kStateDirName, kCardRecordFileName)).has_value();
  for (std::size_t i = 0; i < f.companions.size(); ++i) {
    const bool moved = carded && ck.companions[i] == kCardFileName;
    const auto stamp = dst.stamp(moved ? std::string(kSourceCardFileName) : ck.companions[i]);
    const FileStamp& was = f.companions[i];  // names as json_text() recorded them
    if (!stamp || was.name != json_text(ck.companions[i]) || was.size != stamp->size) {
      return fmt::format("DST's {} changed since", ck.companions[i]);
    }
  }
  if (dst.hash(std::string(kConfigFileName)) != f.config_hash) return "DST's config.json changed since";
  if (f.quant_config_hash != 0 && dst.hash(std::string(kModelOptConfigFileName)) != f.quant_config_hash) {
    return fmt::format("DST's {} changed since", kModelOptConfigFileName);
  }
  if (ck.index.has_value() != (f.index_hash != 0) ||
      (ck.index && dst.hash(std::string(kIndexFileName)) != f.index_hash)) {
    return "DST's index changed since";
  }
  return std::nullopt;
}

}  // namespace

std::set<std::string> files_written(const Checkpoint& ck, TargetFormat format) {
  std::set<std::string> out(ck.companions.begin(), ck.companions.end());
  out.insert(std::string(kConfigFileName));
  if (format == TargetFormat::ModelOpt) out.insert(std::string(kModelOptConfigFileName));
  if (ck.index) out.insert(std::string(kIndexFileName));
  for (const auto& s : ck.shards) out.insert(s.file);
  return out;
}

void add_plan_counts(Report& report, const Plan& plan) {
  report.canonicalised_zero_groups = 0;
  report.marlin_zeroed_groups = 0;
  for (const auto& mp : plan.modules) {
    report.canonicalised_zero_groups += mp.canonical_zero_groups;
    report.marlin_zeroed_groups += mp.marlin_zeroed_groups;
  }
  report.raised_globals = plan.raised_globals;
}

void add_shard_counts(Report& report, const std::vector<ShardRecord>& records) {
  std::uint64_t groups = 0, zero_groups = 0;
  bool counted = true;
  report.target_tensor_bytes = 0;
  report.passthrough_tensors = 0;
  report.shared_bytes = 0;
  report.copied_bytes = 0;
  report.written_bytes = 0;
  for (const auto& r : records) {
    report.target_tensor_bytes += r.target_bytes;
    zero_groups += r.zero_groups;
    report.passthrough_tensors += r.passthrough_tensors;
    groups += r.groups;
    counted = counted && r.groups_counted;
    report.shared_bytes += r.shared_bytes;
    report.copied_bytes += r.copied_bytes;
    report.written_bytes += r.written_bytes;
  }
  // Groups are counted only where mx2nv read the packed bytes (report.hpp).
  if (counted) {
    report.zero_groups = zero_groups;
    report.active_groups = groups - zero_groups;
  }
}

std::optional<ShardRecord> reusable_record(const Destination& dst, const ShardRecord& expected,
                                           const TargetLayout& layout) {
  auto record = dst.read_record(expected.shard);
  if (!record || !record->same_source(expected) || record->plan_hash != expected.plan_hash) return std::nullopt;
  const auto stamp = dst.stamp(expected.shard);
  if (!stamp || stamp->size != record->output_size || stamp->inode != record->output_inode ||
      stamp->ctime_ns != record->output_ctime_ns) {
    return std::nullopt;
  }
  const std::uint64_t data_start = serialize_target_header(layout).size();
  if (data_start + layout.data_size != stamp->size) return std::nullopt;
  if (hash_written_bytes(dst.open_read(expected.shard), layout, data_start) != record->written_hash) {
    return std::nullopt;
  }
  return record;
}

std::uint64_t execute_and_finalize(const SourceCheckpoint& source, const Plan& plan, Report& report, Destination& out,
                                   bool resume, unsigned threads, CopyEngine& engine, ProgressTracker* progress,
                                   std::vector<ErrorStats>* errors,
                                   const std::function<void(const std::vector<ShardRecord>&)>& counted) {
  // DST's index does not depend on the shards: written meanwhile (destination/index_writer.hpp).
  std::optional<BackgroundIndex> index;
  if (const auto total = early_index_total(source, plan)) index.emplace(source, plan, *total, out);
  std::vector<std::size_t> all(source.checkpoint.shards.size());
  std::iota(all.begin(), all.end(), std::size_t{0});
  std::uint64_t resumed = 0;
  std::vector<ShardRecord> records =
      execute_shards(source, plan, out, all, resume, threads, resumed, &engine, progress, errors);
  counted(records);
  if (progress) progress->phase(ProgressPhase::Finalize);
  finalize_conversion(source, plan, report, std::move(records), out, &engine,
                      index ? std::optional<WrittenIndex>(index->take()) : std::nullopt);
  return resumed;
}

void refuse_planned_destination(const Destination& out, Command command) {
  if (out.holds_plan()) {
    fail(ErrorKind::Usage,
         "DST {} holds a plan made by mx2nv plan ({}/plan.json); continue it with mx2nv convert --plan ... --shards "
         "I/N and --finalize, or {} into another DST",
         out.root().string(), (out.root() / kStateDirName).string(), command_name(command));
  }
}

std::vector<ShardRecord> execute_shards(const SourceCheckpoint& source, const Plan& plan, Destination& out,
                                        const std::vector<std::size_t>& shards, bool reuse, unsigned threads,
                                        std::uint64_t& reused, CopyEngine* engine, ProgressTracker* progress,
                                        std::vector<ErrorStats>* errors) {
  CopyEngine auto_engine(CopyMode::Auto);
  CopyEngine& copier = engine ? *engine : auto_engine;
  ProgressTracker silent(Command::Convert, "shards", {});
  ProgressTracker& counter = progress ? *progress : silent;
  std::vector<ShardRecord> records(shards.size());
  std::atomic<std::uint64_t> reused_count{0};
  // A written shard is committed (fsync, rename), stamped and recorded on
  // the queue's thread while its worker moves on; the shard stays locked
  // until then (another process waiting for it must find it finished).
  CommitQueue commits(out, std::max(1u, threads));
  parallel_for(shards.size(), threads, [&](std::size_t i) {
    const std::size_t s = shards[i];
    const OpenShard in = source.checkpoint.read_shard(s);  // its header, read again (not kept from planning)
    const TargetLayout layout = make_target_layout(in.header, s, source.modules, plan);
    ShardRecord r = expected_record(source, plan, in, layout);
    auto lock = std::make_shared<Destination::ShardLock>(out.lock_shard(r.shard));
    if (const auto earlier = reuse ? reusable_record(out, r, layout) : std::nullopt) {
      out.keep(r.shard);
      records[i] = *earlier;
      ++reused_count;
      counter.unit_done(in.summary->data_size);
      return;
    }
    if (reuse) out.discard(r.shard);  // a stale or partial output from an earlier run
    ShardWriteResult w = write_shard(source, plan, in, layout, out, copier, counter, errors);
    r.output_size = w.output_size;
    r.written_hash = w.written_hash;
    r.passthrough_tensors = w.passthrough_tensors;
    r.target_bytes = w.target_bytes;
    r.groups_counted = w.groups_counted;
    r.zero_groups = w.zero_groups;
    r.groups = w.groups;
    r.shared_bytes = w.shared_bytes;
    r.copied_bytes = w.copied_bytes;
    r.written_bytes = w.written_bytes;
    commits.push(std::move(w.output), [&out, &records, &counter, i, r, lock]() mutable {
      const auto stamp = out.stamp(r.shard);
      if (!stamp) fail(ErrorKind::Io, "{}: vanished right after it was written", (out.root() / r.shard).string());
      r.output_inode = stamp->inode;
      r.output_ctime_ns = stamp->ctime_ns;
      out.write_record(r);
      records[i] = r;
      lock.reset();
      counter.unit_done();
    });
  });
  commits.finish();
  reused = reused_count;
  return records;
}

void finalize_conversion(const SourceCheckpoint& source, const Plan& plan, Report& report,
                         std::vector<ShardRecord> records, Destination& out, CopyEngine* engine,
                         std::optional<WrittenIndex> early) {
  CopyEngine auto_engine(CopyMode::Auto);
  CopyEngine& copier = engine ? *engine : auto_engine;
  const Checkpoint& ck = source.checkpoint;
  FinishedRecord finished;
  finished.tool_version = MX2NV_VERSION;
  finished.window = mode_name(plan_mode(plan));
  finished.shards = std::move(records);
  finished.canonicalised_zero_groups = report.canonicalised_zero_groups.value_or(0);
  finished.marlin_zeroed_groups = report.marlin_zeroed_groups.value_or(0);
  TransferTally companions;
  for (const auto& rel : ck.companions) {
    copy_companion(ck.root / rel, out, rel, copier, companions);
    const auto stamp = out.stamp(rel);
    if (!stamp) fail(ErrorKind::Io, "{}: vanished after it was written", (out.root() / rel).string());
    finished.companions.push_back(*stamp);
  }
  report.shared_bytes += companions.shared;
  report.copied_bytes += companions.copied;
  // A requantize plan's config lists no module as requantized: every one is
  // (the checkpoint as `mx2nv requantize` has always written it).
  std::vector<std::string> bf16_modules, requantized_modules;
  for (std::size_t i = 0; i < plan.modules.size() && plan.kind == PlanKind::Convert; ++i) {
    if (plan.modules[i].treatment == Treatment::Bf16) bf16_modules.emplace_back(source.modules.modules[i].name);
    if (plan.modules[i].treatment == Treatment::Requantized) requantized_modules.emplace_back(source.modules.modules[i].name);
  }
  std::string config;
  if (plan.format == TargetFormat::ModelOpt) {
    ModelOptFiles files = modelopt_files(source, plan.modules, requantized_modules);
    out.write_file(std::string(kModelOptConfigFileName), files.hf_quant_config);
    finished.quant_config_hash = text_hash(files.hf_quant_config);
    report.written_bytes += files.hf_quant_config.size();
    config = std::move(files.config);
  } else {
    config = rewrite_config_text(ck.config_text, source.quant, bf16_modules, requantized_modules);
  }
  finished.config_hash = text_hash(config);
  report.written_bytes += config.size();
  if (!ck.index) {
    out.finish(finished, std::string(kConfigFileName), config);
    return;
  }
  out.write_file(std::string(kConfigFileName), config);
  if (early && early->total_size != report.target_tensor_bytes.value_or(0)) {
    out.drop(early->file);  // never expected: target_totals equals the layouts' sum (tested)
    early.reset();
  }
  WrittenIndex index = early ? std::move(*early) : write_target_index(source, plan, report.target_tensor_bytes.value_or(0), out);
  finished.index_hash = index.hash;
  report.written_bytes += index.bytes;
  out.finish(finished, index.file);
}

std::vector<ShardRecord> source_identities(const Checkpoint& ck) {
  std::vector<ShardRecord> out;
  out.reserve(ck.shards.size());
  for (std::size_t s = 0; s < ck.shards.size(); ++s) out.push_back(source_identity(ck, s));
  return out;
}

ConversionIdentity conversion_identity(const std::vector<ShardRecord>& identities, const Plan& plan) {
  return {MX2NV_VERSION, mode_name(plan_mode(plan)), identities.size(), source_digest(identities)};
}

ConversionIdentity conversion_identity(const PlanFile& file, const Plan& plan) {
  std::vector<ShardRecord> identities;
  for (const auto& s : file.shards) {
    ShardRecord r;
    r.shard = s.file;
    r.source_size = s.source_size;
    r.source_mtime_ns = s.source_mtime_ns;
    r.source_header_hash = s.source_header_hash;
    identities.push_back(std::move(r));
  }
  return conversion_identity(identities, plan);
}

bool answer_finished(Report& report, const Destination& dst, const Checkpoint& source, Window window,
                     OverSpanChoice choice, const std::vector<std::uint64_t>* plan_hashes, PlanKind kind,
                     TargetFormat format) {
  if (dst.state() != DestinationState::Finished) return false;
  if (const auto why = finished_mismatch(dst, source, window, choice, plan_hashes, kind, format)) {
    fail(ErrorKind::Usage, "DST {} holds a finished conversion, but not of this SRC with these options: {}",
         dst.root().string(), *why);
  }
  const FinishedRecord& f = *dst.finished();
  report.already_complete = true;
  report.resumed_shards = f.shards.size();
  report.canonicalised_zero_groups = f.canonicalised_zero_groups;
  report.marlin_zeroed_groups = f.marlin_zeroed_groups;
  add_shard_counts(report, f.shards);
  return true;
}

std::optional<Plan> plan_step(Report& report, const Destination& dst, const SourceCheckpoint& source, Window window,
                              unsigned threads, OverSpanChoice choice, TargetFormat format, CacheUse scan_cache) {
  if (answer_finished(report, dst, source.checkpoint, window, choice, nullptr, PlanKind::Convert, format)) {
    return std::nullopt;
  }
  const ScanResult scan = scan_modules(source, threads, kKeptHistogramBytes, nullptr, scan_cache);
  Plan plan = plan_conversion(source, scan, window, format);
  apply_overspan(source, plan, choice, threads);
  if (choice != OverSpanChoice::Fail) add_overspan_report(report, source, plan, threads);
  add_plan_counts(report, plan);
  if (report_refusal(report, source.modules, plan)) return std::nullopt;
  // A module no ModelOpt exclude entry can name is refused before anything is written.
  if (format == TargetFormat::ModelOpt) (void)modelopt_files(source, plan.modules);
  throw_if_stopped();
  return plan;
}

bool report_refusal(Report& report, const ModuleSet& set, const Plan& plan) {
  if (!plan.refused()) return false;
  report.result = Outcome::Refused;
  report.refused_spans = plan.refused_spans;
  report.unrepresentable_globals = bad_global_names(set, plan);
  report.global_conflicts = named_global_conflicts(set, plan);
  return true;
}

}  // namespace mx2nv

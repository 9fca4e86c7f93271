#include "io/distributed.hpp"

#include "core/error.hpp"
#include "core/plan_file.hpp"
#include "core/printable.hpp"
#include "core/target_layout.hpp"
#include "io/cancel.hpp"
#include "io/checkpoint_reader.hpp"
#include "io/convert_steps.hpp"
#include "io/destination.hpp"
#include "io/overspan.hpp"
#include "io/planner.hpp"
#include "io/report_file.hpp"

#include <charconv>
#include <chrono>

namespace mx2nv {
namespace {

constexpr std::uint64_t kMaxPlanBytes = 256 << 20;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::optional<std::size_t> parse_count(std::string_view text) {
  std::size_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return v;
}

// DST of a plan kept at its default place, DST/.mx2nv/plan.json.
std::optional<fs::path> destination_of_default_plan(const fs::path& plan) {
  const fs::path p = fs::absolute(plan).lexically_normal();
  if (p.filename() == kPlanFileName && p.parent_path().filename() == kStateDirName) {
    return p.parent_path().parent_path();
  }
  return std::nullopt;
}

struct LoadedPlan {
  PlanFile file;
  fs::path source, target;
};

// The source as planned: every shard's identity must still match, and the
// modules must be the planned ones.
void check_source_matches(const SourceCheckpoint& source, const PlanFile& plan) {
  const Checkpoint& ck = source.checkpoint;
  if (ck.shards.size() != plan.shards.size()) {
    fail(ErrorKind::Usage, "SRC no longer matches the plan: {} shards planned, {} found; run mx2nv plan again",
         plan.shards.size(), ck.shards.size());
  }
  for (std::size_t s = 0; s < ck.shards.size(); ++s) {
    const ShardRecord now = source_identity(ck, s);
    const PlannedShard& p = plan.shards[s];
    if (now.shard != p.file || now.source_size != p.source_size || now.source_mtime_ns != p.source_mtime_ns ||
        now.source_header_hash != p.source_header_hash) {
      fail(ErrorKind::Usage, "SRC no longer matches the plan: {} changed since it was planned; run mx2nv plan again",
           printable(now.shard));
    }
  }
}

Plan planned(const SourceCheckpoint& source, const PlanFile& file) {
  check_source_matches(source, file);
  std::vector<std::string> names;
  names.reserve(source.modules.modules.size());
  for (const auto& m : source.modules.modules) names.emplace_back(m.name);
  Plan plan = plan_for_modules(file, names);
  for (std::size_t s = 0; s < file.shards.size(); ++s) {
    if (expected_record(source, plan, s).plan_hash != file.shards[s].plan_hash) {
      fail_input("plan: shard {} does not match the plan's own fingerprint (damaged plan?)", file.shards[s].file);
    }
  }
  return plan;
}

PlanFile make_plan_file(const SourceCheckpoint& source, const Plan& plan, const fs::path& src, const fs::path& dst) {
  PlanFile f;
  f.tool_version = MX2NV_VERSION;
  f.window = plan.window;
  f.overspan = plan.overspan;
  f.source = fs::absolute(src).lexically_normal().string();
  f.target = fs::absolute(dst).lexically_normal().string();
  const Checkpoint& ck = source.checkpoint;
  for (std::size_t s = 0; s < ck.shards.size(); ++s) {
    const OpenShard in = ck.read_shard(s);
    const TargetLayout layout = make_target_layout(in.header, s, source.modules, plan.modules);
    const ShardRecord r = expected_record(source, plan, in, layout);
    f.shards.push_back({r.shard, r.source_size, r.source_mtime_ns, r.source_header_hash, r.plan_hash,
                        layout.data_size, layout.tensors.size()});
  }
  for (const auto& m : source.modules.modules) f.module_names.emplace_back(m.name);
  f.modules = plan.modules;
  return f;
}

std::optional<LoadedPlan> load_plan(const PlannedOptions& options) {
  std::error_code ec;
  if (!fs::exists(options.plan, ec)) return std::nullopt;
  LoadedPlan l;
  l.file = plan_file_from_text(read_text_file(options.plan, kMaxPlanBytes), options.plan.string());
  l.source = options.source.value_or(fs::path(l.file.source));
  l.target = options.target.value_or(fs::path(l.file.target));
  return l;
}

// A command whose plan is gone: finalize removes a plan kept in DST/.mx2nv, so
// a retried job after finalize finds DST finished instead.
Report plan_gone(const PlannedOptions& options, std::chrono::steady_clock::time_point started) {
  const auto dst = options.target ? options.target : destination_of_default_plan(options.plan);
  if (dst && options.source) {
    Destination out(*options.source, *dst, true);
    if (out.state() == DestinationState::Finished) {
      const SourceCheckpoint source = open_source_checkpoint(*options.source, 1, IndexNames::Drop);
      const std::string& mode = out.finished()->window;
      const Window window = parse_window(mode.substr(0, mode.find('+'))).value_or(Window::Marlin);
      Report report = start_report("convert", window, *options.source, &*dst);
      add_source_counts(report, source);
      // The finished record's mode says which --overspan choice wrote it.
      OverSpanChoice choice = OverSpanChoice::Fail;
      if (mode.ends_with("+requantize")) choice = OverSpanChoice::Requantize;
      if (mode.ends_with("+bf16")) choice = OverSpanChoice::Bf16;
      answer_finished(report, out, source.checkpoint, window, choice);
      report.seconds = seconds_since(started);
      return report;
    }
  } else if (dst) {
    std::error_code ec;
    const bool finished = fs::is_regular_file(fs::symlink_status(*dst / kStateDirName / kFinishedFileName, ec));
    if (finished) {
      Report report;
      report.command = "convert";
      report.provenance.target = fs::absolute(*dst).lexically_normal().string();
      report.already_complete = true;
      report.seconds = seconds_since(started);
      return report;
    }
  }
  fail(ErrorKind::Usage, "{}: no such plan (run mx2nv plan first)", options.plan.string());
}

}  // namespace

ShardSelection parse_shard_selection(std::string_view text) {
  const auto slash = text.find('/');
  if (slash == std::string_view::npos) fail(ErrorKind::Usage, "--shards {}: expected I/N", printable(text));
  const auto i = parse_count(text.substr(0, slash));
  const auto n = parse_count(text.substr(slash + 1));
  if (!i || !n || *n == 0 || *i >= *n) {
    fail(ErrorKind::Usage, "--shards {}: expected I/N with 0 <= I < N", printable(text));
  }
  return {*i, *n};
}

ShardSelection parse_shard_index(std::string_view text) {
  const auto i = parse_count(text);
  if (!i) fail(ErrorKind::Usage, "--shard {}: expected a shard number", printable(text));
  return {*i, 0};
}

std::vector<std::size_t> selected_shards(const ShardSelection& selection, std::size_t total) {
  if (selection.stride == 0) {
    if (selection.index >= total) {
      fail(ErrorKind::Usage, "--shard {}: the plan has {} shards (0 to {})", selection.index, total, total - 1);
    }
    return {selection.index};
  }
  std::vector<std::size_t> out;
  for (std::size_t s = selection.index; s < total; s += selection.stride) out.push_back(s);
  return out;
}

Report plan_checkpoint(const PlanOptions& options, fs::path& plan_written) {
  const auto started = std::chrono::steady_clock::now();
  std::optional<ReportFile> plan_file_out;
  if (options.plan_out) plan_file_out.emplace(*options.plan_out, std::vector<fs::path>{options.source, options.target});
  Destination out(options.source, options.target, true);
  Report report = start_report("plan", options.window, options.source, &options.target);
  // The plan names no index entry: the index's names go once it is checked.
  const SourceCheckpoint source = open_source_checkpoint(options.source, options.threads, IndexNames::Drop);
  add_source_counts(report, source);
  const std::optional<Plan> planned_here = plan_step(report, out, source, options.window, options.threads, options.overspan);
  if (!planned_here) {
    report.seconds = seconds_since(started);
    return report;
  }
  const Plan& plan = *planned_here;
  PlanFile file = make_plan_file(source, plan, options.source, options.target);
  const std::string text = plan_file_to_text(file);
  if (plan_file_out) {
    plan_file_out->write(text);
    plan_written = *options.plan_out;
  } else {
    const std::string relative = std::string(kStateDirName) + "/" + std::string(kPlanFileName);
    plan_written = options.target / relative;
    // A retried `mx2nv plan`: the same plan is fine, another one is not.
    std::error_code ec;
    if (fs::exists(fs::symlink_status(plan_written, ec))) {
      std::optional<PlanFile> existing;
      try {
        existing = plan_file_from_text(read_text_file(plan_written, kMaxPlanBytes), plan_written.string());
      } catch (const Error&) {
      }
      if (!existing || existing->fingerprint != file.fingerprint) {
        fail(ErrorKind::Usage, "DST {} already holds another plan ({}); refusing to mix conversions",
             options.target.string(), plan_written.string());
      }
    } else {
      out.open_for_writing(files_written(source.checkpoint));
      out.write_file(relative, text);
      out.sync_directories();
    }
  }
  for (const auto& s : file.shards) report.target_tensor_bytes += s.output_data_bytes;
  report.seconds = seconds_since(started);
  return report;
}

Report convert_planned_shards(const PlannedOptions& options, const ShardSelection& selection) {
  const auto started = std::chrono::steady_clock::now();
  ProgressTracker progress("convert", "shards", options.progress);
  progress.phase(ProgressPhase::Plan);
  const auto loaded = load_plan(options);
  if (!loaded) return plan_gone(options, started);
  Destination out(loaded->source, loaded->target, true);
  Report report = start_report("convert", loaded->file.window, loaded->source, &loaded->target);
  const SourceCheckpoint source = open_source_checkpoint(loaded->source, options.threads, IndexNames::Drop);  // shards need no index names
  add_source_counts(report, source);
  if (answer_finished(report, out, source.checkpoint, loaded->file.window, loaded->file.overspan)) {
    report.seconds = seconds_since(started);
    return report;
  }
  const Plan plan = planned(source, loaded->file);
  const std::vector<std::size_t> shards = selected_shards(selection, source.checkpoint.shards.size());
  std::uint64_t selected_bytes = 0;
  for (const std::size_t s : shards) selected_bytes += source.checkpoint.shards[s].data_size;
  progress.phase(ProgressPhase::Shards, selected_bytes, shards.size());
  out.open_for_shards();
  report.copy_mode = std::string(copy_mode_name(options.copy));
  CopyEngine engine(options.copy);
  if (options.copy == CopyMode::Reflink && !shards.empty()) {
    CopyEngine::require_sharing(*source.checkpoint.files->open(shards.front()), loaded->target);
  }
  const std::vector<ShardRecord> records =
      execute_shards(source, plan, out, shards, true, options.threads, report.resumed_shards, &engine, &progress);
  out.sync_directories();  // this step's shards are durable before it reports them done
  report.shards = shards.size();
  add_shard_counts(report, records);
  report.seconds = seconds_since(started);
  progress.done();
  return report;
}

Report finalize_planned(const PlannedOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  ProgressTracker progress("convert", "shards", options.progress);
  progress.phase(ProgressPhase::Finalize);
  const auto loaded = load_plan(options);
  if (!loaded) return plan_gone(options, started);
  Destination out(loaded->source, loaded->target, true);
  Report report = start_report("convert", loaded->file.window, loaded->source, &loaded->target);
  const SourceCheckpoint source = open_source_checkpoint(loaded->source, options.threads, IndexNames::KeepIfSmall);
  const Checkpoint& ck = source.checkpoint;
  add_source_counts(report, source);
  if (answer_finished(report, out, ck, loaded->file.window, loaded->file.overspan)) {
    report.seconds = seconds_since(started);
    return report;
  }
  const Plan plan = planned(source, loaded->file);
  // Every shard must be finished: its record matches the plan and SRC, and the
  // output file is there with the recorded size (`mx2nv verify` proves values).
  std::vector<ShardRecord> records;
  std::vector<std::string> missing;
  for (std::size_t s = 0; s < ck.shards.size(); ++s) {
    const ShardRecord expected = expected_record(source, plan, s);
    const auto record = out.read_record(expected.shard);
    const auto stamp = out.stamp(expected.shard);
    if (!record || !record->same_source(expected) || record->plan_hash != expected.plan_hash || !stamp ||
        stamp->size != record->output_size) {
      missing.push_back(fmt::format("{} (--shard {})", printable(expected.shard), s));
      continue;
    }
    records.push_back(*record);
  }
  if (!missing.empty()) {
    std::string list;
    for (std::size_t i = 0; i < missing.size() && i < 20; ++i) list += (i ? ", " : "") + missing[i];
    if (missing.size() > 20) list += fmt::format(", and {} more", missing.size() - 20);
    fail(ErrorKind::Usage, "cannot finalize {}: {} of {} shards are not finished: {}", loaded->target.string(),
         missing.size(), ck.shards.size(), list);
  }
  out.open_for_writing(files_written(ck));
  add_plan_counts(report, plan);
  if (plan.overspan != OverSpanChoice::Fail) add_overspan_report(report, source, plan, options.threads);
  add_shard_counts(report, records);
  report.copy_mode = std::string(copy_mode_name(options.copy));
  CopyEngine engine(options.copy);
  finalize_conversion(source, plan, report, std::move(records), out, &engine);
  report.seconds = seconds_since(started);
  progress.done();
  return report;
}

}  // namespace mx2nv

#include "convert/planned.hpp"

#include "checkpoint/reader.hpp"
#include "checkpoint/argument_check.hpp"
#include "common/cancel.hpp"
#include "common/error.hpp"
#include "common/parallel.hpp"
#include "common/printable.hpp"
#include "common/stopwatch.hpp"
#include "convert/plan_command.hpp"
#include "checkpoint/source_fields.hpp"
#include "convert/steps.hpp"
#include "destination/destination.hpp"
#include "plan/overspan.hpp"
#include "plan/plan_file.hpp"
#include "plan/target_layout.hpp"
#include "output/report_file.hpp"
#include "scan/overspan_values.hpp"
#include "scan/planner.hpp"

#include <sys/stat.h>

#include <charconv>
#include <chrono>
#include <exception>
#include <memory>

namespace mx2nv {

// A plan file as a step runs it: the plan, and the SRC and DST it uses.
struct LoadedPlan {
  PlanFile file;
  fs::path source, target;
};

namespace {

// DST of a plan kept at its default place, DST/.mx2nv/plan.json.
std::optional<fs::path> destination_of_default_plan(const fs::path& plan) {
  const fs::path p = fs::absolute(plan).lexically_normal();
  if (p.filename() == kPlanFileName && p.parent_path().filename() == kStateDirName) {
    return p.parent_path().parent_path();
  }
  return std::nullopt;
}

// Whether two paths name one existing directory (symlinks followed: DST may
// be given as a link to it).
bool same_directory(const fs::path& a, const fs::path& b) {
  struct stat sa {}, sb {};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && S_ISDIR(sa.st_mode) &&
         sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

// --window / --overspan given to a planned step: the plan decides, so a
// different expectation is a usage error, never a silent override.
void check_expected_options(const PlannedOptions& options, Window window, OverSpanChoice choice, TargetFormat format) {
  if (options.format && *options.format != format) {
    fail(ErrorKind::Usage, "--format {}: the plan was made with --format {} (a step follows its plan; leave --format "
                           "out, or plan again)",
         choice_name(*options.format), choice_name(format));
  }
  if (options.window && *options.window != window) {
    fail(ErrorKind::Usage, "--window {}: the plan was made with --window {} (a step follows its plan; leave --window "
                           "out, or plan again)",
         window_name(*options.window), window_name(window));
  }
  if (options.over_span_choice && *options.over_span_choice != choice) {
    fail(ErrorKind::Usage, "--overspan {}: the plan was made with --overspan {} (a step follows its plan; leave "
                           "--overspan out, or plan again)",
         choice_name(*options.over_span_choice), choice_name(choice));
  }
}

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

// The plan for SRC from the file, checked against SRC: its shards and
// modules, and for each of `checked` (the shards a step converts; every
// shard for finalize) the fingerprint and output size its rows give (which
// the step's writes and finalize's index follow): a step does not pay for
// the shards it leaves to others, as it leaves them their rows
// (check_planned_rows). The shards are checked in parallel; the first in
// order that fails is reported, whatever finished first.
Plan planned(const SourceCheckpoint& source, const PlanFile& file, const std::vector<std::size_t>& checked,
             unsigned threads) {
  check_source_matches(source, file);
  std::vector<std::string_view> names;  // views: K3's ~250k names are not copied again
  names.reserve(source.modules.modules.size());
  for (const auto& m : source.modules.modules) names.push_back(m.name);
  Plan plan = plan_for_modules(file, names);
  std::vector<std::exception_ptr> errors(checked.size());
  parallel_for(checked.size(), threads, [&](std::size_t i) {
    try {
      const std::size_t s = checked[i];
      const OpenShard in = source.checkpoint.read_shard(s);
      const TargetLayout layout = make_target_layout(in.header, s, source.modules, plan);
      const PlannedShard& p = file.shards[s];
      if (expected_record(source, plan, in, layout).plan_hash != p.plan_hash) {
        fail_input("plan: shard {} does not match the plan's own fingerprint (damaged plan?)", printable(p.file));
      }
      if (layout.data_size != p.output_data_bytes || layout.tensors.size() != p.output_tensors) {
        fail_input("plan: shard {} is planned as {} tensors and {} bytes of data, its rows give {} and {} (damaged "
                   "plan?)",
                   printable(p.file), p.output_tensors, p.output_data_bytes, layout.tensors.size(), layout.data_size);
      }
    } catch (...) {
      errors[i] = std::current_exception();
    }
  });
  for (const auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
  return plan;
}

std::vector<std::size_t> every_shard(const PlanFile& file) {
  std::vector<std::size_t> all(file.shards.size());
  for (std::size_t s = 0; s < all.size(); ++s) all[s] = s;
  return all;
}

std::vector<std::uint64_t> plan_hashes(const PlanFile& file) {
  std::vector<std::uint64_t> out;
  for (const auto& s : file.shards) out.push_back(s.plan_hash);
  return out;
}

// The plan as read and checked; null where it is gone. A plan that
// planned_paths read for these options is not read again (K3's is ~250k
// rows): the step runs the plan its output paths were checked against.
std::shared_ptr<const LoadedPlan> load_plan(const PlannedOptions& options, const PlannedPaths* paths = nullptr) {
  if (paths && paths->loaded && paths->plan == options.plan) return paths->loaded;
  std::error_code ec;
  if (fs::is_directory(options.plan, ec)) check_input_file("--plan", options.plan, "the plan file `mx2nv plan` writes");
  if (!fs::exists(options.plan, ec)) return nullptr;
  LoadedPlan l;
  l.file = read_plan_file(options.plan);
  // Another version may plan otherwise (its rows, its fingerprints): a plan
  // is run by the mx2nv that made it.
  if (l.file.tool_version != MX2NV_VERSION) {
    fail(ErrorKind::Usage, "{}: a plan made by mx2nv {}; this is mx2nv {}: run mx2nv plan again with it",
         options.plan.string(), printable(l.file.tool_version), MX2NV_VERSION);
  }
  if (l.file.kind == PlanKind::Requantize && (options.window || options.over_span_choice)) {
    fail(ErrorKind::Usage, "{}: {}: a requantize plan (mx2nv plan --requantize) has no window or --overspan choice; "
                           "leave it out",
         options.plan.string(), options.window ? "--window" : "--overspan");
  }
  check_expected_options(options, l.file.window, l.file.over_span_choice, l.file.format);
  l.source = options.source.value_or(fs::path(l.file.source));
  l.target = options.target.value_or(fs::path(l.file.target));
  // A plan kept in a DST's state directory is that DST's plan: it converts
  // into that directory and no other (a DST moved, or mounted elsewhere
  // here, is given explicitly).
  if (const auto home = destination_of_default_plan(options.plan); home && !same_directory(*home, l.target)) {
    fail(ErrorKind::Usage,
         "{} is the plan kept in DST {}, but it names DST {}; give DST (and SRC) as this machine mounts them: mx2nv "
         "convert --plan P ... SRC DST",
         options.plan.string(), home->string(), l.target.string());
  }
  return std::make_shared<const LoadedPlan>(std::move(l));
}

// A command whose plan is gone: finalize removes a plan kept in DST/.mx2nv, so
// a retried job after finalize finds DST finished instead. Only then: a plan
// kept anywhere else is never removed by mx2nv, and missing is missing.
// A finalize (`tidy`) also removes what a finalize killed after its commit
// point left in DST's state directory (Destination::tidy_finished).
Report plan_gone(const PlannedOptions& options, std::chrono::steady_clock::time_point started, bool tidy) {
  const auto home = destination_of_default_plan(options.plan);
  const auto no_plan = [&]() -> Report {
    fail(ErrorKind::Usage, "{}: no such plan (run mx2nv plan first)", options.plan.string());
  };
  if (!home || (options.target && !same_directory(*home, *options.target))) return no_plan();
  const fs::path dst = options.target.value_or(*home);
  const std::optional<FinishedRecord> finished = Destination::finished_record(dst);
  if (!finished) return no_plan();
  // What can still be checked without the plan: the finished conversion is
  // this mx2nv's, under the options the step was given, of the SRC given.
  if (finished->tool_version != MX2NV_VERSION) {
    fail(ErrorKind::Usage, "DST {} holds a conversion written by mx2nv {}; this is mx2nv {}", dst.string(),
         printable(finished->tool_version), MX2NV_VERSION);
  }
  const std::string& mode = finished->window;
  // The finished record's mode says which window and --overspan choice wrote it.
  const std::optional<ConversionMode> recorded = parse_mode(mode);
  const ConversionMode m = recorded.value_or(ConversionMode{});
  const Window window = m.window;
  const OverSpanChoice choice = m.rewritten;
  const PlanKind kind = m.kind;
  if (!recorded ||
      (options.format && *options.format != m.format) ||
      (options.window && !mode_matches(m, *options.window, options.over_span_choice.value_or(choice), m.format)) ||
      (options.over_span_choice &&
       !mode_matches(m, options.window.value_or(window), *options.over_span_choice, m.format))) {
    fail(ErrorKind::Usage, "DST {} holds a finished conversion under {}, not under the options given", dst.string(),
         printable(mode));
  }
  if (options.source) {
    Destination out(*options.source, dst, true);
    const SourceCheckpoint source = open_source_checkpoint(*options.source, 1, IndexNames::Drop);
    Report report = start_report(Command::Convert, window, *options.source, dst);
    add_source_counts(report, source);
    if (!answer_finished(report, out, source.checkpoint, window, choice, nullptr, kind, m.format)) return no_plan();
    if (tidy) out.tidy_finished();
    report.seconds = seconds_since(started);
    return report;
  }
  if (tidy) Destination::tidy_finished(dst);
  Report report;
  report.command = Command::Convert;
  report.window = window;
  report.provenance.target = fs::absolute(dst).lexically_normal().string();
  report.already_complete = true;
  report.resumed_shards = finished->shards.size();
  report.canonicalised_zero_groups = finished->canonicalised_zero_groups;
  report.marlin_zeroed_groups = finished->marlin_zeroed_groups;
  add_shard_counts(report, finished->shards);
  report.seconds = seconds_since(started);
  return report;
}

}  // namespace

PlannedPaths planned_paths(const PlannedOptions& options, const std::vector<fs::path>& outputs) {
  PlannedPaths paths{options.plan, options.source, options.target};
  if (auto loaded = load_plan(options)) {
    paths.source = loaded->source;
    paths.target = loaded->target;
    paths.loaded = std::move(loaded);
    return paths;
  }
  if (!paths.target) paths.target = destination_of_default_plan(options.plan);
  if (paths.source || !paths.target) return paths;
  std::optional<FinishedRecord> finished;
  try {
    finished = Destination::finished_record(*paths.target);
  } catch (const Error&) {
    return paths;  // the step refuses it
  }
  if (!finished || finished->shards.empty()) return paths;
  const ShardRecord& first = finished->shards.front();
  for (const auto& output : outputs) {
    std::error_code ec;
    for (fs::path dir = fs::weakly_canonical(fs::absolute(output, ec), ec).parent_path(); !ec;
         dir = dir.parent_path()) {
      // SRC as DST's record knows it: its first shard, by name, size and
      // header (hashed only for a file that matches so far). Not by mtime: a
      // SRC touched since is still SRC.
      struct stat st {};
      const fs::path candidate = dir / first.shard;
      if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
          static_cast<std::uint64_t>(st.st_size) == first.source_size) {
        try {
          if (shard_header_hash(candidate) == first.source_header_hash) {
            paths.source = dir;
            return paths;
          }
        } catch (const Error&) {
          // unreadable: not SRC as recorded; keep looking above
        }
      }
      if (dir == dir.root_path() || dir.empty()) break;
    }
  }
  return paths;
}

Report convert_planned_shards(const PlannedOptions& options, const ShardSelection& selection,
                              const PlannedPaths* paths) {
  const auto started = std::chrono::steady_clock::now();
  ProgressTracker progress(Command::Convert, "shards", options.progress);
  progress.phase(ProgressPhase::Plan);
  const auto loaded = load_plan(options, paths);
  if (!loaded) return plan_gone(options, started, false);
  Destination out(loaded->source, loaded->target, true);
  Report report = start_report(Command::Convert, loaded->file.window, loaded->source, loaded->target);
  const SourceCheckpoint source = open_source_checkpoint(loaded->source, options.threads, IndexNames::Drop);  // shards need no index names
  add_source_counts(report, source);
  const std::vector<std::size_t> shards = selected_shards(selection, source.checkpoint.shards.size());
  // A finished DST is answered for by every shard's fingerprint: all checked.
  const Plan plan = planned(source, loaded->file,
                            out.state() == DestinationState::Finished ? every_shard(loaded->file) : shards,
                            options.threads);
  const std::vector<std::uint64_t> hashes = plan_hashes(loaded->file);
  const auto answer = [&] {
    answer_finished(report, out, source.checkpoint, loaded->file.window, loaded->file.over_span_choice, &hashes,
                    loaded->file.kind, loaded->file.format);
    report.seconds = seconds_since(started);
    return report;
  };
  if (out.state() == DestinationState::Finished) return answer();
  if (shards.empty()) {  // --shards I/N with I beyond the plan's shards: nothing here, nothing written
    report.shards = 0;
    report.seconds = seconds_since(started);
    progress.done();
    return report;
  }
  // Everything this step writes is checked before it writes: DST receives
  // this conversion, the rows of the modules it writes are SRC's, and
  // --copy reflink can share.
  const ConversionIdentity identity = conversion_identity(loaded->file, plan);
  out.check_identity(identity);
  check_planned_rows(source, plan, shards, options.threads);
  if (options.copy == CopyMode::Reflink) out.require_sharing(*source.checkpoint.files->open(shards.front()));
  std::uint64_t selected_bytes = 0;
  for (const std::size_t s : shards) selected_bytes += source.checkpoint.shards[s].data_size;
  progress.phase(ProgressPhase::Shards, selected_bytes, shards.size());
  // Finished is decided again under the lock that excludes finalize: a DST
  // finalized since it was opened is answered for, never written.
  if (!out.open_for_shards()) return answer();
  out.claim_identity(identity);
  report.shards = shards.size();
  report.copy_mode = options.copy;
  CopyEngine engine(options.copy);
  std::uint64_t resumed = 0;
  const std::vector<ShardRecord> records =
      execute_shards(source, plan, out, shards, true, options.threads, resumed, &engine, &progress);
  report.resumed_shards = resumed;
  out.sync_directories();  // this step's shards are durable before it reports them done
  add_shard_counts(report, records);
  report.seconds = seconds_since(started);
  progress.done();
  return report;
}

Report finalize_planned(const PlannedOptions& options, const PlannedPaths* paths) {
  const auto started = std::chrono::steady_clock::now();
  ProgressTracker progress(Command::Convert, "shards", options.progress);
  progress.phase(ProgressPhase::Plan);
  const auto loaded = load_plan(options, paths);
  if (!loaded) return plan_gone(options, started, true);
  Destination out(loaded->source, loaded->target, true);
  Report report = start_report(Command::Convert, loaded->file.window, loaded->source, loaded->target);
  const SourceCheckpoint source = open_source_checkpoint(loaded->source, options.threads, IndexNames::KeepIfSmall);
  const Checkpoint& ck = source.checkpoint;
  add_source_counts(report, source);
  const Plan plan = planned(source, loaded->file, every_shard(loaded->file), options.threads);
  const std::vector<std::uint64_t> hashes = plan_hashes(loaded->file);
  const auto answer = [&] {
    if (answer_finished(report, out, ck, loaded->file.window, loaded->file.over_span_choice, &hashes, loaded->file.kind,
                        loaded->file.format)) {
      out.tidy_finished();
    }
    report.seconds = seconds_since(started);
    return report;
  };
  if (out.state() == DestinationState::Finished) return answer();
  const ConversionIdentity identity = conversion_identity(loaded->file, plan);
  out.check_identity(identity);
  if (options.copy == CopyMode::Reflink && !ck.shards.empty()) out.require_sharing(*ck.files->open(0));
  progress.phase(ProgressPhase::Finalize);
  if (!out.open_for_writing(files_written(ck, loaded->file.format))) return answer();
  // Under the exclusive lock: no step writes while the shards are checked.
  out.check_identity(identity);
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
  add_plan_counts(report, plan);
  if (plan.over_span_choice != OverSpanChoice::Fail) add_overspan_report(report, source, plan, options.threads);
  add_shard_counts(report, records);
  report.copy_mode = options.copy;
  CopyEngine engine(options.copy);
  finalize_conversion(source, plan, report, std::move(records), out, &engine);
  report.seconds = seconds_since(started);
  progress.done();
  return report;
}

}  // namespace mx2nv

#include "io/distributed.hpp"

#include "core/error.hpp"
#include "core/overspan.hpp"
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

#include <sys/stat.h>

#include <charconv>
#include <chrono>

namespace mx2nv {
namespace {

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

// Whether two paths name one existing directory (symlinks followed: DST may
// be given as a link to it).
bool same_directory(const fs::path& a, const fs::path& b) {
  struct stat sa {}, sb {};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && S_ISDIR(sa.st_mode) &&
         sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

// A plan file, streamed (core/plan_file.hpp: no copy of the text, no DOM;
// the size capped before anything is read).
PlanFile read_plan_file(const fs::path& path) {
  const File f = File::open_read(path);
  return plan_file_from_source(FileSource(f), f.size(), path.string());
}

struct LoadedPlan {
  PlanFile file;
  fs::path source, target;
};

// --window / --overspan given to a planned step: the plan decides, so a
// different expectation is a usage error, never a silent override.
void check_expected_options(const PlannedOptions& options, Window window, OverSpanChoice choice) {
  if (options.window && *options.window != window) {
    fail(ErrorKind::Usage, "--window {}: the plan was made with --window {} (a step follows its plan; leave --window "
                           "out, or plan again)",
         window_name(*options.window), window_name(window));
  }
  if (options.overspan && *options.overspan != choice) {
    fail(ErrorKind::Usage, "--overspan {}: the plan was made with --overspan {} (a step follows its plan; leave "
                           "--overspan out, or plan again)",
         overspan_name(*options.overspan), overspan_name(choice));
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
// modules, and for every shard the fingerprint and output size its rows give
// (which the step's writes and finalize's index follow). Whether the rows are
// SRC's is check_planned_rows' part, for the modules a step writes.
Plan planned(const SourceCheckpoint& source, const PlanFile& file) {
  check_source_matches(source, file);
  std::vector<std::string_view> names;  // views: K3's ~250k names are not copied again
  names.reserve(source.modules.modules.size());
  for (const auto& m : source.modules.modules) names.push_back(m.name);
  Plan plan = plan_for_modules(file, names);
  for (std::size_t s = 0; s < file.shards.size(); ++s) {
    const OpenShard in = source.checkpoint.read_shard(s);
    const TargetLayout layout = make_target_layout(in.header, s, source.modules, plan.modules);
    const PlannedShard& p = file.shards[s];
    if (expected_record(source, plan, in, layout).plan_hash != p.plan_hash) {
      fail_input("plan: shard {} does not match the plan's own fingerprint (damaged plan?)", printable(p.file));
    }
    if (layout.data_size != p.output_data_bytes || layout.tensors.size() != p.output_tensors) {
      fail_input("plan: shard {} is planned as {} tensors and {} bytes of data, its rows give {} and {} (damaged "
                 "plan?)",
                 printable(p.file), p.output_tensors, p.output_data_bytes, layout.tensors.size(), layout.data_size);
    }
  }
  return plan;
}

std::vector<std::uint64_t> plan_hashes(const PlanFile& file) {
  std::vector<std::uint64_t> out;
  for (const auto& s : file.shards) out.push_back(s.plan_hash);
  return out;
}

// The conversion a plan is (its shards' identities equal SRC's: checked by
// planned()).
ConversionIdentity planned_identity(const PlanFile& file, const Plan& plan) {
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

PlanFile make_plan_file(const SourceCheckpoint& source, const Plan& plan, const fs::path& src, const fs::path& dst) {
  PlanFile f;
  f.tool_version = MX2NV_VERSION;
  f.window = plan.window;
  f.overspan = plan.overspan;
  // The paths' bytes, exactly: a step opens them as they are.
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
  l.file = read_plan_file(options.plan);
  // Another version may plan otherwise (its rows, its fingerprints): a plan
  // is run by the mx2nv that made it.
  if (l.file.tool_version != MX2NV_VERSION) {
    fail(ErrorKind::Usage, "{}: a plan made by mx2nv {}; this is mx2nv {}: run mx2nv plan again with it",
         options.plan.string(), printable(l.file.tool_version), MX2NV_VERSION);
  }
  check_expected_options(options, l.file.window, l.file.overspan);
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
  return l;
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
  const Window window = parse_window(mode.substr(0, mode.find('+'))).value_or(Window::Marlin);
  // The finished record's mode says which --overspan choice wrote it.
  OverSpanChoice choice = OverSpanChoice::Fail;
  if (mode.ends_with("+requantize")) choice = OverSpanChoice::Requantize;
  if (mode.ends_with("+bf16")) choice = OverSpanChoice::Bf16;
  if ((options.window && !mode_matches(mode, *options.window, options.overspan.value_or(choice))) ||
      (options.overspan && !mode_matches(mode, options.window.value_or(window), *options.overspan))) {
    fail(ErrorKind::Usage, "DST {} holds a finished conversion under {}, not under the options given", dst.string(),
         printable(mode));
  }
  if (options.source) {
    Destination out(*options.source, dst, true);
    const SourceCheckpoint source = open_source_checkpoint(*options.source, 1, IndexNames::Drop);
    Report report = start_report("convert", window, *options.source, &dst);
    add_source_counts(report, source);
    if (!answer_finished(report, out, source.checkpoint, window, choice)) return no_plan();
    if (tidy) out.tidy_finished();
    report.seconds = seconds_since(started);
    return report;
  }
  if (tidy) Destination::tidy_finished(dst);
  Report report;
  report.command = "convert";
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

ShardSelection parse_shard_selection(std::string_view text) {
  const auto slash = text.find('/');
  if (slash == std::string_view::npos) fail(ErrorKind::Usage, "--shards {}: expected I/N", printable(text));
  const auto i = parse_count(text.substr(0, slash));
  const auto n = parse_count(text.substr(slash + 1));
  if (!i || !n || *n == 0 || *i >= *n) {
    fail(ErrorKind::Usage, "--shards {}: expected I/N with 0 <= I < N < 2^64", printable(text));
  }
  return {*i, *n};
}

ShardSelection parse_shard_index(std::string_view text) {
  const auto i = parse_count(text);
  if (!i) fail(ErrorKind::Usage, "--shard {}: expected a shard number below 2^64", printable(text));
  return {*i, 0};
}

std::vector<std::size_t> selected_shards(const ShardSelection& selection, std::size_t total) {
  if (selection.stride == 0) {
    if (selection.index >= total) {
      if (total == 0) fail(ErrorKind::Usage, "--shard {}: there are no shards", selection.index);
      fail(ErrorKind::Usage, "--shard {}: the plan has {} shards (0 to {})", selection.index, total, total - 1);
    }
    return {selection.index};
  }
  std::vector<std::size_t> out;
  // s < total, so total - s does not wrap; the next index is s + stride only
  // while that stays below total (s + stride itself could wrap past 2^64).
  for (std::size_t s = selection.index; s < total; s += selection.stride) {
    out.push_back(s);
    if (selection.stride >= total - s) break;
  }
  return out;
}

PlannedPaths planned_paths(const PlannedOptions& options, const std::vector<fs::path>& outputs) {
  PlannedPaths paths{options.plan, options.source, options.target};
  if (const auto loaded = load_plan(options)) {
    paths.source = loaded->source;
    paths.target = loaded->target;
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

Report plan_checkpoint(const PlanOptions& options, fs::path& plan_written) {
  const auto started = std::chrono::steady_clock::now();
  std::optional<ReportFile> plan_file_out;
  if (options.plan_out) {
    plan_file_out.emplace(*options.plan_out, std::vector<fs::path>{options.source, options.target}, "--plan-out");
  }
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
  // DST must not be receiving another conversion (a plan is for an empty DST
  // or one this conversion was started in).
  const ConversionIdentity identity = planned_identity(file, plan);
  out.check_identity(identity);
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
        existing = read_plan_file(plan_written);
      } catch (const Error&) {
      }
      if (!existing || existing->fingerprint != file.fingerprint) {
        fail(ErrorKind::Usage, "DST {} already holds another plan ({}); refusing to mix conversions",
             options.target.string(), plan_written.string());
      }
    } else {
      if (!out.open_for_writing(files_written(source.checkpoint))) {
        // Finished by another process since it was opened: nothing to plan.
        answer_finished(report, out, source.checkpoint, options.window, options.overspan);
        report.seconds = seconds_since(started);
        return report;
      }
      out.claim_identity(identity);
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
  if (!loaded) return plan_gone(options, started, false);
  Destination out(loaded->source, loaded->target, true);
  Report report = start_report("convert", loaded->file.window, loaded->source, &loaded->target);
  const SourceCheckpoint source = open_source_checkpoint(loaded->source, options.threads, IndexNames::Drop);  // shards need no index names
  add_source_counts(report, source);
  const Plan plan = planned(source, loaded->file);
  const std::vector<std::uint64_t> hashes = plan_hashes(loaded->file);
  const auto answer = [&] {
    answer_finished(report, out, source.checkpoint, loaded->file.window, loaded->file.overspan, &hashes);
    report.seconds = seconds_since(started);
    return report;
  };
  if (out.state() == DestinationState::Finished) return answer();
  const std::vector<std::size_t> shards = selected_shards(selection, source.checkpoint.shards.size());
  if (shards.empty()) {  // --shards I/N with I beyond the plan's shards: nothing here, nothing written
    report.shards = 0;
    report.seconds = seconds_since(started);
    progress.done();
    return report;
  }
  // Everything this step writes is checked before it writes: DST receives
  // this conversion, the rows of the modules it writes are SRC's, and
  // --copy reflink can share.
  const ConversionIdentity identity = planned_identity(loaded->file, plan);
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
  report.copy_mode = std::string(copy_mode_name(options.copy));
  CopyEngine engine(options.copy);
  const std::vector<ShardRecord> records =
      execute_shards(source, plan, out, shards, true, options.threads, report.resumed_shards, &engine, &progress);
  out.sync_directories();  // this step's shards are durable before it reports them done
  add_shard_counts(report, records);
  report.seconds = seconds_since(started);
  progress.done();
  return report;
}

Report finalize_planned(const PlannedOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  ProgressTracker progress("convert", "shards", options.progress);
  progress.phase(ProgressPhase::Plan);
  const auto loaded = load_plan(options);
  if (!loaded) return plan_gone(options, started, true);
  Destination out(loaded->source, loaded->target, true);
  Report report = start_report("convert", loaded->file.window, loaded->source, &loaded->target);
  const SourceCheckpoint source = open_source_checkpoint(loaded->source, options.threads, IndexNames::KeepIfSmall);
  const Checkpoint& ck = source.checkpoint;
  add_source_counts(report, source);
  const Plan plan = planned(source, loaded->file);
  const std::vector<std::uint64_t> hashes = plan_hashes(loaded->file);
  const auto answer = [&] {
    if (answer_finished(report, out, ck, loaded->file.window, loaded->file.overspan, &hashes)) out.tidy_finished();
    report.seconds = seconds_since(started);
    return report;
  };
  if (out.state() == DestinationState::Finished) return answer();
  const ConversionIdentity identity = planned_identity(loaded->file, plan);
  out.check_identity(identity);
  if (options.copy == CopyMode::Reflink && !ck.shards.empty()) out.require_sharing(*ck.files->open(0));
  progress.phase(ProgressPhase::Finalize);
  if (!out.open_for_writing(files_written(ck))) return answer();
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

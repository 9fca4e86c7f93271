#include "convert/plan_command.hpp"

#include "checkpoint/reader.hpp"
#include "checkpoint/argument_check.hpp"
#include "common/error.hpp"
#include "common/stopwatch.hpp"
#include "checkpoint/source_fields.hpp"
#include "convert/steps.hpp"
#include "destination/destination.hpp"
#include "plan/plan_file.hpp"
#include "plan/target_layout.hpp"
#include "output/report_file.hpp"
#include "scan/overspan_values.hpp"

#include <chrono>

namespace mx2nv {

PlanFile read_plan_file(const fs::path& path) {
  const File f = File::open_read(path);
  return plan_file_from_source(FileSource(f), f.size(), path.string());
}
namespace {

PlanFile make_plan_file(const SourceCheckpoint& source, const Plan& plan, const fs::path& src, const fs::path& dst) {
  PlanFile f;
  f.kind = plan.kind;
  f.tool_version = MX2NV_VERSION;
  f.window = plan.window;
  f.over_span_choice = plan.over_span_choice;
  // The paths' bytes, exactly: a step opens them as they are.
  f.source = fs::absolute(src).lexically_normal().string();
  f.target = fs::absolute(dst).lexically_normal().string();
  const Checkpoint& ck = source.checkpoint;
  for (std::size_t s = 0; s < ck.shards.size(); ++s) {
    const OpenShard in = ck.read_shard(s);
    const TargetLayout layout = make_target_layout(in.header, s, source.modules, plan);
    const ShardRecord r = expected_record(source, plan, in, layout);
    f.shards.push_back({r.shard, r.source_size, r.source_mtime_ns, r.source_header_hash, r.plan_hash,
                        layout.data_size, layout.tensors.size()});
  }
  for (const auto& m : source.modules.modules) f.module_names.emplace_back(m.name);
  f.modules = plan.modules;
  f.format = plan.format;
  return f;
}

}  // namespace

Report plan_checkpoint(const PlanOptions& options, fs::path& plan_written) {
  const auto started = std::chrono::steady_clock::now();
  check_source_argument({Command::Plan, options.source, options.target});
  check_new_destination({Command::Plan, options.source, options.target});
  std::optional<ReportFile> plan_file_out;
  if (options.plan_out) {
    plan_file_out.emplace(*options.plan_out, std::vector<fs::path>{options.source, options.target}, "--plan-out");
  }
  Destination out(options.source, options.target, true);
  Report report = start_report(Command::Plan, options.window, options.source, options.target);
  // The plan names no index entry: the index's names go once it is checked.
  const SourceCheckpoint source = open_source_checkpoint(options.source, options.threads, IndexNames::Drop);
  add_source_counts(report, source);
  const PlanKind kind = options.requantize ? PlanKind::Requantize : PlanKind::Convert;
  std::optional<Plan> planned_here;
  if (kind == PlanKind::Convert) {
    planned_here = plan_step(report, out, source, options.window, options.threads, options.over_span_choice,
                             options.format);
  } else if (!answer_finished(report, out, source.checkpoint, options.window, options.over_span_choice, nullptr, kind,
                              options.format)) {
    planned_here = requantize_plan(source, options.threads, options.format);
  }
  if (!planned_here) {
    report.seconds = seconds_since(started);
    return report;
  }
  const Plan& plan = *planned_here;
  PlanFile file = make_plan_file(source, plan, options.source, options.target);
  // DST must not be receiving another conversion (a plan is for an empty DST
  // or one this conversion was started in).
  const ConversionIdentity identity = conversion_identity(file, plan);
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
      if (!out.open_for_writing(files_written(source.checkpoint, options.format))) {
        // Finished by another process since it was opened: nothing to plan.
        answer_finished(report, out, source.checkpoint, options.window, options.over_span_choice, nullptr, kind,
                        options.format);
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

}  // namespace mx2nv

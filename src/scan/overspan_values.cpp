#include "scan/overspan_values.hpp"

#include "common/cancel.hpp"
#include "common/error.hpp"
#include "common/printable.hpp"
#include "common/parallel.hpp"
#include "scan/requantizer.hpp"

#include <algorithm>
#include <cmath>
#include <memory>

namespace mx2nv {

void apply_overspan(const SourceCheckpoint& source, Plan& plan, OverSpanChoice choice, unsigned threads) {
  const ModuleSet& set = source.modules;
  plan.over_span_choice = choice;
  if (choice == OverSpanChoice::Fail || !plan.refused()) return;
  // The layout's quantizer's second-level scale for each refused group, read
  // before the plan changes.
  const std::vector<std::size_t> groups = refused_scale_groups(set, plan);
  std::vector<float> globals(set.scale_groups.size(), 1.0f);
  if (choice == OverSpanChoice::Requantize) {
    const Recipe recipe = recipe_of(plan.format);
    parallel_for(groups.size(), threads, [&](std::size_t g) {
      globals[groups[g]] = second_level_for(recipe, scale_group_amax(source, groups[g])).stored;
    });
    throw_if_stopped();
  }
  resolve_over_span(set, plan, choice, [&](std::size_t sg) { return globals[sg]; });
  if (choice == OverSpanChoice::Bf16) {
    // Every value of every BF16 module must be representable: refuse before writing.
    std::vector<std::size_t> bf16_groups;
    for (std::size_t sg = 0; sg < set.scale_groups.size(); ++sg) {
      if (plan.modules[set.scale_groups[sg][0]].treatment == Treatment::Bf16) bf16_groups.push_back(sg);
    }
    parallel_for(bf16_groups.size(), threads, [&](std::size_t g) { scale_group_amax(source, bf16_groups[g]); });
    throw_if_stopped();
  }
}

Plan requantize_plan(const SourceCheckpoint& source, unsigned threads, TargetFormat format) {
  const ModuleSet& set = source.modules;
  Plan plan;
  plan.kind = PlanKind::Requantize;
  plan.format = format;
  plan.modules.resize(set.modules.size());
  // The writer reads every shard again, front to back.
  const std::unique_ptr<ShardFiles> sparse_reads = source.checkpoint.files->pool_for(CacheUse::Passing);
  parallel_for(set.scale_groups.size(), threads, [&](std::size_t sg) {
    const float amax = scale_group_amax(source, sg, *sparse_reads);
    const float stored = second_level_for(recipe_of(format), amax).stored;
    if (!std::isnormal(stored)) {
      fail_input("{}: its largest |value| {} gives ModelOpt's weight_scale_2 = amax / 2688 = {}, no normal float "
                 "(runtimes flush it to zero); it cannot be requantized in the {} layout",
                 printable(scale_group_name(set, sg)), amax, stored, choice_name(format));
    }
    for (const std::size_t i : set.scale_groups[sg]) {
      plan.modules[i].treatment = Treatment::Requantized;
      plan.modules[i].divisor = stored;
    }
  });
  throw_if_stopped();
  return plan;
}

std::vector<ModuleError> measure_requantized(const SourceCheckpoint& source, const Plan& plan, unsigned threads) {
  const ModuleSet& set = source.modules;
  std::vector<std::size_t> modules;
  for (std::size_t i = 0; i < set.modules.size(); ++i) {
    if (plan.modules[i].treatment == Treatment::Requantized) modules.push_back(i);
  }
  std::vector<ModuleError> rows(modules.size());
  const TensorEmit discard = [](std::uint64_t, std::span<const std::byte>) { throw_if_stopped(); };
  parallel_for(modules.size(), threads, [&](std::size_t r) {
    const std::size_t i = modules[r];
    ErrorStats stats;
    stream_requantized_packed(source, i, requantized_level(plan.format, plan.modules[i]), discard, stats);
    rows[r] = {std::string(set.modules[i].name), plan.modules[i].divisor, stats.values, stats.relative_rmse(), stats.cosine(),
               stats.max_abs, stats.marlin_zeroed_blocks};
  });
  return rows;  // module indices ascend, and modules are sorted by name
}

void add_overspan_report(Report& report, const SourceCheckpoint& source, const Plan& plan, unsigned threads) {
  report.over_span_choice = plan.over_span_choice;
  report.requantized = measure_requantized(source, plan, threads);
  report.requantized_marlin_zeroed_blocks = 0;
  for (const auto& m : report.requantized) report.requantized_marlin_zeroed_blocks += m.marlin_zeroed_blocks;
  report.bf16_layers = bf16_layers(source.modules, plan);
  report.resolved_spans = plan.resolved_spans;
}

}  // namespace mx2nv

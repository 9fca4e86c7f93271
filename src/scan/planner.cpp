#include "scan/planner.hpp"

#include "common/cancel.hpp"
#include "common/error.hpp"
#include "common/parallel.hpp"
#include "common/printable.hpp"
#include "model/module_names.hpp"
#include "model/scale_scan.hpp"
#include "plan/overspan.hpp"
#include "scan/overspan_values.hpp"
#include "scan/requantizer.hpp"
#include "sys/batched_io.hpp"

#include <algorithm>
#include <bit>
#include <set>
#include <atomic>
#include <cstring>
#include <optional>
#include <span>
#include <tuple>
#include <vector>

namespace mx2nv {
namespace {

// Module m's tensors, read through `packed` and `scale` (the same source
// when both are in one shard).
ModuleLocation module_location(const SourceCheckpoint& source, const QuantModule& m, const ByteSource* packed,
                               const ByteSource* scale) {
  return {packed, source.checkpoint.shards[m.packed_shard].data_start + m.packed.begin, scale,
          source.checkpoint.shards[m.scale_shard].data_start + m.scale.begin,
          source.checkpoint.shards[m.scale_shard].file};
}

// Where a module's packed and scale bytes are; holds the two shard files
// (from a bounded pool of the checkpoint's files, ShardFiles::pool_for) as
// long as the scanner using it.
class ModuleSources {
 public:
  ModuleSources(const SourceCheckpoint& source, const ShardFiles& files, const QuantModule& m)
      : packed_file_(files.open(m.packed_shard)),
        scale_file_(files.open(m.scale_shard)),
        packed_(*packed_file_),
        scale_(*scale_file_),
        location_(module_location(source, m, &packed_,
                                  m.packed_shard == m.scale_shard ? static_cast<const ByteSource*>(&packed_)
                                                                  : &scale_)) {}
  ModuleSources(const ModuleSources&) = delete;
  ModuleSources& operator=(const ModuleSources&) = delete;
  const ModuleLocation& location() const { return location_; }

 private:
  std::shared_ptr<const File> packed_file_;
  std::shared_ptr<const File> scale_file_;
  FileSource packed_;
  FileSource scale_;
  ModuleLocation location_;
};

// The scan visits modules in file order, a run of them per task. In a run,
// the small modules of one shard (each read whole, model/scale_scan.hpp) are
// read ahead through one BatchedReader, so a checkpoint of many small
// modules costs a system call per window instead of one per module. Large
// modules read as before.
constexpr std::size_t kModulesPerTask = 256;
constexpr std::uint64_t kScaleBytesPerTask = 1 << 20;

// A small module's bytes, read ahead: reads inside them are served from
// memory, anything else (never expected) from the file.
class PrefetchedSource final : public ByteSource {
 public:
  PrefetchedSource(const ByteSource& file, std::uint64_t base, std::span<const std::byte> bytes)
      : file_(file), base_(base), bytes_(bytes) {}
  void read_at(std::uint64_t offset, std::span<std::byte> out) const override {
    if (offset >= base_ && offset - base_ <= bytes_.size() && out.size() <= bytes_.size() - (offset - base_)) {
      std::memcpy(out.data(), bytes_.data() + (offset - base_), out.size());
      return;
    }
    file_.read_at(offset, out);
  }

 private:
  const ByteSource& file_;
  std::uint64_t base_;
  std::span<const std::byte> bytes_;
};

struct ScanTally {
  std::atomic<std::uint64_t> probes{0};
  std::atomic<std::uint64_t> full{0};
  std::atomic<std::uint64_t> kept{0};  // histogram bytes kept, against the budget
  std::uint64_t budget = kKeptHistogramBytes;
};

void scan_one(const QuantModule& m, const ModuleLocation& where, ModuleFacts& f, ScanTally& tally) {
  ModuleScanner scanner(m, where);
  scanner.read_histogram();
  f.k_max = scanner.active_k_max();
  if (f.k_max) f.k_min = scanner.active_k_min();
  SparseHistogram sparse = to_sparse(scanner.histogram());
  const std::uint64_t bytes = sizeof(SparseHistogram) + sparse.size() * (sizeof(std::uint64_t) + 1);
  if (tally.kept.fetch_add(bytes) + bytes <= tally.budget) {
    f.histogram = std::move(sparse);
  } else {
    f.histogram_kept = false;
  }
  tally.probes += scanner.probes();
  tally.full += scanner.classified_fully() ? 1 : 0;
}

// Scans modules order[first, last): runs of small modules in one shard
// share a BatchedReader.
void scan_run(const SourceCheckpoint& source, const ShardFiles& files, std::span<const std::size_t> run,
              ScanResult& result, ScanTally& tally) {
  const auto& modules = source.modules.modules;
  const auto span_of = [&](const QuantModule& m) -> std::optional<ModuleSpan> {
    if (m.packed_shard != m.scale_shard) return std::nullopt;
    const std::uint64_t data_start = source.checkpoint.shards[m.packed_shard].data_start;
    return small_module_span(m, data_start + m.packed.begin, data_start + m.scale.begin);
  };
  for (std::size_t j = 0; j < run.size();) {
    const QuantModule& first = modules[run[j]];
    // The run of small modules in this shard from here, read ahead together.
    std::vector<ByteRange> ranges;
    for (std::size_t k = j; k < run.size() && modules[run[k]].packed_shard == first.packed_shard; ++k) {
      const auto span = span_of(modules[run[k]]);
      if (!span) break;
      ranges.push_back({span->begin, span->end - span->begin});
    }
    if (ranges.empty()) {  // a large module, or one split across shards
      const ModuleSources sources(source, files, first);
      scan_one(first, sources.location(), result.facts[run[j]], tally);
      ++j;
      continue;
    }
    const std::shared_ptr<const File> file = files.open(first.packed_shard);
    const FileSource direct(*file);
    BatchedReader reader(*file, ranges);
    for (std::size_t r = 0; r < ranges.size(); ++r, ++j) {
      const PrefetchedSource bytes(direct, ranges[r].offset, reader.next());
      scan_one(modules[run[j]], module_location(source, modules[run[j]], &bytes, &bytes), result.facts[run[j]],
               tally);
    }
  }
}

}  // namespace

ScanResult scan_modules(const SourceCheckpoint& source, unsigned threads, std::uint64_t histogram_budget,
                        const std::vector<bool>* only, CacheUse cache) {
  const auto& modules = source.modules.modules;
  ScanResult result;
  result.facts.resize(modules.size());
  std::vector<std::size_t> order = modules_in_file_order(source.modules);
  if (only) std::erase_if(order, [&](std::size_t i) { return !(*only)[i]; });
  // Runs of up to kModulesPerTask modules and kScaleBytesPerTask of scales:
  // small modules are batched, and a model of a few hundred large modules
  // still spreads over every worker.
  std::vector<std::size_t> starts{0};
  std::uint64_t scale_bytes = 0;
  for (std::size_t k = 0; k < order.size(); ++k) {
    scale_bytes += modules[order[k]].group_count();
    if (k + 1 - starts.back() == kModulesPerTask || scale_bytes >= kScaleBytesPerTask) {
      starts.push_back(k + 1);
      scale_bytes = 0;
    }
  }
  if (starts.back() != order.size()) starts.push_back(order.size());
  ScanTally tally;
  tally.budget = histogram_budget;
  const std::unique_ptr<ShardFiles> files = source.checkpoint.files->pool_for(cache);
  parallel_for(starts.size() - 1, threads, [&](std::size_t task) {
    scan_run(source, *files, std::span(order).subspan(starts[task], starts[task + 1] - starts[task]), result,
             tally);
  });
  result.probes = tally.probes;
  result.fully_classified = tally.full;
  return result;
}

Plan plan_conversion(const SourceCheckpoint& source, const ScanResult& scan, Window window, TargetFormat format) {
  // Rare re-reads (histograms beyond the scan's budget): nothing to keep.
  const std::unique_ptr<ShardFiles> files = source.checkpoint.files->pool_for(CacheUse::Passing);
  const auto count_active = [&](std::size_t i, int k_lo, int k_hi) {
    const QuantModule& m = source.modules.modules[i];
    const ModuleSources sources(source, *files, m);
    ModuleScanner scanner(m, sources.location());
    if (scan.facts[i].histogram_kept) {
      scanner.use_histogram(to_dense(scan.facts[i].histogram));
    } else {
      scanner.read_histogram();
    }
    return scanner.count_active(k_lo, k_hi);
  };
  const auto read_histogram = [&](std::size_t i) {
    const QuantModule& m = source.modules.modules[i];
    const ModuleSources sources(source, *files, m);
    ModuleScanner scanner(m, sources.location());
    scanner.read_histogram();
    return to_sparse(scanner.histogram());
  };
  Plan plan = make_plan(source.modules, scan.facts, window, count_active, read_histogram);
  plan.format = format;
  if (format == TargetFormat::ModelOpt) refuse_subnormal_multipliers(source.modules, plan);
  return plan;
}

namespace {

bool same_row(const ModulePlan& a, const ModulePlan& b) {
  return a.treatment == b.treatment && a.m == b.m &&
         std::bit_cast<std::uint32_t>(a.divisor) == std::bit_cast<std::uint32_t>(b.divisor) &&
         a.zero_scales == b.zero_scales && a.span == b.span && a.groups_outside == b.groups_outside &&
         a.canonical_zero_groups == b.canonical_zero_groups && a.marlin_zeroed_groups == b.marlin_zeroed_groups;
}

std::string describe_row(const ModulePlan& p) {
  return fmt::format("treatment {}, m {}, global divisor {}, zero scales {}, span {}, {} groups outside, {} zero "
                     "groups canonicalised, {} Marlin-zeroed",
                     static_cast<int>(p.treatment), p.m, p.divisor, p.zero_scales, p.span, p.groups_outside,
                     p.canonical_zero_groups, p.marlin_zeroed_groups);
}

}  // namespace

namespace {

// A requantize plan's rows: each written module's second-level scale is the
// one its layout's quantizer gives its scale group, read again from SRC.
void check_requantized_rows(const SourceCheckpoint& source, const Plan& plan, const std::vector<std::size_t>& written,
                            unsigned threads) {
  const ModuleSet& set = source.modules;
  std::vector<std::size_t> groups;
  for (const std::size_t i : written) groups.push_back(set.modules[i].scale_group);
  std::sort(groups.begin(), groups.end());
  groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
  std::vector<float> globals(groups.size());
  const Recipe recipe = recipe_of(plan.format);
  parallel_for(groups.size(), threads,
               [&](std::size_t g) { globals[g] = second_level_for(recipe, scale_group_amax(source, groups[g])).stored; });
  throw_if_stopped();
  for (std::size_t g = 0; g < groups.size(); ++g) {
    for (const std::size_t i : set.scale_groups[groups[g]]) {
      const ModulePlan& have = plan.modules[i];
      if (have.treatment != Treatment::Requantized ||
          std::bit_cast<std::uint32_t>(have.divisor) != std::bit_cast<std::uint32_t>(globals[g])) {
        fail_input("the requantize plan's row for module {} ({}) is not what SRC gives (global {}); the plan was "
                   "edited, or SRC's data changed since it was planned: run mx2nv plan --requantize again",
                   printable(set.modules[i].name), describe_row(have), globals[g]);
      }
    }
  }
}

}  // namespace

void check_planned_rows(const SourceCheckpoint& source, const Plan& plan, const std::vector<std::size_t>& shards,
                        unsigned threads) {
  const ModuleSet& set = source.modules;
  std::vector<bool> selected(source.checkpoint.shards.size(), false);
  for (const std::size_t s : shards) selected[s] = true;
  std::vector<std::size_t> written;
  for (std::size_t i = 0; i < set.modules.size(); ++i) {
    if (selected[set.modules[i].packed_shard] || selected[set.modules[i].scale_shard]) written.push_back(i);
  }
  if (written.empty()) return;
  if (plan.kind == PlanKind::Requantize) return check_requantized_rows(source, plan, written, threads);
  // What decides the written modules' rows: their scale groups, and under
  // --overspan bf16 every scale group of their MoE layers.
  std::vector<bool> scan(set.modules.size(), false);
  const auto add_group = [&](std::size_t sg) {
    for (const std::size_t i : set.scale_groups[sg]) scan[i] = true;
  };
  for (const std::size_t i : written) add_group(set.modules[i].scale_group);
  if (plan.over_span_choice == OverSpanChoice::Bf16) {
    std::set<std::string_view> layers;  // views into the modules' names
    for (const std::size_t i : written) layers.insert(moe_layer_of(set.modules[i].name));
    for (std::size_t i = 0; i < set.modules.size(); ++i) {
      if (!scan[i] && layers.contains(moe_layer_of(set.modules[i].name))) add_group(set.modules[i].scale_group);
    }
  }
  Plan derived =
      plan_conversion(source, scan_modules(source, threads, kKeptHistogramBytes, &scan), plan.window, plan.format);
  apply_overspan(source, derived, plan.over_span_choice, threads);
  for (const std::size_t i : written) {
    const ModulePlan& want = derived.modules[i];
    const ModulePlan& have = plan.modules[i];
    if (!same_row(want, have)) {
      fail_input("the plan's row for module {} ({}) is not what SRC gives under window {} with --overspan {} ({}); "
                 "the plan was edited, or SRC's data changed since it was planned: run mx2nv plan again",
                 printable(set.modules[i].name), describe_row(have), window_name(plan.window),
                 choice_name(plan.over_span_choice), describe_row(want));
    }
  }
  if (derived.refused()) {
    // Only modules outside the written ones can be left (the rows above
    // matched): refused by SRC, planned as convertible.
    const std::string what = !derived.refused_spans.empty() ? derived.refused_spans.front().module
                                                        : bad_global_name(set, derived.bad_globals.front());
    fail_input("SRC's {} is refused under window {} with --overspan {}, but the plan converts it; the plan was edited, "
               "or SRC's data changed since it was planned: run mx2nv plan again",
               printable(what), window_name(plan.window), choice_name(plan.over_span_choice));
  }
}

}  // namespace mx2nv

#include "io/planner.hpp"

#include "core/scale_scan.hpp"
#include "io/parallel.hpp"

#include <atomic>

namespace mx2nv {
namespace {

// Where a module's packed and scale bytes are; holds the two shard files
// (from the checkpoint's bounded pool) as long as the scanner using it.
class ModuleSources {
 public:
  ModuleSources(const SourceCheckpoint& source, const QuantModule& m)
      : packed_file_(source.checkpoint.files->open(m.packed_shard)),
        scale_file_(source.checkpoint.files->open(m.scale_shard)),
        packed_(*packed_file_),
        scale_(*scale_file_),
        location_{&packed_, source.checkpoint.shards[m.packed_shard].data_start + m.packed.begin, &scale_,
                  source.checkpoint.shards[m.scale_shard].data_start + m.scale.begin,
                  source.checkpoint.shards[m.scale_shard].file} {}
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

}  // namespace

ScanResult scan_modules(const SourceCheckpoint& source, unsigned threads) {
  const auto& modules = source.modules.modules;
  ScanResult result;
  result.facts.resize(modules.size());
  std::atomic<std::uint64_t> probes{0}, full{0};
  parallel_for(modules.size(), threads, [&](std::size_t i) {
    const ModuleSources sources(source, modules[i]);
    ModuleScanner scanner(modules[i], sources.location());
    scanner.read_histogram();
    ModuleFacts& f = result.facts[i];
    f.k_max = scanner.active_k_max();
    if (f.k_max) f.k_min = scanner.active_k_min();
    f.histogram = to_sparse(scanner.histogram());
    probes += scanner.probes();
    full += scanner.classified_fully() ? 1 : 0;
  });
  result.probes = probes;
  result.fully_classified = full;
  return result;
}

Plan plan_conversion(const SourceCheckpoint& source, const ScanResult& scan, Window window) {
  const auto count_active = [&](std::size_t i, int k_lo, int k_hi) {
    const QuantModule& m = source.modules.modules[i];
    const ModuleSources sources(source, m);
    ModuleScanner scanner(m, sources.location());
    scanner.use_histogram(to_dense(scan.facts[i].histogram));
    return scanner.count_active(k_lo, k_hi);
  };
  return make_plan(source.modules, scan.facts, window, count_active);
}

}  // namespace mx2nv

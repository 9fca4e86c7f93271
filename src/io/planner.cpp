#include "io/planner.hpp"

#include "core/scale_scan.hpp"
#include "io/parallel.hpp"

#include <atomic>

namespace mx2nv {
namespace {

struct Sources {
  FileSource packed;
  FileSource scale;
  ModuleLocation location;
};

Sources locate(const SourceCheckpoint& source, const QuantModule& m) {
  const OpenShard& ps = source.checkpoint.shards[m.packed_shard];
  const OpenShard& ss = source.checkpoint.shards[m.scale_shard];
  Sources s{FileSource(ps.handle), FileSource(ss.handle), {}};
  s.location = {nullptr, ps.header.data_start() + m.packed.begin, nullptr, ss.header.data_start() + m.scale.begin,
                ss.file};
  return s;
}

}  // namespace

ScanResult scan_modules(const SourceCheckpoint& source, unsigned threads) {
  const auto& modules = source.modules.modules;
  ScanResult result;
  result.facts.resize(modules.size());
  std::atomic<std::uint64_t> probes{0}, full{0};
  parallel_for(modules.size(), threads, [&](std::size_t i) {
    Sources s = locate(source, modules[i]);
    s.location.packed = &s.packed;
    s.location.scale = &s.scale;
    ModuleScanner scanner(modules[i], s.location);
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
    Sources s = locate(source, m);
    s.location.packed = &s.packed;
    s.location.scale = &s.scale;
    ModuleScanner scanner(m, s.location);
    scanner.use_histogram(to_dense(scan.facts[i].histogram));
    return scanner.count_active(k_lo, k_hi);
  };
  return make_plan(source.modules, scan.facts, window, count_active);
}

}  // namespace mx2nv

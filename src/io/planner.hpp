// Plan step of a conversion, over files: scan every module's scales (in
// parallel), then decide globals and refusals with the core planner.
#pragma once

#include "core/numerics.hpp"
#include "core/plan.hpp"
#include "io/checkpoint_reader.hpp"

#include <vector>

namespace mx2nv {

// Bytes of scale histograms a scan keeps for planning; beyond it, the plan
// reads a module's scales again (never at K3's structure: ~25 bytes a module
// there; a real checkpoint uses a few dozen exponents, 9 bytes each).
inline constexpr std::uint64_t kKeptHistogramBytes = 48ull << 20;

struct ScanResult {
  std::vector<ModuleFacts> facts;  // parallel to modules
  std::uint64_t probes = 0;        // packed groups read to decide activity
  std::uint64_t fully_classified = 0;  // modules whose packed bytes were read in full
};

// `histogram_budget`: bytes of histograms kept (tests force it down).
ScanResult scan_modules(const SourceCheckpoint& source, unsigned threads,
                        std::uint64_t histogram_budget = kKeptHistogramBytes);

Plan plan_conversion(const SourceCheckpoint& source, const ScanResult& scan, Window window);

}  // namespace mx2nv

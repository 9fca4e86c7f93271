// Plan step of a conversion, over files: scan every module's scales (in
// parallel), then decide globals and refusals with the core planner.
#pragma once

#include "core/numerics.hpp"
#include "core/plan.hpp"
#include "io/checkpoint_reader.hpp"

#include <vector>

namespace mx2nv {

struct ScanResult {
  std::vector<ModuleFacts> facts;  // parallel to modules
  std::uint64_t probes = 0;        // packed groups read to decide activity
  std::uint64_t fully_classified = 0;  // modules whose packed bytes were read in full
};

ScanResult scan_modules(const SourceCheckpoint& source, unsigned threads);

Plan plan_conversion(const SourceCheckpoint& source, const ScanResult& scan, Window window);

}  // namespace mx2nv

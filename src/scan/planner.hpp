// Plan step of a conversion, over files: scan every module's scales (in
// parallel), then decide globals and refusals with the core planner.
#pragma once

#include "checkpoint/reader.hpp"
#include "numerics/formats.hpp"
#include "plan/plan.hpp"

#include <vector>

namespace mx2nv {

// Bytes of scale histograms a scan keeps for planning; beyond it, the plan
// reads a module's scales again. A histogram takes 9 bytes per distinct
// exponent and a real module uses a few dozen, so a real checkpoint's stay
// within it; a hostile one (254 exponents per module) is read again.
inline constexpr std::uint64_t kKeptHistogramBytes = 48ull << 20;

struct ScanResult {
  std::vector<ModuleFacts> facts;  // parallel to modules
  std::uint64_t probes = 0;        // packed groups read to decide activity
  std::uint64_t fully_classified = 0;  // modules whose packed bytes were read in full
};

// `histogram_budget`: bytes of histograms kept (tests force it down).
// `only` (parallel to the modules): scan those alone; the facts of the others
// stay empty (no active group).
// The scan reads SRC's files anew with `cache` (sys/file.hpp): Passing
// unless the caller reads the same scales again next and nothing else of
// the shards (a conversion that shares the unchanged bytes: Random).
ScanResult scan_modules(const SourceCheckpoint& source, unsigned threads,
                        std::uint64_t histogram_budget = kKeptHistogramBytes, const std::vector<bool>* only = nullptr,
                        CacheUse cache = CacheUse::Passing);

// The plan of a conversion into `format` (make_plan; for ModelOpt's layout,
// with refuse_subnormal_multipliers).
Plan plan_conversion(const SourceCheckpoint& source, const ScanResult& scan, Window window,
                     TargetFormat format = TargetFormat::CompressedTensors);

// A plan from a file (`mx2nv plan`, read by a planned step) against SRC: the
// rows of every module whose tensors are in `shards` (the ones a step writes)
// are derived again from SRC, with the same scan and rules as mx2nv plan
// (plan_conversion, then apply_overspan with the plan's choice), restricted
// to those modules' scale groups, which decide a global together, and under
// --overspan bf16 to every scale group of their MoE layers, which decide
// BF16 together. Throws Error(InvalidInput) naming the first module whose
// planned row differs from SRC's, or which SRC refuses under the plan's
// window and choice: a step writes nothing `mx2nv plan` would not have
// planned, whatever the file says.
void check_planned_rows(const SourceCheckpoint& source, const Plan& plan, const std::vector<std::size_t>& shards,
                        unsigned threads);

}  // namespace mx2nv

// convert --overspan over files (the rules: plan/overspan.hpp). Reads the
// values the choice needs: the second-level scale the layout's quantizer
// gives each requantized scale group (from its absolute max), each requantized module's error against
// its MXFP4 values, and whether BF16 holds every value of a BF16 module.
#pragma once

#include "checkpoint/reader.hpp"
#include "plan/overspan.hpp"
#include "plan/plan.hpp"
#include "report/report.hpp"

#include <vector>

namespace mx2nv {

// Resolves a refused plan with `choice` (nothing to do for fail, or when the
// plan refuses nothing). Throws Error(InvalidInput) for a NaN scale or a value
// beyond float32 (which BF16 cannot hold either) in a module it rewrites.
void apply_overspan(const SourceCheckpoint& source, Plan& plan, OverSpanChoice choice, unsigned threads);

// `mx2nv requantize`'s plan (PlanKind::Requantize): every module Requantized
// under the second-level scale `format`'s quantizer gives its scale group
// (from the group's absolute max: a gate/up pair shares one), whatever the
// window. Throws Error(InvalidInput) for a NaN scale or a value beyond
// float32.
Plan requantize_plan(const SourceCheckpoint& source, unsigned threads,
                     TargetFormat format = TargetFormat::CompressedTensors);

// The report's error table: every requantized module of the plan, measured
// against its MXFP4 values (one streaming pass each), sorted by name.
std::vector<ModuleError> measure_requantized(const SourceCheckpoint& source, const Plan& plan, unsigned threads);

// Fills the report's over-span section from a resolved plan: the choice, the
// requantized modules' errors, the BF16 layers with why and their size cost.
void add_overspan_report(Report& report, const SourceCheckpoint& source, const Plan& plan, unsigned threads);

}  // namespace mx2nv

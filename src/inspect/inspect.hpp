// mx2nv inspect: a dry run from headers and scales (packed bytes are read
// only where a group's activity decides an answer; see scale_scan.hpp).
#pragma once

#include "gate/rules.hpp"
#include "numerics/formats.hpp"
#include "report/report.hpp"
#include "safetensors/name_table.hpp"
#include "sys/file.hpp"

namespace mx2nv {

struct ModuleSummary {
  std::string_view name;  // in Inspection::names
  std::uint64_t rows = 0, groups = 0;
  std::optional<int> k_max, k_min;  // over active groups
  int span = 0;                     // k_max of the scale group - this module's k_min
  bool pair = false;
};

struct WindowOutcome {
  Window window;
  bool refused = false;
  std::vector<OverSpan> over_span;
  std::vector<std::string> unrepresentable_globals;
  std::vector<GlobalConflict> global_conflicts;
  std::uint64_t raised_globals = 0;
  std::uint64_t canonicalised_zero_groups = 0;
  std::uint64_t marlin_zeroed_groups = 0;
};

struct Inspection {
  Report report;  // counts, bytes, provenance; result for the chosen window
  std::vector<ModuleSummary> modules;
  NameArena names;  // the modules' names (the source's module table, kept)
  std::vector<WindowOutcome> outcomes;  // marlin, e4m3
  std::uint64_t probes = 0;
  std::uint64_t fully_scanned_modules = 0;
  int max_span = 0;
  std::optional<MoeDims> moe_dims;  // routed-expert shape, for the TP feasibility table
  // When the selected window refuses: what convert --overspan bf16 and
  // requantize would do (the same layers, sizes and errors convert reports).
  struct OverSpanCost {
    std::vector<Bf16Layer> bf16_layers;
    std::int64_t bf16_size_change = 0;  // bytes, BF16 weights minus the NVFP4 tensors they replace
    std::vector<ModuleError> requantized;
    std::string bf16_refused, requantize_refused;  // why that choice would refuse too (empty: it converts)
  };
  std::optional<OverSpanCost> overspan;
};

Inspection inspect_checkpoint(const fs::path& source, Window window, unsigned threads);
Json inspection_to_json(const Inspection& inspection);

}  // namespace mx2nv

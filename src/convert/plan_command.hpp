// mx2nv plan: plan a conversion once (read every header and scale, decide
// every global, refuse here) and write the plan file that the per-shard steps
// of convert/planned.hpp run on other processes and machines.
#pragma once

#include "numerics/window.hpp"
#include "plan/overspan.hpp"
#include "plan/plan_file.hpp"
#include "report/report.hpp"
#include "sys/file.hpp"

#include <optional>

namespace mx2nv {

struct PlanOptions {
  fs::path source;
  fs::path target;
  Window window = Window::Marlin;
  unsigned threads = 1;
  std::optional<fs::path> plan_out;  // default: DST/.mx2nv/plan.json
  OverSpanChoice over_span_choice = OverSpanChoice::Fail;  // as convert --overspan; recorded in the plan
  // --requantize: plan `mx2nv requantize` (PlanKind::Requantize) instead of a
  // conversion; window and overspan stay at their defaults.
  bool requantize = false;
  TargetFormat format = TargetFormat::CompressedTensors;  // as convert --format; recorded in the plan
};
// Plans and writes the plan file. report.result is Refused (nothing written)
// when the window refuses a module.
Report plan_checkpoint(const PlanOptions& options, fs::path& plan_written);

// A plan file, streamed (plan/plan_file.hpp: no copy of the text, no DOM;
// the size capped before anything is read).
PlanFile read_plan_file(const fs::path& path);

}  // namespace mx2nv

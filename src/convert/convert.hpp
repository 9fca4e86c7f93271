// mx2nv convert: plan (headers + scales of every shard; decide every global;
// refuse early) -> execute (per shard, parallel) -> finalize (companions,
// config, index last). Returns the report; throws Error on failure, after
// removing everything it wrote to DST.
#pragma once

#include "common/progress.hpp"
#include "convert/plan_command.hpp"  // the rest of convert/'s face: mx2nv plan
#include "convert/planned.hpp"       // and the steps of a plan
#include "numerics/formats.hpp"
#include "plan/plan.hpp"
#include "report/report.hpp"
#include "sys/copy_engine.hpp"
#include "sys/file.hpp"

namespace mx2nv {

struct ConvertOptions {
  fs::path source;
  fs::path target;
  Window window = Window::Marlin;
  unsigned threads = 1;
  bool resume = false;  // continue an interrupted conversion into DST
  CopyMode copy = CopyMode::Auto;  // how unchanged bytes reach DST (--copy)
  OverSpanChoice over_span_choice = OverSpanChoice::Fail;  // scale groups the window refuses (--overspan)
  TargetFormat format = TargetFormat::CompressedTensors;   // the layout written (--format)
  ProgressCallback progress = {};  // optional; see common/progress.hpp (unit: shards, bytes: source tensor bytes)
};

Report convert_checkpoint(const ConvertOptions& options);

}  // namespace mx2nv

// mx2nv requantize: the lossy companion artifact. Every quantized module
// (the routed experts) is decoded from MXFP4 and quantized to NVFP4 the way
// the layout's own producer does it (scan/requantizer.hpp): compressed-
// tensors' NVFP4 quantization, or, with format ModelOpt, ModelOpt's dynamic
// NVFP4 weight quantizer; gate/up pairs share one second-level scale from
// the pair's absolute max. It runs through convert's steps
// (convert/steps.hpp) on a requantize plan (PlanKind::Requantize): the
// shards are written by convert's shard writer, in parallel and crash-safe,
// unchanged tensors go through the copy engine (--copy), --resume reuses
// finished shards, a finished DST is answered as already complete, and
// finalize writes companions, config and the index last. The same plan can
// run as planned steps (`mx2nv plan --requantize`, then convert --plan P
// --shards I/N and --finalize). The report carries a per-module error table
// (relative RMSE, cosine, max abs error against the MXFP4 values), measured
// as the modules are written (two passes over each module's packed bytes:
// amax, then quantize), and for shards reused by --resume in a pass of
// their own. Refuses only NaN scales and values beyond float32.
#pragma once

#include "model/target_format.hpp"
#include "report/report.hpp"
#include "sys/copy_engine.hpp"
#include "sys/file.hpp"

namespace mx2nv {

struct RequantizeOptions {
  fs::path source;
  fs::path target;
  unsigned threads = 1;
  bool resume = false;             // as convert --resume
  CopyMode copy = CopyMode::Auto;  // as convert --copy
  TargetFormat format = TargetFormat::CompressedTensors;  // as convert --format
};

Report requantize_checkpoint(const RequantizeOptions& options);

}  // namespace mx2nv

// mx2nv requantize: the lossy companion artifact. Every quantized module
// (the routed experts) is decoded from MXFP4 and quantized to NVFP4 the way
// compressed-tensors does it (requantize/requantizer.hpp), gate/up pairs
// sharing one global from the pair's absolute max; everything else is copied
// as convert copies it. Two passes over each module's packed bytes (amax,
// then quantize), streamed through fixed buffers, shards in parallel. The
// report carries a per-module error table (relative RMSE, cosine, max abs
// error against the MXFP4 values). Refuses only NaN scales and values beyond
// float32.
#pragma once

#include "report/report.hpp"
#include "sys/file.hpp"

namespace mx2nv {

struct RequantizeOptions {
  fs::path source;
  fs::path target;
  unsigned threads = 1;
};

Report requantize_checkpoint(const RequantizeOptions& options);

}  // namespace mx2nv

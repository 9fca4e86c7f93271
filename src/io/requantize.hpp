// mx2nv requantize: the lossy companion artifact. Every quantized module
// (the routed experts) is decoded from MXFP4 and quantized to NVFP4 the way
// compressed-tensors does it (src/core/requantize.hpp), gate/up pairs sharing
// one global from the pair's absolute max; everything else is copied as
// convert copies it. Two passes over each module's packed bytes (amax, then
// quantize), streamed through fixed buffers, shards in parallel. The report
// carries a per-module error table (relative RMSE, cosine, max abs error
// against the MXFP4 values). Refuses only NaN scales and values beyond float32.
#pragma once

#include "core/report.hpp"
#include "core/requantize.hpp"
#include "io/checkpoint_reader.hpp"

#include <functional>
#include <vector>

namespace mx2nv {

struct RequantizeOptions {
  fs::path source;
  fs::path target;
  unsigned threads = 1;
};

Report requantize_checkpoint(const RequantizeOptions& options);

// Building blocks, shared with the other paths that requantize (and verify):

// The largest |value| over a scale group's modules (a gate/up pair or one
// module), in float32. Throws Error(InvalidInput) naming module, row and
// group for a NaN scale or a value beyond float32.
float scale_group_amax(const SourceCheckpoint& source, std::size_t scale_group);

// Streams module `module` requantized under `global`: emit(offset, bytes) for
// the packed tensor (16 bytes per 32-group) or, with `scales`, for the
// F8_E4M3 weight_scale tensor (2 bytes per 32-group); offsets are relative to
// the tensor. Adds every value's error to `stats` (packed pass only).
using TensorEmit = std::function<void(std::uint64_t offset, std::span<const std::byte> bytes)>;
void stream_requantized_packed(const SourceCheckpoint& source, std::size_t module, float global, const TensorEmit& emit,
                               ErrorStats& stats);
void stream_requantized_scales(const SourceCheckpoint& source, std::size_t module, float global, const TensorEmit& emit);

}  // namespace mx2nv

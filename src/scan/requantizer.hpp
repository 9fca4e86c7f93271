// Requantizing a source checkpoint's modules from their decoded MXFP4 values,
// the way compressed-tensors' or ModelOpt's NVFP4 quantization does it
// (numerics/nvfp4_quantizer.hpp), streamed through fixed buffers: the
// building blocks of `mx2nv requantize`, `convert --overspan requantize|bf16`
// and of verify's check of such modules.
#pragma once

#include "checkpoint/reader.hpp"
#include "numerics/nvfp4_quantizer.hpp"

#include <functional>
#include <span>

namespace mx2nv {

// The largest |value| over a scale group's modules (a gate/up pair or one
// module), in float32. Throws Error(InvalidInput) naming module, row and
// group for a NaN scale or a value beyond float32.
// Where a group's scales bound what its packed bytes can raise the maximum
// to, those bytes are not read: mostly only the scales and a few groups are.
float scale_group_amax(const SourceCheckpoint& source, std::size_t scale_group);
// The same, reading the scales and single groups through `sparse_reads`
// (ShardFiles::pool_for(CacheUse::Passing) leaves no islands in the page
// cache for a later stream over the shards to meet); modules read whole go
// through the checkpoint's own pool.
float scale_group_amax(const SourceCheckpoint& source, std::size_t scale_group, const ShardFiles& sparse_reads);

// Streams module `module` requantized under `level`: emit(offset, bytes) for
// the packed tensor (16 bytes per 32-group) or, with `scales`, for the
// F8_E4M3 weight_scale tensor (2 bytes per 32-group); offsets are relative to
// the tensor. Adds every value's error to `stats` (packed pass only).
using TensorEmit = std::function<void(std::uint64_t offset, std::span<const std::byte> bytes)>;
void stream_requantized_packed(const SourceCheckpoint& source, std::size_t module, SecondLevel level,
                               const TensorEmit& emit, ErrorStats& stats);
void stream_requantized_scales(const SourceCheckpoint& source, std::size_t module, SecondLevel level,
                               const TensorEmit& emit);
// Both in one pass over the module's source bytes: the same bytes to each
// emit (interleaved a chunk at a time), the same stats.
void stream_requantized(const SourceCheckpoint& source, std::size_t module, SecondLevel level,
                        const TensorEmit& emit_packed, const TensorEmit& emit_scales, ErrorStats& stats);

// Streams module `module` decoded into its BF16 `weight` [N, K] (2 bytes per
// value, row-major; exact, -0 kept). Throws Error(InvalidInput) for a NaN
// scale or a value BF16 cannot hold (|v| >= 2^128, scale bytes 253-254).
void stream_bf16_weight(const SourceCheckpoint& source, std::size_t module, const TensorEmit& emit);

// verify: compares DST's packed and scale bytes of `module` with the
// documented recomputation under `level`. read(tensor_offset, out) reads DST.
struct RequantizedCheck {
  std::uint64_t packed_bytes_differing = 0;
  std::uint64_t scale_bytes_differing = 0;
  ErrorStats error;  // of the recomputed (hence, when equal, DST's) values against SRC's
};
using TensorRead = std::function<void(std::uint64_t offset, std::span<std::byte> out)>;
RequantizedCheck check_requantized(const SourceCheckpoint& source, std::size_t module, SecondLevel level,
                                   const TensorRead& read_packed, const TensorRead& read_scales);
// verify: the number of BF16 values of `module` in DST that differ from SRC's
// decoded values (bit for bit, -0 included). read(tensor_offset, out) reads DST.
std::uint64_t count_bf16_differences(const SourceCheckpoint& source, std::size_t module, const TensorRead& read_weight);

}  // namespace mx2nv

// One module's figures (compare/compare.hpp CompareSums): SRC's and OTHER's
// values decoded chunk by chunk from their bit fields and compared in IEEE
// binary64, as compare_oracle.compare_module defines them.
#pragma once

#include "checkpoint/reader.hpp"
#include "compare/compare.hpp"
#include "compare/other_tree.hpp"
#include "sys/ordered_reads.hpp"

#include <cstddef>
#include <vector>

namespace mx2nv {

// Checks OTHER's tensors of a matched module against SRC's shape: dtypes,
// shapes, and for a quantized module the presence of the scale and global.
// Throws Error(InvalidInput) naming the tensor.
void check_other_module(const QuantModule& src, const OtherModule& other, OtherFormat format);

// A worker's read buffers, kept from one module to the next.
struct CompareBuffers {
  ReadBuffer a_packed, a_scale, b_weight, b_scale;
  ReadOrder::Place place;
};

// Streams both modules (checked first) and fills `out`'s sums, global and
// input scale, reading in chunks sized for `workers` running at once
// (stream_chunk_bytes), the first chunk in `turn` (sys/ordered_reads.hpp). A
// NaN SRC scale, a NaN OTHER block scale, a global that is not finite and
// positive, or a non-finite unquantized value is invalid input.
void compare_module_values(const Checkpoint& src, const QuantModule& m, const OtherTree& other,
                           const OtherModule& om, unsigned workers, CompareBuffers& buffers, ReadOrder::Turn& turn,
                           ModuleComparison& out);

}  // namespace mx2nv

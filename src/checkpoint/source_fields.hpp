// The one place a report's fields that SRC alone decides are filled: every
// command that opens a source checkpoint (convert, the planned steps, plan,
// verify, inspect, requantize) reports the same figures for it.
#pragma once

#include "checkpoint/reader.hpp"
#include "report/report.hpp"

namespace mx2nv {

// shards, modules, scale_groups (distinct global scales), companion_files
// and source_tensor_bytes of `source`.
void add_source_counts(Report& report, const SourceCheckpoint& source);

}  // namespace mx2nv

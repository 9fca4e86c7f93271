#include "checkpoint/source_fields.hpp"

namespace mx2nv {

void add_source_counts(Report& report, const SourceCheckpoint& source) {
  const Checkpoint& ck = source.checkpoint;
  report.shards = ck.shards.size();
  report.modules = source.modules.modules.size();
  report.scale_groups = source.modules.scale_groups.size();
  report.companion_files = ck.companions.size();
  report.source_tensor_bytes = ck.tensor_bytes();
}

}  // namespace mx2nv

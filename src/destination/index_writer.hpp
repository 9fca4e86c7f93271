// DST's index (model.safetensors.index.json) written to its temporary file in
// DST, streamed from SRC's index and the plan (render_target_index) and
// hashed on the way; finalize commits it last.
//
// convert starts it on a thread of its own before the shards are written:
// nothing in it depends on the shards (metadata.total_size is predicted from
// the module table, target_totals, and checked when the shards are done), so
// rendering it overlaps the shard pass instead of following it. Only where
// that costs no memory worth counting:
// the index's names were kept (an index read again would be held beside the
// shard workers), and no module is written as BF16 (a size target_totals does
// not model).
#pragma once

#include "checkpoint/reader.hpp"
#include "destination/destination.hpp"
#include "plan/plan.hpp"

#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <span>
#include <thread>

namespace mx2nv {

// The index of the converted checkpoint: the source's, plus each module's
// second-level scale (weight_global_scale, or ModelOpt's weight_scale_2) in the
// shard of its weight_scale. Needs source.checkpoint.index; if its names were
// dropped, reads the index again and refuses one that changed.
// `plan` (parallel to the modules, or empty: every module exact): a BF16
// module's weight_packed becomes its `weight`, and it has no scale or global.
// `format` ModelOpt: every other module's weight_packed becomes its `weight`.
void render_target_index(const SourceCheckpoint& source, std::span<const ModulePlan> plan, std::uint64_t total_size,
                         const TextSink& sink, TargetFormat format = TargetFormat::CompressedTensors);

// Every tensor name of SRC, from its index (read again if its names were
// dropped, as above) or, for a checkpoint without one, its shards' headers.
void for_each_source_tensor(const SourceCheckpoint& source, const std::function<void(std::string_view)>& visit);

struct WrittenIndex {
  Destination::Pending file;    // under its temporary name, not yet committed
  std::uint64_t hash = 0;       // XXH3-64 of the bytes written
  std::uint64_t bytes = 0;
  std::uint64_t total_size = 0;  // the metadata.total_size it states
};

WrittenIndex write_target_index(const SourceCheckpoint& source, const Plan& plan, std::uint64_t total_size,
                                Destination& out);

// The total size convert would write early (see above), or nullopt when the
// index should wait for finalize.
std::optional<std::uint64_t> early_index_total(const SourceCheckpoint& source, const Plan& plan);

class BackgroundIndex {
 public:
  BackgroundIndex(const SourceCheckpoint& source, const Plan& plan, std::uint64_t total_size, Destination& out);
  ~BackgroundIndex();  // joins; a result not taken is left to Destination's clean-up
  BackgroundIndex(const BackgroundIndex&) = delete;
  BackgroundIndex& operator=(const BackgroundIndex&) = delete;
  // Joins; rethrows the thread's error.
  WrittenIndex take();

 private:
  std::optional<WrittenIndex> result_;
  std::exception_ptr error_;
  std::jthread thread_;  // last: started once the members above exist
};

}  // namespace mx2nv

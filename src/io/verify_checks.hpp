// The checks verify_checkpoint runs, one concept each (verify.hpp says what
// is proved). They share a context: both checkpoints, the differences found,
// and what the shard pass learned about each module's target tensors.
#pragma once

#include "core/value_compare.hpp"
#include "core/error.hpp"
#include "io/checkpoint_reader.hpp"
#include "io/progress.hpp"
#include "io/verify.hpp"
#include "core/plan.hpp"

#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace mx2nv {

// Thread-safe list of differences, capped for the report; counts all.
class Differences {
 public:
  template <typename... Args>
  void add(fmt::format_string<Args...> format, Args&&... args) {
    std::lock_guard lock(mutex_);
    ++count_;
    if (list_.size() < kMaxReportedDifferences) list_.push_back(fmt::format(format, std::forward<Args>(args)...));
  }
  std::uint64_t count() const { return count_; }
  std::vector<std::string> take();

 private:
  std::mutex mutex_;
  std::uint64_t count_ = 0;
  std::vector<std::string> list_;
};

// A module's tensors as found in DST by the shard pass. Each field is written
// by the worker of the one shard that holds that tensor.
struct TargetModule {
  std::optional<std::uint64_t> packed_offset;  // absolute, in DST's packed shard
  std::optional<std::uint64_t> scale_offset;
  std::size_t packed_shard = 0, scale_shard = 0;  // DST shard indices
  std::optional<float> global;  // present, F32 [1], positive normal
  bool global_seen = false;     // found anywhere (even if wrong)
  // convert --overspan bf16: DST's BF16 `weight` in place of the NVFP4 tensors.
  std::optional<std::uint64_t> bf16_offset;
  std::size_t bf16_shard = 0;
  bool scale_absent = false;  // SRC's weight_scale is not in DST (right only for a BF16 module)
};

struct VerifyContext {
  const SourceCheckpoint& source;
  const Checkpoint& target;
  const VerifyOptions& options;
  Differences& diff;
  // verify --shards I/N: the shards whose bytes and values this part compares
  // (a module belongs to its packed tensor's shard). Structure is checked everywhere.
  std::vector<bool> selected;
  std::vector<TargetModule> modules;  // parallel to source.modules.modules
  std::atomic<std::uint64_t> passthrough_tensors{0};
  // What convert --overspan wrote for each module (check_overspan); empty: every module exact.
  std::vector<Treatment> treatments;
  std::vector<std::string> bf16_modules;         // the config's ignore must list them
  std::vector<std::string> requantized_modules;  // the config must name them as lossy
  Treatment treatment(std::size_t module) const { return treatments.empty() ? Treatment::Exact : treatments[module]; }
  // Bytes compared on both sides (pass-through tensors in the shard pass,
  // then each selected module's packed and scale bytes); one unit per module.
  ProgressTracker* progress = nullptr;
};

// What `progress` counts in total for the selected shards: bytes (both
// sides) and modules.
struct VerifyWork {
  std::uint64_t bytes = 0;
  std::uint64_t modules = 0;
};
VerifyWork verify_work(const SourceCheckpoint& source, const std::vector<bool>& selected);
// Both sides' bytes of one module's values: packed codes twice, 1 source and
// 2 target scale bytes per 32-group.
inline std::uint64_t module_compare_bytes(const QuantModule& m) { return 2 * m.packed.nbytes() + 3 * m.group_count(); }

// Byte-compares two ranges; reports the first differing offset.
void compare_bytes(const File& a, std::uint64_t a_off, const File& b, std::uint64_t b_off, std::uint64_t n,
                   const std::string& what, Differences& diff);

// Companion files byte for byte, the same shard files, the index's presence
// and total_size. (config.json: core/target_config_check.hpp.)
void check_files(const VerifyContext& ctx);
// Shard by shard: tensor order, placement, pass-through bytes, each module's
// target tensors and global (filled into ctx.modules).
void check_shards(VerifyContext& ctx);
// Modules DST holds requantized or as BF16 (convert --overspan): allowed only
// as convert --overspan would write them for SRC under the window (the plan is
// recomputed); fills ctx.treatments and the report's over-span section.
void check_overspan(VerifyContext& ctx, Report& report);
// Their values: requantized bytes bit for bit against the recomputation (with
// the measured error in the report), BF16 values exactly.
void check_rewritten_values(const VerifyContext& ctx, Report& report);
// Gate/up pairs carry one global.
void check_globals(const VerifyContext& ctx);
// Every value of every module, decoded on both sides; tallies into `report`.
void check_values(const VerifyContext& ctx, Report& report);

}  // namespace mx2nv

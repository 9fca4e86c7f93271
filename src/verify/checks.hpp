// The checks verify_checkpoint runs, one concept each (verify.hpp says what
// is proved). They share a context: both checkpoints, the differences found,
// and what the shard pass learned about each module's target tensors.
#pragma once

#include "verify/value_compare.hpp"
#include "common/error.hpp"
#include "checkpoint/reader.hpp"
#include "common/progress.hpp"
#include "verify/verify.hpp"
#include "plan/plan.hpp"

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

// A file offset that may be absent, in 8 bytes (std::optional takes 16): no
// offset in a file reaches 2^64 - 1.
class MaybeOffset {
 public:
  MaybeOffset& operator=(std::uint64_t offset) {
    offset_ = offset;
    return *this;
  }
  explicit operator bool() const { return offset_ != kNone; }
  std::uint64_t operator*() const { return offset_; }

 private:
  static constexpr std::uint64_t kNone = ~std::uint64_t{0};
  std::uint64_t offset_ = kNone;
};

// A module's tensors as found in DST by the shard pass. Each field is written
// by the worker of the one shard that holds that tensor. Kept small: there
// is one per module.
struct TargetModule {
  MaybeOffset packed_offset;  // absolute, in DST's packed shard
  MaybeOffset scale_offset;
  // convert --overspan bf16: DST's BF16 `weight` in place of the NVFP4 tensors.
  MaybeOffset bf16_offset;
  std::uint32_t packed_shard = 0, scale_shard = 0, bf16_shard = 0;  // DST shard indices (kMaxShards fits)
  // The second-level F32 as stored: present, of the format's shape,
  // positive normal (compressed-tensors' divisor, ModelOpt's multiplier).
  std::optional<float> stored;
  // The divisor it stands for (the stored value, or ModelOpt's exact
  // 1/multiplier); empty for a ModelOpt multiplier that is no power of two,
  // which only a requantized module holds (its values: `stored` and its
  // layout's recipe).
  std::optional<float> global;
  bool global_seen = false;     // found anywhere (even if wrong)
  bool scale_absent = false;  // SRC's weight_scale is not in DST (right only for a BF16 module)
};

struct VerifyContext {
  const SourceCheckpoint& source;
  const Checkpoint& target;
  const VerifyOptions& options;
  Differences& diff;
  // The layout DST is in, as its config says (model/target_format.hpp):
  // which names its module tensors bear and how its global is stored.
  TargetFormat format = TargetFormat::CompressedTensors;
  // verify --shards I/N: the shards whose bytes and values this part compares
  // (a module belongs to its packed tensor's shard). Structure is checked everywhere.
  std::vector<bool> selected;
  std::vector<TargetModule> modules;  // parallel to source.modules.modules
  std::atomic<std::uint64_t> passthrough_tensors{0};
  // What convert --overspan wrote for each module (check_overspan); empty: every module exact.
  std::vector<Treatment> treatments;
  std::vector<std::string> bf16_modules;         // the config's ignore must list them
  std::vector<std::string> requantized_modules;  // the config must name them as lossy
  // ModelOpt layout: SRC's `M.weight` tensors that are no quantized module's
  // (the shard pass collects them; the exclude list must name each).
  std::mutex unquantized_mutex;
  std::vector<std::string> unquantized_weights;
  Treatment treatment(std::size_t module) const { return treatments.empty() ? Treatment::Exact : treatments[module]; }
  // Bytes compared on both sides (pass-through tensors in the shard pass,
  // then each selected module's packed and scale bytes); one unit per module.
  ProgressTracker* progress = nullptr;
  // Tensors of SRC that DST's same-named shard lacks (shard, tensor), up to
  // the differences kept: once the shard pass is done, DST's index, streamed
  // again, says which moved (its names are not held through the pass).
  std::mutex absent_mutex;
  std::vector<std::pair<std::string, std::string>> absent;
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
// and total_size. (config.json: verify/config_check.hpp.)
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

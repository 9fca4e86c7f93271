// The plan: from every module's scale facts, decide each global scale, check
// the window, and list everything that would be refused, before a single
// output byte is written. Pure logic; reads happen through ActiveCounter.
//
// Rules (README "Transcode rules"): for a scale group (a gate/up pair or a
// lone module) k_max and k_min are over active groups. The global exponent m
// (divisor 2^-m) must keep every active block scale in the window,
// m in [k_max - 8, k_min - window.min_exp], and itself lie in the window's
// global range [global_min, global_max]. The plan takes m = k_max - 8 (the
// largest scale at 2^8) unless that is below the window's preferred global
// minimum (quiet experts under Marlin's fp16 rule); then it raises m toward
// that minimum as far as the block scales allow.
#pragma once

#include "common/choice.hpp"

#include "model/modules.hpp"
#include "model/scale_scan.hpp"
#include "model/target_format.hpp"
#include "numerics/formats.hpp"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mx2nv {

// Scale bytes present in a module and how often: sparse, because a model has
// hundreds of thousands of modules and each uses only a few dozen of the 255
// exponents. One exactly sized block per module, 9 bytes an entry (the
// counts, then the bytes), behind a 16-byte handle, where a vector of (byte,
// count) pairs takes 16 bytes an entry plus its own 24 and the allocator's
// slack.
class SparseHistogram {
 public:
  using Entry = std::pair<std::uint8_t, std::uint64_t>;
  class Iterator {
   public:
    Iterator(const SparseHistogram* h, std::size_t i) : h_(h), i_(i) {}
    Entry operator*() const { return (*h_)[i_]; }
    Iterator& operator++() {
      ++i_;
      return *this;
    }
    bool operator==(const Iterator& o) const { return i_ == o.i_; }

   private:
    const SparseHistogram* h_;
    std::size_t i_;
  };

  SparseHistogram() = default;
  explicit SparseHistogram(std::size_t size);
  SparseHistogram(const SparseHistogram& other);
  SparseHistogram& operator=(const SparseHistogram& other);
  SparseHistogram(SparseHistogram&&) noexcept = default;
  SparseHistogram& operator=(SparseHistogram&&) noexcept = default;

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  Entry operator[](std::size_t i) const;
  void set(std::size_t i, Entry e);
  Iterator begin() const { return {this, 0}; }
  Iterator end() const { return {this, size_}; }

 private:
  std::unique_ptr<std::byte[]> block_;
  std::size_t size_ = 0;
};
SparseHistogram to_sparse(const ByteHistogram& dense);
ByteHistogram to_dense(const SparseHistogram& sparse);

struct ModuleFacts {
  SparseHistogram histogram;  // when kept (below)
  std::optional<int> k_max;  // over active groups
  std::optional<int> k_min;
  // False when the scan did not keep the histogram (its memory budget was
  // spent: a module can have 254 distinct scale bytes, 254 x 9 here, and a
  // checkpoint within the caps ~400k modules); make_plan reads it again.
  bool histogram_kept = true;
};

// Number of active groups of module `module` whose exponent is in [k_lo, k_hi].
using ActiveCounter = std::function<std::uint64_t(std::size_t module, int k_lo, int k_hi)>;
// A module's scale histogram read again (for facts that did not keep it).
using HistogramReader = std::function<SparseHistogram(std::size_t module)>;

// What convert writes for a module: its exact NVFP4 transcode (the default),
// or, for scale groups the window refuses (`--overspan`, plan/overspan.hpp),
// the lossy requantization from decoded values (divisor = the F32 its
// layout's quantizer stores: compressed-tensors' global, a divisor, or
// ModelOpt's weight_scale_2, a multiplier; m and zero_scales unused) or a
// BF16 `weight` (no NVFP4 tensors).
enum class Treatment : std::uint8_t { Exact = 0, Requantized = 1, Bf16 = 2 };
// convert --overspan: what to do with scale groups the window refuses (plan/overspan.hpp).
enum class OverSpanChoice { Fail, Bf16, Requantize };
template <>
std::span<const Choice<OverSpanChoice>> choices<OverSpanChoice>();

// What a plan writes: a conversion (`mx2nv convert`: exact, with --overspan's
// rewrites), or `mx2nv requantize`'s lossy checkpoint: every module
// Requantized under compressed-tensors' global of its scale group, in the
// layout of an exact conversion (make_target_layout), with no window to fit.
enum class PlanKind : std::uint8_t { Convert = 0, Requantize = 1 };
// How records and plan files name the kind (the one spelling of "requantize"
// in a mode, a plan's "kind" and a shard's fingerprint).
template <>
std::span<const Choice<PlanKind>> choices<PlanKind>();

struct ModulePlan {
  Treatment treatment = Treatment::Exact;
  int m = 0;                 // global exponent: scales become 2^(k - m), divisor 2^-m
  float divisor = 1.0f;      // weight_global_scale; Requantized: the stored F32 (Treatment, written_second_level)
  bool zero_scales = false;  // the scale group has no active group: all scales 0x00
  int span = 0;              // k_max of the scale group - k_min of this module
  std::uint64_t groups_outside = 0;         // active groups below the window (refusal)
  std::uint64_t canonical_zero_groups = 0;  // zero groups whose 2^(k-m) E4M3 cannot hold: 0x00
  std::uint64_t marlin_zeroed_groups = 0;   // active groups with 2^(k-m) < 2^-6: Marlin flushes them
};

// The F32 a module's second-level tensor holds in `format`: an exact
// module's divisor 2^-m, or ModelOpt's multiplier 1/divisor (exact: a power
// of two); a requantized module's stored value as it is.
float written_second_level(TargetFormat format, const ModulePlan& m);
// A requantized module's second-level scale with its layout's recipe.
SecondLevel requantized_level(TargetFormat format, const ModulePlan& m);

struct OverSpan {
  std::string module;
  int span = 0;
  int limit = 0;
  std::uint64_t groups_outside = 0;
};

// A scale group whose spans fit the window but for which no global exponent
// lies in the window's global range: the block scales need
// m in [needed_min, needed_max], the runtime takes m in [allowed_min, allowed_max].
// The plan holds the group by index (ScaleGroupConflict); reports name it
// (GlobalConflict, by scale_group_name).
struct ScaleGroupConflict {
  std::size_t scale_group = 0;  // index into ModuleSet::scale_groups
  int k_max = 0, k_min = 0;
  int needed_min = 0, needed_max = 0;
  int allowed_min = 0, allowed_max = 0;
};
struct GlobalConflict {
  std::string scale_group;  // scale_group_name: the member names joined by '+'
  int k_max = 0, k_min = 0;
  int needed_min = 0, needed_max = 0;
  int allowed_min = 0, allowed_max = 0;
};

// A scale group no global exponent serves: none in the window's global range
// (a ScaleGroupConflict), no normal FP32 divisor, or, after --overspan
// requantize, compressed-tensors' global outside the window's range.
struct BadGlobal {
  std::size_t scale_group = 0;                // index into ModuleSet::scale_groups
  std::optional<float> requantized_global;  // set when the requantized second-level scale is what does not fit
  bool no_normal_multiplier = false;        // ModelOpt layout: 1/divisor is no normal FP32
};

struct Plan {
  PlanKind kind = PlanKind::Convert;
  Window window = Window::Marlin;
  TargetFormat format = TargetFormat::CompressedTensors;  // the layout written (--format)
  std::vector<ModulePlan> modules;         // parallel to ModuleSet::modules
  std::vector<OverSpan> refused_spans;         // every module refused by the window
  std::vector<BadGlobal> bad_globals;      // scale groups no global exponent serves, ascending
  std::vector<ScaleGroupConflict> global_conflicts;  // those of them whose ranges do not meet
  std::uint64_t raised_globals = 0;        // scale groups whose m is above k_max - 8 (quiet experts)
  OverSpanChoice over_span_choice = OverSpanChoice::Fail;
  std::vector<OverSpan> resolved_spans;    // refusals the --overspan choice resolved (why)
  std::vector<std::size_t> resolved_globals;  // likewise for bad_globals: scale group indices
  bool refused() const { return !refused_spans.empty() || !bad_globals.empty(); }
};

// How reports name a scale group: its members' names joined by '+' (a lone
// module by its own name). Built only for reporting; the plan and its
// resolution identify groups by index.
std::string scale_group_name(const ModuleSet& set, std::size_t scale_group);
// A refused global as the report lists it (unrepresentable_globals): the
// group's name, and why the requantized global does not fit when that is
// the reason.
std::string bad_global_name(const ModuleSet& set, const BadGlobal& bad);
std::vector<std::string> bad_global_names(const ModuleSet& set, const Plan& plan);
std::vector<GlobalConflict> named_global_conflicts(const ModuleSet& set, const Plan& plan);

// The global exponent for a scale group with active exponents in [k_max, k_min]
// under `limits`, or nullopt when no exponent satisfies both the block-scale
// window and the global range: max(k_max - 8, global_min, global_preferred_min)
// capped by k_min - min_exp and global_max. Deterministic, and k_max - 8
// whenever that already meets the preferred minimum.
std::optional<int> choose_global_exponent(int k_max, int k_min, const WindowLimits& limits);

// The ModelOpt layout stores 1/divisor (weight_scale_2): a scale group whose
// divisor has no normal FP32 reciprocal (e4m3's widest globals) joins
// plan.bad_globals, so the plan refuses it as it refuses any global it
// cannot write.
void refuse_subnormal_multipliers(const ModuleSet& set, Plan& plan);

Plan make_plan(const ModuleSet& set, const std::vector<ModuleFacts>& facts, Window window,
               const ActiveCounter& count_active, const HistogramReader& read_histogram = {});

}  // namespace mx2nv

// The rest of plan/'s face: the --overspan choice and conversion modes
// (after the Plan they build on).
#include "plan/overspan.hpp"

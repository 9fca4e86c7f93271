// Lossy NVFP4 quantization of decoded MXFP4 values, computed exactly as the
// quantizer of the layout it is written in computes it, step by step in
// float32 (every E2M1 x 2^k below 2^128 is exact in float32, and in BF16).
//
// compressed-tensors' NVFP4 quantization (pinned 0.20.1, CPU path):
//
//   global  = generate_gparam:   2688 / max(amax, FLT_MIN), 1.0 when not finite
//             (2688 = 448 x 6; amax over the whole module, or over the gate/up
//             pair so both halves keep one global)
//   scale   = calculate_qparams: global x (block_amax / 6), clamped to +-448,
//             rounded to E4M3 (nearest, ties to even); a scale rounding to 0
//             becomes E4M3's epsilon 0.125
//   code    = _quantize:         x / (scale / global), clamped to +-6, rounded
//             to E2M1 (nearest, ties to even); the sign bit is set for x < 0,
//             so -0.0 becomes +0 and small negatives become -0 (0x8)
//
// ModelOpt's dynamic, max-calibrated NVFP4 weight quantizer (nvidia-modelopt
// 0.47.0, modelopt/torch/quantization/qtensor/nvfp4_tensor.py, NVFP4QTensor):
//
//   weight_scale_2 = get_weights_scaling_factor_2_from_quantizer: amax / 2688
//             (amax over the module or the gate/up pair, as the exporter's
//             gate/up amax unification gives it); an amax of 0 is taken as 6,
//             the maxbound ModelOpt's own export_amax sanitizes it to (its
//             NVFP4 path would divide by 0: the one deliberate deviation)
//   scale   = get_weights_scaling_factor: block_amax / (6 x weight_scale_2),
//             the product first; 0 becomes 1.0; clamped to [2^-9, 448] and
//             rounded to E4M3 (_cast_per_block_scale_to_fp8)
//   code    = quantize: x / (scale x weight_scale_2), the product first;
//             _cast_fp4: the sign bit for x < 0, the magnitude nearest with
//             ties to even (the thresholds below), beyond 5 -> 6
//
// Blocks are 16 values along a row: a 32-value MXFP4 group is two blocks.
// This is the "documented recomputation" verify and the conformance suite
// check byte for byte. The error metrics compare the dequantized result
// (code x scale / global or code x scale x weight_scale_2, in double) with
// the MXFP4 values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace mx2nv {

inline constexpr std::size_t kNvBlock = 16;  // values per NVFP4 block scale

// code x 2^k as float32; nullopt when it is beyond float32's range (|v| >= 2^128,
// which only scale bytes 253 and 254 can produce).
std::optional<float> mxfp4_value_f32(std::uint8_t code, int k);

// A 32-group's values as float32, each equal to mxfp4_value_f32's; false
// (out unspecified) when any is beyond float32.
bool mxfp4_group_values_f32(std::span<const std::byte, 16> packed, std::uint8_t e8m0, std::span<float, 32> out);

// The largest |value| of a 32-group: 16 packed bytes and its E8M0 byte (not
// NaN). nullopt when a value is beyond float32.
std::optional<float> mxfp4_group_amax(std::span<const std::byte, 16> packed, std::uint8_t e8m0);

// generate_gparam for NVFP4 weights.
float nvfp4_global_scale(float amax);

// Whose NVFP4 weight quantizer a requantization reproduces (file comment).
enum class Recipe : std::uint8_t { CompressedTensors = 0, ModelOpt = 1 };

// A requantized module's second-level scale, as its layout stores it (F32):
// compressed-tensors' global, a divisor (value = e2m1 x scale / global), or
// ModelOpt's weight_scale_2, a multiplier (value = e2m1 x scale x
// weight_scale_2). Neither is a power of two in general, so neither is turned
// into the other.
struct SecondLevel {
  Recipe recipe = Recipe::CompressedTensors;
  float stored = 1.0f;
  // Bit for bit: the same recipe and the same F32 bits.
  bool same_as(const SecondLevel& o) const;
};
// The second-level scale a recipe computes from the largest |value| of a
// module or of a gate/up pair.
SecondLevel second_level_for(Recipe recipe, float amax);

// ModelOpt's steps (file comment), each in float32.
float modelopt_weight_scale_2(float amax);

// float -> E4M3FN byte, round to nearest, ties to even. |x| must be <= 448
// (callers clamp first, as compressed-tensors does); NaN is not accepted.
std::uint8_t e4m3_round(float x);

struct BlockScale {
  std::uint8_t byte;  // the E4M3FN byte written to weight_scale
  float value;        // its value as the quantizer uses it (0.125 for a rounded-away 0)
};
// calculate_qparams for one block.
BlockScale nvfp4_block_scale(float block_amax, float global);

// _quantize + cast_to_fp4 + pack: the E2M1 code of x for a block.
std::uint8_t nvfp4_code(float x, float scale_value, float global);

// ModelOpt's block scale and code (file comment).
BlockScale modelopt_block_scale(float block_amax, float weight_scale_2);
std::uint8_t modelopt_code(float x, float scale_value, float weight_scale_2);

// Accumulates the error of quantized values q against reference values x
// (both exact in double), in a fixed order so results are reproducible.
struct ErrorStats {
  double sum_err2 = 0;  // sum (q - x)^2
  double sum_ref2 = 0;  // sum x^2
  double sum_q2 = 0;    // sum q^2
  double sum_dot = 0;   // sum q x
  double max_abs = 0;   // max |q - x|
  std::uint64_t values = 0;
  std::uint64_t marlin_zeroed_blocks = 0;  // block scales E4M3 holds only as subnormals (< 2^-6)
  void add(double reference, double quantized);
  void merge(const ErrorStats& other);
  // sqrt(sum_err2 / sum_ref2); 0 when nothing differs, +inf when x is all zero but q is not.
  double relative_rmse() const;
  // sum_dot / sqrt(sum_ref2 sum_q2); 1 when both are all zero, 0 when only one is.
  double cosine() const;
};

// Requantizes one MXFP4 32-group (16 packed bytes, E8M0 byte `e8m0`, not NaN)
// under `level`: writes 16 packed NVFP4 bytes and the two block-scale bytes,
// and adds every value to `stats`. Returns false, writing nothing, when a
// value is beyond float32.
bool requantize_group(std::span<const std::byte, 16> packed, std::uint8_t e8m0, SecondLevel level,
                      std::span<std::byte, 16> out_packed, std::span<std::uint8_t, 2> out_scales, ErrorStats& stats);

// The largest |value| over consecutive 32-groups (16 packed bytes and one
// E8M0 byte each), raised into `amax`: what mxfp4_group_amax gives for each.
// Returns how many groups were taken before the first that has a NaN scale
// byte or a value beyond float32 (all of them when none has).
std::size_t mxfp4_groups_amax(std::span<const std::byte> packed, std::span<const std::byte> e8m0s, float& amax);

// requantize_group for many groups under one second-level scale. A block's scale, and
// each of its values' code and error terms, depend only on the group's E8M0
// byte and the block's largest magnitude code (E2M1 magnitudes grow with the
// code), so they are computed once per such pair and looked up for every
// later block: the same bytes and the same stats, bit for bit (the sums'
// proof is at SumRun in the .cpp). Over long runs of groups whose sums are
// large, a block's values are not added one by one: each block's source
// bytes are counted and the run's sums computed from the counts
// (requantize_whole). Holds at most 256 x 8 blocks of ~2 KiB, only those
// met; each thread that requantizes also holds 2 MiB of run counts.
class GroupRequantizer {
 public:
  explicit GroupRequantizer(SecondLevel level) : level_(level) {}
  const SecondLevel& level() const { return level_; }

  // Requantizes consecutive groups: `packed` holds 16 bytes a group and
  // `e8m0s` one scale byte a group. Writes each group's 16 packed NVFP4 bytes
  // to out_packed and its two block-scale bytes to out_scales (either may be
  // empty: not written), and adds every value to *stats in value order
  // (stats may be null: not measured). Returns how many groups were done
  // before the first that cannot be (a NaN scale byte, or a value beyond
  // float32), all of them when none; that group and later ones are neither
  // written nor counted.
  std::size_t requantize(std::span<const std::byte> packed, std::span<const std::byte> e8m0s,
                         std::span<std::byte> out_packed, std::span<std::uint8_t> out_scales, ErrorStats* stats);

  // One group (e8m0 not NaN): requantize_group's result through the lookup.
  bool requantize(std::span<const std::byte, 16> packed, std::uint8_t e8m0, std::span<std::byte, 16> out_packed,
                  std::span<std::uint8_t, 2> out_scales, ErrorStats& stats);
  // What a run of groups added whole takes from the sums and gives back
  // (requantize_whole; the .cpp's SumRun fills and takes it).
  struct WholeRun {
    std::uint64_t key = 0;     // the sums' units key: every block of the run has it
    double room[4]{};          // each sum's units left below 2^53: the run adds less
    int p[4]{};                // each sum's u = 2^p
    std::uint64_t units[4]{};  // the units added, exact
    std::uint64_t blocks = 0, marlin_zeroed = 0;
    double max_abs = 0;  // the largest |q - x| of the run's values (at least the one given)
  };
  // Only the two block-scale bytes requantize would write (no codes, no
  // stats): for writing weight_scale without redoing every value.
  bool scales(std::span<const std::byte, 16> packed, std::uint8_t e8m0, std::span<std::uint8_t, 2> out_scales);

  // How many of the four sums of how many blocks were added whole (SumRun)
  // rather than value by value, summed: for tests, which must see both ways
  // taken.
  std::uint64_t blocks_summed_whole() const { return blocks_summed_whole_; }
  // How many groups were added by whole runs (requantize_whole): for tests,
  // which must see that path taken too.
  std::uint64_t groups_in_whole_runs() const { return groups_in_whole_runs_; }

  // One block's outcome for an E8M0 byte and its largest magnitude code.
  struct Block {
    bool finite = false;         // every value of the block within float32
    std::uint8_t scale = 0;      // the E4M3 block-scale byte
    bool marlin_zeroed = false;  // that byte is an E4M3 subnormal (vLLM's Marlin path flushes it)
    std::uint8_t byte[256]{};    // by source byte (two codes): the NVFP4 byte written
    // By source code: the four terms ErrorStats::add adds for its value x and
    // its dequantized q (file comment), in ErrorStats's order:
    // (q - x)^2, x^2, q^2, q x; and |q - x|.
    double term[16][4]{};
    double abs_error[16]{};
    double term_max[4]{};  // the largest of each term over the block's codes
    // By a set of four codes 4q..4q+3 (bit i for code 4q+i): the largest |q - x| over it.
    double max_by_nibble[4][16]{};
    // term / 2^units_ulp[j] rounded to an integer, for the whole-block sums
    // (SumRun); units_ok[j] false when that rounding is not a fixed function
    // of the term (a tie, a negative or an oversized term).
    int units_ulp[4]{kNoUlp, kNoUlp, kNoUlp, kNoUlp};
    bool units_ok[4]{};
    double units[16][4]{};
    double units_bound[4]{};      // 16 x the largest units[c][j]: no block adds more to sum j
    std::uint64_t units_key = 0;  // the sums' u all four units were computed for, when all are good; 0: none
    static constexpr int kNoUlp = -100000;
  };

 private:
  // The place in blocks_ of the block of (e8m0, top), computed on first use
  // (add_block).
  std::size_t block_index(std::uint8_t e8m0, std::uint8_t top) {
    const std::uint16_t at = index_[static_cast<std::size_t>(e8m0) * 8 + top];
    return at != 0 ? at - 1u : add_block(e8m0, top);
  }
  std::size_t add_block(std::uint8_t e8m0, std::uint8_t top);
  // Requantizes groups from the first while both blocks of each are known
  // and have the run's units key and the run's room is not exceeded,
  // counting each block's source bytes instead of adding its values one by
  // one; returns how many (the .cpp states why the sums are the same).
  std::size_t requantize_whole(const std::uint8_t* in, std::span<const std::byte> e8m0s, std::uint8_t* out,
                               std::uint8_t* scales_out, WholeRun& run);
  SecondLevel level_;
  std::uint16_t index_[256 * 8]{};  // 1 + the block's place in blocks_; 0: not computed yet
  // By the same key, for the scale-only path: kComputed | the block's scale
  // byte, or kComputed | kBeyondFloat32; 0: not computed yet.
  static constexpr std::uint16_t kComputed = 0x100, kBeyondFloat32 = 0x200;
  std::uint16_t scale_of_[256 * 8]{};
  std::vector<Block> blocks_;
  std::uint64_t blocks_summed_whole_ = 0;
  std::uint64_t groups_in_whole_runs_ = 0;
};

}  // namespace mx2nv

// mx2nv compare SRC OTHER: how far any NVFP4 checkpoint OTHER made from an
// MXFP4 SRC is from SRC's values, per quantized module and in total.
// docs/compare.md is the user's reference; every figure is defined as in
// tests/conformance/compare_oracle.py, which the tests hold it to.
//
// OTHER may be compressed-tensors nvfp4-pack-quantized (value = e2m1 x scale
// / global) or ModelOpt NVFP4 (value = e2m1 x weight_scale x weight_scale_2),
// with modules left unquantized (BF16/F16/F32 `weight`). Modules are matched
// by name (compare/module_key.hpp). Values are decoded with the general
// bit-field decoders (numerics/formats.hpp); nothing of convert's is used.
//
// Invalid input (either side) throws Error(InvalidInput) naming the tensor
// or file; nothing is reported then. Memory: SRC's module table (as verify),
// OTHER's module tensors' names and places, one record per compared module,
// and a fixed chunk per worker while values stream.
#pragma once

#include "common/progress.hpp"
#include "sys/file.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mx2nv {

struct CompareOptions {
  fs::path source;
  fs::path other;
  unsigned threads = 1;
  // --modules REGEX (ECMAScript, searched anywhere in the name): the SRC
  // modules compared; empty: all.
  std::string modules;
  ProgressCallback progress = {};  // unit: modules
};

// Additive figures of a module or of a sum of modules. d, s, o are OTHER -
// SRC, SRC and OTHER values; the four sums are kept so totals can be formed.
struct CompareSums {
  std::uint64_t values = 0;
  std::uint64_t exact_values = 0;
  double max_abs_error = 0;
  double sum_d2 = 0, sum_s2 = 0, sum_o2 = 0, sum_os = 0;
  std::uint64_t packed_bytes = 0;
  std::uint64_t packed_bytes_identical = 0;
  std::uint64_t zero_sign_rewrites = 0;       // nibbles 0x0 <-> 0x8
  std::uint64_t zero_sign_rewrite_bytes = 0;  // differing bytes whose every difference is such a flip
  std::uint64_t active_block_scales_below_min_normal = 0;  // E4M3 subnormal scale, a non-zero code in the block
  bool exact() const { return exact_values == values; }
};

// ||o - s|| / ||s||: 0 when nothing differs, nullopt when SRC is all zero and
// something differs.
std::optional<double> relative_rmse(double sum_d2, double sum_s2);
// 1 when every value is exact; else 0 when either side is all zero, else
// <o, s> / (||o|| ||s||) clamped to [-1, 1].
double cosine_similarity(bool exact, double sum_os, double sum_o2, double sum_s2);

struct ModuleComparison {
  std::string_view name;   // SRC's (in CompareResult::source_names)
  std::string other_name;  // OTHER's; empty when it is SRC's
  bool quantized = true;   // false: OTHER holds it as BF16/F16/F32
  std::optional<std::uint64_t> layer, expert;  // routed experts
  std::string_view projection;                 // gate, up, down (static storage); empty otherwise
  CompareSums sums;
  std::optional<std::uint32_t> global_bits;  // the stored F32 global (ct: divisor, ModelOpt: multiplier)
  std::optional<double> input_scale;         // finite input_global_scale / input_scale
  bool has_input_scale = false;              // the tensor exists (whatever its value)
  std::optional<bool> gate_up_globals_bit_equal;
};

enum class OtherFormat { CompressedTensors, ModelOpt };

struct CompareResult {
  fs::path source, other;
  std::shared_ptr<const void> source_names;  // keeps the modules' names alive
  OtherFormat format = OtherFormat::CompressedTensors;
  std::vector<ModuleComparison> modules;  // by SRC name
  std::vector<std::string> missing_in_other;  // SRC modules OTHER lacks, sorted
  std::vector<std::string> extra_in_other;    // OTHER modules with no SRC module, sorted
  double seconds = 0;
  bool all_exact() const;
  // 0: every value equal and nothing missing or extra; 1 otherwise.
  int exit_code() const;
};

CompareResult compare_checkpoints(const CompareOptions& options);

// Whether an F32 bit pattern is a positive power of two (normal with a zero
// mantissa, or subnormal with one mantissa bit).
bool f32_is_power_of_two(std::uint32_t bits);
float f32_from_bits(std::uint32_t bits);

}  // namespace mx2nv

// The rest of compare/'s face: the JSON document (after what it writes).
#include "compare/compare_json.hpp"

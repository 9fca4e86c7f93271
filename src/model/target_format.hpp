// The NVFP4 layout convert writes (`--format`): compressed-tensors'
// `nvfp4-pack-quantized` (the default) or ModelOpt's `W4A16_NVFP4`. Both hold
// the same FP4 code bytes and the same E4M3 block-scale bytes; only three
// things differ (docs/reference/nvfp4-checkpoint-formats.md §3-4):
//   - the names: `M.weight_packed` / `M.weight_global_scale` (compressed-
//     tensors) against `M.weight` / `M.weight_scale_2` (ModelOpt);
//   - the second-level scale: compressed-tensors stores the global as a
//     divisor (value = e2m1 x scale / global), ModelOpt as a multiplier
//     (value = e2m1 x scale x scale_2), an F32 [1] against a scalar F32 [];
//   - the config (model/quant_config.hpp, model/modelopt_config.hpp).
// Every global mx2nv writes exactly is a power of two, so 1/divisor is exact
// and both layouts decode to the same values. A requantized module follows
// its layout's own quantizer (numerics/nvfp4_quantizer.hpp), whose stored
// F32 is no power of two: it is never turned into the other layout's.
#pragma once

#include "common/choice.hpp"
#include "numerics/nvfp4_quantizer.hpp"

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace mx2nv {

enum class TargetFormat : std::uint8_t { CompressedTensors = 0, ModelOpt = 1 };
template <>
std::span<const Choice<TargetFormat>> choices<TargetFormat>();

// The tensor names and the second-level scale of a format.
struct FormatNames {
  std::string_view packed;  // suffix of the packed FP4 codes (U8 [N, K/2])
  std::string_view scale;   // suffix of the E4M3 block scales (F8_E4M3 [N, K/16])
  std::string_view global;  // suffix of the second-level scale (F32)
  std::vector<std::uint64_t> global_shape;  // [1] (compressed-tensors) or [] (ModelOpt, a scalar)
  bool global_is_divisor = true;            // compressed-tensors: divisor; ModelOpt: multiplier
};
const FormatNames& format_names(TargetFormat format);

// The quantizer whose recipe a requantized module follows in a format: the
// layout's own producer (compressed-tensors' or ModelOpt's).
Recipe recipe_of(TargetFormat format);

// The F32 value a module whose values are e2m1 x scale / divisor stores as its
// second-level scale: the divisor, or its reciprocal (exact for a power of two).
float stored_global(TargetFormat format, float divisor);
// The divisor a stored second-level scale stands for (its reciprocal for
// ModelOpt); nullopt where the stored value is no positive finite number or its
// reciprocal is not finite.
std::optional<float> divisor_of_stored(TargetFormat format, float stored);

// The multiplier a stored second-level scale stands for, in double (the
// values are e2m1 x scale x it): 1/stored for compressed-tensors' divisor,
// the stored value itself for ModelOpt's. What a runtime's global range is
// judged on (global_multiplier_fits).
double multiplier_of_stored(TargetFormat format, float stored);

// The layout a converted checkpoint says it is in: ModelOpt's when it has
// hf_quant_config.json or any quantization_config (top level or one level
// down) whose quant_method starts with "modelopt", else compressed-tensors'.
// Read leniently (unparsable text: compressed-tensors, whose checks then say
// what is wrong), so that one damaged copy of the config does not make a
// checker judge every tensor by the other layout's names.
TargetFormat target_format_of(std::string_view config_text, bool has_hf_quant_config);

}  // namespace mx2nv

// OTHER, the NVFP4 checkpoint compare reads: its container (opened and
// validated like any checkpoint, checkpoint/reader.hpp), its format (from
// config.json's quantization_config, else hf_quant_config.json) and the
// tensors that can belong to a module, with where their bytes are.
//
// Module tensors (docs/reference/nvfp4-checkpoint-formats.md section 7):
// compressed-tensors P.weight_packed / weight_scale / weight_global_scale /
// input_global_scale; ModelOpt P.weight (U8) / weight_scale / weight_scale_2
// / input_scale; unquantized P.weight in a float dtype. Which P are modules
// is decided by other_modules() against SRC's keys.
#pragma once

#include "checkpoint/reader.hpp"
#include "compare/compare.hpp"
#include "safetensors/dtype.hpp"
#include "safetensors/name_table.hpp"

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mx2nv {

// The tensor names a module can have: PREFIX + one of these.
enum class OtherSuffix : std::uint8_t {
  WeightPacked,       // .weight_packed (compressed-tensors codes)
  WeightScale,        // .weight_scale (both)
  WeightGlobalScale,  // .weight_global_scale (compressed-tensors)
  InputGlobalScale,   // .input_global_scale (compressed-tensors)
  Weight,             // .weight (ModelOpt codes, or an unquantized weight)
  WeightScale2,       // .weight_scale_2 (ModelOpt)
  InputScale,         // .input_scale (ModelOpt)
};
std::string_view suffix_text(OtherSuffix s);  // with its leading dot

// Kept small: a checkpoint at K3's structure has ~750k module tensors. The
// name is PREFIX + suffix, the prefix stored once for a module's tensors in
// one shard (so the names cost about a third of their text). A module
// tensor's shape has rank 0 to 2; up to kKeptDims dimensions are kept
// (enough to tell any other shape apart and to name it in a message).
struct OtherTensor {
  static constexpr std::size_t kKeptDims = 3;
  std::string_view prefix;  // in OtherTree::names
  std::uint64_t offset = 0;  // absolute, in its shard file
  std::uint64_t nbytes = 0;
  std::array<std::uint64_t, kKeptDims> dims = {};
  std::uint32_t shard = 0;
  Dtype dtype = Dtype::U8;
  std::uint8_t rank = 0;  // saturates at 255
  OtherSuffix suffix = OtherSuffix::Weight;
  std::string name() const;
  bool has_shape(std::span<const std::uint64_t> shape) const;
  std::string shape_text() const;  // "[N, K]"; dimensions past kKeptDims as "..."
};

struct OtherTree {
  Checkpoint checkpoint;
  NameArena names;  // the tensors' prefixes
  OtherFormat format = OtherFormat::CompressedTensors;
  // The module tensors, sorted by name, names unique; a deque, so collecting
  // hundreds of thousands never holds two copies while growing.
  std::deque<OtherTensor> tensors;
  const OtherTensor* find(std::string_view prefix, OtherSuffix suffix) const;
};

OtherTree open_other(const fs::path& root, unsigned threads);

// The format named by OTHER's config.json text and, when that has no NVFP4
// quantization config, hf_quant_config.json's text (empty: absent).
OtherFormat detect_other_format(std::string_view config_text, std::string_view hf_quant_config_text);

struct OtherModule {
  std::string_view name;  // its weight tensor's prefix
  bool quantized = true;
  const OtherTensor* weight = nullptr;  // packed codes, or the float weight
  const OtherTensor* scale = nullptr;
  const OtherTensor* global = nullptr;
  const OtherTensor* input_scale = nullptr;
};

// OTHER's modules sorted by name: every quantized prefix of its format, and
// every float `P.weight` whose P is a routed expert or whose key SRC has
// (`src_has_key`). A prefix with tensors of both conventions is invalid input.
std::vector<OtherModule> other_modules(const OtherTree& tree,
                                       const std::function<bool(std::string_view key)>& src_has_key);

}  // namespace mx2nv

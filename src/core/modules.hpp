// Quantized modules of a checkpoint: every `M.weight_packed` + `M.weight_scale`
// pair, checked for shape and dtype, and the gate/up pairs that must share
// one global scale because vLLM's fused MoE applies the gate's global to both.
#pragma once

#include "core/safetensors.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace mx2nv {

inline constexpr std::string_view kPackedSuffix = ".weight_packed";
inline constexpr std::string_view kScaleSuffix = ".weight_scale";
inline constexpr std::string_view kGlobalSuffix = ".weight_global_scale";
inline constexpr std::uint64_t kMxGroup = 32;       // values per MXFP4 scale
inline constexpr std::uint64_t kGroupBytes = kMxGroup / 2;  // packed bytes per 32-group

struct ShardTensors {
  std::string file;  // shard file name relative to the checkpoint
  const ShardHeader* header = nullptr;
};

struct QuantModule {
  std::string name;           // M
  std::size_t packed_shard = 0;
  std::size_t scale_shard = 0;  // the global scale is written to this shard too
  TensorInfo packed;          // U8 [N, K/2]
  TensorInfo scale;           // U8 or F8_E8M0 [N, K/32]
  std::uint64_t rows = 0;     // N
  std::uint64_t groups = 0;   // K/32 per row
  std::size_t scale_group = 0;  // index into ModuleSet::scale_groups
  std::uint64_t group_count() const { return rows * groups; }
};

struct ModuleSet {
  std::vector<QuantModule> modules;                     // sorted by name
  std::vector<std::vector<std::size_t>> scale_groups;   // modules sharing one global
  std::unordered_map<std::string, std::size_t> by_name;
  // The module whose `suffix` tensor (kPackedSuffix, kScaleSuffix, ...) `tensor` is.
  std::optional<std::size_t> module_of(std::string_view tensor, std::string_view suffix) const;
  // Names of all tensors that belong to a module (packed or scale).
  bool is_module_tensor(const std::string& tensor) const;
};

// The name of M's gate/up partner (w1<->w3, gate_proj<->up_proj), or "".
std::string gate_up_partner(const std::string& module);

// Throws Error(InvalidInput) naming the tensor on any inconsistency.
ModuleSet discover_modules(const std::vector<ShardTensors>& shards);

}  // namespace mx2nv

// The layout of one output shard: the source's tensors in the source's header
// order and byte order, with each module's weight_scale retyped to F8_E4M3
// [N, K/16] and its weight_global_scale (F32 [1]) inserted right after it.
// A pure function of the source header, so the plan can predict sizes and
// every writer produces the same bytes.
#pragma once

#include "core/modules.hpp"
#include "core/safetensors.hpp"

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace mx2nv {

enum class TensorRole { PassThrough, Packed, Scale, Global };

struct TargetTensor {
  TensorInfo info;               // offsets in the target shard
  TensorRole role = TensorRole::PassThrough;
  std::size_t source = 0;        // index into the source header's tensors (not for Global)
  std::size_t module = 0;        // index into ModuleSet::modules (Packed, Scale, Global)
};

struct TargetLayout {
  std::vector<TargetTensor> tensors;     // header order
  std::vector<std::size_t> data_order;   // indices into tensors, by offset
  std::uint64_t data_size = 0;
  std::optional<std::map<std::string, std::string>> metadata;
};

TargetLayout make_target_layout(const ShardHeader& source, std::size_t shard, const ModuleSet& modules);

}  // namespace mx2nv

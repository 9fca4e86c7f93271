// The routed experts of an NVFP4 checkpoint as gate reads them: a compact
// table built while the shard headers stream by (open_checkpoint's visitor),
// one fixed record per expert module (where its three tensors are, their
// dtypes and first two dimensions, what the scan finds) plus its name's
// bytes, so memory follows the module count, not every tensor's name, and no
// header is kept. Modules are found by parse_expert_module
// (model/module_names.hpp); a module is a weight_packed.
#pragma once

#include "model/target_format.hpp"

#include "gate/rules.hpp"
#include "safetensors/header.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace mx2nv {

struct ExpertName;

inline constexpr std::uint32_t kNoModule = std::numeric_limits<std::uint32_t>::max();

enum Role : std::uint8_t { W1, W3, W2 };

// Where one tensor of an NVFP4 expert module lives, and the header facts gate
// checks: fixed size, no name (the module's name and the suffix give it), so
// what stays after the headers are dropped is a few words per tensor.
struct ExpertTensor {
  std::uint64_t start = 0;  // absolute offset in the shard file
  std::uint64_t nbytes = 0;
  std::array<std::uint64_t, 2> dims{};  // the first two dimensions
  std::uint32_t shard = 0;
  Dtype dtype = Dtype::U8;
  std::uint8_t rank = 0;
  bool present = false;
};

struct ExpertModule {
  std::uint64_t name_at = 0;  // in Experts::names
  std::uint32_t name_size = 0;
  std::uint32_t layer = 0;
  Role role = W1;
  ExpertTensor packed, scale, global;
  std::uint64_t rows = 0, blocks = 0;  // N, K/16
  // Filled by the scan.
  float global_value = 0;  // as stored: a divisor (compressed-tensors) or a multiplier (ModelOpt)
  double max_scale = 0;
  std::uint64_t suspects = 0;  // blocks with 0 < scale < 2^-6 (active or not)
  std::uint64_t negative = 0;
};

struct ExpertLayer {
  std::string prefix;
  std::array<std::string, 3> names;  // the checkpoint's gate, up, down projection names
  std::map<std::uint64_t, std::array<std::uint32_t, 3>> experts;  // expert -> module index per role
};

// Module names, appended into chunks that never move (no copy of all names
// while one grows): a name is a chunk and an offset.
class NameChunks {
 public:
  std::uint64_t add(std::string_view name) {
    if (chunks_.empty() || chunks_.back().size() + name.size() > chunks_.back().capacity()) {
      chunks_.emplace_back().reserve(std::max(kChunkBytes, name.size()));
    }
    const std::uint64_t at = (static_cast<std::uint64_t>(chunks_.size() - 1) << 32) | chunks_.back().size();
    chunks_.back() += name;
    return at;
  }
  std::string_view get(std::uint64_t at, std::size_t size) const {
    return std::string_view(chunks_[static_cast<std::size_t>(at >> 32)]).substr(at & 0xFFFFFFFFu, size);
  }

 private:
  static constexpr std::size_t kChunkBytes = 1 << 20;
  std::vector<std::string> chunks_;
};

// The routed experts among the NVFP4 modules (parse_expert_module), built as
// the headers stream by: a fixed record per module plus its name's bytes
// (a deque: no module is copied while it grows).
struct Experts {
  TargetFormat format = TargetFormat::CompressedTensors;  // whose names the modules were found under
  NameChunks names;
  std::deque<ExpertModule> modules;
  std::vector<ExpertLayer> layers;  // sorted by prefix once complete
  std::string_view name(const ExpertModule& m) const { return names.get(m.name_at, m.name_size); }
};

// Collects the experts' tensors from each header as it streams by; only
// what gate reads later is kept.
class ExpertCollector {
 public:
  // Collects the modules of `format`'s names (a ModelOpt packed `weight` is
  // U8; a BF16 `weight` is no NVFP4 module's).
  explicit ExpertCollector(TargetFormat format = TargetFormat::CompressedTensors) { x_.format = format; }
  // Called once per shard header (never concurrently).
  void add(std::size_t shard, const ShardHeader& header);
  Experts finish();

 private:
  ExpertModule& module_for(std::string_view base, const ExpertName& parsed);
  Experts x_;
  std::map<std::string, std::size_t, std::less<>> layer_index_;  // prefix -> index in x_.layers
};

// Every module holds NVFP4 tensors: weight_packed U8 [N, K/2], weight_scale
// F8_E4M3 [N, K/16], weight_global_scale F32 with one value (ModelOpt:
// weight, weight_scale, weight_scale_2) (else Error(InvalidInput)); fills
// each module's rows and blocks.
void check_nvfp4(Experts& x);

inline const ExpertModule& module_at(const Experts& x, const std::array<std::uint32_t, 3>& slots, Role r) {
  return x.modules[slots[r]];
}

// Dimensions: one shape for every layer and expert, each expert complete
// (else Error(InvalidInput)).
MoeDims expert_dims(const Experts& x);

// Every module in a fixed order (layers by prefix, experts by number, then
// w1, w3, w2), whatever order the headers streamed by in: the modules named
// as examples are the same on every run.
template <typename Fn>
void for_each_module(const Experts& x, Fn&& fn) {
  for (const auto& layer : x.layers) {
    for (const auto& [e, slots] : layer.experts) {
      for (const Role r : {W1, W3, W2}) fn(module_at(x, slots, r));
    }
  }
}

}  // namespace mx2nv

// Quantized modules of a checkpoint: every `M.weight_packed` + `M.weight_scale`
// pair, checked for shape and dtype, and the gate/up pairs that must share
// one global scale because vLLM's fused MoE applies the gate's global to both.
//
// Names. A module name M is the tensor name minus the suffix and must not be
// empty: a tensor named just ".weight_packed" is refused (exit 3), since no
// loader can attach it to a layer. Gate/up partners are `P.w1` <-> `P.w3` and
// `P.gate_proj` <-> `P.up_proj` with the same non-empty parent P
// (gate_up_partner, model/module_names.hpp); nothing else is ever paired, so
// a module never shares a global across parents.
//
// Scale: a large MoE checkpoint has hundreds of thousands of modules, so a
// module's record is small and fixed. Discovery sees one shard header at a
// time (ModuleCollector) and keeps, per module, its name and where its two
// tensors are, not the headers. Each module name is stored once (the set's
// NameArena) and viewed from its record.
#pragma once

#include "safetensors/dtype.hpp"
#include "safetensors/header.hpp"
#include "safetensors/name_table.hpp"

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mx2nv {

inline constexpr std::string_view kPackedSuffix = ".weight_packed";
inline constexpr std::string_view kScaleSuffix = ".weight_scale";
inline constexpr std::string_view kGlobalSuffix = ".weight_global_scale";
inline constexpr std::string_view kBf16WeightSuffix = ".weight";  // a module written dequantized (--overspan bf16)
inline constexpr std::uint64_t kMxGroup = 32;       // values per MXFP4 scale
inline constexpr std::uint64_t kNvGroup = 16;       // values per NVFP4 scale
inline constexpr std::uint64_t kGroupBytes = kMxGroup / 2;  // packed bytes per 32-group
inline constexpr std::uint64_t kNvScalesPerMxScale = kMxGroup / kNvGroup;

// Where a tensor's bytes are in its shard's data section, and its dtype.
struct TensorExtent {
  Dtype dtype = Dtype::U8;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::uint64_t nbytes() const { return end - begin; }
};

struct QuantModule {
  std::string_view name;      // M; its bytes live in the ModuleSet's names (or a literal)
  std::size_t packed_shard = 0;
  std::size_t scale_shard = 0;  // the global scale is written to this shard too
  TensorExtent packed;        // U8 [N, K/2]
  TensorExtent scale;         // U8 or F8_E8M0 [N, K/32]
  std::uint64_t rows = 0;     // N
  std::uint64_t groups = 0;   // K/32 per row
  std::size_t scale_group = 0;  // index into ModuleSet::scale_groups
  std::uint64_t group_count() const { return rows * groups; }
  std::string packed_name() const { return std::string(name) + std::string(kPackedSuffix); }
  std::string scale_name() const { return std::string(name) + std::string(kScaleSuffix); }
  std::string global_name() const { return std::string(name) + std::string(kGlobalSuffix); }
  std::vector<std::uint64_t> packed_shape() const { return {rows, groups * kGroupBytes}; }
  std::vector<std::uint64_t> target_scale_shape() const { return {rows, groups * kNvScalesPerMxScale}; }
};

// Modules sharing one global: a gate/up pair or a lone module, so at most
// two, held inline (no allocation per group).
class ScaleGroup {
 public:
  ScaleGroup() = default;
  ScaleGroup(std::initializer_list<std::size_t> members);
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::size_t operator[](std::size_t i) const { return members_[i]; }
  const std::size_t* begin() const { return members_; }
  const std::size_t* end() const { return members_ + size_; }
  void push_back(std::size_t module);  // at most two members

 private:
  std::size_t members_[2] = {0, 0};
  std::size_t size_ = 0;
};

struct ModuleSet {
  std::vector<QuantModule> modules;                     // sorted by name
  std::vector<ScaleGroup> scale_groups;                 // modules sharing one global
  NameArena names;  // the bytes of the modules' names (only views are kept per module)
  std::optional<std::size_t> find(std::string_view module) const;  // binary search by name
  // The same, trying modules hint..hint+2 first: in name order a module's
  // neighbours are its siblings (w1, w2, w3), and shard headers list modules
  // in about name order.
  std::optional<std::size_t> find_near(std::string_view module, std::size_t hint) const;
  // The module whose `suffix` tensor (kPackedSuffix, kScaleSuffix, ...) `tensor` is.
  std::optional<std::size_t> module_of(std::string_view tensor, std::string_view suffix) const;
  // Names of all tensors that belong to a module (packed or scale).
  bool is_module_tensor(std::string_view tensor) const;
};

// Whether a's packed tensor lies before b's (shard, then offset), and the
// modules' indices in that order: passes that read every module visit them
// so, each file read front to back where the kernel's readahead serves it.
bool before_in_file(const QuantModule& a, const QuantModule& b);
std::vector<std::size_t> modules_in_file_order(const ModuleSet& set);

// Collects module tensors shard by shard; finish() validates and pairs.
// Throws Error(InvalidInput) naming the file and tensor on any inconsistency.
class ModuleCollector {
 public:
  // `file` names the shard in messages; shards are numbered by the caller.
  void add_shard(std::size_t shard, std::string_view file, const ShardHeader& header);
  // Room for `modules` records up front (the index's packed tensors), so the
  // table is not grown by doubling (which holds up to twice its size).
  void reserve(std::size_t modules);
  ModuleSet finish() &&;

 private:
  // What finish() checks that the module itself does not keep: the scale's
  // shape and which halves were seen. The module record is built in place
  // (groups holds the packed row length until finish() checks it), so
  // collecting needs no second copy of the module table.
  struct Pending {
    std::uint64_t scale_dims[2] = {0, 0};
    bool packed = false, scale = false;
  };
  struct Clash {  // a tensor M.<suffix> that an MXFP4 weight-only module must not have
    std::string module, suffix;
    std::uint32_t shard = 0;
  };
  void add_half(std::size_t shard, std::string_view file, const TensorInfo& t, std::string_view suffix);

  NameTable names_;
  std::vector<QuantModule> modules_;  // parallel to names_ (ids), names viewed in names_
  std::vector<Pending> pending_;      // parallel to names_
  std::vector<std::string> files_;
  std::vector<Clash> clashes_;
};

struct ShardTensors {
  std::string file;  // shard file name relative to the checkpoint
  const ShardHeader* header = nullptr;
};

// All shards at once (tests, small checkpoints): a ModuleCollector over them.
ModuleSet discover_modules(const std::vector<ShardTensors>& shards);

}  // namespace mx2nv

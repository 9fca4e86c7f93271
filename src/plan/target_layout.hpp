// The layout of one output shard, a pure function of the source header, so
// the plan can predict sizes and every writer produces the same bytes.
//
// Header order (the JSON keys) is the source's, each module's weight_scale
// retyped to F8_E4M3 [N, K/16] and its weight_global_scale (F32 [1]) inserted
// right after it.
//
// Byte order (the data section) is chosen so the unchanged bytes can be
// shared with SRC instead of copied (reflink, README "Zero-copy output"):
// every unchanged tensor (packed FP4 codes, pass-through tensors) is placed
// at the same file offset modulo kShareBlock as in its source shard whenever
// the safetensors rules allow it. safetensors demands that the tensors tile
// the data section with no gap, so the only free space is the header's
// trailing-space padding: it sets the residue of the data start, and the
// order of the tensors does the rest.
//   1. The unchanged tensors first, in source order, contiguous.
//   2. Then the changed tensors in source order, each scale followed by its
//      global.
//   3. The header is padded with spaces (fewer than kShareBlock) so the data
//      section starts where the most whole source blocks line up.
// When the changed tensors between two unchanged ones in SRC add up to a
// multiple of kShareBlock, every unchanged tensor is aligned. That holds for
// every real MoE shape (a scale is N*K/32 bytes: 458752 for K3's 2048x7168
// experts, 112 blocks), so there every unchanged byte outside a tensor's
// first and last partial block can be shared. For shapes where it does not
// hold (tiny test models, K*N not a multiple of 2^17), only the tensors of the
// best residue class are aligned; the others are copied, never wrong.
#pragma once

#include "model/modules.hpp"
#include "plan/plan.hpp"
#include "safetensors/header.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace mx2nv {

// The alignment unit: the block size of XFS, btrfs, ext4 and most file
// systems on 4 KiB-page machines, and a multiple of every O_DIRECT/GDS
// alignment requirement. A constant, not the destination's block size, so the
// output bytes do not depend on where they are written.
inline constexpr std::uint64_t kShareBlock = 4096;

// Requantized: the packed codes of a module convert --overspan requantize
// recomputes. Bf16Weight: the `weight` [N, K] of a module written dequantized
// (--overspan bf16), in its packed tensor's place; its scale and global are
// not written.
enum class TensorRole { PassThrough, Packed, Scale, Global, Requantized, Bf16Weight };

// Unchanged tensors are copied (or shared) byte for byte from SRC.
constexpr bool is_unchanged(TensorRole role) { return role == TensorRole::PassThrough || role == TensorRole::Packed; }

struct TargetTensor {
  TensorInfo info;               // offsets in the target shard's data section
  TensorRole role = TensorRole::PassThrough;
  std::size_t source = 0;        // index into the source header's tensors (not for Global)
  std::size_t module = 0;        // index into ModuleSet::modules (Packed, Scale, Global)
  bool aligned = false;          // unchanged and at its source offset modulo kShareBlock
};

struct TargetLayout {
  std::vector<TargetTensor> tensors;     // header order
  std::vector<std::size_t> data_order;   // indices into tensors, by offset
  std::uint64_t data_size = 0;
  // The data section's start modulo `data_start_modulus` (header padding).
  std::uint64_t data_start_residue = 0;
  std::uint64_t data_start_modulus = 8;
  std::optional<std::map<std::string, std::string>> metadata;
};

// `plan` (parallel to modules.modules, or empty: every module exact) says
// which modules are requantized or written as BF16; `format` names the
// packed tensor and the second-level scale (model/target_format.hpp). A
// source tensor that already bears a name the layout gives is refused.
TargetLayout make_target_layout(const ShardHeader& source, std::size_t shard, const ModuleSet& modules,
                                std::span<const ModulePlan> plan = {},
                                TargetFormat format = TargetFormat::CompressedTensors);
// The layout `plan` writes: as above for a conversion; for a requantize plan
// (PlanKind::Requantize) the exact layout with every packed tensor
// Requantized in its place (the bytes `mx2nv requantize` has always written:
// nothing of a module is unchanged, so placing them for sharing gains nothing
// and would move every byte).
TargetLayout make_target_layout(const ShardHeader& source, std::size_t shard, const ModuleSet& modules,
                                const Plan& plan);

// The order a writer takes the target's tensors in (positions in
// data_order) to read its source shard once, front to back, as `cp` reads
// it: by source offset. Taken in data_order, the changed tensors after all
// unchanged ones, the source would be read twice over (its unchanged bytes,
// then each scale again), and a scale read ahead with its neighbours would
// have been evicted from a small page cache before its turn. The target is
// then written in two ascending runs. It is the merge of data_order's two
// parts (unchanged, changed) by source offset, so each part keeps its own
// order: a writer hashes the new bytes in data_order's order whatever the
// parts hold (a requantize layout's changed part is its packed tensors, then
// its scales). A global takes its scale's place, right after it.
std::vector<std::size_t> source_read_order(const ShardHeader& source, const TargetLayout& layout);

// What the layouts of all shards add up to, from the module table alone (the
// data section tiles with no gap, so only the tensors count): the source's
// tensor bytes plus, per module, the second half of its scale (E4M3
// [N, K/16] replaces E8M0 [N, K/32]) and a 4-byte global; every tensor but
// a module's two is passed through. Equal to summing make_target_layout over
// the shards (tested), without reading a header again (inspect reads no
// header twice).
struct TargetTotals {
  std::uint64_t tensor_bytes = 0;
  std::uint64_t passthrough_tensors = 0;
};
TargetTotals target_totals(std::uint64_t source_tensor_bytes, std::uint64_t source_tensors, const ModuleSet& modules);

// The target shard's header bytes (length prefix, JSON, padding).
std::string serialize_target_header(const TargetLayout& layout);

}  // namespace mx2nv

#include "plan/target_layout.hpp"

#include "common/checked.hpp"
#include "common/error.hpp"

#include <algorithm>
#include <optional>
#include <string_view>
#include <unordered_map>

namespace mx2nv {
namespace {

// Header order: the source's, a global following its module's scale.
// position_of_source[i] is where source tensor i went.
constexpr std::size_t kDropped = static_cast<std::size_t>(-1);

// ModuleSet::module_of with a guess: a shard's tensors mostly come in the
// modules' name order (a module's packed and scale tensors, then the next
// module's), so the module found last, or the one after it, is tried before
// a binary search over all of them (one lookup per tensor of every shard).
class ModuleLookup {
 public:
  explicit ModuleLookup(const ModuleSet& modules) : modules_(modules) {}
  std::optional<std::size_t> of(std::string_view tensor, std::string_view suffix) {
    if (!tensor.ends_with(suffix)) return std::nullopt;
    const auto found = modules_.find_near(tensor.substr(0, tensor.size() - suffix.size()), last_);
    if (found) last_ = *found;
    return found;
  }

 private:
  const ModuleSet& modules_;
  std::size_t last_ = 0;
};

void build_header_order(TargetLayout& layout, const ShardHeader& source, std::size_t shard, const ModuleSet& modules,
                        std::span<const ModulePlan> plan, TargetFormat format,
                        std::vector<std::size_t>& position_of_source) {
  const FormatNames& names = format_names(format);
  const auto treatment = [&](std::size_t m) { return plan.empty() ? Treatment::Exact : plan[m].treatment; };
  const auto& src = source.tensors();
  position_of_source.resize(src.size());
  ModuleLookup lookup(modules);
  for (std::size_t i = 0; i < src.size(); ++i) {
    TargetTensor t;
    t.info = src[i];
    t.source = i;
    if (const auto m = lookup.of(src[i].name, kPackedSuffix)) {
      t.role = TensorRole::Packed;
      t.module = *m;
      if (treatment(*m) == Treatment::Requantized) t.role = TensorRole::Requantized;
      if (names.packed != kPackedSuffix && treatment(*m) != Treatment::Bf16) {
        t.info.name = std::string(modules.modules[*m].name) + std::string(names.packed);
        if (source.find(t.info.name) != nullptr) {
          fail_input("tensor \"{}\" exists beside a quantized module of that name (it would be the module's {} weight)",
                     t.info.name, choice_name(format));
        }
      }
      if (treatment(*m) == Treatment::Bf16) {
        t.role = TensorRole::Bf16Weight;
        t.info.name = std::string(modules.modules[*m].name) + std::string(kBf16WeightSuffix);
        if (source.find(t.info.name) != nullptr) fail_input("tensor \"{}\" exists beside a quantized module of that name", t.info.name);
        t.info.dtype = Dtype::BF16;
        t.info.shape = {modules.modules[*m].rows, modules.modules[*m].groups * 32};
      }
    } else if (const auto ms = lookup.of(src[i].name, kScaleSuffix); ms && treatment(*ms) == Treatment::Bf16) {
      position_of_source[i] = kDropped;  // a BF16 module has no scales
      continue;
    } else if (ms && modules.modules[*ms].scale_shard == shard) {
      t.role = TensorRole::Scale;
      t.module = *ms;
      t.info.dtype = Dtype::F8_E4M3;
      t.info.shape = {modules.modules[*ms].rows, modules.modules[*ms].groups * 2};
    }
    position_of_source[i] = layout.tensors.size();
    layout.tensors.push_back(t);
    if (t.role == TensorRole::Scale) {
      TargetTensor g;
      g.role = TensorRole::Global;
      g.module = t.module;
      g.info.name = std::string(modules.modules[t.module].name) + std::string(names.global);
      if (source.find(g.info.name) != nullptr) fail_input("tensor \"{}\" exists beside a quantized module", g.info.name);
      g.info.dtype = Dtype::F32;
      g.info.shape = names.global_shape;
      layout.tensors.push_back(g);
    }
  }
}

}  // namespace

TargetLayout make_target_layout(const ShardHeader& source, std::size_t shard, const ModuleSet& modules,
                                std::span<const ModulePlan> plan, TargetFormat format) {
  TargetLayout layout;
  layout.metadata = source.metadata();
  std::vector<std::size_t> position_of_source;
  build_header_order(layout, source, shard, modules, plan, format, position_of_source);

  std::uint64_t cursor = 0;
  const auto place = [&](std::size_t index) {
    TargetTensor& t = layout.tensors[index];
    const auto nbytes = tensor_nbytes(t.info.dtype, t.info.shape);
    const auto end = nbytes ? checked_add(cursor, *nbytes) : std::nullopt;
    if (!end) fail_input("tensor \"{}\": target size overflows", t.info.name);
    t.info.begin = cursor;
    t.info.end = *end;
    cursor = *end;
    layout.data_order.push_back(index);
  };

  // 1. Unchanged tensors in source order, contiguous.
  // Source offsets are within the validated file size: no overflow.
  const auto& src = source.tensors();
  const auto source_offset = [&](std::size_t index) {
    return source.data_start() + src[layout.tensors[index].source].begin;
  };
  const std::vector<std::size_t> offset_order = source.offset_order();
  std::vector<std::size_t> unchanged;  // target indices
  for (const std::size_t i : offset_order) {
    if (position_of_source[i] != kDropped && is_unchanged(layout.tensors[position_of_source[i]].role)) {
      unchanged.push_back(position_of_source[i]);
      place(unchanged.back());
    }
  }
  // The data start residue: the one under which the most whole source
  // blocks line up (all of them when the changed tensors between unchanged
  // ones fill whole blocks); of equals, the one that got there first.
  if (!unchanged.empty()) {
    std::unordered_map<std::uint64_t, std::uint64_t> blocks_by_residue;
    std::optional<std::uint64_t> best;
    for (const std::size_t index : unchanged) {
      const TargetTensor& t = layout.tensors[index];
      const std::uint64_t from = source_offset(index);
      const std::uint64_t first_block = (from + kShareBlock - 1) / kShareBlock;
      const std::uint64_t end_block = (from + t.info.nbytes()) / kShareBlock;
      const std::uint64_t residue = (from % kShareBlock + kShareBlock - t.info.begin % kShareBlock) % kShareBlock;
      std::uint64_t& blocks = blocks_by_residue[residue];
      blocks += end_block > first_block ? end_block - first_block : 0;
      if (!best || blocks > blocks_by_residue[*best]) best = residue;
    }
    layout.data_start_modulus = kShareBlock;
    layout.data_start_residue = *best;
    for (const std::size_t index : unchanged) {
      TargetTensor& t = layout.tensors[index];
      t.aligned = (layout.data_start_residue + t.info.begin) % kShareBlock == source_offset(index) % kShareBlock;
    }
  }
  // 2. Changed tensors in source order, each global right after its scale.
  for (const std::size_t i : offset_order) {
    const std::size_t index = position_of_source[i];
    if (index == kDropped || is_unchanged(layout.tensors[index].role)) continue;
    place(index);
    if (layout.tensors[index].role == TensorRole::Scale) place(index + 1);
  }
  layout.data_size = cursor;
  return layout;
}

TargetLayout make_target_layout(const ShardHeader& source, std::size_t shard, const ModuleSet& modules,
                                const Plan& plan) {
  if (plan.kind == PlanKind::Convert) return make_target_layout(source, shard, modules, plan.modules, plan.format);
  TargetLayout layout = make_target_layout(source, shard, modules, {}, plan.format);
  for (TargetTensor& t : layout.tensors) {
    if (t.role != TensorRole::Packed) continue;
    t.role = TensorRole::Requantized;
    t.aligned = false;  // written, never shared
  }
  return layout;
}

std::vector<std::size_t> source_read_order(const ShardHeader& source, const TargetLayout& layout) {
  const auto& sources = source.tensors();
  const std::size_t n = layout.data_order.size();
  std::vector<std::uint64_t> key(n);
  std::vector<std::size_t> unchanged, changed;
  for (std::size_t i = 0; i < n; ++i) {
    const TargetTensor& t = layout.tensors[layout.data_order[i]];
    key[i] = t.role == TensorRole::Global && i > 0 ? key[i - 1] : sources[t.source].begin;
    (is_unchanged(t.role) ? unchanged : changed).push_back(i);
  }
  // Merged by hand: std::merge asks for sorted inputs, and the changed part
  // need not be (a requantize layout's); each part keeps its order here.
  std::vector<std::size_t> order;
  order.reserve(n);
  std::size_t u = 0, c = 0;
  while (u < unchanged.size() || c < changed.size()) {
    const bool take_changed = c < changed.size() && (u == unchanged.size() || key[changed[c]] < key[unchanged[u]]);
    order.push_back(take_changed ? changed[c++] : unchanged[u++]);
  }
  return order;
}

TargetTotals target_totals(std::uint64_t source_tensor_bytes, std::uint64_t source_tensors, const ModuleSet& modules) {
  constexpr std::uint64_t kGlobalBytes = 4;  // F32 [1]
  TargetTotals totals{source_tensor_bytes, 0};
  for (const QuantModule& m : modules.modules) {
    // Scale bytes are within a validated file, global bytes are 4: no overflow
    // short of 2^64 bytes of files, checked all the same.
    const auto grown = checked_add(totals.tensor_bytes, m.group_count() * (kNvScalesPerMxScale - 1));
    const auto with_global = grown ? checked_add(*grown, kGlobalBytes) : std::nullopt;
    if (!with_global) fail_input("module \"{}\": target size overflows", m.name);
    totals.tensor_bytes = *with_global;
  }
  const std::uint64_t module_tensors = 2 * static_cast<std::uint64_t>(modules.modules.size());
  if (module_tensors > source_tensors) fail_input("{} module tensors among {} tensors", module_tensors, source_tensors);
  totals.passthrough_tensors = source_tensors - module_tensors;
  return totals;
}

std::string serialize_target_header(const TargetLayout& layout) {
  std::vector<TensorInfo> header_order;
  header_order.reserve(layout.tensors.size());
  std::uint64_t name_bytes = 0;
  for (const auto& t : layout.tensors) {
    header_order.push_back(t.info);
    name_bytes += t.info.name.size();
  }
  std::string header =
      serialize_header(layout.metadata, header_order, layout.data_start_modulus, layout.data_start_residue);
  // The converted shard must be readable under the rules its source passed
  // (verify and --resume read it back): a global per module and doubled
  // scale shapes can push a header near a cap over it.
  if (header.size() - kHeaderLengthBytes > kMaxHeaderBytes || header_order.size() > kMaxTensorsPerShard ||
      name_bytes > kMaxShardNameBytes) {
    fail_input("converted shard header would hold {} tensors, {} bytes of names and {} bytes in all, over the limits "
               "every reader applies ({} tensors, {} bytes of names, {} bytes)",
               header_order.size(), name_bytes, header.size() - kHeaderLengthBytes, kMaxTensorsPerShard,
               kMaxShardNameBytes, kMaxHeaderBytes);
  }
  return header;
}

}  // namespace mx2nv

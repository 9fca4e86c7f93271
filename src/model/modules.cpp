#include "model/modules.hpp"

#include "common/checked.hpp"
#include "common/error.hpp"
#include "model/module_names.hpp"
#include "json/strict_json.hpp"

#include <algorithm>
#include <stdexcept>
#include <tuple>

namespace mx2nv {
namespace {

// Tensors an MXFP4 weight-only module cannot already have.
constexpr std::string_view kClashSuffixes[] = {kGlobalSuffix, ".weight_zero_point", ".input_global_scale",
                                               ".weight_scale_2", ".input_scale"};

std::string shape_text(std::span<const std::uint64_t> shape) {
  return Json(std::vector<std::uint64_t>(shape.begin(), shape.end())).dump();
}

}  // namespace

ScaleGroup::ScaleGroup(std::initializer_list<std::size_t> members) {
  for (const std::size_t m : members) push_back(m);
}

void ScaleGroup::push_back(std::size_t module) {
  if (size_ == 2) throw std::logic_error("a scale group has at most two modules");
  members_[size_++] = module;
}

std::optional<std::size_t> ModuleSet::find(std::string_view module) const {
  const auto it = std::lower_bound(modules.begin(), modules.end(), module,
                                   [](const QuantModule& m, std::string_view n) { return m.name < n; });
  if (it == modules.end() || it->name != module) return std::nullopt;
  return static_cast<std::size_t>(it - modules.begin());
}

std::optional<std::size_t> ModuleSet::find_near(std::string_view module, std::size_t hint) const {
  for (std::size_t k = hint; k < modules.size() && k <= hint + 2; ++k) {
    if (modules[k].name == module) return k;
  }
  return find(module);
}

std::optional<std::size_t> ModuleSet::module_of(std::string_view tensor, std::string_view suffix) const {
  if (!tensor.ends_with(suffix)) return std::nullopt;
  return find(tensor.substr(0, tensor.size() - suffix.size()));
}

bool ModuleSet::is_module_tensor(std::string_view tensor) const {
  return module_of(tensor, kPackedSuffix) || module_of(tensor, kScaleSuffix);
}

void ModuleCollector::add_half(std::size_t shard, std::string_view file, const TensorInfo& t,
                               std::string_view suffix) {
  const std::string_view module = std::string_view(t.name).substr(0, t.name.size() - suffix.size());
  if (module.empty()) {
    fail_input("{}: tensor \"{}\" has an empty module name; a quantized weight must belong to a named module", file,
               t.name);
  }
  const bool packed = suffix == kPackedSuffix;
  if (packed && (t.dtype != Dtype::U8 || t.shape.size() != 2)) {
    fail_input("{}: \"{}\" is {} {}, expected U8 [N, K/2]", file, t.name, dtype_name(t.dtype), shape_text(t.shape));
  }
  if (!packed && ((t.dtype != Dtype::U8 && t.dtype != Dtype::F8_E8M0) || t.shape.size() != 2)) {
    fail_input("{}: \"{}\" is {} {}, expected U8 (E8M0) [N, K/32]", file, t.name, dtype_name(t.dtype),
               shape_text(t.shape));
  }
  const auto [id, added] = names_.insert(module);
  if (added) {
    modules_.emplace_back().name = names_.name(id);
    pending_.emplace_back();
  }
  QuantModule& m = modules_[id];
  Pending& p = pending_[id];
  if (packed ? p.packed : p.scale) fail_input("{}: tensor \"{}\" appears twice", file, t.name);
  if (packed) {
    p.packed = true;
    m.packed_shard = shard;
    m.packed = {t.dtype, t.begin, t.end};
    m.rows = t.shape[0];
    m.groups = t.shape[1];  // the packed row length; finish() checks it and divides
  } else {
    p.scale = true;
    m.scale_shard = shard;
    m.scale = {t.dtype, t.begin, t.end};
    p.scale_dims[0] = t.shape[0];
    p.scale_dims[1] = t.shape[1];
  }
}

void ModuleCollector::reserve(std::size_t modules) {
  modules_.reserve(modules);
  pending_.reserve(modules);
}

void ModuleCollector::add_shard(std::size_t shard, std::string_view file, const ShardHeader& header) {
  if (files_.size() <= shard) files_.resize(shard + 1);
  files_[shard] = std::string(file);
  for (const TensorInfo& t : header.tensors()) {
    if (t.name.ends_with(kPackedSuffix)) {
      add_half(shard, file, t, kPackedSuffix);
    } else if (t.name.ends_with(kScaleSuffix)) {
      add_half(shard, file, t, kScaleSuffix);
    } else {
      for (const std::string_view suffix : kClashSuffixes) {
        if (t.name.ends_with(suffix)) {
          clashes_.push_back({t.name.substr(0, t.name.size() - suffix.size()), std::string(suffix.substr(1)),
                              static_cast<std::uint32_t>(shard)});
        }
      }
    }
  }
}

ModuleSet ModuleCollector::finish() && {
  const std::vector<NameTable::Id> order = names_.sorted_ids();
  // Checked in name order, so the first error reported does not depend on
  // the order shards were read in.
  for (const NameTable::Id id : order) {
    const std::string_view name = names_.name(id);
    QuantModule& m = modules_[id];
    const Pending& p = pending_[id];
    if (!p.packed) {
      fail_input("{}: \"{}{}\" has no \"{}{}\"", files_[m.scale_shard], name, kScaleSuffix, name, kPackedSuffix);
    }
    if (!p.scale) {
      fail_input("{}: \"{}{}\" has no \"{}{}\"", files_[m.packed_shard], name, kPackedSuffix, name, kScaleSuffix);
    }
    const std::string& pf = files_[m.packed_shard];
    const std::string& sf = files_[m.scale_shard];
    const std::uint64_t packed_dims[2] = {m.rows, m.groups};
    const std::uint64_t packed_cols = m.groups;
    if (packed_cols % kGroupBytes != 0) {
      fail_input("{}: \"{}{}\" has K = {} values per row, not a multiple of {}", pf, name, kPackedSuffix,
                 checked_mul(packed_cols, 2).value_or(0), kMxGroup);
    }
    const std::uint64_t groups = packed_cols / kGroupBytes;
    if (p.scale_dims[0] != m.rows || p.scale_dims[1] != groups) {
      fail_input("{}: \"{}{}\" is {} but \"{}{}\" {} needs [{}, {}]", sf, name, kScaleSuffix,
                 shape_text(p.scale_dims), name, kPackedSuffix, shape_text(packed_dims), m.rows, groups);
    }
    m.groups = groups;
  }
  pending_ = std::vector<Pending>();
  // The records into name order in place (following the permutation's
  // cycles): no second vector of modules.
  std::vector<bool> placed(order.size(), false);
  for (std::size_t i = 0; i < order.size(); ++i) {
    if (placed[i]) continue;
    QuantModule first = modules_[i];
    std::size_t j = i;
    while (order[j] != i) {
      modules_[j] = modules_[order[j]];
      placed[j] = true;
      j = order[j];
    }
    modules_[j] = first;
    placed[j] = true;
  }
  ModuleSet set;
  set.modules = std::move(modules_);
  set.names = std::move(names_).take_names();  // the views stay valid; the lookup table goes
  for (const Clash& c : clashes_) {
    if (set.find(c.module)) {
      fail_input("{}: module \"{}\" already has \"{}\"; this is not an MXFP4 weight-only module", files_[c.shard],
                 c.module, c.suffix);
    }
  }

  // Scale groups: a gate/up pair of one parent shares one; every other module has its own.
  std::vector<bool> assigned(set.modules.size(), false);
  for (std::size_t i = 0; i < set.modules.size(); ++i) {
    if (assigned[i]) continue;
    ScaleGroup members{i};
    const std::string partner = gate_up_partner(set.modules[i].name);
    // In name order a gate's up projection is two places on (w1, w2, w3;
    // gate_proj, up_proj): looked at before a search over all the modules.
    const auto j = partner.empty() ? std::nullopt : set.find_near(partner, i + 1);
    if (j && !assigned[*j] && *j != i) {
      members.push_back(*j);
    }
    for (const std::size_t m : members) {
      assigned[m] = true;
      set.modules[m].scale_group = set.scale_groups.size();
    }
    set.scale_groups.push_back(members);
  }
  return set;
}

ModuleSet discover_modules(const std::vector<ShardTensors>& shards) {
  ModuleCollector collector;
  for (std::size_t s = 0; s < shards.size(); ++s) collector.add_shard(s, shards[s].file, *shards[s].header);
  return std::move(collector).finish();
}

bool before_in_file(const QuantModule& a, const QuantModule& b) {
  return std::tie(a.packed_shard, a.packed.begin) < std::tie(b.packed_shard, b.packed.begin);
}

std::vector<std::size_t> modules_in_file_order(const ModuleSet& set) {
  std::vector<std::size_t> order(set.modules.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return before_in_file(set.modules[a], set.modules[b]); });
  return order;
}

}  // namespace mx2nv

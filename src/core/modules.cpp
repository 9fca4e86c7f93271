#include "core/modules.hpp"

#include "core/checked.hpp"
#include "core/error.hpp"
#include "core/strict_json.hpp"

#include <algorithm>
#include <map>

namespace mx2nv {
namespace {

std::string shape_text(const TensorInfo& t) { return Json(t.shape).dump(); }

}  // namespace

std::optional<std::size_t> ModuleSet::module_of(std::string_view tensor, std::string_view suffix) const {
  if (!tensor.ends_with(suffix)) return std::nullopt;
  const auto it = by_name.find(std::string(tensor.substr(0, tensor.size() - suffix.size())));
  if (it == by_name.end()) return std::nullopt;
  return it->second;
}

bool ModuleSet::is_module_tensor(const std::string& tensor) const {
  return module_of(tensor, kPackedSuffix) || module_of(tensor, kScaleSuffix);
}

std::string gate_up_partner(const std::string& module) {
  static const std::pair<std::string_view, std::string_view> kPairs[] = {
      {".w1", ".w3"}, {".w3", ".w1"}, {".gate_proj", ".up_proj"}, {".up_proj", ".gate_proj"}};
  for (const auto& [mine, theirs] : kPairs) {
    if (module.ends_with(mine)) return module.substr(0, module.size() - mine.size()) + std::string(theirs);
  }
  return {};
}

ModuleSet discover_modules(const std::vector<ShardTensors>& shards) {
  struct Halves {
    const TensorInfo* packed = nullptr;
    const TensorInfo* scale = nullptr;
    std::size_t packed_shard = 0, scale_shard = 0;
  };
  std::map<std::string, Halves> found;
  std::map<std::string, std::string> other;  // tensor -> shard, for collision checks
  for (std::size_t s = 0; s < shards.size(); ++s) {
    for (const TensorInfo& t : shards[s].header->tensors()) {
      if (t.name.ends_with(kPackedSuffix)) {
        auto& h = found[t.name.substr(0, t.name.size() - kPackedSuffix.size())];
        h.packed = &t;
        h.packed_shard = s;
      } else if (t.name.ends_with(kScaleSuffix)) {
        auto& h = found[t.name.substr(0, t.name.size() - kScaleSuffix.size())];
        h.scale = &t;
        h.scale_shard = s;
      } else {
        other.emplace(t.name, shards[s].file);
      }
    }
  }

  ModuleSet set;
  for (const auto& [name, h] : found) {
    if (!h.packed) fail_input("{}: \"{}{}\" has no \"{}{}\"", shards[h.scale_shard].file, name, kScaleSuffix, name, kPackedSuffix);
    if (!h.scale) fail_input("{}: \"{}{}\" has no \"{}{}\"", shards[h.packed_shard].file, name, kPackedSuffix, name, kScaleSuffix);
    const TensorInfo& p = *h.packed;
    const TensorInfo& sc = *h.scale;
    const std::string& pf = shards[h.packed_shard].file;
    const std::string& sf = shards[h.scale_shard].file;
    for (const auto suffix : {std::string_view(kGlobalSuffix), std::string_view(".weight_zero_point"),
                              std::string_view(".input_global_scale")}) {
      if (other.count(name + std::string(suffix))) {
        fail_input("{}: module \"{}\" already has \"{}\"; this is not an MXFP4 weight-only module",
                   other[name + std::string(suffix)], name, std::string(suffix).substr(1));
      }
    }
    if (p.dtype != Dtype::U8 || p.shape.size() != 2) {
      fail_input("{}: \"{}\" is {} {}, expected U8 [N, K/2]", pf, p.name, dtype_name(p.dtype), shape_text(p));
    }
    if ((sc.dtype != Dtype::U8 && sc.dtype != Dtype::F8_E8M0) || sc.shape.size() != 2) {
      fail_input("{}: \"{}\" is {} {}, expected U8 (E8M0) [N, K/32]", sf, sc.name, dtype_name(sc.dtype),
                 shape_text(sc));
    }
    const std::uint64_t rows = p.shape[0];
    const std::uint64_t packed_cols = p.shape[1];
    if (packed_cols % kGroupBytes != 0) {
      fail_input("{}: \"{}\" has K = {} values per row, not a multiple of {}", pf, p.name,
                 checked_mul(packed_cols, 2).value_or(0), kMxGroup);
    }
    const std::uint64_t groups = packed_cols / kGroupBytes;
    if (sc.shape[0] != rows || sc.shape[1] != groups) {
      fail_input("{}: \"{}\" is {} but \"{}\" {} needs [{}, {}]", sf, sc.name, shape_text(sc), p.name, shape_text(p),
                 rows, groups);
    }
    QuantModule m;
    m.name = name;
    m.packed_shard = h.packed_shard;
    m.scale_shard = h.scale_shard;
    m.packed = p;
    m.scale = sc;
    m.rows = rows;
    m.groups = groups;
    set.by_name.emplace(name, set.modules.size());
    set.modules.push_back(std::move(m));
  }

  // Scale groups: a gate/up pair shares one; every other module has its own.
  std::vector<bool> assigned(set.modules.size(), false);
  for (std::size_t i = 0; i < set.modules.size(); ++i) {
    if (assigned[i]) continue;
    std::vector<std::size_t> members{i};
    const auto partner = set.by_name.find(gate_up_partner(set.modules[i].name));
    if (partner != set.by_name.end()) members.push_back(partner->second);
    for (const std::size_t m : members) {
      assigned[m] = true;
      set.modules[m].scale_group = set.scale_groups.size();
    }
    set.scale_groups.push_back(std::move(members));
  }
  return set;
}

}  // namespace mx2nv

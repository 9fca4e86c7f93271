#include "gate/expert_table.hpp"

#include "common/error.hpp"
#include "common/printable.hpp"
#include "model/module_names.hpp"
#include "model/modules.hpp"

#include <optional>
#include <utility>

namespace mx2nv {
namespace {

Role role_of(Projection p) { return p == Projection::Gate ? W1 : p == Projection::Up ? W3 : W2; }

// Which of an NVFP4 module's tensors `name` is (0 packed, 1 scale, 2 global),
// and the module's name.
std::optional<std::pair<std::string_view, int>> nvfp4_tensor(std::string_view name, TargetFormat format) {
  const FormatNames& names = format_names(format);
  const std::string_view suffixes[] = {names.packed, names.scale, names.global};
  for (int k = 0; k < 3; ++k) {
    const std::string_view suffix = suffixes[k];
    if (name.ends_with(suffix)) return std::pair{name.substr(0, name.size() - suffix.size()), k};
  }
  return std::nullopt;
}

}  // namespace

void ExpertCollector::add(std::size_t shard, const ShardHeader& header) {
  for (const auto& t : header.tensors()) {
    const auto which = nvfp4_tensor(t.name, x_.format);
    if (!which) continue;
    if (which->second == 0 && x_.format == TargetFormat::ModelOpt && t.dtype != Dtype::U8) continue;  // a BF16 weight
    const auto parsed = parse_expert_module(which->first);
    if (!parsed) continue;
    ExpertModule& m = module_for(which->first, *parsed);
    ExpertTensor& l = which->second == 0 ? m.packed : which->second == 1 ? m.scale : m.global;
    l.start = header.data_start() + t.begin;
    l.nbytes = t.nbytes();
    l.shard = static_cast<std::uint32_t>(shard);
    l.dtype = t.dtype;
    l.rank = static_cast<std::uint8_t>(std::min<std::size_t>(t.shape.size(), 255));
    for (std::size_t d = 0; d < 2 && d < t.shape.size(); ++d) l.dims[d] = t.shape[d];
    l.present = true;
  }
}

ExpertModule& ExpertCollector::module_for(std::string_view base, const ExpertName& parsed) {
  auto it = layer_index_.find(parsed.layer);
  if (it == layer_index_.end()) {
    it = layer_index_.emplace(std::string(parsed.layer), x_.layers.size()).first;
    x_.layers.push_back({std::string(parsed.layer), {}, {}});
  }
  ExpertLayer& layer = x_.layers[it->second];
  const Role role = role_of(parsed.projection.projection);
  auto& slots = layer.experts.try_emplace(parsed.expert, std::array{kNoModule, kNoModule, kNoModule}).first->second;
  if (slots[role] != kNoModule) {
    ExpertModule& m = x_.modules[slots[role]];
    // One module per layer, expert and projection: another spelling of the
    // same one ("experts.07.w1", "experts.7.gate_proj") is ambiguous.
    if (x_.name(m) != base) {
      fail_input("\"{}\" and \"{}\" name the same expert projection (expert {} of {})", printable(x_.name(m)),
                 printable(base), parsed.expert, printable(parsed.layer));
    }
    return m;
  }
  if (x_.modules.size() >= kNoModule) fail_input("more than {} expert modules", kNoModule);
  slots[role] = static_cast<std::uint32_t>(x_.modules.size());
  ExpertModule m;
  m.name_at = x_.names.add(base);
  m.name_size = static_cast<std::uint32_t>(base.size());
  m.layer = static_cast<std::uint32_t>(it->second);
  m.role = role;
  layer.names[role] = std::string(parsed.projection.suffix);
  return x_.modules.emplace_back(m);
}

// A module is a weight_packed (its scale and global alone are none): the
// others are dropped, and the layers left are sorted by prefix.
Experts ExpertCollector::finish() {
  std::vector<std::uint32_t> moved(x_.modules.size(), kNoModule);
  std::size_t kept = 0;
  for (std::size_t i = 0; i < x_.modules.size(); ++i) {
    if (!x_.modules[i].packed.present) continue;
    moved[i] = static_cast<std::uint32_t>(kept);
    x_.modules[kept++] = x_.modules[i];
  }
  x_.modules.resize(kept);
  std::vector<std::uint32_t> layer_moved(x_.layers.size(), kNoModule);
  std::vector<ExpertLayer> layers;
  for (const auto& [prefix, i] : layer_index_) {  // by prefix
    ExpertLayer& l = x_.layers[i];
    for (auto e = l.experts.begin(); e != l.experts.end();) {
      bool any = false;
      for (auto& slot : e->second) {
        if (slot != kNoModule) slot = moved[slot];
        any = any || slot != kNoModule;
      }
      e = any ? std::next(e) : l.experts.erase(e);
    }
    if (l.experts.empty()) continue;
    layer_moved[i] = static_cast<std::uint32_t>(layers.size());
    layers.push_back(std::move(l));
  }
  for (auto& m : x_.modules) m.layer = layer_moved[m.layer];
  x_.layers = std::move(layers);
  return std::move(x_);
}

void check_nvfp4(Experts& x) {
  for (auto& m : x.modules) {
    const std::string_view base = x.name(m);
    if (!m.scale.present || !m.global.present) {
      const FormatNames& n = format_names(x.format);
      fail_input("\"{}\": an NVFP4 module needs {}, {} and {}", base, n.packed.substr(1), n.scale.substr(1),
                 n.global.substr(1));
    }
    const ExpertTensor& p = m.packed;
    const ExpertTensor& s = m.scale;
    if (p.dtype != Dtype::U8 || p.rank != 2 || s.dtype != Dtype::F8_E4M3 || s.rank != 2 || s.dims[0] != p.dims[0] ||
        p.dims[1] % 8 != 0 || s.dims[1] != p.dims[1] / 8 || m.global.dtype != Dtype::F32 || m.global.nbytes != 4) {
      fail_input("\"{}\": not NVFP4 (weight_packed U8 [N, K/2], weight_scale F8_E4M3 [N, K/16], "
                 "weight_global_scale F32 with one value)", base);
    }
    m.rows = p.dims[0];
    m.blocks = s.dims[1];
  }
}

MoeDims expert_dims(const Experts& x) {
  MoeDims dims;
  dims.layers = x.layers.size();
  for (const auto& layer : x.layers) {
    for (const auto& [e, slots] : layer.experts) {
      for (const Role r : {W1, W3, W2}) {
        if (slots[r] == kNoModule) fail_input("{}.{}: expert without its {}", layer.prefix, e, r == W1 ? "w1" : r == W3 ? "w3" : "w2");
      }
      const ExpertModule& w1 = module_at(x, slots, W1);
      const ExpertModule& w3 = module_at(x, slots, W3);
      const ExpertModule& w2 = module_at(x, slots, W2);
      const std::uint64_t n = w1.rows, k = w1.blocks * 16;
      if (dims.hidden == 0) {
        dims.hidden = k;
        dims.intermediate = n;
        dims.experts = layer.experts.size();
      }
      if (n != dims.intermediate || k != dims.hidden || w3.rows != n || w3.blocks * 16 != k || w2.rows != k ||
          w2.blocks * 16 != n) {
        fail_input("{}.{}: expert shapes differ from the first expert's (hidden {}, intermediate {})", layer.prefix, e,
                   dims.hidden, dims.intermediate);
      }
    }
  }
  return dims;
}

}  // namespace mx2nv

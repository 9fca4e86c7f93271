// Which prefixes of OTHER are modules (compare/other_tree.hpp): the rules of
// compare_oracle.other_modules, in the same order, so the same tensor is
// named when a checkpoint breaks more than one.
#include "common/error.hpp"
#include "compare/module_key.hpp"
#include "compare/other_tree.hpp"

#include <algorithm>
#include <array>
#include <map>

namespace mx2nv {
namespace {

struct Convention {
  std::string_view packed, global, input;
  std::array<std::string_view, 3> foreign;  // the other convention's names
};
constexpr Convention kCompressedTensors = {
    ".weight_packed", ".weight_global_scale", ".input_global_scale", {".weight", ".weight_scale_2", ".input_scale"}};
constexpr Convention kModelOpt = {
    ".weight", ".weight_scale_2", ".input_scale", {".weight_packed", ".weight_global_scale", ".input_global_scale"}};

std::string_view strip(std::string_view name, std::string_view suffix) {
  return name.substr(0, name.size() - suffix.size());
}

void refuse_foreign(const OtherTree& tree, const std::string& prefix, const Convention& c, std::string_view own) {
  for (const auto foreign : c.foreign) {
    if (tree.find(prefix + std::string(foreign))) {
      fail_input("{}{}: name collision with {}{} (two conventions in one module)", prefix, foreign, prefix, own);
    }
  }
}

OtherModule quantized(const OtherTree& tree, const std::string& p, const Convention& c) {
  OtherModule m;
  m.name = p;
  m.weight = tree.find(p + std::string(c.packed));
  m.scale = tree.find(p + ".weight_scale");
  m.global = tree.find(p + std::string(c.global));
  m.input_scale = tree.find(p + std::string(c.input));
  return m;
}

void add_compressed_tensors(const OtherTree& tree, std::map<std::string, OtherModule>& out) {
  const Convention& c = kCompressedTensors;
  for (const OtherTensor& t : tree.tensors) {
    const std::string_view name = t.name;
    if (name.ends_with(c.packed)) {
      const std::string p(strip(name, c.packed));
      refuse_foreign(tree, p, c, c.packed);
      out.emplace(p, quantized(tree, p, c));
    } else if (name.ends_with(c.global) || name.ends_with(c.input)) {
      const std::string p(name.substr(0, name.rfind('.')));
      if (!tree.find(p + std::string(c.packed))) fail_input("{}: no {}{} beside it", name, p, c.packed);
    }
  }
}

void add_modelopt(const OtherTree& tree, std::map<std::string, OtherModule>& out) {
  const Convention& c = kModelOpt;
  for (const OtherTensor& t : tree.tensors) {
    const std::string_view name = t.name;
    const bool packed = name.ends_with(c.packed) && t.dtype == Dtype::U8;
    if (!packed && !name.ends_with(c.global)) continue;
    const std::string p(name.substr(0, name.rfind('.')));
    if (out.contains(p)) continue;
    refuse_foreign(tree, p, c, c.packed);
    OtherModule m = quantized(tree, p, c);
    if (!m.weight) fail_input("{}{}: missing", p, c.packed);
    out.emplace(p, std::move(m));
  }
}

}  // namespace

std::vector<OtherModule> other_modules(const OtherTree& tree, std::span<const std::string> src_keys) {
  std::map<std::string, OtherModule> out;
  if (tree.format == OtherFormat::CompressedTensors) {
    add_compressed_tensors(tree, out);
  } else {
    add_modelopt(tree, out);
  }
  constexpr std::string_view kWeight = ".weight";
  for (const OtherTensor& t : tree.tensors) {
    if (!t.name.ends_with(kWeight) || t.name.size() == kWeight.size()) continue;
    std::string p(strip(t.name, kWeight));
    if (out.contains(p)) continue;
    if (routed_expert(p) || std::binary_search(src_keys.begin(), src_keys.end(), module_key(p))) {
      OtherModule m;
      m.name = p;
      m.quantized = false;
      m.weight = &t;
      out.emplace(std::move(p), std::move(m));
    }
  }
  std::vector<OtherModule> modules;
  modules.reserve(out.size());
  for (auto& [name, m] : out) modules.push_back(std::move(m));
  return modules;
}

}  // namespace mx2nv

// Which prefixes of OTHER are modules (compare/other_tree.hpp): the rules of
// compare_oracle.other_modules, in the same order, so the same tensor is
// named when a checkpoint breaks more than one.
#include "common/error.hpp"
#include "compare/module_key.hpp"
#include "compare/other_tree.hpp"

#include <algorithm>
#include <array>

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

void refuse_foreign(const OtherTree& tree, std::string_view prefix, const Convention& c, std::string_view own) {
  for (const auto foreign : c.foreign) {
    if (tree.find(std::string(prefix) + std::string(foreign))) {
      fail_input("{}{}: name collision with {}{} (two conventions in one module)", prefix, foreign, prefix, own);
    }
  }
}

OtherModule quantized(const OtherTree& tree, std::string_view p, const Convention& c) {
  const std::string prefix(p);
  OtherModule m;
  m.name = p;
  m.weight = tree.find(prefix + std::string(c.packed));
  m.scale = tree.find(prefix + ".weight_scale");
  m.global = tree.find(prefix + std::string(c.global));
  m.input_scale = tree.find(prefix + std::string(c.input));
  return m;
}

bool by_name(const OtherModule& a, const OtherModule& b) { return a.name < b.name; }

void add_compressed_tensors(const OtherTree& tree, std::vector<OtherModule>& out) {
  const Convention& c = kCompressedTensors;
  for (const OtherTensor& t : tree.tensors) {
    const std::string_view name = t.name;
    if (name.ends_with(c.packed)) {
      const std::string_view p = strip(name, c.packed);
      refuse_foreign(tree, p, c, c.packed);
      out.push_back(quantized(tree, p, c));
    } else if (name.ends_with(c.global) || name.ends_with(c.input)) {
      const std::string_view p = name.substr(0, name.rfind('.'));
      if (!tree.find(std::string(p) + std::string(c.packed))) fail_input("{}: no {}{} beside it", name, p, c.packed);
    }
  }
}

void add_modelopt(const OtherTree& tree, std::vector<OtherModule>& out) {
  const Convention& c = kModelOpt;
  std::vector<std::string_view> prefixes;  // of U8 weights and of globals: a module's two are one
  for (const OtherTensor& t : tree.tensors) {
    const std::string_view name = t.name;
    if ((name.ends_with(c.packed) && t.dtype == Dtype::U8) || name.ends_with(c.global)) {
      prefixes.push_back(name.substr(0, name.rfind('.')));
    }
  }
  std::sort(prefixes.begin(), prefixes.end());
  prefixes.erase(std::unique(prefixes.begin(), prefixes.end()), prefixes.end());
  for (const std::string_view p : prefixes) {
    refuse_foreign(tree, p, c, c.packed);
    OtherModule m = quantized(tree, p, c);
    if (!m.weight) fail_input("{}{}: missing", p, c.packed);
    out.push_back(m);
  }
}

}  // namespace

std::vector<OtherModule> other_modules(const OtherTree& tree,
                                       const std::function<bool(std::string_view key)>& src_has_key) {
  std::vector<OtherModule> out;
  if (tree.format == OtherFormat::CompressedTensors) {
    add_compressed_tensors(tree, out);
  } else {
    add_modelopt(tree, out);
  }
  std::sort(out.begin(), out.end(), by_name);
  const std::size_t quantized_count = out.size();
  constexpr std::string_view kWeight = ".weight";
  for (const OtherTensor& t : tree.tensors) {
    if (!t.name.ends_with(kWeight) || t.name.size() == kWeight.size()) continue;
    OtherModule m;
    m.name = strip(t.name, kWeight);
    if (std::binary_search(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(quantized_count), m, by_name)) {
      continue;
    }
    if (routed_expert(m.name) || src_has_key(module_key(m.name))) {
      m.quantized = false;
      m.weight = &t;
      out.push_back(m);
    }
  }
  std::sort(out.begin(), out.end(), by_name);
  return out;
}

}  // namespace mx2nv

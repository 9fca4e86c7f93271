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
  OtherSuffix packed, global, input;
  std::array<OtherSuffix, 3> foreign;  // the other convention's names
};
constexpr Convention kCompressedTensors = {OtherSuffix::WeightPacked,
                                           OtherSuffix::WeightGlobalScale,
                                           OtherSuffix::InputGlobalScale,
                                           {OtherSuffix::Weight, OtherSuffix::WeightScale2, OtherSuffix::InputScale}};
constexpr Convention kModelOpt = {
    OtherSuffix::Weight,
    OtherSuffix::WeightScale2,
    OtherSuffix::InputScale,
    {OtherSuffix::WeightPacked, OtherSuffix::WeightGlobalScale, OtherSuffix::InputGlobalScale}};

void refuse_foreign(const OtherTree& tree, std::string_view prefix, const Convention& c, OtherSuffix own) {
  for (const auto foreign : c.foreign) {
    if (tree.find(prefix, foreign)) {
      fail_input("{}{}: name collision with {}{} (two conventions in one module)", prefix, suffix_text(foreign), prefix,
                 suffix_text(own));
    }
  }
}

OtherModule quantized(const OtherTree& tree, std::string_view prefix, const Convention& c) {
  OtherModule m;
  m.name = prefix;
  m.weight = tree.find(prefix, c.packed);
  m.scale = tree.find(prefix, OtherSuffix::WeightScale);
  m.global = tree.find(prefix, c.global);
  m.input_scale = tree.find(prefix, c.input);
  return m;
}

bool by_name(const OtherModule& a, const OtherModule& b) { return a.name < b.name; }

void add_compressed_tensors(const OtherTree& tree, std::vector<OtherModule>& out) {
  const Convention& c = kCompressedTensors;
  for (const OtherTensor& t : tree.tensors) {
    if (t.suffix == c.packed) {
      refuse_foreign(tree, t.prefix, c, c.packed);
      out.push_back(quantized(tree, t.prefix, c));
    } else if (t.suffix == c.global || t.suffix == c.input) {
      if (!tree.find(t.prefix, c.packed)) fail_input("{}: no {}{} beside it", t.name(), t.prefix, suffix_text(c.packed));
    }
  }
}

void add_modelopt(const OtherTree& tree, std::vector<OtherModule>& out) {
  const Convention& c = kModelOpt;
  std::vector<std::string_view> prefixes;  // of U8 weights and of globals: a module's two are one
  for (const OtherTensor& t : tree.tensors) {
    if ((t.suffix == c.packed && t.dtype == Dtype::U8) || t.suffix == c.global) prefixes.push_back(t.prefix);
  }
  std::sort(prefixes.begin(), prefixes.end());
  prefixes.erase(std::unique(prefixes.begin(), prefixes.end()), prefixes.end());
  for (const std::string_view p : prefixes) {
    refuse_foreign(tree, p, c, c.packed);
    OtherModule m = quantized(tree, p, c);
    if (!m.weight) fail_input("{}{}: missing", p, suffix_text(c.packed));
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
  for (const OtherTensor& t : tree.tensors) {
    if (t.suffix != OtherSuffix::Weight) continue;
    OtherModule m;
    m.name = t.prefix;
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

#include "compare/other_tree.hpp"

#include "common/error.hpp"
#include "compare/module_key.hpp"
#include "json/strict_json.hpp"

#include <algorithm>
#include <array>
#include <mutex>

namespace mx2nv {
namespace {

inline constexpr std::uint64_t kMaxHfQuantConfigBytes = 16 << 20;

constexpr std::array<std::string_view, 7> kModuleSuffixes = {
    ".weight_packed", ".weight_scale", ".weight_global_scale", ".input_global_scale",
    ".weight",        ".weight_scale_2", ".input_scale"};

bool is_module_tensor(std::string_view name) {
  return std::any_of(kModuleSuffixes.begin(), kModuleSuffixes.end(),
                     [&](std::string_view s) { return name.size() > s.size() && name.ends_with(s); });
}

const Json* quantization_config(const Json& config) {
  if (!config.is_object()) return nullptr;
  if (const auto it = config.find("quantization_config"); it != config.end() && it->is_object()) return &*it;
  if (const auto text = config.find("text_config"); text != config.end() && text->is_object()) {
    if (const auto it = text->find("quantization_config"); it != text->end() && it->is_object()) return &*it;
  }
  return nullptr;
}

bool names_nvfp4_format(const Json& qc) {
  const auto is_nvfp4 = [](const Json& o) {
    const auto f = o.find("format");
    return f != o.end() && f->is_string() && f->get<std::string>() == "nvfp4-pack-quantized";
  };
  if (is_nvfp4(qc)) return true;
  const auto groups = qc.find("config_groups");
  if (groups == qc.end() || !groups->is_object()) return false;
  return std::any_of(groups->begin(), groups->end(), [&](const Json& g) { return g.is_object() && is_nvfp4(g); });
}

}  // namespace

OtherFormat detect_other_format(std::string_view config_text, std::string_view hf_quant_config_text) {
  const Json config = parse_strict_json(config_text, "OTHER's config.json").value;
  const Json* qc = quantization_config(config);
  std::string method;
  if (qc) {
    if (const auto m = qc->find("quant_method"); m != qc->end() && m->is_string()) method = m->get<std::string>();
  }
  if (method == "compressed-tensors") {
    if (!names_nvfp4_format(*qc)) {
      fail_input("OTHER's config.json: a compressed-tensors config without the nvfp4-pack-quantized format");
    }
    return OtherFormat::CompressedTensors;
  }
  if (method.starts_with("modelopt")) return OtherFormat::ModelOpt;
  if (!hf_quant_config_text.empty()) {
    const Json hf = parse_strict_json(hf_quant_config_text, "OTHER's hf_quant_config.json").value;
    if (hf.is_object()) {
      const auto producer = hf.find("producer");
      const bool modelopt = producer != hf.end() && producer->is_object() && producer->contains("name") &&
                            (*producer)["name"] == "modelopt";
      const auto quant = hf.find("quantization");
      if (modelopt || (quant != hf.end() && quant->is_object())) return OtherFormat::ModelOpt;
    }
  }
  fail_input("OTHER's config.json: no NVFP4 quantization config (compressed-tensors nvfp4-pack-quantized or ModelOpt)");
}

bool OtherTensor::has_shape(std::span<const std::uint64_t> shape) const {
  return rank == shape.size() && std::equal(shape.begin(), shape.end(), dims.begin());
}

std::string OtherTensor::shape_text() const {
  std::string out = "[";
  for (std::size_t i = 0; i < std::min<std::size_t>(rank, kKeptDims); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  if (rank > kKeptDims) out += ", ...";
  return out + "]";
}

const OtherTensor* OtherTree::find(std::string_view name) const {
  const auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                                   [](const OtherTensor& t, std::string_view n) { return t.name < n; });
  return it != tensors.end() && it->name == name ? &*it : nullptr;
}

OtherTree open_other(const fs::path& root, unsigned threads) {
  OtherTree tree;
  std::mutex mutex;
  const auto visit = [&](std::size_t shard, std::string_view, const ShardHeader& header) {
    std::vector<std::pair<std::string_view, OtherTensor>> found;  // names viewed in `header`
    for (const TensorInfo& t : header.tensors()) {
      if (!is_module_tensor(t.name)) continue;
      OtherTensor o;
      o.offset = header.data_start() + t.begin;
      o.nbytes = t.nbytes();
      std::copy_n(t.shape.begin(), std::min(t.shape.size(), OtherTensor::kKeptDims), o.dims.begin());
      o.shard = static_cast<std::uint32_t>(shard);
      o.dtype = t.dtype;
      o.rank = static_cast<std::uint8_t>(std::min<std::size_t>(t.shape.size(), 255));
      found.emplace_back(t.name, o);
    }
    std::lock_guard lock(mutex);
    for (auto& [name, o] : found) {
      o.name = tree.names.store(name);
      tree.tensors.push_back(o);
    }
  };
  tree.checkpoint = open_checkpoint(root, CheckpointRole::Target, threads, visit);
  std::sort(tree.tensors.begin(), tree.tensors.end(),
            [](const OtherTensor& a, const OtherTensor& b) { return a.name < b.name; });
  for (std::size_t i = 1; i < tree.tensors.size(); ++i) {
    if (tree.tensors[i].name == tree.tensors[i - 1].name) {
      fail_input("{}: name collision, in {} and {}", tree.tensors[i].name,
                 tree.checkpoint.shards[tree.tensors[i - 1].shard].file, tree.checkpoint.shards[tree.tensors[i].shard].file);
    }
  }
  std::string hf;
  const fs::path hf_path = root / "hf_quant_config.json";
  if (std::error_code ec; fs::is_regular_file(hf_path, ec)) hf = read_text_file(hf_path, kMaxHfQuantConfigBytes);
  tree.format = detect_other_format(tree.checkpoint.config_text, hf);
  return tree;
}

}  // namespace mx2nv

#include "compare/other_tree.hpp"

#include "common/error.hpp"
#include "compare/module_key.hpp"
#include "json/strict_json.hpp"

#include <algorithm>
#include <array>
#include <mutex>
#include <optional>
#include <utility>

namespace mx2nv {
namespace {

inline constexpr std::uint64_t kMaxHfQuantConfigBytes = 16 << 20;

// Indexed by OtherSuffix.
constexpr std::array<std::string_view, 7> kModuleSuffixes = {
    ".weight_packed", ".weight_scale", ".weight_global_scale", ".input_global_scale",
    ".weight",        ".weight_scale_2", ".input_scale"};

// PREFIX and suffix of a module tensor's name (a non-empty prefix, then one
// of the suffixes: the text after the name's last dot), or nullopt.
std::optional<std::pair<std::string_view, OtherSuffix>> split_module_name(std::string_view name) {
  const std::size_t dot = name.rfind('.');
  if (dot == std::string_view::npos || dot == 0) return std::nullopt;
  const std::string_view tail = name.substr(dot);
  for (std::size_t i = 0; i < kModuleSuffixes.size(); ++i) {
    if (tail == kModuleSuffixes[i]) return std::pair(name.substr(0, dot), static_cast<OtherSuffix>(i));
  }
  return std::nullopt;
}

// Orders tensors as their whole names would be ordered (PREFIX + suffix
// compared as one string), so every walk meets them as the oracle does.
int compare_names(std::string_view prefix_a, OtherSuffix a, std::string_view prefix_b, OtherSuffix b) {
  std::string_view x = prefix_a, x_next = suffix_text(a), y = prefix_b, y_next = suffix_text(b);
  for (;;) {  // at most four rounds: each ends a piece of one side
    const std::size_t n = std::min(x.size(), y.size());
    if (const int c = x.substr(0, n).compare(y.substr(0, n)); c != 0) return c;
    x.remove_prefix(n);
    y.remove_prefix(n);
    if (x.empty()) x = std::exchange(x_next, {});
    if (y.empty()) y = std::exchange(y_next, {});
    if (x.empty() || y.empty()) return x.empty() == y.empty() ? 0 : x.empty() ? -1 : 1;
  }
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

std::string_view suffix_text(OtherSuffix s) { return kModuleSuffixes[static_cast<std::size_t>(s)]; }

std::string OtherTensor::name() const { return std::string(prefix) + std::string(suffix_text(suffix)); }

bool OtherTensor::has_shape(std::span<const std::uint64_t> shape) const {
  return rank == shape.size() && std::equal(shape.begin(), shape.end(), dims.begin());
}

std::string OtherTensor::shape_text() const {
  std::string out = "[";
  for (std::size_t i = 0; i < std::min<std::size_t>(rank, kKeptDims); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  if (rank > kKeptDims) out += ", ...";
  return out + "]";
}

const OtherTensor* OtherTree::find(std::string_view prefix, OtherSuffix suffix) const {
  const auto it = std::lower_bound(tensors.begin(), tensors.end(), 0, [&](const OtherTensor& t, int) {
    return compare_names(t.prefix, t.suffix, prefix, suffix) < 0;
  });
  return it != tensors.end() && it->prefix == prefix && it->suffix == suffix ? &*it : nullptr;
}

OtherTree open_other(const fs::path& root, unsigned threads) {
  OtherTree tree;
  std::mutex mutex;
  const auto visit = [&](std::size_t shard, std::string_view, const ShardHeader& header) {
    std::vector<OtherTensor> found;  // prefixes viewed in `header`
    for (const TensorInfo& t : header.tensors()) {
      const auto split = split_module_name(t.name);
      if (!split) continue;
      OtherTensor o;
      o.prefix = split->first;
      o.suffix = split->second;
      o.offset = header.data_start() + t.begin;
      o.nbytes = t.nbytes();
      std::copy_n(t.shape.begin(), std::min(t.shape.size(), OtherTensor::kKeptDims), o.dims.begin());
      o.shard = static_cast<std::uint32_t>(shard);
      o.dtype = t.dtype;
      o.rank = static_cast<std::uint8_t>(std::min<std::size_t>(t.shape.size(), 255));
      found.push_back(o);
    }
    // A module's tensors in this shard side by side, so its prefix is stored once.
    std::sort(found.begin(), found.end(), [](const OtherTensor& a, const OtherTensor& b) {
      return a.prefix != b.prefix ? a.prefix < b.prefix : a.suffix < b.suffix;
    });
    std::lock_guard lock(mutex);
    std::string_view stored;
    for (std::size_t i = 0; i < found.size(); ++i) {
      if (i == 0 || found[i].prefix != found[i - 1].prefix) stored = tree.names.store(found[i].prefix);
      found[i].prefix = stored;
      tree.tensors.push_back(found[i]);
    }
  };
  tree.checkpoint = open_checkpoint(root, CheckpointRole::Target, threads, visit);
  // The index was checked against the shards; nothing looks a name up in it
  // again, so its names go before SRC's module table is built.
  if (tree.checkpoint.index) tree.checkpoint.index->forget_tensors();
  std::sort(tree.tensors.begin(), tree.tensors.end(), [](const OtherTensor& a, const OtherTensor& b) {
    return compare_names(a.prefix, a.suffix, b.prefix, b.suffix) < 0;
  });
  for (std::size_t i = 1; i < tree.tensors.size(); ++i) {
    const OtherTensor &a = tree.tensors[i - 1], &b = tree.tensors[i];
    if (a.prefix == b.prefix && a.suffix == b.suffix) {
      fail_input("{}: name collision, in {} and {}", b.name(), tree.checkpoint.shards[a.shard].file,
                 tree.checkpoint.shards[b.shard].file);
    }
  }
  std::string hf;
  const fs::path hf_path = root / "hf_quant_config.json";
  if (std::error_code ec; fs::is_regular_file(hf_path, ec)) hf = read_text_file(hf_path, kMaxHfQuantConfigBytes);
  tree.format = detect_other_format(tree.checkpoint.config_text, hf);
  return tree;
}

}  // namespace mx2nv

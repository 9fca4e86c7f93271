// Fuzz target: quantization_config typing. Raw-text fuzzing almost never
// produces a well-formed config with one field of the wrong JSON type, which
// is where nlohmann's type_error used to escape as "internal error". So this
// target is structure-aware: it starts from a valid K3 MXFP4 config and lets
// the input replace values at chosen paths with values of every JSON type.
// Properties:
// - reading it throws nothing but mx2nv::Error;
// - an accepted config rewrites to a DST config that verify's check accepts
//   with no difference (convert and verify agree on every accepted shape);
// - verify's check of the mutated text as a DST config never throws.
#include "common/error.hpp"
#include "model/quant_config.hpp"
#include "verify/config_check.hpp"

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using mx2nv::Json;

constexpr const char* kBase = R"({"architectures": ["KimiK3ForCausalLM"], "text_config": {"hidden_size": 64,
 "quantization_config": {"config_groups": {"group_0": {"format": "mxfp4-pack-quantized",
 "input_activations": null, "output_activations": null, "targets": ["Linear"], "weights": {"actorder": null,
 "block_structure": null, "dynamic": false, "group_size": 32, "num_bits": 4, "observer": "minmax",
 "observer_kwargs": {}, "scale_dtype": "torch.uint8", "strategy": "group", "symmetric": true, "type": "float",
 "zp_dtype": "torch.uint8"}}}, "format": "mxfp4-pack-quantized", "global_compression_ratio": null,
 "ignore": ["re:.*self_attn.*", "re:.*lm_head.*"], "kv_cache_scheme": null, "quant_method": "compressed-tensors",
 "quantization_status": "compressed", "sparsity_config": {}, "transform_config": {}, "version": "0.14.0"}}})";

class Bytes {
 public:
  Bytes(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  bool empty() const { return at_ >= size_; }
  std::uint8_t next() { return at_ < size_ ? data_[at_++] : 0; }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t at_ = 0;
};

void collect_pointers(const Json& v, const Json::json_pointer& here, std::vector<Json::json_pointer>& out) {
  out.push_back(here);
  if (v.is_object()) {
    for (const auto& [key, child] : v.items()) collect_pointers(child, here / key, out);
  } else if (v.is_array()) {
    for (std::size_t i = 0; i < v.size(); ++i) collect_pointers(v[i], here / i, out);
  }
}

Json value_of_some_type(Bytes& in) {
  switch (in.next() % 9) {
    case 0: return nullptr;
    case 1: return (in.next() & 1) != 0;
    case 2: return static_cast<int>(in.next()) - 64;
    case 3: return static_cast<double>(in.next()) / 7.0;
    case 4: return std::string(in.next() % 4, static_cast<char>('a' + in.next() % 26));
    case 5: return Json::array({in.next(), "x"});
    case 6: return Json::object({{"format", in.next()}});
    case 7: return "mxfp4-pack-quantized";
    default: return Json::array();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace mx2nv;
  Bytes in(data, size);
  Json config = Json::parse(kBase);
  const int mutations = 1 + in.next() % 4;
  for (int m = 0; m < mutations && !in.empty(); ++m) {
    std::vector<Json::json_pointer> pointers;
    collect_pointers(config, Json::json_pointer(), pointers);
    const Json::json_pointer& at = pointers[in.next() % pointers.size()];
    if (at.empty()) continue;  // replacing the whole document is the raw-text target's job
    if ((in.next() & 7) == 0) {
      Json& parent = config[at.parent_pointer()];
      if (parent.is_object()) parent.erase(at.back());  // a missing key
    } else {
      config[at] = value_of_some_type(in);
    }
  }
  const std::string text = config.dump(1);
  try {
    const SourceQuantConfig src = read_source_quant_config(text);
    const std::string out = rewrite_config_text(text, src);
    if (!check_target_config(src, out).empty()) std::abort();  // convert writes what verify accepts
    (void)check_target_config(src, text);  // the mutated text as a hostile DST config: no exception
  } catch (const Error&) {
  }
  return 0;
}

// Fuzz target: the ModelOpt config, written and read. Properties: no crash;
// for an accepted MXFP4 config, the ModelOpt config.json mx2nv writes parses
// strictly, holds ModelOpt's quantization_config at the top level and where
// the source had its own, is unchanged everywhere else, and verify's reader
// finds nothing wrong with it and its hf_quant_config.json; any text read as
// a DST's config (verify, gate) yields differences or a layout, never an
// exception other than mx2nv's Error.
#include "common/error.hpp"
#include "model/modelopt_config.hpp"
#include "model/target_format.hpp"
#include "verify/modelopt_config_check.hpp"

#include <cstdint>
#include <cstdlib>

namespace {

const mx2nv::SourceQuantConfig& fixed_source() {
  static const mx2nv::SourceQuantConfig src = mx2nv::read_source_quant_config(
      R"({"architectures": ["DeepseekV3ForCausalLM"], "quantization_config": {"quant_method": "compressed-tensors",)"
      R"( "format": "mxfp4-pack-quantized", "config_groups": {"group_0": {"targets": ["Linear"], "weights":)"
      R"( {"num_bits": 4, "type": "float", "group_size": 32, "strategy": "group", "symmetric": true,)"
      R"( "dynamic": false, "scale_dtype": "torch.uint8"}}}, "ignore": ["lm_head"]}})");
  return src;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace mx2nv;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::vector<std::string> exclude{"lm_head", "model.layers.0.self_attn.o_proj"};
  const std::vector<std::string> layers{"model.layers.1.mlp.experts"};
  (void)target_format_of(text, false);
  (void)check_modelopt_config(fixed_source(), text, std::string(text), exclude, {}, layers);
  try {
    const SourceQuantConfig src = read_source_quant_config(text);
    const std::string out = modelopt_config_text(text, src, exclude, "fuzz");
    Json parsed = parse_strict_json(out, "written").value;
    const Json qc = modelopt_quant_config(exclude, "fuzz");
    if (parsed["quantization_config"] != qc) std::abort();
    if (!src.parent.empty() && parsed[src.parent]["quantization_config"] != qc) std::abort();
    if (target_format_of(out, false) != TargetFormat::ModelOpt) std::abort();
    if (!check_modelopt_config(src, out, modelopt_hf_quant_config_text(exclude, "fuzz"), exclude, {}, layers).empty()) {
      std::abort();
    }
    Json before = src.config;
    parsed.erase("quantization_config");
    before.erase("quantization_config");
    if (!src.parent.empty()) {
      parsed[src.parent].erase("quantization_config");
      before[src.parent].erase("quantization_config");
    }
    if (before != parsed) std::abort();
  } catch (const Error&) {
  }
  return 0;
}

// ModelOpt's W4A16_NVFP4 config as mx2nv writes it (model/modelopt_config.hpp):
// the exclude list names each unquantized module once, refuses one no entry
// can name without reaching a quantized layer, and the config lands at the
// top level and where SRC keeps its own, every other byte kept.
#include "model/modelopt_config.hpp"

#include "common/error.hpp"

#include <gtest/gtest.h>

namespace mx2nv {
namespace {

const std::vector<std::string> kK3Layers = {"language_model.model.layers.1.block_sparse_moe.experts",
                                            "language_model.model.layers.2.block_sparse_moe.experts"};

TEST(ModelOptExclude, EachUnquantizedModuleOnceSorted) {
  const auto e = modelopt_exclude_entries({"language_model.lm_head", "language_model.model.layers.1.self_attn.o_proj",
                                           "language_model.lm_head"},
                                          {}, kK3Layers);
  EXPECT_EQ(e, (std::vector<std::string>{"language_model.lm_head", "language_model.model.layers.1.self_attn.o_proj"}));
}

TEST(ModelOptExclude, ABf16ModuleIsNamedWithItsLayer) {
  const auto e = modelopt_exclude_entries({}, {"language_model.model.layers.3.block_sparse_moe.experts.0.w2"}, kK3Layers);
  EXPECT_EQ(e, (std::vector<std::string>{"language_model.model.layers.3.block_sparse_moe.experts",
                                         "language_model.model.layers.3.block_sparse_moe.experts.0.w2"}));
}

TEST(ModelOptExclude, AnEntryThatWouldReachAQuantizedLayerIsRefused) {
  // A bare part of the layer's name (SGLang matches dotted parts, and maps
  // block_sparse_moe to mlp), a name holding the layer (vLLM), a wildcard.
  for (const std::string bad : {"experts", "mlp", "language_model.model.layers.1",
                                "language_model.model.layers.1.block_sparse_moe.experts_bias", "lm_*", "x|experts",
                                "(experts)", "expert+s", "x|mlp", "a?b", "a\\b", "a^b", "a{1}", "a$"}) {
    EXPECT_THROW(modelopt_exclude_entries({bad}, {}, kK3Layers), Error) << bad;
  }
  // Layer 1 is no part of layer 11's name at a dot: fine.
  EXPECT_NO_THROW(modelopt_exclude_entries({"language_model.model.layers.11.self_attn.o_proj"}, {}, kK3Layers));
}

TEST(ModelOptConfig, NestedSourcesGetItTwiceFlatOnesOnce) {
  const std::string nested = "{\n  \"architectures\": [\"X\"],\n  \"text_config\": {\n    \"hidden_size\": 8,\n"
                             "    \"quantization_config\": {\"quant_method\": \"compressed-tensors\"}\n  }\n}\n";
  SourceQuantConfig src{Json::parse(nested), "text_config", Json::parse(R"({"quant_method": "compressed-tensors"})")};
  const std::vector<std::string> exclude{"language_model.lm_head"};
  const std::string text = modelopt_config_text(nested, src, exclude, "1.0");
  const Json j = Json::parse(text);
  EXPECT_EQ(j["quantization_config"], modelopt_quant_config(exclude, "1.0"));
  EXPECT_EQ(j["text_config"]["quantization_config"], j["quantization_config"]);
  EXPECT_EQ(j["text_config"]["hidden_size"], 8);
  EXPECT_EQ(j["architectures"], Json::array({"X"}));
  EXPECT_EQ(text.find("\n  \"quantization_config\": {"), text.find('\n')) << "laid out like the file:\n" << text;
  const Json& qc = j["quantization_config"];
  EXPECT_EQ(qc["quant_method"], "modelopt");
  EXPECT_EQ(qc["quant_algo"], "W4A16_NVFP4");
  EXPECT_EQ(qc["ignore"], Json(exclude));
  EXPECT_FALSE(qc.contains("quantization")) << "vLLM refuses W4A16_NVFP4 in the nested form";
  const std::string flat = R"({"quantization_config": {"quant_method": "compressed-tensors"}, "a": 1})";
  SourceQuantConfig top{Json::parse(flat), "", Json::parse(R"({"quant_method": "compressed-tensors"})")};
  const std::string flat_text = modelopt_config_text(flat, top, exclude, "1.0");
  EXPECT_EQ(flat_text.find("quantization_config"), flat_text.rfind("quantization_config"));
  EXPECT_EQ(Json::parse(flat_text)["a"], 1);
  const Json hf = Json::parse(modelopt_hf_quant_config_text(exclude, "1.0"));
  EXPECT_EQ(hf["quantization"]["exclude_modules"], Json(exclude));
  EXPECT_TRUE(hf["quantization"]["kv_cache_quant_algo"].is_null());
  EXPECT_EQ(hf["quantization"]["group_size"], 16);
}

}  // namespace
}  // namespace mx2nv

// Fuzz target: config.json. Property: no crash; an accepted MXFP4 config
// rewrites to text that parses strictly, holds the NVFP4 quantization_config
// where the source had it, and is unchanged everywhere else.
#include "common/error.hpp"
#include "model/quant_config.hpp"

#include <cstdint>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace mx2nv;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const SourceQuantConfig src = read_source_quant_config(text);
    const std::string out = rewrite_config_text(text, src);
    Json parsed = parse_strict_json(out, "rewritten").value;
    Json& qc = src.parent.empty() ? parsed["quantization_config"] : parsed[src.parent]["quantization_config"];
    if (qc != nvfp4_quant_config(src.quant_config)) std::abort();
    Json before = src.config;
    qc = nullptr;
    (src.parent.empty() ? before["quantization_config"] : before[src.parent]["quantization_config"]) = nullptr;
    if (before != parsed) std::abort();
  } catch (const Error&) {
  }
  return 0;
}

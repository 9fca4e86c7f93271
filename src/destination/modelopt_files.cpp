#include "destination/modelopt_files.hpp"

#include "common/error.hpp"
#include "common/printable.hpp"
#include "destination/index_writer.hpp"
#include "model/modelopt_config.hpp"
#include "model/module_names.hpp"

namespace mx2nv {

ModelOptFiles modelopt_files(const SourceCheckpoint& source, std::span<const ModulePlan> plan,
                             const std::vector<std::string>& requantized_modules) {
  const ModuleSet& set = source.modules;
  std::vector<std::string> unquantized, bf16, layers;
  for (std::size_t i = 0; i < set.modules.size(); ++i) {
    const std::string_view name = set.modules[i].name;
    if (!plan.empty() && plan[i].treatment == Treatment::Bf16) {
      bf16.emplace_back(name);
    } else if (layers.empty() || layers.back() != moe_layer_of(name)) {  // modules are sorted: a layer's are adjacent
      layers.emplace_back(moe_layer_of(name));
    }
  }
  for_each_source_tensor(source, [&](std::string_view tensor) {
    if (!tensor.ends_with(kBf16WeightSuffix)) return;
    const std::string_view module = tensor.substr(0, tensor.size() - kBf16WeightSuffix.size());
    if (module.empty()) return;
    if (set.find(module)) {
      // ModelOpt names a module's packed codes `M.weight`: taken already.
      fail_input("tensor \"{}\" exists beside a quantized module of that name (it would be the module's modelopt "
                 "weight)", printable(tensor));
    }
    unquantized.emplace_back(module);
  });
  ModelOptFiles files;
  files.exclude = modelopt_exclude_entries(std::move(unquantized), bf16, layers);
  files.config = modelopt_config_text(source.checkpoint.config_text, source.quant, files.exclude, MX2NV_VERSION,
                                      requantized_modules);
  files.hf_quant_config = modelopt_hf_quant_config_text(files.exclude, MX2NV_VERSION);
  return files;
}

}  // namespace mx2nv

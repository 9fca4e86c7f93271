#include "core/target_layout.hpp"

#include "core/checked.hpp"
#include "core/error.hpp"

namespace mx2nv {
TargetLayout make_target_layout(const ShardHeader& source, std::size_t shard, const ModuleSet& modules) {
  TargetLayout layout;
  layout.metadata = source.metadata();
  const auto& src = source.tensors();
  // Header order: the source's, a global following its module's scale.
  std::vector<std::size_t> position_of_source(src.size());
  for (std::size_t i = 0; i < src.size(); ++i) {
    TargetTensor t;
    t.info = src[i];
    t.source = i;
    if (const auto m = modules.module_of(src[i].name, kPackedSuffix)) {
      t.role = TensorRole::Packed;
      t.module = *m;
    } else if (const auto ms = modules.module_of(src[i].name, kScaleSuffix);
               ms && modules.modules[*ms].scale_shard == shard) {
      t.role = TensorRole::Scale;
      t.module = *ms;
      t.info.dtype = Dtype::F8_E4M3;
      t.info.shape = {modules.modules[*ms].rows, modules.modules[*ms].groups * 2};
    }
    position_of_source[i] = layout.tensors.size();
    layout.tensors.push_back(t);
    if (t.role == TensorRole::Scale) {
      TargetTensor g;
      g.role = TensorRole::Global;
      g.module = t.module;
      g.info.name = modules.modules[t.module].name + std::string(kGlobalSuffix);
      g.info.dtype = Dtype::F32;
      g.info.shape = {1};
      layout.tensors.push_back(g);
    }
  }
  // Byte order: the source's, each global right after its scale.
  std::uint64_t cursor = 0;
  const auto place = [&](std::size_t index) {
    TargetTensor& t = layout.tensors[index];
    const auto nbytes = tensor_nbytes(t.info.dtype, t.info.shape);
    const auto end = nbytes ? checked_add(cursor, *nbytes) : std::nullopt;
    if (!end) fail_input("tensor \"{}\": target size overflows", t.info.name);
    t.info.begin = cursor;
    t.info.end = *end;
    cursor = *end;
    layout.data_order.push_back(index);
  };
  for (const std::size_t i : source.offset_order()) {
    const std::size_t index = position_of_source[i];
    place(index);
    if (layout.tensors[index].role == TensorRole::Scale) place(index + 1);
  }
  layout.data_size = cursor;
  return layout;
}

}  // namespace mx2nv

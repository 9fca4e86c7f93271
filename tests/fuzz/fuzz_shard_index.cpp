// Fuzz target: model.safetensors.index.json. Property: no crash; every shard
// name accepted is confined to the checkpoint; a parsed index re-renders to
// one that parses to the same weight_map.
#include "common/error.hpp"
#include "safetensors/index.hpp"

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace mx2nv;
  try {
    const ShardIndex index = parse_shard_index({reinterpret_cast<const char*>(data), size}, "fuzz");
    // Independently of is_confined_relative_path: no accepted name is
    // absolute or has an empty, "." or ".." component.
    for (const auto& shard : index.shard_files) {
      if (shard.empty() || shard.front() == '/') std::abort();
      std::size_t start = 0;
      for (;;) {
        const std::size_t slash = shard.find('/', start);
        const std::string part = shard.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
        if (part.empty() || part == "." || part == "..") std::abort();
        if (slash == std::string::npos) break;
        start = slash + 1;
      }
    }
    std::vector<IndexEntry> entries;
    for (NameTable::Id id = 0; id < index.tensors.size(); ++id) {
      entries.push_back({index.tensors.name(id), {}, index.shard_files[index.shard_of[id]]});
    }
    const std::string again = render_shard_index(index.other, entries, 7);
    const ShardIndex back = parse_shard_index(again, "again");
    if (back.tensors.size() != index.tensors.size() || back.shard_files != index.shard_files) std::abort();
    for (NameTable::Id id = 0; id < index.tensors.size(); ++id) {
      if (back.shard_for(index.tensors.name(id)) != index.shard_for(index.tensors.name(id))) std::abort();
    }
  } catch (const Error&) {
  }
  return 0;
}

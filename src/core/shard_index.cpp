#include "core/shard_index.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <set>

namespace mx2nv {

bool is_confined_relative_path(std::string_view path) {
  if (path.empty() || path.front() == '/') return false;
  if (path.find('\\') != std::string_view::npos || path.find('\0') != std::string_view::npos) return false;
  std::size_t start = 0;
  while (start <= path.size()) {
    const std::size_t slash = path.find('/', start);
    const std::string_view part = path.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (part.empty() || part == "." || part == "..") return false;
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return true;
}

ShardIndex parse_shard_index(std::string_view text, std::string_view what) {
  ShardIndex index;
  index.document = parse_strict_json(text, what).value;
  const Json& doc = index.document;
  if (!doc.is_object()) fail_input("{}: not a JSON object", what);
  if (!doc.contains("weight_map") || !doc["weight_map"].is_object()) fail_input("{}: no weight_map object", what);
  if (doc.contains("metadata") && !doc["metadata"].is_object()) fail_input("{}: metadata is not an object", what);
  std::set<std::string> shards;
  for (const auto& [tensor, shard] : doc["weight_map"].items()) {
    if (!shard.is_string()) fail_input("{}: weight_map entry \"{}\" is not a string", what, tensor);
    const auto& name = shard.get_ref<const std::string&>();
    if (!is_confined_relative_path(name)) {
      fail_input("{}: tensor \"{}\" names shard \"{}\", which is not a plain relative path inside the checkpoint",
                 what, tensor, name);
    }
    if (is_reserved_name(name)) {
      fail_input("{}: tensor \"{}\" names shard \"{}\"; names starting with \"{}\" are reserved for mx2nv's state",
                 what, tensor, name, kStateDirName);
    }
    index.weight_map.emplace(tensor, name);
    shards.insert(name);
  }
  if (index.weight_map.empty()) fail_input("{}: weight_map is empty", what);
  index.shard_files.assign(shards.begin(), shards.end());
  return index;
}

void check_index_matches_shards(const ShardIndex& index, const std::vector<const ShardHeader*>& headers) {
  std::size_t tensors_in_shards = 0;
  for (std::size_t s = 0; s < index.shard_files.size(); ++s) {
    const std::string& shard = index.shard_files[s];
    for (const TensorInfo& t : headers[s]->tensors()) {
      const auto it = index.weight_map.find(t.name);
      if (it == index.weight_map.end()) fail_input("{}: tensor \"{}\" is not in the index", shard, t.name);
      if (it->second != shard) {
        fail_input("{}: tensor \"{}\" is indexed to shard \"{}\" (stored twice or mis-indexed)", shard, t.name,
                   it->second);
      }
      ++tensors_in_shards;
    }
  }
  if (tensors_in_shards != index.weight_map.size()) {
    for (const auto& [tensor, shard] : index.weight_map) {
      const auto pos = std::lower_bound(index.shard_files.begin(), index.shard_files.end(), shard);
      const auto s = static_cast<std::size_t>(pos - index.shard_files.begin());
      if (headers[s]->find(tensor) == nullptr) {
        fail_input("{}: indexed tensor \"{}\" is missing from shard \"{}\"", kIndexFileName, tensor, shard);
      }
    }
  }
}

std::string render_shard_index(const Json& source_document, const std::map<std::string, std::string>& weight_map,
                               std::uint64_t total_size) {
  Json doc = source_document;
  doc["weight_map"] = weight_map;
  if (!doc.contains("metadata")) doc["metadata"] = Json::object();
  doc["metadata"]["total_size"] = total_size;
  return doc.dump(2) + "\n";
}

}  // namespace mx2nv

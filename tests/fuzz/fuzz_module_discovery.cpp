// Fuzz target: module discovery over tensor names, dtypes and shapes.
// Input: one tensor per line, "SHARD|NAME|DTYPE|D0,D1,...", SHARD a digit
// (0-3). Lines that do not describe a valid tensor are skipped, so every
// input becomes real shard headers. Properties: no crash, only Error thrown;
// an accepted set has named modules sorted and found by name, every module
// in exactly one scale group, and only P.w1/P.w3 or P.gate_proj/P.up_proj
// with the same non-empty parent P share one.
#include "common/checked.hpp"
#include "common/error.hpp"
#include "json/strict_json.hpp"
#include "model/modules.hpp"

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace mx2nv;

std::optional<std::pair<unsigned, TensorInfo>> parse_line(const std::string& line) {
  std::vector<std::string> f;
  std::stringstream in(line);
  for (std::string part; std::getline(in, part, '|');) f.push_back(part);
  if (f.size() != 4 || f[0].size() != 1 || f[0][0] < '0' || f[0][0] > '3') return std::nullopt;
  TensorInfo t;
  t.name = f[1];
  try {
    (void)Json(t.name).dump();  // a header can only hold valid UTF-8 names
  } catch (const Json::exception&) {
    return std::nullopt;
  }
  const auto dtype = parse_dtype(f[2]);
  if (!dtype) return std::nullopt;
  t.dtype = *dtype;
  std::stringstream dims(f[3]);
  for (std::string d; std::getline(dims, d, ',');) {
    if (d.empty() || d.size() > 6 || d.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
    t.shape.push_back(std::stoull(d));
    if (t.shape.size() > kMaxRank) return std::nullopt;
  }
  return std::make_pair(static_cast<unsigned>(f[0][0] - '0'), t);
}

// Splits `parent.last` at the last dot; parent empty when there is none.
std::pair<std::string, std::string> split(std::string_view module) {
  const auto dot = module.rfind('.');
  if (dot == std::string::npos) return {"", std::string(module)};
  return {std::string(module.substr(0, dot)), std::string(module.substr(dot + 1))};
}

bool may_pair(std::string_view a, std::string_view b) {
  const auto [pa, la] = split(a);
  const auto [pb, lb] = split(b);
  if (pa.empty() || pa != pb) return false;
  return (la == "w1" && lb == "w3") || (la == "w3" && lb == "w1") || (la == "gate_proj" && lb == "up_proj") ||
         (la == "up_proj" && lb == "gate_proj");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::vector<TensorInfo>> shards(4);
  std::vector<std::uint64_t> cursor(4, 0);
  std::stringstream in(std::string(reinterpret_cast<const char*>(data), size));
  for (std::string line; std::getline(in, line);) {
    auto parsed = parse_line(line);
    if (!parsed) continue;
    auto& [s, t] = *parsed;
    const auto nbytes = tensor_nbytes(t.dtype, t.shape);
    const auto end = nbytes ? checked_add(cursor[s], *nbytes) : std::nullopt;
    if (!end) continue;
    t.begin = cursor[s];
    t.end = *end;
    cursor[s] = *end;
    shards[s].push_back(std::move(t));
  }
  try {
    std::vector<ShardHeader> headers;
    for (std::size_t s = 0; s < shards.size(); ++s) {
      const std::string h = serialize_header(std::nullopt, shards[s]);
      headers.push_back(ShardHeader::parse(std::string_view(h).substr(8), h.size() + cursor[s], "fuzz"));
    }
    std::vector<ShardTensors> views;
    for (std::size_t s = 0; s < headers.size(); ++s) views.push_back({"shard" + std::to_string(s), &headers[s]});
    const ModuleSet set = discover_modules(views);
    std::vector<int> groups_of(set.modules.size(), 0);
    for (std::size_t i = 0; i < set.modules.size(); ++i) {
      const QuantModule& m = set.modules[i];
      if (m.name.empty()) std::abort();
      if (i > 0 && !(set.modules[i - 1].name < m.name)) std::abort();
      if (set.find(m.name) != i || set.module_of(m.packed_name(), kPackedSuffix) != i) std::abort();
      if (m.packed.nbytes() != m.rows * m.groups * kGroupBytes || m.scale.nbytes() != m.rows * m.groups) std::abort();
    }
    for (std::size_t g = 0; g < set.scale_groups.size(); ++g) {
      const auto& members = set.scale_groups[g];
      if (members.empty() || members.size() > 2) std::abort();
      for (const std::size_t i : members) {
        ++groups_of[i];
        if (set.modules[i].scale_group != g) std::abort();
      }
      if (members.size() == 2 && !may_pair(set.modules[members[0]].name, set.modules[members[1]].name)) std::abort();
    }
    for (const int n : groups_of) {
      if (n != 1) std::abort();
    }
  } catch (const Error&) {
  }
  return 0;
}

#include "core/safetensors.hpp"

#include "core/checked.hpp"
#include "core/error.hpp"
#include "core/strict_json.hpp"

#include <algorithm>
#include <numeric>

namespace mx2nv {
namespace {

std::uint64_t json_u64(const Json& v, std::string_view what, std::string_view tensor, std::string_view field) {
  if (!v.is_number_unsigned()) {
    // Negative integers parse as signed; floats and huge integers parse as float.
    fail_input("{}: tensor \"{}\": {} must hold non-negative integers below 2^64", what, tensor, field);
  }
  return v.get<std::uint64_t>();
}

TensorInfo parse_tensor_entry(const std::string& name, const Json& entry, std::string_view what) {
  if (!entry.is_object()) fail_input("{}: tensor \"{}\": entry is not an object", what, name);
  for (const auto& [key, _] : entry.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      fail_input("{}: tensor \"{}\": unknown field \"{}\"", what, name, key);
    }
  }
  if (!entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets")) {
    fail_input("{}: tensor \"{}\": needs dtype, shape and data_offsets", what, name);
  }
  TensorInfo t;
  t.name = name;
  const Json& dtype = entry["dtype"];
  if (!dtype.is_string()) fail_input("{}: tensor \"{}\": dtype is not a string", what, name);
  const auto parsed = parse_dtype(dtype.get_ref<const std::string&>());
  if (!parsed) fail_input("{}: tensor \"{}\": unknown dtype \"{}\"", what, name, dtype.get<std::string>());
  t.dtype = *parsed;

  const Json& shape = entry["shape"];
  if (!shape.is_array()) fail_input("{}: tensor \"{}\": shape is not an array", what, name);
  if (shape.size() > kMaxRank) fail_input("{}: tensor \"{}\": rank {} exceeds {}", what, name, shape.size(), kMaxRank);
  for (const auto& d : shape) t.shape.push_back(json_u64(d, what, name, "shape"));

  const Json& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    fail_input("{}: tensor \"{}\": data_offsets must be [begin, end]", what, name);
  }
  t.begin = json_u64(offsets[0], what, name, "data_offsets");
  t.end = json_u64(offsets[1], what, name, "data_offsets");
  if (t.end < t.begin) fail_input("{}: tensor \"{}\": data_offsets end {} before begin {}", what, name, t.end, t.begin);

  const auto nbytes = tensor_nbytes(t.dtype, t.shape);
  if (!nbytes) fail_input("{}: tensor \"{}\": size of shape overflows or is not whole bytes", what, name);
  if (*nbytes != t.nbytes()) {
    fail_input("{}: tensor \"{}\": data_offsets span {} bytes but {} {} needs {}", what, name, t.nbytes(),
               dtype_name(t.dtype), Json(t.shape).dump(), *nbytes);
  }
  return t;
}

}  // namespace

std::optional<std::uint64_t> tensor_nbytes(Dtype dtype, std::span<const std::uint64_t> shape) {
  std::optional<std::uint64_t> bits = dtype_bits(dtype);
  for (const auto d : shape) {
    if (!bits) return std::nullopt;
    bits = checked_mul(*bits, d);
  }
  if (!bits || *bits % 8 != 0) return std::nullopt;
  return *bits / 8;
}

std::uint64_t ShardHeader::parse_header_length(std::span<const std::byte> first8, std::uint64_t file_size,
                                               std::string_view what) {
  if (file_size < kHeaderLengthBytes || first8.size() < kHeaderLengthBytes) {
    fail_input("{}: {} bytes is too small for a safetensors file", what, file_size);
  }
  std::uint64_t n = 0;
  for (std::size_t i = 0; i < kHeaderLengthBytes; ++i) n |= std::to_integer<std::uint64_t>(first8[i]) << (8 * i);
  if (n > kMaxHeaderBytes) fail_input("{}: header length {} exceeds the {} byte limit", what, n, kMaxHeaderBytes);
  if (n > file_size - kHeaderLengthBytes) {
    fail_input("{}: header length {} runs past the end of the {} byte file", what, n, file_size);
  }
  if (n < 2) fail_input("{}: header length {} cannot hold a JSON object", what, n);
  return n;
}

ShardHeader ShardHeader::parse(std::string_view header_json, std::uint64_t file_size, std::string_view what) {
  ShardHeader h;
  h.header_length_ = header_json.size();
  StrictJson doc = parse_strict_json(header_json, what);
  if (!doc.value.is_object()) fail_input("{}: header is not a JSON object", what);

  for (const std::string& key : doc.top_level_keys) {
    const Json& entry = doc.value[key];
    if (key == "__metadata__") {
      if (!entry.is_object()) fail_input("{}: __metadata__ is not an object", what);
      std::map<std::string, std::string> meta;
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) fail_input("{}: __metadata__ value \"{}\" is not a string", what, k);
        meta.emplace(k, v.get<std::string>());
      }
      h.metadata_ = std::move(meta);
      continue;
    }
    h.by_name_.emplace(key, h.tensors_.size());
    h.tensors_.push_back(parse_tensor_entry(key, entry, what));
  }

  // Offsets sorted must tile [0, data_size) exactly: no holes, no overlaps.
  std::uint64_t cursor = 0;
  for (const std::size_t i : h.offset_order()) {
    const TensorInfo& t = h.tensors_[i];
    if (t.begin != cursor) {
      fail_input("{}: tensor \"{}\" starts at {} but the previous tensor ends at {} ({})", what, t.name, t.begin,
                 cursor, t.begin > cursor ? "hole" : "overlap");
    }
    cursor = t.end;
  }
  h.data_size_ = cursor;
  const auto expected = checked_add(h.data_start(), cursor);
  if (!expected || *expected != file_size) {
    fail_input("{}: header and tensors cover {} bytes but the file has {} ({})", what,
               expected ? *expected : 0, file_size,
               expected && *expected < file_size ? "trailing bytes" : "truncated");
  }
  return h;
}

std::vector<std::size_t> ShardHeader::offset_order() const {
  std::vector<std::size_t> order(tensors_.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const TensorInfo& x = tensors_[a];
    const TensorInfo& y = tensors_[b];
    return x.begin != y.begin ? x.begin < y.begin : x.end < y.end;
  });
  return order;
}

const TensorInfo* ShardHeader::find(std::string_view name) const {
  const auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

std::string serialize_header(const std::optional<std::map<std::string, std::string>>& metadata,
                             std::span<const TensorInfo> tensors, std::uint64_t modulus, std::uint64_t residue) {
  // Built by concatenation: ordered_json's insertion is linear per key, which
  // is quadratic for headers with hundreds of thousands of tensors.
  std::string json = "{";
  bool first = true;
  if (metadata) {
    json += "\"__metadata__\":";
    json += Json(*metadata).dump();
    first = false;
  }
  for (const TensorInfo& t : tensors) {
    if (!first) json += ',';
    first = false;
    json += Json(t.name).dump();
    json += ":{\"dtype\":\"";
    json += dtype_name(t.dtype);
    json += "\",\"shape\":";
    json += Json(t.shape).dump();
    json += ",\"data_offsets\":[";
    json += std::to_string(t.begin);
    json += ',';
    json += std::to_string(t.end);
    json += "]}";
  }
  json += '}';
  // Pad so the data section (after the 8-byte length) starts at `residue`.
  const std::uint64_t at = (kHeaderLengthBytes + json.size()) % modulus;
  json.append(static_cast<std::size_t>((residue % modulus + modulus - at) % modulus), ' ');

  std::string out(kHeaderLengthBytes, '\0');
  std::uint64_t n = json.size();
  for (std::size_t i = 0; i < kHeaderLengthBytes; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  out += json;
  return out;
}

}  // namespace mx2nv

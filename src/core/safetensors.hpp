// The safetensors container: an 8-byte little-endian header length N, N bytes
// of JSON, then the tensor bytes. Parsing is from bytes only (the I/O layer
// reads them); every rule of huggingface/safetensors' `Metadata::validate` is
// enforced inside construction, so a ShardHeader that exists is consistent.
#pragma once

#include "core/dtype.hpp"

#include <bit>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace mx2nv {

// safetensors stores little-endian data and so do we, with plain memcpy.
static_assert(std::endian::native == std::endian::little, "big-endian hosts are not supported");

inline constexpr std::uint64_t kHeaderLengthBytes = 8;
inline constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;  // safetensors MAX_HEADER_SIZE
inline constexpr std::size_t kMaxRank = 16;

struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::U8;
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0;  // relative to the start of the data section
  std::uint64_t end = 0;    // exclusive
  std::uint64_t nbytes() const { return end - begin; }
};

// Bytes a tensor of this dtype and shape occupies; nullopt on overflow or on
// a bit count that is not a whole number of bytes.
std::optional<std::uint64_t> tensor_nbytes(Dtype dtype, std::span<const std::uint64_t> shape);

class ShardHeader {
 public:
  // Reads N from the first 8 bytes of a file of `file_size` bytes and checks
  // it against the cap and the file. `what` names the file in errors.
  static std::uint64_t parse_header_length(std::span<const std::byte> first8, std::uint64_t file_size,
                                           std::string_view what);
  // Validates the JSON header of a file of `file_size` bytes.
  static ShardHeader parse(std::string_view header_json, std::uint64_t file_size, std::string_view what);

  std::uint64_t header_length() const { return header_length_; }
  std::uint64_t data_start() const { return kHeaderLengthBytes + header_length_; }
  std::uint64_t data_size() const { return data_size_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // header order
  std::vector<std::size_t> offset_order() const;                       // indices by begin
  const TensorInfo* find(std::string_view name) const;
  const std::optional<std::map<std::string, std::string>>& metadata() const { return metadata_; }

 private:
  std::uint64_t header_length_ = 0;
  std::uint64_t data_size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, std::size_t> by_name_;
  std::optional<std::map<std::string, std::string>> metadata_;
};

// Serialises a header (length prefix + JSON padded with trailing spaces) for
// tensors given in header order with offsets already assigned. The padding
// (fewer than `modulus` spaces) makes the data section start at
// `residue` modulo `modulus`; the default is the reference writer's 8-byte
// alignment. Output is a pure function of the arguments.
std::string serialize_header(const std::optional<std::map<std::string, std::string>>& metadata,
                             std::span<const TensorInfo> tensors, std::uint64_t modulus = 8,
                             std::uint64_t residue = 0);

}  // namespace mx2nv

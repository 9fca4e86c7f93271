// The safetensors container: an 8-byte little-endian header length N, N bytes
// of JSON, then the tensor bytes. Parsing is from bytes only (the I/O layer
// reads them); every rule of huggingface/safetensors' `Metadata::validate` is
// enforced inside construction, so a ShardHeader that exists is consistent.
#pragma once

#include "common/byte_source.hpp"
#include "safetensors/dtype.hpp"
#include "safetensors/name_table.hpp"

#include <bit>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mx2nv {

// safetensors stores little-endian data and so do we, with plain memcpy.
static_assert(std::endian::native == std::endian::little, "big-endian hosts are not supported");

inline constexpr std::uint64_t kHeaderLengthBytes = 8;
inline constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;  // safetensors MAX_HEADER_SIZE
inline constexpr std::size_t kMaxRank = 16;
// Tensors in one shard header, with headroom over real checkpoints' shards,
// converted ones included (docs/performance.md, "memory at the caps"). The
// cap bounds the memory a hostile header can claim while a shard is worked
// on: each worker holds its tensors as parsed, as the target layout and as
// the serialized header.
inline constexpr std::size_t kMaxTensorsPerShard = 1 << 16;
// Bytes of tensor names and of __metadata__ in one header, with headroom
// over real shards; held about three times over while a shard is converted.
inline constexpr std::uint64_t kMaxShardNameBytes = 8ull << 20;
inline constexpr std::uint64_t kMaxShardMetadataBytes = 1ull << 20;

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
  // The one entry point for a shard on disk (or anywhere): reads the length
  // prefix and streams the JSON header from `source`, a safetensors file of
  // `file_size` bytes, validating everything. `what` names the file in errors.
  static ShardHeader read(const ByteSource& source, std::uint64_t file_size, std::string_view what);
  // Reads N from the first 8 bytes of a file of `file_size` bytes and checks
  // it against the cap and the file.
  static std::uint64_t parse_header_length(std::span<const std::byte> first8, std::uint64_t file_size,
                                           std::string_view what);
  // Validates the JSON header (the N bytes after the prefix) of a file of
  // `file_size` bytes held in memory.
  static ShardHeader parse(std::string_view header_json, std::uint64_t file_size, std::string_view what);

  std::uint64_t header_length() const { return header_length_; }
  std::uint64_t data_start() const { return kHeaderLengthBytes + header_length_; }
  std::uint64_t data_size() const { return data_size_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // header order
  std::vector<std::size_t> offset_order() const;                       // indices by begin
  const TensorInfo* find(std::string_view name) const;
  const std::optional<std::map<std::string, std::string>>& metadata() const { return metadata_; }

 private:
  friend class HeaderSax;
  static ShardHeader parse_json(const ByteSource& source, std::uint64_t offset, std::uint64_t length,
                                std::uint64_t file_size, std::string_view what);
  void check_offsets(std::uint64_t file_size, std::string_view what);
  auto name_of() const {
    return [this](NameSlots::Id id) { return std::string_view(tensors_[id].name); };
  }

  std::uint64_t header_length_ = 0;
  std::uint64_t data_size_ = 0;
  std::vector<TensorInfo> tensors_;
  NameSlots by_name_;  // indices into tensors_
  std::uint64_t name_bytes_ = 0;
  std::uint64_t metadata_bytes_ = 0;
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

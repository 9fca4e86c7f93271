#include "safetensors/header.hpp"

#include "common/checked.hpp"
#include "common/error.hpp"
#include "common/printable.hpp"
#include "json/json_stream.hpp"
#include "json/json_writer.hpp"

#include <algorithm>
#include <numeric>

namespace mx2nv {

// Builds a ShardHeader from SAX events without a DOM: a state machine over
// the only shape a safetensors header may have. A schema error is recorded
// and the rest skipped (StrictSax::reject), so malformed JSON is reported as
// such first; duplicate keys and the caps stop the parse at once.
class HeaderSax final : public StrictSax {
 public:
  HeaderSax(ShardHeader& header, std::string_view what) : StrictSax(what), h_(header) {}

  bool start_object(std::size_t members) override {
    enter();
    switch (state_) {
      case State::Skip: return true;
      case State::Start:
        // The fast path knows the member count (the streaming parser says
        // -1): room for that many tensors up front, within the cap.
        if (members <= kMaxTensorsPerShard + 1) {
          h_.tensors_.reserve(members);
          h_.by_name_.reserve(members);
        }
        state_ = State::Top;
        return true;
      case State::MetaOpen: h_.metadata_.emplace(); state_ = State::Meta; return true;
      case State::EntryOpen: state_ = State::Entry; fields_ = 0; return true;
      default: return unexpected();
    }
  }
  bool end_object() override {
    leave();
    switch (state_) {
      case State::Skip: return true;
      case State::Top: state_ = State::Done; return true;
      case State::Meta: state_ = State::Top; return true;
      case State::Entry: state_ = State::Top; return finish_entry();
      default: return unexpected();
    }
  }
  bool start_array(std::size_t) override {
    enter();
    if (state_ == State::Skip) return true;
    if (state_ == State::ShapeOpen) {
      state_ = State::Shape;
      tensor().shape.reserve(4);  // one allocation for the usual 1-4 dimensions, not one per growth
      return true;
    }
    if (state_ == State::OffsetsOpen) {
      state_ = State::Offsets;
      offsets_ = 0;
      return true;
    }
    return unexpected();
  }
  bool end_array() override {
    leave();
    if (state_ == State::Skip) return true;
    if (state_ == State::Shape) {
      state_ = State::Entry;
      return true;
    }
    if (state_ == State::Offsets) {
      if (offsets_ != 2) return skip_with("{}: tensor \"{}\": data_offsets must be [begin, end]", what(), tensor().name);
      state_ = State::Entry;
      return true;
    }
    return unexpected();
  }
  bool key(string_t& k) override {
    switch (state_) {
      case State::Skip: return true;
      case State::Top:
        if (k == "__metadata__") {
          if (h_.metadata_) fail_input("{}: duplicate JSON key \"{}\"", what(), excerpt(k));
          state_ = State::MetaOpen;
          return true;
        }
        if (h_.tensors_.size() >= kMaxTensorsPerShard) {
          fail_input("{}: more than {} tensors in one shard header", what(), kMaxTensorsPerShard);
        }
        h_.name_bytes_ += k.size();
        if (h_.name_bytes_ > kMaxShardNameBytes) {
          fail_input("{}: tensor names exceed {} bytes in one shard header", what(), kMaxShardNameBytes);
        }
        if (!h_.by_name_.insert(static_cast<NameSlots::Id>(h_.tensors_.size()), k, h_.name_of())) {
          fail_input("{}: duplicate JSON key \"{}\"", what(), excerpt(k));
        }
        h_.tensors_.emplace_back().name = std::move(k);
        state_ = State::EntryOpen;
        return true;
      case State::Meta:
        if (h_.metadata_->count(k)) fail_input("{}: duplicate JSON key \"{}\"", what(), excerpt(k));
        h_.metadata_bytes_ += k.size();
        meta_key_ = std::move(k);
        state_ = State::MetaValue;
        return true;
      case State::Entry: {
        const int field = k == "dtype" ? 1 : k == "shape" ? 2 : k == "data_offsets" ? 4 : 0;
        if (fields_ & field) fail_input("{}: duplicate JSON key \"{}\"", what(), excerpt(k));
        if (field == 0) return skip_with("{}: tensor \"{}\": unknown field \"{}\"", what(), tensor().name, k);
        fields_ |= field;
        state_ = field == 1 ? State::Dtype : field == 2 ? State::ShapeOpen : State::OffsetsOpen;
        return true;
      }
      default: return unexpected();
    }
  }
  bool string(string_t& v) override {
    if (state_ == State::Skip) return true;
    if (state_ == State::MetaValue) {
      h_.metadata_bytes_ += v.size();
      if (h_.metadata_bytes_ > kMaxShardMetadataBytes) {
        fail_input("{}: __metadata__ exceeds {} bytes", what(), kMaxShardMetadataBytes);
      }
      h_.metadata_->emplace(std::move(meta_key_), std::move(v));
      state_ = State::Meta;
      return true;
    }
    if (state_ == State::Dtype) {
      const auto parsed = parse_dtype(v);
      if (!parsed) return skip_with("{}: tensor \"{}\": unknown dtype \"{}\"", what(), tensor().name, v);
      tensor().dtype = *parsed;
      state_ = State::Entry;
      return true;
    }
    return unexpected();
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (state_ == State::Skip) return true;
    if (state_ == State::Shape) {
      if (tensor().shape.size() == kMaxRank) {
        return skip_with("{}: tensor \"{}\": rank exceeds {}", what(), tensor().name, kMaxRank);
      }
      tensor().shape.push_back(v);
      return true;
    }
    if (state_ == State::Offsets && offsets_ < 2) {
      (offsets_++ == 0 ? tensor().begin : tensor().end) = v;
      return true;
    }
    return unexpected();
  }
  bool number_integer(number_integer_t) override { return unexpected(); }
  bool number_float(number_float_t, const string_t&) override { return unexpected(); }
  bool boolean(bool) override { return unexpected(); }
  bool null() override { return unexpected(); }

 private:
  enum class State { Start, Top, MetaOpen, Meta, MetaValue, EntryOpen, Entry, Dtype, ShapeOpen, Shape, OffsetsOpen,
                     Offsets, Done, Skip };
  TensorInfo& tensor() { return h_.tensors_.back(); }

  template <typename... Args>
  bool skip_with(fmt::format_string<Args...> format, Args&&... args) {
    state_ = State::Skip;
    return reject(format, std::forward<Args>(args)...);
  }

  // Every event not expected in the current state: name the rule it breaks.
  bool unexpected() {
    switch (state_) {
      case State::Skip: return true;
      case State::Start: return skip_with("{}: header is not a JSON object", what());
      case State::MetaOpen: return skip_with("{}: __metadata__ is not an object", what());
      case State::MetaValue: return skip_with("{}: __metadata__ value \"{}\" is not a string", what(), meta_key_);
      case State::EntryOpen: return skip_with("{}: tensor \"{}\": entry is not an object", what(), tensor().name);
      case State::Dtype: return skip_with("{}: tensor \"{}\": dtype is not a string", what(), tensor().name);
      case State::ShapeOpen: return skip_with("{}: tensor \"{}\": shape is not an array", what(), tensor().name);
      case State::Shape:
        // Negative integers parse as signed; floats and huge integers as float.
        return skip_with("{}: tensor \"{}\": shape must hold non-negative integers below 2^64", what(),
                         tensor().name);
      case State::Offsets:
        if (offsets_ < 2) {
          return skip_with("{}: tensor \"{}\": data_offsets must hold non-negative integers below 2^64", what(),
                           tensor().name);
        }
        [[fallthrough]];
      case State::OffsetsOpen:
        return skip_with("{}: tensor \"{}\": data_offsets must be [begin, end]", what(), tensor().name);
      default: return skip_with("{}: not a safetensors header", what());
    }
  }

  bool finish_entry() {
    TensorInfo& t = tensor();
    if (fields_ != 7) return skip_with("{}: tensor \"{}\": needs dtype, shape and data_offsets", what(), t.name);
    if (t.end < t.begin) {
      return skip_with("{}: tensor \"{}\": data_offsets end {} before begin {}", what(), t.name, t.end, t.begin);
    }
    const auto nbytes = tensor_nbytes(t.dtype, t.shape);
    if (!nbytes) return skip_with("{}: tensor \"{}\": size of shape overflows or is not whole bytes", what(), t.name);
    if (*nbytes != t.nbytes()) {
      return skip_with("{}: tensor \"{}\": data_offsets span {} bytes but {} {} needs {}", what(), t.name, t.nbytes(),
                       dtype_name(t.dtype), Json(t.shape).dump(), *nbytes);
    }
    return true;
  }

  ShardHeader& h_;
  State state_ = State::Start;
  int fields_ = 0;
  int offsets_ = 0;
  std::string meta_key_;
};

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

ShardHeader ShardHeader::read(const ByteSource& source, std::uint64_t file_size, std::string_view what) {
  std::byte first8[kHeaderLengthBytes] = {};
  if (file_size >= kHeaderLengthBytes) source.read_at(0, first8);
  const std::uint64_t n = parse_header_length(first8, file_size, what);
  return parse_json(source, kHeaderLengthBytes, n, file_size, what);
}

ShardHeader ShardHeader::parse(std::string_view header_json, std::uint64_t file_size, std::string_view what) {
  const MemorySource source(header_json);
  return parse_json(source, 0, header_json.size(), file_size, what);
}

ShardHeader ShardHeader::parse_json(const ByteSource& source, std::uint64_t offset, std::uint64_t length,
                                    std::uint64_t file_size, std::string_view what) {
  ShardHeader h;
  h.header_length_ = length;
  HeaderSax sax(h, what);
  parse_json_stream(source, offset, length, sax, what);
  sax.finish();
  h.check_offsets(file_size, what);
  return h;
}

void ShardHeader::check_offsets(std::uint64_t file_size, std::string_view what) {
  // Offsets sorted must tile [0, data_size) exactly: no holes, no overlaps.
  std::uint64_t cursor = 0;
  for (const std::size_t i : offset_order()) {
    const TensorInfo& t = tensors_[i];
    if (t.begin != cursor) {
      fail_input("{}: tensor \"{}\" starts at {} but the previous tensor ends at {} ({})", what, t.name, t.begin,
                 cursor, t.begin > cursor ? "hole" : "overlap");
    }
    cursor = t.end;
  }
  data_size_ = cursor;
  const auto expected = checked_add(data_start(), cursor);
  if (!expected || *expected != file_size) {
    fail_input("{}: header and tensors cover {} bytes but the file has {} ({})", what, expected ? *expected : 0,
               file_size, expected && *expected < file_size ? "trailing bytes" : "truncated");
  }
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
  const auto id = by_name_.find(name, name_of());
  return id ? &tensors_[*id] : nullptr;
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
    append_json_string(json, t.name);
    json += ":{\"dtype\":\"";
    json += dtype_name(t.dtype);
    json += "\",\"shape\":";
    append_json_uint_array(json, t.shape);
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

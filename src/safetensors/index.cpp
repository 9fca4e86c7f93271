#include "safetensors/index.hpp"

#include "json/json_fast.hpp"

#include "common/error.hpp"
#include "common/printable.hpp"
#include "json/json_stream.hpp"
#include "json/json_writer.hpp"

#include <xxhash.h>

#include <algorithm>
#include <new>

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

// weight_map goes into the name table as it streams by; every other member
// is built as JSON (with the same strict rules) and kept, within a budget.
//
// Lookup mode (`wanted` set): the index was read and checked before, and only
// the shards of the wanted tensors are recorded; no other name is kept.
class IndexSax final : public StrictSax {
 public:
  // `bulk`: tensor names are appended unchecked and indexed (duplicates
  // found) by finish_bulk() once the document is through (the fast path, which
  // declines on a duplicate so the streaming parser reports it).
  IndexSax(ShardIndex& index, NameTable& shards, std::string_view what, bool bulk = false)
      : StrictSax(what), index_(index), shards_(shards), bulk_(bulk) {}
  IndexSax(ShardIndex& index, NameTable& shards, std::string_view what, const NameTable& wanted,
           std::vector<std::string>& found)
      : StrictSax(what), index_(index), shards_(shards), wanted_(&wanted), found_(&found) {}

  bool start_object(std::size_t) override {
    enter();
    switch (state_) {
      case State::Skip: return true;
      case State::Start: state_ = State::Top; return true;
      case State::WeightMapOpen: state_ = State::WeightMap; return true;
      case State::Member: return open(Json::object());
      default: return unexpected();
    }
  }
  bool start_array(std::size_t) override {
    enter();
    if (state_ == State::Skip) return true;
    return state_ == State::Member && !(tree_.at_root() && member_ == "metadata") ? open(Json::array()) : unexpected();
  }
  bool end_object() override {
    leave();
    if (state_ == State::Skip) return true;
    if (state_ == State::Top) {
      state_ = State::Done;
      return true;
    }
    if (state_ == State::WeightMap) {
      state_ = State::Top;
      return true;
    }
    return state_ == State::Member ? close() : unexpected();
  }
  bool end_array() override {
    leave();
    if (state_ == State::Skip) return true;
    return state_ == State::Member ? close() : unexpected();
  }
  bool key(string_t& k) override {
    switch (state_) {
      case State::Skip: return true;
      case State::Top:
        if (k == "weight_map") {
          if (weight_map_seen_) fail_input("{}: duplicate JSON key \"{}\"", what(), excerpt(k));
          weight_map_seen_ = true;
          state_ = State::WeightMapOpen;
          return true;
        }
        if (index_.other.contains(k)) fail_input("{}: duplicate JSON key \"{}\"", what(), excerpt(k));
        charge(k.size());
        member_ = std::move(k);
        tree_ = JsonTree(index_.other[member_]);
        state_ = State::Member;
        return true;
      case State::WeightMap: {
        if (wanted_ != nullptr) {
          wanted_id_ = wanted_->find(k);
          state_ = State::WeightMapValue;
          return true;
        }
        if (bulk_) {
          index_.tensors.append_unindexed(k);
        } else if (!index_.tensors.insert(k).second) {
          fail_input("{}: duplicate JSON key \"{}\"", what(), excerpt(k));
        }
        if (index_.tensors.size() > kMaxIndexTensors) {
          fail_input("{}: more than {} tensors in weight_map", what(), kMaxIndexTensors);
        }
        if (index_.tensors.name_bytes() > kMaxIndexNameBytes) {
          fail_input("{}: weight_map names exceed {} bytes in total", what(), kMaxIndexNameBytes);
        }
        state_ = State::WeightMapValue;
        return true;
      }
      case State::Member: {
        const std::size_t size = k.size();
        if (!tree_.key(k)) fail_input("{}: duplicate JSON key \"{}\"", what(), excerpt(k));
        charge(size);
        return true;
      }
      default: return unexpected();
    }
  }
  bool string(string_t& v) override {
    if (state_ == State::Skip) return true;
    if (state_ == State::WeightMapValue && wanted_ != nullptr) {
      if (wanted_id_) (*found_)[*wanted_id_] = std::move(v);
      state_ = State::WeightMap;
      return true;
    }
    if (state_ == State::WeightMapValue) {
      if (!is_confined_relative_path(v)) {
        reject("{}: tensor \"{}\" names shard \"{}\", which is not a plain relative path inside the checkpoint",
                   what(), current_tensor(), v);
      } else if (is_reserved_name(v)) {
        reject("{}: tensor \"{}\" names shard \"{}\"; names starting with \"{}\" are reserved for mx2nv's state",
               what(), current_tensor(), v, kStateDirName);
      }
      const auto [shard, added] = shards_.insert(v);
      if (added && shards_.size() > kMaxShards) fail_input("{}: more than {} shard files", what(), kMaxShards);
      index_.shard_of.push_back(shard);
      state_ = State::WeightMap;
      return true;
    }
    charge(v.size());
    return value(Json(std::move(v)));
  }
  bool null() override { return value(Json(nullptr)); }
  bool boolean(bool v) override { return value(Json(v)); }
  bool number_integer(number_integer_t v) override { return value(Json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return value(Json(v)); }
  bool number_float(number_float_t v, const string_t&) override { return value(Json(v)); }

  void finish() const {
    StrictSax::finish();
    if (!weight_map_seen_) fail_input("{}: no weight_map object", what());
    if (wanted_ == nullptr && index_.tensors.size() == 0) fail_input("{}: weight_map is empty", what());
  }

 private:
  enum class State { Start, Top, WeightMapOpen, WeightMap, WeightMapValue, Member, Done, Skip };

  std::string_view current_tensor() const {
    if (wanted_ != nullptr) return "?";  // lookup mode keeps no names (and the index was checked before)
    return index_.tensors.name(static_cast<NameTable::Id>(index_.tensors.size() - 1));
  }
  template <typename... Args>
  bool skip_with(fmt::format_string<Args...> format, Args&&... args) {
    state_ = State::Skip;
    return reject(format, std::forward<Args>(args)...);
  }
  bool unexpected() {
    switch (state_) {
      case State::Skip: return true;
      case State::Start: return skip_with("{}: not a JSON object", what());
      case State::WeightMapOpen: return skip_with("{}: no weight_map object", what());
      case State::WeightMapValue:
        return skip_with("{}: weight_map entry \"{}\" is not a string", what(), current_tensor());
      case State::Member: return skip_with("{}: metadata is not an object", what());
      default: return skip_with("{}: not an index document", what());
    }
  }
  void charge(std::size_t bytes) {
    other_bytes_ += bytes + sizeof(Json);
    if (other_bytes_ > kMaxIndexOtherBytes) {
      fail_input("{}: members outside weight_map exceed {} bytes", what(), kMaxIndexOtherBytes);
    }
  }
  // A value inside a member (or the member itself, when it is a scalar).
  bool value(Json&& v) {
    if (state_ == State::Skip) return true;
    if (state_ != State::Member || (tree_.at_root() && member_ == "metadata")) return unexpected();
    charge(0);
    tree_.place(std::move(v));
    if (tree_.at_root()) state_ = State::Top;
    return true;
  }
  bool open(Json&& container) {
    charge(0);
    tree_.open(std::move(container));
    return true;
  }
  bool close() {
    tree_.close();
    if (tree_.at_root()) state_ = State::Top;
    return true;
  }

  ShardIndex& index_;
  NameTable& shards_;
  State state_ = State::Start;
  bool weight_map_seen_ = false;
  std::string member_;
  JsonTree tree_{index_.other};  // the member being built (set at its key)
  std::uint64_t other_bytes_ = 0;
  bool bulk_ = false;
  const NameTable* wanted_ = nullptr;  // lookup mode
  std::vector<std::string>* found_ = nullptr;
  std::optional<NameTable::Id> wanted_id_;
};

void check_converted_index_caps(std::uint64_t tensors, std::uint64_t name_bytes) {
  if (tensors > kMaxIndexTensors || name_bytes > kMaxIndexNameBytes) {
    fail_input("{}: the converted index would hold {} tensors with {} bytes of names, over the limits every reader "
               "applies ({} tensors, {} bytes)",
               kIndexFileName, tensors, name_bytes, kMaxIndexTensors, kMaxIndexNameBytes);
  }
}

ShardIndex read_shard_index(const ByteSource& source, std::uint64_t size, std::string_view what,
                            IndexParser parser) {
  ShardIndex index;
  NameTable shards;
  {
    // simdjson first (json_fast.hpp); a decline may come after part of the
    // index was built, so the streaming parser starts again from nothing.
    IndexSax sax(index, shards, what, true);
    if (parser == IndexParser::Streaming || !parse_large_object_fast(source, size, sax, what) ||
        index.tensors.index_appended()) {  // a repeated name: the streaming parser reports it
      index = ShardIndex();
      shards = NameTable();
      IndexSax canonical(index, shards, what);
      parse_json_streaming(source, 0, size, canonical, what);
      canonical.finish();
    } else {
      sax.finish();
    }
  }
  // Shard ids in order of first mention -> positions in the sorted list.
  const std::vector<NameTable::Id> sorted = shards.sorted_ids();
  std::vector<std::uint32_t> position(sorted.size());
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    position[sorted[i]] = static_cast<std::uint32_t>(i);
    index.shard_files.emplace_back(shards.name(sorted[i]));
  }
  for (auto& s : index.shard_of) s = position[s];
  XXH3_state_t* state = XXH3_createState();
  if (state == nullptr) throw std::bad_alloc();
  XXH3_64bits_reset(state);
  for (std::size_t i = 0; i < index.shard_of.size(); ++i) {
    const std::string_view name = index.tensors.name(static_cast<NameTable::Id>(i));
    const std::uint64_t length = name.size();
    XXH3_64bits_update(state, &length, sizeof length);
    XXH3_64bits_update(state, name.data(), name.size());
    XXH3_64bits_update(state, &index.shard_of[i], sizeof index.shard_of[i]);
  }
  // And the other members (metadata...), which DST's index carries over.
  const std::string other = index.other.dump();
  XXH3_64bits_update(state, other.data(), other.size());
  index.fingerprint = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return index;
}

std::vector<std::string> find_indexed_shards(const ByteSource& source, std::uint64_t size, std::string_view what,
                                             const std::vector<std::string>& tensors) {
  NameTable wanted;
  for (const auto& t : tensors) wanted.insert(t);
  std::vector<std::string> found(wanted.size());
  ShardIndex index;
  NameTable shards;
  IndexSax sax(index, shards, what, wanted, found);
  parse_json_stream(source, 0, size, sax, what);
  sax.finish();
  std::vector<std::string> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) out.push_back(found[*wanted.find(t)]);
  return out;
}

ShardIndex parse_shard_index(std::string_view text, std::string_view what) {
  const MemorySource source(text);
  return read_shard_index(source, text.size(), what);
}

void ShardIndex::forget_tensors() {
  tensors = NameTable();
  shard_of = std::vector<std::uint32_t>();
}

std::string_view ShardIndex::shard_for(std::string_view tensor) const {
  const auto id = tensors.find(tensor);
  return id ? std::string_view(shard_files[shard_of[*id]]) : std::string_view();
}

void IndexCoverage::add_shard(std::size_t shard, const ShardHeader& header) {
  const std::string& file = index_.shard_files[shard];
  for (const TensorInfo& t : header.tensors()) {
    const auto id = index_.tensors.find(t.name);
    if (!id) fail_input("{}: tensor \"{}\" is not in the index", file, t.name);
    if (index_.shard_of[*id] != shard) {
      fail_input("{}: tensor \"{}\" is indexed to shard \"{}\" (stored twice or mis-indexed)", file, t.name,
                 index_.shard_files[index_.shard_of[*id]]);
    }
    seen_[*id] = 1;
  }
  covered_ += header.tensors().size();
}

void IndexCoverage::finish() const {
  if (covered_ == index_.tensors.size()) return;
  for (std::size_t id = 0; id < seen_.size(); ++id) {
    if (!seen_[id]) {
      fail_input("{}: indexed tensor \"{}\" is missing from shard \"{}\"", kIndexFileName,
                 index_.tensors.name(static_cast<NameTable::Id>(id)), index_.shard_files[index_.shard_of[id]]);
    }
  }
}

namespace {

char char_at(const IndexEntry& e, std::size_t i) { return i < e.name.size() ? e.name[i] : e.suffix[i - e.name.size()]; }

}  // namespace

// Orders entries by their full name, name + suffix, bytewise (as std::string
// compares), without building it.
bool full_name_less(const IndexEntry& a, const IndexEntry& b) {
  const std::size_t common = std::min(a.name.size(), b.name.size());
  if (const int c = a.name.substr(0, common).compare(b.name.substr(0, common)); c != 0) return c < 0;
  const std::size_t na = a.name.size() + a.suffix.size(), nb = b.name.size() + b.suffix.size();
  for (std::size_t i = common; i < std::min(na, nb); ++i) {
    const auto x = static_cast<unsigned char>(char_at(a, i)), y = static_cast<unsigned char>(char_at(b, i));
    if (x != y) return x < y;
  }
  return na < nb;
}

void render_shard_index(const Json& other, std::size_t count, const IndexEntries& entry, std::uint64_t total_size,
                        const TextSink& sink) {
  Json doc = other;
  if (!doc.contains("metadata")) doc["metadata"] = Json::object();
  doc["metadata"]["total_size"] = total_size;
  doc["weight_map"] = Json::object();
  const std::string text = doc.dump(2);
  // Splice the (large) weight_map in as text rather than as a DOM. At
  // indent 2, a top-level key is the only thing that can follow a newline
  // and exactly two spaces (strings escape newlines).
  constexpr std::string_view kSlot = "\n  \"weight_map\": {}";
  const std::size_t at = text.find(kSlot) + kSlot.size() - 1;  // the closing brace
  std::vector<std::uint32_t> order(count);
  for (std::size_t i = 0; i < count; ++i) order[i] = static_cast<std::uint32_t>(i);
  const auto less = [&](std::uint32_t a, std::uint32_t b) { return full_name_less(entry(a), entry(b)); };
  if (!std::is_sorted(order.begin(), order.end(), less)) std::sort(order.begin(), order.end(), less);
  std::string piece = text.substr(0, at);
  for (std::size_t i = 0; i < count; ++i) {
    const IndexEntry e = entry(order[i]);
    piece += i == 0 ? "\n    " : ",\n    ";
    append_json_string(piece, e.name, e.suffix);
    piece += ": ";
    append_json_string(piece, e.shard);
    if (piece.size() >= kJsonChunkBytes) {
      sink(piece);
      piece.clear();
    }
  }
  if (count != 0) piece += "\n  ";
  piece += text.substr(at);
  piece += '\n';
  sink(piece);
}

std::string render_shard_index(const Json& other, const std::vector<IndexEntry>& weight_map, std::uint64_t total_size) {
  std::string out;
  render_shard_index(
      other, weight_map.size(), [&](std::size_t i) { return weight_map[i]; }, total_size,
      [&](std::string_view piece) { out += piece; });
  return out;
}

}  // namespace mx2nv

// Interned names for checkpoints with hundreds of thousands of tensors: the
// bytes live in one chunked arena (addresses stay valid when the table moves
// or grows), each name gets a dense 32-bit id, and lookups go through an
// open-addressing table of ids. About 16 bytes per name plus the name itself
// (a 4-byte position, a 1-2 byte length prefix, 8-byte slots at load <= 3/4),
// against ~150 for a std::map<std::string, ...> node.
#pragma once

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace mx2nv {

// Bytes of names that stay where they are: chunks of 1 MiB (a long name gets
// a block of its own), so a view into the arena survives moving the arena.
// Each name is stored after its length (LEB128) and has a 32-bit position:
// the arena is addressed as 1 MiB pages, a block spanning several. Positions
// cover 4 GiB; every caller's names are capped far below (the index's at
// kMaxIndexNameBytes, a header's at kMaxShardNameBytes).
class NameArena {
 public:
  using Position = std::uint32_t;
  Position append(std::string_view name);
  std::string_view at(Position position) const;
  std::string_view store(std::string_view name) { return at(append(name)); }

 private:
  static constexpr unsigned kPageBits = 20;
  static constexpr std::size_t kPageBytes = std::size_t{1} << kPageBits;
  static constexpr std::size_t kMaxPages = std::size_t{1} << (32 - kPageBits);
  std::vector<std::unique_ptr<char[]>> blocks_;
  std::vector<char*> pages_;  // page i starts at pages_[i]
  std::size_t open_page_ = 0;  // the page being filled and its free bytes
  std::size_t open_used_ = kPageBytes;
};

class NameTable {
 public:
  using Id = std::uint32_t;

  // The id of `name`, adding it if absent; second is true when it was added.
  // Not while names appended by append_unindexed() wait for index_appended().
  std::pair<Id, bool> insert(std::string_view name);
  // Bulk loading (a large index): appends `name` without looking it up, and
  // index_appended() later places every such name in the lookup with each
  // slot prefetched well ahead of its use, where an insert costs a cache miss
  // once the slots outgrow the cache. Until then the appended names are not
  // found and may repeat.
  Id append_unindexed(std::string_view name);
  // Places the names appended since the last call; the id of the first one
  // that repeats an earlier name, if any (the table is then unusable).
  std::optional<Id> index_appended();
  std::optional<Id> find(std::string_view name) const;
  std::string_view name(Id id) const { return arena_.at(positions_[id]); }
  std::size_t size() const { return positions_.size(); }
  std::uint64_t name_bytes() const { return name_bytes_; }
  // Ids ordered by name (bytewise), for sorted output.
  std::vector<Id> sorted_ids() const;
  // The names' bytes, without the lookup (positions and slots: ~16 bytes a
  // name): for a caller that keeps views of the names and looks nothing up again.
  NameArena take_names() && { return std::move(arena_); }
  // Frees the lookup (8-11 bytes a name); names stay readable by id, find()
  // finds nothing and insert() may not be called again.
  void drop_lookup() { slots_ = std::vector<Slot>(); }

 private:
  static constexpr Id kEmpty = ~Id{0};
  // A slot keeps 32 bits of its name's hash: probing past other names and
  // growing the table compare and rehash those, never touching the names (in
  // a large table each such touch is a cache miss). That keeps probe
  // sequences cheap enough for a load of 3/4 (half the slots of 1/2).
  struct Slot {
    Id id = kEmpty;
    std::uint32_t hash = 0;
  };
  void grow();
  void resize_slots(std::size_t slots);
  std::size_t slot_of(std::string_view name, std::uint32_t hash) const;
  static std::uint32_t hash_of(std::string_view name);

  NameArena arena_;
  std::vector<NameArena::Position> positions_;  // per id
  std::vector<Slot> slots_;  // power-of-two size, load <= 3/4
  std::uint64_t name_bytes_ = 0;
  std::size_t indexed_ = 0;  // ids below this are in slots_
};

// XXH3 of a name, under a per-process seed (name_table.cpp): the one hash
// every table here uses, on names by the hundred thousand.
std::uint64_t name_hash(std::string_view name);

// An open-addressing set of dense ids whose names live elsewhere (a shard
// header's tensors): 8 bytes per name at most, no copy of the name.
class NameSlots {
 public:
  using Id = std::uint32_t;

  // Room for `names` without growing (each growth hashes every name again).
  void reserve(std::size_t names) {
    std::size_t want = 16;
    while (want < 2 * names) want *= 2;
    if (size_ == 0 && want > slots_.size()) slots_.assign(want, kEmpty);
  }

  // The id named `name`, if any; name_of(id) gives an id's name.
  template <typename NameOf>
  std::optional<Id> find(std::string_view name, const NameOf& name_of) const {
    if (slots_.empty()) return std::nullopt;
    const Id id = slots_[slot_of(name, name_of)];
    if (id == kEmpty) return std::nullopt;
    return id;
  }
  // Adds `id`, named `name`; false (and nothing added) if the name is taken.
  template <typename NameOf>
  bool insert(Id id, std::string_view name, const NameOf& name_of) {
    if ((size_ + 1) * 2 > slots_.size()) {
      std::vector<Id> old = std::move(slots_);
      slots_.assign(std::max<std::size_t>(16, old.size() * 2), kEmpty);
      for (const Id o : old) {
        if (o != kEmpty) slots_[slot_of(name_of(o), name_of)] = o;
      }
    }
    const std::size_t slot = slot_of(name, name_of);
    if (slots_[slot] != kEmpty) return false;
    slots_[slot] = id;
    ++size_;
    return true;
  }

 private:
  static constexpr Id kEmpty = ~Id{0};
  template <typename NameOf>
  std::size_t slot_of(std::string_view name, const NameOf& name_of) const {
    const std::size_t mask = slots_.size() - 1;
    for (std::size_t i = static_cast<std::size_t>(name_hash(name)) & mask;; i = (i + 1) & mask) {
      if (slots_[i] == kEmpty || name_of(slots_[i]) == name) return i;
    }
  }
  std::vector<Id> slots_;
  std::size_t size_ = 0;
};

}  // namespace mx2nv

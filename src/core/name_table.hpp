// Interned names for checkpoints with hundreds of thousands of tensors: the
// bytes live in one chunked arena (addresses stay valid when the table moves
// or grows), each name gets a dense 32-bit id, and lookups go through an
// open-addressing table of ids. About 32 bytes per name plus the name itself,
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

class NameTable {
 public:
  using Id = std::uint32_t;

  // The id of `name`, adding it if absent; second is true when it was added.
  std::pair<Id, bool> insert(std::string_view name);
  std::optional<Id> find(std::string_view name) const;
  std::string_view name(Id id) const { return names_[id]; }
  std::size_t size() const { return names_.size(); }
  std::uint64_t name_bytes() const { return name_bytes_; }
  // Ids ordered by name (bytewise), for sorted output.
  std::vector<Id> sorted_ids() const;

 private:
  static constexpr Id kEmpty = ~Id{0};
  static constexpr std::size_t kChunkBytes = 1 << 20;
  // A slot keeps 32 bits of its name's hash: probing past other names and
  // growing the table compare and rehash those, never touching the names
  // (at K3's 500k names each such touch was a cache miss).
  struct Slot {
    Id id = kEmpty;
    std::uint32_t hash = 0;
  };
  std::string_view store(std::string_view name);
  void grow();
  std::size_t slot_of(std::string_view name, std::uint32_t hash) const;
  static std::uint32_t hash_of(std::string_view name);

  std::vector<std::unique_ptr<char[]>> chunks_;
  char* open_ = nullptr;  // free space of the chunk being filled
  std::size_t open_left_ = 0;
  std::vector<std::string_view> names_;
  std::vector<Slot> slots_;  // power-of-two size, load <= 1/2
  std::uint64_t name_bytes_ = 0;
};

// An open-addressing set of dense ids whose names live elsewhere (a shard
// header's tensors): 8 bytes per name at most, no copy of the name.
class NameSlots {
 public:
  using Id = std::uint32_t;

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
    for (std::size_t i = std::hash<std::string_view>{}(name) & mask;; i = (i + 1) & mask) {
      if (slots_[i] == kEmpty || name_of(slots_[i]) == name) return i;
    }
  }
  std::vector<Id> slots_;
  std::size_t size_ = 0;
};

}  // namespace mx2nv

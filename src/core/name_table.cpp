#include "core/name_table.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

namespace mx2nv {

std::uint32_t NameTable::hash_of(std::string_view name) {
  return static_cast<std::uint32_t>(XXH3_64bits(name.data(), name.size()));
}

// The table never exceeds 2^32 slots (ids are 32-bit), so the stored 32 bits
// are enough to place a name in it.
std::size_t NameTable::slot_of(std::string_view name, std::uint32_t hash) const {
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t i = hash & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.id == kEmpty || (s.hash == hash && names_[s.id] == name)) return i;
  }
}

std::optional<NameTable::Id> NameTable::find(std::string_view name) const {
  if (slots_.empty()) return std::nullopt;
  const Id id = slots_[slot_of(name, hash_of(name))].id;
  if (id == kEmpty) return std::nullopt;
  return id;
}

std::pair<NameTable::Id, bool> NameTable::insert(std::string_view name) {
  if ((names_.size() + 1) * 2 > slots_.size()) grow();
  const std::uint32_t hash = hash_of(name);
  Slot& slot = slots_[slot_of(name, hash)];
  if (slot.id != kEmpty) return {slot.id, false};
  const auto id = static_cast<Id>(names_.size());
  names_.push_back(store(name));
  slot = {id, hash};
  name_bytes_ += name.size();
  return {id, true};
}

std::string_view NameTable::store(std::string_view name) {
  if (name.empty()) return {};
  if (name.size() > kChunkBytes / 4) {
    // Long names get a chunk of their own; the open chunk stays open.
    auto& own = chunks_.emplace_back(std::make_unique<char[]>(name.size()));
    std::memcpy(own.get(), name.data(), name.size());
    return {own.get(), name.size()};
  }
  if (name.size() > open_left_) {
    open_ = chunks_.emplace_back(std::make_unique<char[]>(kChunkBytes)).get();
    open_left_ = kChunkBytes;
  }
  char* at = open_;
  std::memcpy(at, name.data(), name.size());
  open_ += name.size();
  open_left_ -= name.size();
  return {at, name.size()};
}

void NameTable::grow() {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(std::max<std::size_t>(64, old.size() * 2), Slot{});
  const std::size_t mask = slots_.size() - 1;
  for (const Slot& s : old) {
    if (s.id == kEmpty) continue;
    std::size_t i = s.hash & mask;
    while (slots_[i].id != kEmpty) i = (i + 1) & mask;
    slots_[i] = s;
  }
}

std::vector<NameTable::Id> NameTable::sorted_ids() const {
  std::vector<Id> ids(names_.size());
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<Id>(i);
  std::sort(ids.begin(), ids.end(), [&](Id a, Id b) { return names_[a] < names_[b]; });
  return ids;
}

}  // namespace mx2nv

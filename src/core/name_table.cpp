#include "core/name_table.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

namespace mx2nv {

std::size_t NameTable::slot_of(std::string_view name) const {
  const auto h = static_cast<std::size_t>(XXH3_64bits(name.data(), name.size()));
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t i = h & mask;; i = (i + 1) & mask) {
    if (slots_[i] == kEmpty || names_[slots_[i]] == name) return i;
  }
}

std::optional<NameTable::Id> NameTable::find(std::string_view name) const {
  if (slots_.empty()) return std::nullopt;
  const Id id = slots_[slot_of(name)];
  if (id == kEmpty) return std::nullopt;
  return id;
}

std::pair<NameTable::Id, bool> NameTable::insert(std::string_view name) {
  if ((names_.size() + 1) * 2 > slots_.size()) grow();
  const std::size_t slot = slot_of(name);
  if (slots_[slot] != kEmpty) return {slots_[slot], false};
  const auto id = static_cast<Id>(names_.size());
  names_.push_back(store(name));
  slots_[slot] = id;
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
  std::vector<Id> old = std::move(slots_);
  slots_.assign(std::max<std::size_t>(64, old.size() * 2), kEmpty);
  for (const Id id : old) {
    if (id != kEmpty) slots_[slot_of(names_[id])] = id;
  }
}

std::vector<NameTable::Id> NameTable::sorted_ids() const {
  std::vector<Id> ids(names_.size());
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<Id>(i);
  std::sort(ids.begin(), ids.end(), [&](Id a, Id b) { return names_[a] < names_[b]; });
  return ids;
}

}  // namespace mx2nv

#include "safetensors/name_table.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <stdexcept>

namespace mx2nv {

namespace {

// A seed drawn once per process: names come from hostile files, and with a
// fixed hash a header or index could be made of names that all collide
// (quadratic probing: a 65k-tensor header would take billions of
// comparisons). Placement only: no output depends on the hash.
std::uint64_t process_seed() {
  static const std::uint64_t seed = [] {
    std::random_device device;
    return (static_cast<std::uint64_t>(device()) << 32) ^ device();
  }();
  return seed;
}

}  // namespace

std::uint64_t name_hash(std::string_view name) { return XXH3_64bits_withSeed(name.data(), name.size(), process_seed()); }

std::uint32_t NameTable::hash_of(std::string_view name) { return static_cast<std::uint32_t>(name_hash(name)); }

NameArena::Position NameArena::append(std::string_view name) {
  char prefix[10];
  std::size_t prefix_size = 0;
  for (std::uint64_t n = name.size();; n >>= 7) {
    prefix[prefix_size++] = static_cast<char>((n & 0x7f) | (n >= 0x80 ? 0x80 : 0));
    if (n < 0x80) break;
  }
  const std::size_t size = prefix_size + name.size();
  char* at = nullptr;
  std::size_t page = 0, offset = 0;
  // Blocks are not zeroed: only the bytes written are ever read, and an
  // untouched tail then costs no memory.
  if (size > kPageBytes / 4) {
    // A long name gets a block of its own, exactly its size, which takes as
    // many page numbers as it spans (positions stay below 4 GiB of names);
    // only the first is ever read. The open page stays open.
    const std::size_t pages = (size + kPageBytes - 1) / kPageBytes;
    if (pages_.size() + pages > kMaxPages) throw std::length_error("name arena: more than 4 GiB of names");
    at = blocks_.emplace_back(std::make_unique_for_overwrite<char[]>(size)).get();
    page = pages_.size();
    pages_.push_back(at);
    pages_.resize(pages_.size() + pages - 1, nullptr);
  } else {
    if (size > kPageBytes - open_used_) {
      if (pages_.size() + 1 > kMaxPages) throw std::length_error("name arena: more than 4 GiB of names");
      open_page_ = pages_.size();
      open_used_ = 0;
      pages_.push_back(blocks_.emplace_back(std::make_unique_for_overwrite<char[]>(kPageBytes)).get());
    }
    page = open_page_;
    offset = open_used_;
    at = pages_[page] + offset;
    open_used_ += size;
  }
  std::memcpy(at, prefix, prefix_size);
  if (!name.empty()) std::memcpy(at + prefix_size, name.data(), name.size());
  return static_cast<Position>((page << kPageBits) | offset);
}

std::string_view NameArena::at(Position position) const {
  const char* p = pages_[position >> kPageBits] + (position & (kPageBytes - 1));
  std::size_t size = 0;
  for (unsigned shift = 0;; shift += 7) {
    const auto byte = static_cast<unsigned char>(*p++);
    size |= static_cast<std::size_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) break;
  }
  return {p, size};
}

// The table never exceeds 2^32 slots (ids are 32-bit), so the stored 32 bits
// are enough to place a name in it.
std::size_t NameTable::slot_of(std::string_view name, std::uint32_t hash) const {
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t i = hash & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.id == kEmpty || (s.hash == hash && arena_.at(positions_[s.id]) == name)) return i;
  }
}

std::optional<NameTable::Id> NameTable::find(std::string_view name) const {
  if (slots_.empty()) return std::nullopt;
  const Id id = slots_[slot_of(name, hash_of(name))].id;
  if (id == kEmpty) return std::nullopt;
  return id;
}

std::pair<NameTable::Id, bool> NameTable::insert(std::string_view name) {
  if (indexed_ != positions_.size()) throw std::logic_error("NameTable::insert with names not yet indexed");
  if ((positions_.size() + 1) * 4 > slots_.size() * 3) grow();
  const std::uint32_t hash = hash_of(name);
  Slot& slot = slots_[slot_of(name, hash)];
  if (slot.id != kEmpty) return {slot.id, false};
  const auto id = static_cast<Id>(positions_.size());
  positions_.push_back(arena_.append(name));
  indexed_ = positions_.size();
  slot = {id, hash};
  name_bytes_ += name.size();
  return {id, true};
}

NameTable::Id NameTable::append_unindexed(std::string_view name) {
  const auto id = static_cast<Id>(positions_.size());
  positions_.push_back(arena_.append(name));
  name_bytes_ += name.size();
  return id;
}

std::optional<NameTable::Id> NameTable::index_appended() {
  const std::size_t n = positions_.size();
  std::size_t want = std::max<std::size_t>(64, slots_.size());
  while (n * 4 > want * 3) want *= 2;
  if (want != slots_.size()) resize_slots(want);
  const std::size_t mask = slots_.size() - 1;
  // Hashes first (the names are read in arena order), then each insertion
  // with the slot of the one kAhead later already on its way into cache.
  constexpr std::size_t kAhead = 16;
  std::vector<std::uint32_t> hashes(n - indexed_);
  for (std::size_t i = indexed_; i < n; ++i) hashes[i - indexed_] = hash_of(name(static_cast<Id>(i)));
  for (std::size_t i = indexed_; i < n; ++i) {
    if (i + kAhead < n) __builtin_prefetch(&slots_[hashes[i + kAhead - indexed_] & mask]);
    const std::uint32_t hash = hashes[i - indexed_];
    const std::string_view added = name(static_cast<Id>(i));
    for (std::size_t at = hash & mask;; at = (at + 1) & mask) {
      Slot& slot = slots_[at];
      if (slot.id == kEmpty) {
        slot = {static_cast<Id>(i), hash};
        break;
      }
      if (slot.hash == hash && name(slot.id) == added) return static_cast<Id>(i);
    }
  }
  indexed_ = n;
  return std::nullopt;
}

void NameTable::grow() { resize_slots(std::max<std::size_t>(64, slots_.size() * 2)); }

void NameTable::resize_slots(std::size_t slots) {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(slots, Slot{});
  const std::size_t mask = slots_.size() - 1;
  for (const Slot& s : old) {
    if (s.id == kEmpty) continue;
    std::size_t i = s.hash & mask;
    while (slots_[i].id != kEmpty) i = (i + 1) & mask;
    slots_[i] = s;
  }
}

std::vector<NameTable::Id> NameTable::sorted_ids() const {
  // Sorted as (view, id) pairs: a comparison reads the two names and nothing
  // else (through ids it also read two positions and decoded two lengths).
  std::vector<std::pair<std::string_view, Id>> named(positions_.size());
  for (std::size_t i = 0; i < named.size(); ++i) named[i] = {name(static_cast<Id>(i)), static_cast<Id>(i)};
  std::sort(named.begin(), named.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Id> ids(named.size());
  for (std::size_t i = 0; i < named.size(); ++i) ids[i] = named[i].second;
  return ids;
}

}  // namespace mx2nv

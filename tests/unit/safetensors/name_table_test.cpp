// Interned names: the arena's length prefixes and pages, the table's lookups,
// and its bulk loading (names appended unchecked, then indexed at once with
// their duplicates found).
#include "safetensors/name_table.hpp"

#include <gtest/gtest.h>

#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace mx2nv {
namespace {

TEST(NameArena, EveryLengthPrefixAndPageBoundaryReadsBack) {
  // LEB128 boundaries, a name filling most of a page, one with a block of its
  // own, and one spanning several pages.
  std::vector<std::string> names;
  for (const std::size_t n : {0u, 1u, 127u, 128u, 16383u, 16384u, 200000u, 262145u, 1048576u, 3000000u}) {
    std::string s(n, 'x');
    for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>('a' + (i * 7 + n) % 26);
    names.push_back(s);
  }
  for (int i = 0; i < 20000; ++i) names.push_back("model.layers." + std::to_string(i) + ".mlp.experts.w1");
  NameArena arena;
  std::vector<NameArena::Position> at;
  std::vector<std::string_view> views;
  for (const auto& n : names) {
    at.push_back(arena.append(n));
    views.push_back(arena.at(at.back()));
  }
  const NameArena moved = std::move(arena);  // views stay valid
  for (std::size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(moved.at(at[i]), names[i]) << i;
    EXPECT_EQ(views[i], names[i]) << i;
  }
}

std::vector<std::string> some_names(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::string> out;
  for (std::size_t i = 0; i < n; ++i) {
    out.push_back("layers." + std::to_string(rng() % 97) + ".experts." + std::to_string(i) + ".w" +
                  std::to_string(rng() % 3 + 1) + std::string(rng() % 40, 'p'));
  }
  return out;
}

TEST(NameTable, InsertFindAndSortedIds) {
  const auto names = some_names(50000, 1);
  NameTable t;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto [id, added] = t.insert(names[i]);
    EXPECT_TRUE(added);
    EXPECT_EQ(id, i);
  }
  EXPECT_FALSE(t.insert(names[123]).second);
  EXPECT_EQ(t.insert(names[123]).first, 123u);
  for (std::size_t i = 0; i < names.size(); i += 97) EXPECT_EQ(t.find(names[i]), i);
  EXPECT_FALSE(t.find("absent"));
  const auto sorted = t.sorted_ids();
  for (std::size_t i = 1; i < sorted.size(); ++i) EXPECT_LT(t.name(sorted[i - 1]), t.name(sorted[i]));
}

TEST(NameTable, BulkLoadingFindsEveryNameAndTheFirstRepeat) {
  const auto names = some_names(100000, 2);
  NameTable t;
  t.insert("before");  // indexed names and appended ones mix
  for (const auto& n : names) t.append_unindexed(n);
  EXPECT_THROW(t.insert("x"), std::logic_error);  // appended names are not indexed yet
  EXPECT_EQ(t.index_appended(), std::nullopt);
  EXPECT_EQ(t.size(), names.size() + 1);
  for (std::size_t i = 0; i < names.size(); i += 31) EXPECT_EQ(t.find(names[i]), i + 1);
  EXPECT_EQ(t.find("before"), 0u);
  EXPECT_TRUE(t.insert("after").second);

  // A repeat far from its first occurrence, and of a name indexed before.
  for (const std::string& repeated : {names[5], std::string("before")}) {
    NameTable u;
    u.insert("before");
    for (std::size_t i = 0; i < 5000; ++i) u.append_unindexed(names[i]);
    u.append_unindexed(repeated);
    u.append_unindexed("tail");
    EXPECT_EQ(u.index_appended(), 5001u) << repeated;
  }
}

TEST(NameSlots, ReservedOrGrownTheSameSet) {
  const auto names = some_names(3000, 3);
  const auto name_of = [&](NameSlots::Id id) { return std::string_view(names[id]); };
  NameSlots reserved, grown;
  reserved.reserve(names.size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    EXPECT_TRUE(reserved.insert(static_cast<NameSlots::Id>(i), names[i], name_of));
    EXPECT_TRUE(grown.insert(static_cast<NameSlots::Id>(i), names[i], name_of));
  }
  EXPECT_FALSE(reserved.insert(7, names[7], name_of));
  for (std::size_t i = 0; i < names.size(); i += 13) {
    EXPECT_EQ(reserved.find(names[i], name_of), i);
    EXPECT_EQ(grown.find(names[i], name_of), i);
  }
  EXPECT_FALSE(reserved.find("absent", name_of));
}

}  // namespace
}  // namespace mx2nv

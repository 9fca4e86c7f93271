// Module discovery, the scale scanner (against brute force), and planning:
// shared gate/up globals, over-span reporting, zero groups, NaN refusal.
#include "common/error.hpp"
#include "model/modules.hpp"
#include "model/scale_scan.hpp"
#include "plan/plan.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>

namespace mx2nv {
namespace {

class MemorySource final : public ByteSource {
 public:
  std::vector<std::byte> bytes;
  mutable std::uint64_t reads = 0;
  void read_at(std::uint64_t offset, std::span<std::byte> out) const override {
    ASSERT_LE(offset + out.size(), bytes.size());
    std::memcpy(out.data(), bytes.data() + offset, out.size());
    ++reads;
  }
};

// A module in memory: packed at offset 0 of `packed`, scales at 0 of `scale`.
struct MemModule {
  QuantModule module;
  MemorySource packed, scale;
  std::vector<bool> active;
  ModuleLocation where() { return {&packed, 0, &scale, 0, "mem"}; }
};

MemModule make(std::uint64_t rows, std::uint64_t groups, const std::function<std::pair<int, bool>(std::uint64_t)>& gen) {
  MemModule m;
  m.module.name = "m";
  m.module.rows = rows;
  m.module.groups = groups;
  m.packed.bytes.resize(static_cast<std::size_t>(rows * groups * 16));
  m.scale.bytes.resize(static_cast<std::size_t>(rows * groups));
  for (std::uint64_t p = 0; p < rows * groups; ++p) {
    const auto [k, active] = gen(p);
    m.scale.bytes[p] = static_cast<std::byte>(k + 127);
    m.active.push_back(active);
    if (active) m.packed.bytes[p * 16 + p % 16] = std::byte{0x30};  // code 3 in the high nibble
    else m.packed.bytes[p * 16] = std::byte{0x88};                  // two -0 codes
  }
  return m;
}

TEST(GroupIsActive, SignOnlyNibblesAreZero) {
  std::byte g[16] = {};
  EXPECT_FALSE(group_is_active(g));
  for (int i = 0; i < 16; ++i) g[i] = std::byte{0x88};
  EXPECT_FALSE(group_is_active(g));
  for (int pos = 0; pos < 32; ++pos) {
    for (std::uint8_t code = 1; code < 16; ++code) {
      if ((code & 7) == 0) continue;
      std::byte h[16] = {};
      h[pos / 2] = static_cast<std::byte>(pos % 2 ? code << 4 : code);
      EXPECT_TRUE(group_is_active(h)) << pos << " " << int(code);
    }
  }
}

TEST(ModuleScanner, SmallModuleInOneFileIsReadOnce) {
  // The same module laid out in one file, packed then scales with a gap:
  // with a small gap one read serves the histogram and every probe, and the
  // answers are those of the two-file layout; with a large gap, or in two
  // files, the tensors are read separately.
  MemModule m = make(8, 4, [](std::uint64_t p) -> std::pair<int, bool> { return {-3 - static_cast<int>(p % 5), p % 3 != 0}; });
  ModuleScanner two(m.module, m.where());
  two.read_histogram();
  const auto k_max = two.active_k_max(), k_min = two.active_k_min();
  EXPECT_EQ(m.packed.reads + m.scale.reads, 2u);
  for (const std::uint64_t gap : {std::uint64_t{0}, std::uint64_t{100}, std::uint64_t{1} << 20}) {
    MemorySource file;
    file.bytes.resize(7 + m.packed.bytes.size() + gap + m.scale.bytes.size());
    std::copy(m.packed.bytes.begin(), m.packed.bytes.end(), file.bytes.begin() + 7);
    const std::uint64_t scale_at = 7 + m.packed.bytes.size() + gap;
    std::copy(m.scale.bytes.begin(), m.scale.bytes.end(), file.bytes.begin() + static_cast<std::ptrdiff_t>(scale_at));
    ModuleScanner one(m.module, {&file, 7, &file, scale_at, "mem"});
    one.read_histogram();
    EXPECT_EQ(one.histogram(), two.histogram());
    EXPECT_EQ(one.active_k_max(), k_max);
    EXPECT_EQ(one.active_k_min(), k_min);
    EXPECT_EQ(file.reads, gap > 4096 ? 2u : 1u) << "gap " << gap;
  }
}

TEST(ModuleScanner, ExtremesIgnoreZeroGroups) {
  // Zero groups carry the most extreme scales; active ones span [-10, -3].
  MemModule m = make(8, 4, [](std::uint64_t p) -> std::pair<int, bool> {
    if (p == 5) return {20, false};
    if (p == 6) return {-127, false};
    return {-3 - static_cast<int>(p % 8), true};
  });
  ModuleScanner s(m.module, m.where());
  s.read_histogram();
  EXPECT_EQ(s.active_k_max(), -3);
  EXPECT_EQ(s.active_k_min(), -10);
  EXPECT_EQ(s.count_active(-127, -11), 0u);
  EXPECT_LT(s.probes(), 8u);  // a handful of probes, not the whole tensor
}

TEST(ModuleScanner, AllZeroModuleHasNoExtremes) {
  MemModule m = make(4, 2, [](std::uint64_t p) { return std::pair<int, bool>{static_cast<int>(p) - 3, false}; });
  ModuleScanner s(m.module, m.where());
  s.read_histogram();
  EXPECT_FALSE(s.active_k_max().has_value());
  EXPECT_FALSE(s.active_k_min().has_value());
}

TEST(ModuleScanner, NaNScaleRefusedWithRowAndGroup) {
  MemModule m = make(3, 4, [](std::uint64_t) { return std::pair<int, bool>{0, true}; });
  m.scale.bytes[6] = std::byte{0xFF};
  ModuleScanner s(m.module, m.where());
  try {
    s.read_histogram();
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
    EXPECT_NE(std::string(e.what()).find("row 1 group 2"), std::string::npos) << e.what();
  }
}

TEST(ModuleScanner, NaNInZeroGroupIsRefusedToo) {
  MemModule m = make(2, 2, [](std::uint64_t p) { return std::pair<int, bool>{0, p != 3}; });
  m.scale.bytes[3] = std::byte{0xFF};
  ModuleScanner s(m.module, m.where());
  EXPECT_THROW(s.read_histogram(), Error);
}

// Property: whatever the mix (including many zero groups at the extremes,
// which forces the full-classification fallback), answers equal brute force.
TEST(ModuleScanner, MatchesBruteForce) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 60; ++trial) {
    const std::uint64_t rows = 1 + rng() % 40, groups = 1 + rng() % 12;
    const int zero_pct = static_cast<int>(rng() % 101);
    MemModule m = make(rows, groups, [&](std::uint64_t) -> std::pair<int, bool> {
      const bool active = static_cast<int>(rng() % 100) >= zero_pct;
      return {static_cast<int>(rng() % 40) - 30, active};
    });
    std::optional<int> kmax, kmin;
    for (std::size_t p = 0; p < m.active.size(); ++p) {
      if (!m.active[p]) continue;
      const int k = std::to_integer<int>(m.scale.bytes[p]) - 127;
      kmax = std::max(kmax.value_or(k), k);
      kmin = std::min(kmin.value_or(k), k);
    }
    ModuleScanner s(m.module, m.where());
    s.read_histogram();
    EXPECT_EQ(s.active_k_max(), kmax) << trial;
    EXPECT_EQ(s.active_k_min(), kmin) << trial;
    for (int lo = -31; lo <= 10; lo += 7) {
      std::uint64_t expect = 0;
      for (std::size_t p = 0; p < m.active.size(); ++p) {
        const int k = std::to_integer<int>(m.scale.bytes[p]) - 127;
        if (m.active[p] && k >= lo && k <= lo + 5) ++expect;
      }
      EXPECT_EQ(s.count_active(lo, lo + 5), expect) << trial;
    }
  }
}

// --- module discovery
struct HeaderBuilder {
  std::vector<TensorInfo> tensors;
  std::uint64_t cursor = 0;
  HeaderBuilder& add(const std::string& name, Dtype d, std::vector<std::uint64_t> shape) {
    const std::uint64_t n = tensor_nbytes(d, shape).value();
    tensors.push_back({name, d, std::move(shape), cursor, cursor + n});
    cursor += n;
    return *this;
  }
  ShardHeader build() const {
    const std::string h = serialize_header(std::nullopt, tensors);
    return ShardHeader::parse(std::string_view(h).substr(8), h.size() + cursor, "s");
  }
};

ErrorKind discover_error(const ShardHeader& h, const std::string& fragment) {
  try {
    discover_modules({{"s.safetensors", &h}});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    return e.kind();
  }
  ADD_FAILURE() << "accepted";
  return ErrorKind::Io;
}

TEST(Modules, PairsGateUpAcrossShards) {
  const ShardHeader a = HeaderBuilder()
                            .add("e.0.w1.weight_packed", Dtype::U8, {4, 32})
                            .add("e.0.w1.weight_scale", Dtype::U8, {4, 2})
                            .add("e.0.w2.weight_packed", Dtype::U8, {4, 16})
                            .add("e.0.w2.weight_scale", Dtype::U8, {4, 1})
                            .build();
  const ShardHeader b = HeaderBuilder()
                            .add("e.0.w3.weight_packed", Dtype::U8, {4, 32})
                            .add("e.0.w3.weight_scale", Dtype::U8, {4, 2})
                            .add("m.gate_proj.weight_packed", Dtype::U8, {2, 16})
                            .add("m.gate_proj.weight_scale", Dtype::F8_E8M0, {2, 1})
                            .add("m.up_proj.weight_packed", Dtype::U8, {2, 16})
                            .add("m.up_proj.weight_scale", Dtype::U8, {2, 1})
                            .add("norm.weight", Dtype::BF16, {4})
                            .build();
  const ModuleSet set = discover_modules({{"a", &a}, {"b", &b}});
  ASSERT_EQ(set.modules.size(), 5u);
  EXPECT_EQ(set.scale_groups.size(), 3u);
  const auto& w1 = set.modules[set.find("e.0.w1").value()];
  const auto& w3 = set.modules[set.find("e.0.w3").value()];
  EXPECT_EQ(w1.scale_group, w3.scale_group);
  EXPECT_NE(w1.scale_shard, w3.scale_shard);
  EXPECT_NE(set.modules[set.find("e.0.w2").value()].scale_group, w1.scale_group);
  EXPECT_EQ(set.modules[set.find("m.gate_proj").value()].scale_group, set.modules[set.find("m.up_proj").value()].scale_group);
  EXPECT_EQ(w1.groups, 2u);
  EXPECT_TRUE(set.is_module_tensor("e.0.w1.weight_packed"));
  EXPECT_FALSE(set.is_module_tensor("norm.weight"));
}

// A module is named; a tensor that is only a suffix belongs to no layer.
TEST(Modules, RefusesAnEmptyModuleName) {
  EXPECT_EQ(discover_error(HeaderBuilder()
                               .add(".weight_packed", Dtype::U8, {4, 16})
                               .add(".weight_scale", Dtype::U8, {4, 1})
                               .add("x.w1.weight_packed", Dtype::U8, {4, 16})
                               .add("x.w1.weight_scale", Dtype::U8, {4, 1})
                               .build(),
                           "empty module name"),
            ErrorKind::InvalidInput);
  EXPECT_EQ(discover_error(HeaderBuilder().add(".weight_scale", Dtype::U8, {4, 1}).build(), "empty module name"),
            ErrorKind::InvalidInput);
}

// Pairs only P.w1<->P.w3 and P.gate_proj<->P.up_proj with one non-empty P;
// everything else gets a global of its own.
TEST(Modules, NeverPairsAcrossParents) {
  HeaderBuilder b;
  for (const char* m : {".w1", ".w3", "a.w1", "b.w3", "c.gate_proj", "c.up_proj", "d.gate_proj", "d.w3", "w1", "w3",
                        "e.w1", "e.w3", "e.w2", "f.up_proj", "x.w1.w3"}) {
    b.add(std::string(m) + ".weight_packed", Dtype::U8, {2, 16}).add(std::string(m) + ".weight_scale", Dtype::U8, {2, 1});
  }
  const ShardHeader h = b.build();
  const ModuleSet set = discover_modules({{"s", &h}});
  std::set<std::pair<std::string, std::string>> pairs;
  for (const auto& members : set.scale_groups) {
    ASSERT_LE(members.size(), 2u);
    if (members.size() == 2) {
      auto x = set.modules[members[0]].name, y = set.modules[members[1]].name;
      pairs.emplace(std::min(x, y), std::max(x, y));
    }
  }
  EXPECT_EQ(pairs, (std::set<std::pair<std::string, std::string>>{{"c.gate_proj", "c.up_proj"}, {"e.w1", "e.w3"}}));
  for (std::size_t i = 0; i < set.modules.size(); ++i) {
    EXPECT_EQ(std::count_if(set.scale_groups.begin(), set.scale_groups.end(),
                            [&](const auto& g) { return std::find(g.begin(), g.end(), i) != g.end(); }),
              1);
  }
}

TEST(Modules, RefusesInconsistentPairs) {
  EXPECT_EQ(discover_error(HeaderBuilder().add("a.weight_packed", Dtype::U8, {4, 16}).build(), "has no"),
            ErrorKind::InvalidInput);
  EXPECT_EQ(discover_error(HeaderBuilder().add("a.weight_scale", Dtype::U8, {4, 1}).build(), "has no"),
            ErrorKind::InvalidInput);
  EXPECT_EQ(discover_error(HeaderBuilder().add("a.weight_packed", Dtype::U8, {4, 16}).add("a.weight_scale", Dtype::U8, {4, 2}).build(), "needs [4, 1]"),
            ErrorKind::InvalidInput);
  EXPECT_EQ(discover_error(HeaderBuilder().add("a.weight_packed", Dtype::U8, {4, 16}).add("a.weight_scale", Dtype::U8, {3, 1}).build(), "needs [4, 1]"),
            ErrorKind::InvalidInput);
  EXPECT_EQ(discover_error(HeaderBuilder().add("a.weight_packed", Dtype::U8, {4, 8}).add("a.weight_scale", Dtype::U8, {4, 1}).build(), "multiple of 32"),
            ErrorKind::InvalidInput);
  EXPECT_EQ(discover_error(HeaderBuilder().add("a.weight_packed", Dtype::I8, {4, 16}).add("a.weight_scale", Dtype::U8, {4, 1}).build(), "expected U8"),
            ErrorKind::InvalidInput);
  EXPECT_EQ(discover_error(HeaderBuilder().add("a.weight_packed", Dtype::U8, {4, 16}).add("a.weight_scale", Dtype::F16, {4, 1}).build(), "expected U8"),
            ErrorKind::InvalidInput);
  EXPECT_EQ(discover_error(HeaderBuilder().add("a.weight_packed", Dtype::U8, {64}).add("a.weight_scale", Dtype::U8, {4}).build(), "expected U8"),
            ErrorKind::InvalidInput);
  EXPECT_EQ(discover_error(HeaderBuilder()
                               .add("a.weight_packed", Dtype::U8, {4, 16})
                               .add("a.weight_scale", Dtype::U8, {4, 1})
                               .add("a.weight_global_scale", Dtype::F32, {1})
                               .build(),
                           "already has"),
            ErrorKind::InvalidInput);
}

// --- planning
ModuleSet two_module_pair() {
  ModuleSet set;
  for (const char* n : {"x.w1", "x.w3"}) {
    QuantModule m;
    m.name = n;
    m.rows = 1;
    m.groups = 4;
    set.modules.push_back(m);
  }
  set.scale_groups = {{0, 1}};
  return set;
}

ModuleSet single_module(const std::string& name, std::uint64_t groups) {
  ModuleSet set;
  QuantModule m;
  m.name = set.names.store(name);
  m.rows = 1;
  m.groups = groups;
  set.modules.push_back(m);
  set.scale_groups = {{0}};
  return set;
}

ModuleFacts facts(std::optional<int> kmax, std::optional<int> kmin, std::vector<std::pair<int, std::uint64_t>> hist) {
  ModuleFacts f;
  f.k_max = kmax;
  f.k_min = kmin;
  ByteHistogram h{};
  // E8M0 holds exponents -127..127; a defensive test may state facts beyond
  // them (k_min/k_max only), which no histogram byte can carry.
  for (const auto& [k, n] : hist) {
    if (k >= -127 && k <= 127) h[static_cast<std::size_t>(k + 127)] += n;
  }
  f.histogram = to_sparse(h);
  return f;
}

TEST(Plan, PairSharesTheHigherGlobal) {
  const ModuleSet set = two_module_pair();
  const auto counter = [](std::size_t, int, int) -> std::uint64_t { return 0; };
  const Plan plan = make_plan(set, {facts(-5, -10, {{-5, 2}, {-10, 2}}), facts(-2, -9, {{-2, 2}, {-9, 2}})},
                              Window::Marlin, counter);
  EXPECT_FALSE(plan.refused());
  EXPECT_EQ(plan.modules[0].m, -10);
  EXPECT_EQ(plan.modules[1].m, -10);
  EXPECT_EQ(plan.modules[0].divisor, 1024.0f);
  EXPECT_EQ(plan.modules[0].span, 8);  // -2 - (-10)
}

TEST(Plan, SharingCanPushTheLowerPartnerOverTheWindow) {
  const ModuleSet set = two_module_pair();
  // Alone w1 spans 10; with w3's k_max of 5 it spans 15 > 14.
  const auto counter = [](std::size_t module, int lo, int hi) -> std::uint64_t {
    return module == 0 && lo <= -10 && -10 <= hi ? 3 : 0;
  };
  const Plan marlin = make_plan(set, {facts(0, -10, {{0, 1}, {-10, 3}}), facts(5, 0, {{5, 1}, {0, 3}})},
                                Window::Marlin, counter);
  ASSERT_TRUE(marlin.refused());
  ASSERT_EQ(marlin.refused_spans.size(), 1u);
  EXPECT_EQ(marlin.refused_spans[0].module, "x.w1");
  EXPECT_EQ(marlin.refused_spans[0].span, 15);
  EXPECT_EQ(marlin.refused_spans[0].limit, 14);
  EXPECT_EQ(marlin.refused_spans[0].groups_outside, 3u);
  const Plan e4m3 = make_plan(set, {facts(0, -10, {{0, 1}, {-10, 3}}), facts(5, 0, {{5, 1}, {0, 3}})},
                              Window::E4M3, counter);
  EXPECT_FALSE(e4m3.refused());
  EXPECT_EQ(e4m3.modules[0].marlin_zeroed_groups, 3u);  // 2^-7 block scales: exact on disk, zeroed by Marlin
}

TEST(Plan, EveryOffendingModuleIsReported) {
  ModuleSet set;
  for (int i = 0; i < 3; ++i) {
    QuantModule m;
    m.name = set.names.store("e." + std::to_string(i) + ".w2");
    m.rows = 1;
    m.groups = 2;
    set.modules.push_back(m);
    set.scale_groups.push_back({static_cast<std::size_t>(i)});
  }
  const auto counter = [](std::size_t, int, int) -> std::uint64_t { return 1; };
  const Plan plan = make_plan(set, {facts(0, -20, {{0, 1}, {-20, 1}}), facts(0, -5, {{0, 1}, {-5, 1}}),
                                    facts(0, -16, {{0, 1}, {-16, 1}})},
                              Window::Marlin, counter);
  ASSERT_EQ(plan.refused_spans.size(), 2u);
  EXPECT_EQ(plan.refused_spans[0].module, "e.0.w2");
  EXPECT_EQ(plan.refused_spans[1].module, "e.2.w2");
}

TEST(Plan, ZeroGroupsOutsideTheWindowAreCanonicalisedNotRefused) {
  const ModuleSet set = single_module("e.w2", 6);
  const auto counter = [](std::size_t, int, int) -> std::uint64_t { return 0; };
  // Active in [-10, -3]; zero groups at -127 (byte 0), +40, -21 and -13.
  const Plan plan = make_plan(set, {facts(-3, -10, {{-3, 1}, {-10, 1}, {-127, 1}, {40, 1}, {-21, 1}, {-13, 1}})},
                              Window::Marlin, counter);
  EXPECT_FALSE(plan.refused());
  EXPECT_EQ(plan.modules[0].m, -11);
  EXPECT_EQ(plan.modules[0].canonical_zero_groups, 3u);  // -127, +40, -21 (k - m = -10); -13 (k - m = -2) is kept exact
}

// A scan over its histogram budget keeps none for some modules; the plan
// then reads them again and decides the same.
TEST(Plan, AHistogramNotKeptIsReadAgainWithTheSameResult) {
  const ModuleSet set = single_module("e.w2", 6);
  const auto counter = [](std::size_t, int, int) -> std::uint64_t { return 0; };
  const ModuleFacts full = facts(-3, -10, {{-3, 1}, {-10, 1}, {-127, 1}, {40, 1}, {-21, 1}, {-13, 1}});
  ModuleFacts dropped = full;
  dropped.histogram = {};
  dropped.histogram_kept = false;
  int reads = 0;
  const auto reader = [&](std::size_t module) {
    EXPECT_EQ(module, 0u);
    ++reads;
    return full.histogram;
  };
  const Plan kept = make_plan(set, {full}, Window::Marlin, counter);
  const Plan again = make_plan(set, {dropped}, Window::Marlin, counter, reader);
  EXPECT_EQ(reads, 1);
  EXPECT_EQ(again.modules[0].m, kept.modules[0].m);
  EXPECT_EQ(again.modules[0].canonical_zero_groups, 3u);
  EXPECT_EQ(again.modules[0].canonical_zero_groups, kept.modules[0].canonical_zero_groups);
}

TEST(Plan, ModuleWithoutActiveGroupsGetsUnitGlobalAndZeroScales) {
  ModuleSet set = two_module_pair();
  const auto counter = [](std::size_t, int, int) -> std::uint64_t { return 0; };
  const Plan plan = make_plan(set, {facts(std::nullopt, std::nullopt, {{-3, 4}}), facts(std::nullopt, std::nullopt, {{0, 4}})},
                              Window::Marlin, counter);
  EXPECT_FALSE(plan.refused());
  for (const auto& p : plan.modules) {
    EXPECT_TRUE(p.zero_scales);
    EXPECT_EQ(p.divisor, 1.0f);
    EXPECT_EQ(p.canonical_zero_groups, 4u);
  }
}

TEST(Plan, PairWithOneSilentMemberUsesTheOthersGlobal) {
  ModuleSet set = two_module_pair();
  const auto counter = [](std::size_t, int, int) -> std::uint64_t { return 0; };
  const Plan plan = make_plan(set, {facts(std::nullopt, std::nullopt, {{-3, 4}}), facts(-1, -4, {{-1, 2}, {-4, 2}})},
                              Window::Marlin, counter);
  EXPECT_FALSE(plan.refused());
  EXPECT_FALSE(plan.modules[0].zero_scales);
  EXPECT_EQ(plan.modules[0].m, -9);
  EXPECT_EQ(plan.modules[0].canonical_zero_groups, 0u);  // 2^(-3+9) fits E4M3
}

TEST(Plan, GlobalBeyondFloatIsRefused) {
  const ModuleSet set = single_module("tiny.w2", 1);
  const auto counter = [](std::size_t, int, int) -> std::uint64_t { return 0; };
  // m = k_max - 8 = -133 has no normal FP32 divisor; the block scales allow m up to -140 + 9 = -131 < -127.
  const Plan plan = make_plan(set, {facts(-125, -140, {{-125, 1}, {-140, 1}})}, Window::E4M3, counter);
  EXPECT_TRUE(plan.refused());
  ASSERT_EQ(plan.bad_globals.size(), 1u);
  ASSERT_EQ(plan.global_conflicts.size(), 1u);
  EXPECT_EQ(plan.global_conflicts[0].needed_min, -133);
  EXPECT_EQ(plan.global_conflicts[0].needed_max, -131);
  // A narrow span lets the global move up into FP32's range instead.
  const Plan narrow = make_plan(set, {facts(-125, -130, {{-125, 1}, {-130, 1}})}, Window::E4M3, counter);
  EXPECT_FALSE(narrow.refused());
  EXPECT_EQ(narrow.modules[0].m, -127);
}

TEST(Plan, QuietExpertGetsANormalFp16GlobalUnderMarlin) {
  const ModuleSet set = single_module("quiet.w2", 2);
  const auto counter = [](std::size_t, int, int) -> std::uint64_t { return 0; };
  // Largest exponent -16: m = k_max - 8 = -24 would make 2^(m+7) subnormal in fp16.
  const Plan plan = make_plan(set, {facts(-16, -20, {{-16, 1}, {-20, 1}})}, Window::Marlin, counter);
  EXPECT_FALSE(plan.refused());
  EXPECT_EQ(plan.modules[0].m, -14);  // raised toward -13 as far as the lowest block scale (2^-6) allows
  EXPECT_EQ(plan.raised_globals, 1u);
  EXPECT_EQ(plan.modules[0].divisor, std::ldexp(1.0f, 14));
  // A narrow span reaches the preferred -13 (2^(m+7) = 2^-6: routing weights down to 2^-8 stay normal).
  EXPECT_EQ(make_plan(set, {facts(-16, -17, {{-16, 1}, {-17, 1}})}, Window::Marlin, counter).modules[0].m, -13);
  // A wide one still gets a normal fp16 global, without headroom.
  EXPECT_EQ(make_plan(set, {facts(-14, -27, {{-14, 1}, {-27, 1}})}, Window::Marlin, counter).modules[0].m, -21);
  // e4m3 keeps the largest block scale at 2^8.
  EXPECT_EQ(make_plan(set, {facts(-16, -20, {{-16, 1}, {-20, 1}})}, Window::E4M3, counter).modules[0].m, -24);
}

TEST(Plan, QuietExpertWithAWideSpanHasNoMarlinGlobal) {
  const ModuleSet set = single_module("quiet.w2", 2);
  const auto counter = [](std::size_t, int, int) -> std::uint64_t { return 0; };
  // Span 12 fits, but the block scales need m <= -30 + 6 = -24 and fp16 needs m >= -21.
  const Plan plan = make_plan(set, {facts(-18, -30, {{-18, 1}, {-30, 1}})}, Window::Marlin, counter);
  EXPECT_TRUE(plan.refused());
  EXPECT_TRUE(plan.refused_spans.empty());
  ASSERT_EQ(plan.global_conflicts.size(), 1u);
  const ScaleGroupConflict& c = plan.global_conflicts[0];
  EXPECT_EQ(scale_group_name(set, c.scale_group), "quiet.w2");
  EXPECT_EQ(c.needed_min, -26);
  EXPECT_EQ(c.needed_max, -24);
  EXPECT_EQ(c.allowed_min, -21);
  EXPECT_EQ(c.allowed_max, 8);
}

TEST(Plan, LoudExpertsGlobalStaysBelowFp16Overflow) {
  const ModuleSet set = single_module("loud.w2", 2);
  const auto counter = [](std::size_t, int, int) -> std::uint64_t { return 0; };
  // k_max 20: m = 12 would overflow 2^(m+7) in fp16; k_min 10 allows m <= 16 but fp16 needs m <= 8.
  const Plan plan = make_plan(set, {facts(20, 10, {{20, 1}, {10, 1}})}, Window::Marlin, counter);
  EXPECT_TRUE(plan.refused());
  ASSERT_EQ(plan.global_conflicts.size(), 1u);
  EXPECT_FALSE(make_plan(set, {facts(20, 10, {{20, 1}, {10, 1}})}, Window::E4M3, counter).refused());
}

TEST(Plan, PairIsRaisedTogether) {
  const ModuleSet set = two_module_pair();
  const auto counter = [](std::size_t, int, int) -> std::uint64_t { return 0; };
  const Plan plan = make_plan(set, {facts(-15, -18, {{-15, 1}, {-18, 1}}), facts(-14, -17, {{-14, 1}, {-17, 1}})},
                              Window::Marlin, counter);
  EXPECT_FALSE(plan.refused());
  EXPECT_EQ(plan.modules[0].m, -13);
  EXPECT_EQ(plan.modules[1].m, -13);
  EXPECT_EQ(plan.raised_globals, 1u);  // one scale group
}

}  // namespace
}  // namespace mx2nv

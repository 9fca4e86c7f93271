#include "plan/plan.hpp"

#include <algorithm>
#include <cmath>
#include <array>
#include <cstring>

namespace mx2nv {

float written_second_level(TargetFormat format, const ModulePlan& m) {
  return m.treatment == Treatment::Requantized ? m.divisor : stored_global(format, m.divisor);
}

SecondLevel requantized_level(TargetFormat format, const ModulePlan& m) { return {recipe_of(format), m.divisor}; }

namespace {
constexpr Choice<PlanKind> kPlanKinds[] = {
    {PlanKind::Convert, "convert", "an exact conversion (mx2nv convert)"},
    {PlanKind::Requantize, "requantize", "the LOSSY companion (mx2nv requantize)"},
};
}  // namespace

template <>
std::span<const Choice<PlanKind>> choices<PlanKind>() {
  return kPlanKinds;
}

SparseHistogram::SparseHistogram(std::size_t size)
    : block_(size == 0 ? nullptr : std::make_unique<std::byte[]>(size * (sizeof(std::uint64_t) + 1))), size_(size) {}

SparseHistogram::SparseHistogram(const SparseHistogram& other) : SparseHistogram(other.size_) {
  if (size_ != 0) std::memcpy(block_.get(), other.block_.get(), size_ * (sizeof(std::uint64_t) + 1));
}

SparseHistogram& SparseHistogram::operator=(const SparseHistogram& other) {
  if (this != &other) *this = SparseHistogram(other);
  return *this;
}

SparseHistogram::Entry SparseHistogram::operator[](std::size_t i) const {
  std::uint64_t count = 0;
  std::memcpy(&count, block_.get() + i * sizeof(std::uint64_t), sizeof count);
  return {std::to_integer<std::uint8_t>(block_[size_ * sizeof(std::uint64_t) + i]), count};
}

void SparseHistogram::set(std::size_t i, Entry e) {
  std::memcpy(block_.get() + i * sizeof(std::uint64_t), &e.second, sizeof e.second);
  block_[size_ * sizeof(std::uint64_t) + i] = std::byte{e.first};
}

SparseHistogram to_sparse(const ByteHistogram& dense) {
  // One branch-free pass collects the bytes present (a module uses a few
  // dozen of 256, at unpredictable places, and this runs once per module),
  // then an exactly sized block is filled.
  std::array<std::uint8_t, 256> present;
  std::size_t n = 0;
  for (std::size_t b = 0; b < dense.size(); ++b) {
    present[n] = static_cast<std::uint8_t>(b);
    n += dense[b] != 0 ? 1u : 0u;
  }
  SparseHistogram sparse(n);
  for (std::size_t i = 0; i < n; ++i) sparse.set(i, {present[i], dense[present[i]]});
  return sparse;
}

ByteHistogram to_dense(const SparseHistogram& sparse) {
  ByteHistogram dense{};
  for (const auto& [b, n] : sparse) dense[b] = n;
  return dense;
}

std::optional<int> choose_global_exponent(int k_max, int k_min, const WindowLimits& limits) {
  const int lo = std::max(k_max - limits.max_exp, limits.global_min);
  const int hi = std::min(k_min - limits.min_exp, limits.global_max);
  if (lo > hi) return std::nullopt;
  return std::min(std::max(lo, limits.global_preferred_min), hi);
}

Plan make_plan(const ModuleSet& set, const std::vector<ModuleFacts>& facts, Window window,
               const ActiveCounter& count_active, const HistogramReader& read_histogram) {
  Plan plan;
  plan.window = window;
  plan.modules.resize(set.modules.size());
  const WindowLimits limits = window_limits(window);
  constexpr int kLowestK = -kE8M0Bias;

  for (std::size_t sg = 0; sg < set.scale_groups.size(); ++sg) {
    const ScaleGroup& members = set.scale_groups[sg];
    std::optional<int> k_max;
    for (const std::size_t i : members) {
      if (facts[i].k_max) k_max = std::max(k_max.value_or(facts[i].k_max.value()), facts[i].k_max.value());
    }
    if (!k_max) {
      // No value anywhere in the group: nothing to preserve but zeros.
      for (const std::size_t i : members) {
        ModulePlan& p = plan.modules[i];
        p.zero_scales = true;
        p.canonical_zero_groups = set.modules[i].group_count();
      }
      continue;
    }
    std::optional<int> k_min;
    for (const std::size_t i : members) {
      if (facts[i].k_min) k_min = std::min(k_min.value_or(facts[i].k_min.value()), facts[i].k_min.value());
    }
    // Spans beyond the window are refused module by module below (over-span),
    // with m = k_max - 8; otherwise the smallest m the window allows.
    int m = *k_max - limits.max_exp;
    bool conflict = false;
    if (*k_max - *k_min <= limits.max_span()) {
      if (const auto chosen = choose_global_exponent(*k_max, *k_min, limits)) {
        if (*chosen != m) ++plan.raised_globals;
        m = *chosen;
      } else {
        conflict = true;
        plan.global_conflicts.push_back({sg, *k_max, *k_min, *k_max - limits.max_exp, *k_min - limits.min_exp,
                                         limits.global_min, limits.global_max});
      }
    }
    const auto divisor = global_divisor_for(m);
    if (!divisor || conflict) plan.bad_globals.push_back({sg, std::nullopt});
    for (const std::size_t i : members) {
      ModulePlan& p = plan.modules[i];
      const ModuleFacts& f = facts[i];
      p.m = m;
      p.divisor = divisor.value_or(1.0f);
      // Zero groups whose exponent E4M3 cannot carry are written as 0x00.
      std::uint64_t unrepresentable = 0;
      SparseHistogram read_again;
      if (!f.histogram_kept) read_again = read_histogram(i);
      for (const auto& [b, n] : f.histogram_kept ? f.histogram : read_again) {
        const int e = e8m0_exponent(b) - m;
        if (e < kE4M3MinPow2 || e > kE4M3MaxPow2) unrepresentable += n;
      }
      if (!f.k_min) {
        p.canonical_zero_groups = unrepresentable;
        continue;
      }
      p.span = *k_max - *f.k_min;
      const int lowest = *f.k_min - m;
      // Counting needs packed bytes, so it is only asked for when a group can be there.
      const std::uint64_t below_e4m3 = lowest < kE4M3MinPow2 ? count_active(i, kLowestK, m + kE4M3MinPow2 - 1) : 0;
      p.canonical_zero_groups = unrepresentable - below_e4m3;
      if (lowest < kE4M3MinNormalPow2) {
        p.marlin_zeroed_groups = count_active(i, m + kE4M3MinPow2, m + kE4M3MinNormalPow2 - 1);
      }
      if (lowest < limits.min_exp) {
        p.groups_outside = limits.min_exp == kE4M3MinNormalPow2 ? below_e4m3 + p.marlin_zeroed_groups : below_e4m3;
        plan.refused_spans.push_back({std::string(set.modules[i].name), p.span, limits.max_span(), p.groups_outside});
      }
    }
  }
  return plan;
}

std::string scale_group_name(const ModuleSet& set, std::size_t scale_group) {
  std::string name;
  for (const std::size_t i : set.scale_groups[scale_group]) {
    if (!name.empty()) name += '+';
    name += set.modules[i].name;
  }
  return name;
}

std::string bad_global_name(const ModuleSet& set, const BadGlobal& bad) {
  std::string name = scale_group_name(set, bad.scale_group);
  if (bad.requantized_global) {
    name += " (requantized second-level scale " + std::to_string(*bad.requantized_global) +
            " is no normal float or outside the window's range)";
  }
  if (bad.no_normal_multiplier) name += " (its weight_scale_2, 1/global, would be no normal FP32: --format modelopt)";
  return name;
}

void refuse_subnormal_multipliers(const ModuleSet& set, Plan& plan) {
  for (std::size_t sg = 0; sg < set.scale_groups.size(); ++sg) {
    bool bad = false;
    for (const std::size_t i : set.scale_groups[sg]) {
      const ModulePlan& m = plan.modules[i];
      bad = bad || (m.treatment != Treatment::Bf16 && !std::isnormal(1.0f / m.divisor));
    }
    const bool listed = std::any_of(plan.bad_globals.begin(), plan.bad_globals.end(),
                                    [&](const BadGlobal& b) { return b.scale_group == sg; });
    if (bad && !listed) plan.bad_globals.push_back({sg, std::nullopt, true});
  }
  std::sort(plan.bad_globals.begin(), plan.bad_globals.end(),
            [](const BadGlobal& a, const BadGlobal& b) { return a.scale_group < b.scale_group; });
}

std::vector<std::string> bad_global_names(const ModuleSet& set, const Plan& plan) {
  std::vector<std::string> names;
  names.reserve(plan.bad_globals.size());
  for (const BadGlobal& b : plan.bad_globals) names.push_back(bad_global_name(set, b));
  return names;
}

std::vector<GlobalConflict> named_global_conflicts(const ModuleSet& set, const Plan& plan) {
  std::vector<GlobalConflict> named;
  named.reserve(plan.global_conflicts.size());
  for (const ScaleGroupConflict& c : plan.global_conflicts) {
    named.push_back({scale_group_name(set, c.scale_group), c.k_max, c.k_min, c.needed_min, c.needed_max,
                     c.allowed_min, c.allowed_max});
  }
  return named;
}

}  // namespace mx2nv

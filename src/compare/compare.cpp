#include "compare/compare.hpp"

#include "checkpoint/argument_check.hpp"
#include "common/cancel.hpp"
#include "common/error.hpp"
#include "common/parallel.hpp"
#include "common/stopwatch.hpp"
#include "compare/module_key.hpp"
#include "compare/module_values.hpp"
#include "compare/other_tree.hpp"
#include "sys/heap.hpp"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <memory>
#include <tuple>

#include <re2/re2.h>

namespace mx2nv {
namespace {

// --modules: RE2, so matching is linear in the name whatever the pattern
// (no backtracking a hostile pattern could make exponential).
std::unique_ptr<const re2::RE2> module_filter(const std::string& pattern) {
  re2::RE2::Options options;
  options.set_log_errors(false);
  auto filter = std::make_unique<const re2::RE2>(pattern, options);
  if (!filter->ok()) fail(ErrorKind::Usage, "--modules: invalid regular expression: {}", filter->error());
  return filter;
}

// Module keys of one side, sorted (then by name), each with its module's
// index; two modules with one key are refused, naming both.
class KeyIndex {
 public:
  template <typename NameOf>
  KeyIndex(std::size_t count, NameOf&& name_of, std::string_view side) {
    entries_.reserve(count);
    for (std::size_t i = 0; i < count; ++i) entries_.emplace_back(module_key(name_of(i)), i);
    std::sort(entries_.begin(), entries_.end(), [&](const auto& a, const auto& b) {
      return a.first != b.first ? a.first < b.first : name_of(a.second) < name_of(b.second);
    });
    for (std::size_t i = 1; i < entries_.size(); ++i) {
      if (entries_[i].first == entries_[i - 1].first) {
        fail_input("{}: name collision with {} in {}", name_of(entries_[i].second), name_of(entries_[i - 1].second),
                   side);
      }
    }
  }
  std::optional<std::size_t> find(std::string_view key) const {
    const auto it = std::lower_bound(entries_.begin(), entries_.end(), key,
                                     [](const auto& e, std::string_view k) { return e.first < k; });
    if (it == entries_.end() || it->first != key) return std::nullopt;
    return it->second;
  }
  const std::vector<std::pair<std::string, std::size_t>>& entries() const { return entries_; }

 private:
  std::vector<std::pair<std::string, std::size_t>> entries_;
};

// Gate and up of one routed expert, each told whether their globals are
// bit-equal. SRC's keys are unique (match_modules refused two spellings of
// one), so a (layer, expert) has at most one gate and one up.
void pair_gate_up_globals(std::vector<ModuleComparison>& modules) {
  struct Half {
    std::uint64_t layer, expert;
    std::size_t index;
  };
  std::vector<Half> halves;
  for (std::size_t i = 0; i < modules.size(); ++i) {
    const ModuleComparison& r = modules[i];
    if (r.layer && r.expert && r.global_bits && (r.projection == "gate" || r.projection == "up")) {
      halves.push_back({*r.layer, *r.expert, i});
    }
  }
  std::sort(halves.begin(), halves.end(), [](const Half& a, const Half& b) {
    return std::tie(a.layer, a.expert, a.index) < std::tie(b.layer, b.expert, b.index);
  });
  for (std::size_t i = 1; i < halves.size(); ++i) {
    const Half &a = halves[i - 1], &b = halves[i];
    if (a.layer != b.layer || a.expert != b.expert) continue;
    ModuleComparison &x = modules[a.index], &y = modules[b.index];
    x.gate_up_globals_bit_equal = y.gate_up_globals_bit_equal = *x.global_bits == *y.global_bits;
  }
}

}  // namespace

std::optional<double> relative_rmse(double sum_d2, double sum_s2) {
  if (sum_d2 == 0) return 0.0;
  if (sum_s2 == 0) return std::nullopt;
  return std::sqrt(sum_d2) / std::sqrt(sum_s2);
}

double cosine_similarity(bool exact, double sum_os, double sum_o2, double sum_s2) {
  if (exact) return 1.0;
  if (sum_o2 == 0 || sum_s2 == 0) return 0.0;
  return std::clamp(sum_os / std::sqrt(sum_o2 * sum_s2), -1.0, 1.0);
}

bool f32_is_power_of_two(std::uint32_t bits) {
  if (bits & 0x80000000u) return false;
  const std::uint32_t exp = (bits >> 23) & 0xFF, man = bits & 0x7FFFFF;
  if (exp == 0xFF) return false;
  if (exp == 0) return man != 0 && std::has_single_bit(man);
  return man == 0;
}

float f32_from_bits(std::uint32_t bits) { return std::bit_cast<float>(bits); }

bool CompareResult::all_exact() const {
  return std::all_of(modules.begin(), modules.end(), [](const ModuleComparison& m) { return m.sums.exact(); });
}

int CompareResult::exit_code() const {
  return all_exact() && missing_in_other.empty() && extra_in_other.empty() ? 0 : 1;
}

namespace {

// SRC and OTHER modules matched by key: (SRC module, OTHER module) pairs in
// SRC name order, and the names missing and extra into `result`. The key
// tables live only here, so they are gone before the values stream.
std::vector<std::pair<std::size_t, std::size_t>> match_modules(const ModuleSet& source, const OtherTree& other,
                                                               std::vector<OtherModule>& others,
                                                               const std::function<bool(std::string_view)>& selected,
                                                               CompareResult& result) {
  const auto& src_modules = source.modules;
  const KeyIndex src_keys(src_modules.size(), [&](std::size_t i) { return src_modules[i].name; }, "SRC");
  others = other_modules(other, [&](std::string_view key) { return src_keys.find(key).has_value(); });
  const KeyIndex other_keys(others.size(), [&](std::size_t i) { return others[i].name; }, "OTHER");
  std::vector<std::pair<std::size_t, std::size_t>> pairs;
  for (std::size_t i = 0; i < src_modules.size(); ++i) {
    const QuantModule& m = src_modules[i];
    if (!selected(m.name)) continue;
    if (const auto o = other_keys.find(module_key(m.name))) {
      pairs.emplace_back(i, *o);
    } else {
      result.missing_in_other.emplace_back(m.name);
    }
  }
  for (const auto& [key, i] : other_keys.entries()) {
    if (!src_keys.find(key) && selected(others[i].name)) result.extra_in_other.emplace_back(others[i].name);
  }
  std::sort(result.extra_in_other.begin(), result.extra_in_other.end());
  return pairs;
}

}  // namespace

CompareResult compare_checkpoints(const CompareOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  check_source_argument({Command::Compare, options.source, options.other});
  check_converted_argument({Command::Compare, options.source, options.other});
  const std::unique_ptr<const re2::RE2> filter = options.modules.empty() ? nullptr : module_filter(options.modules);
  const auto selected = [&](std::string_view name) {
    return !filter || re2::RE2::PartialMatch(re2::StringPiece(name.data(), name.size()), *filter);
  };
  ProgressTracker progress(Command::Compare, "modules", options.progress);
  progress.phase(ProgressPhase::Plan);
  // OTHER first, so its index's names are gone before SRC's module table is
  // built; SRC's errors are still reported first.
  std::optional<OtherTree> other_opened;
  std::exception_ptr other_error;
  try {
    other_opened.emplace(open_other(options.other, options.threads));
  } catch (const Error&) {
    other_error = std::current_exception();
  }
  release_free_heap();  // OTHER's index names, dropped
  auto opened = std::make_shared<const SourceCheckpoint>(
      open_source_checkpoint(options.source, options.threads, IndexNames::Drop));
  const SourceCheckpoint& source = *opened;
  if (other_error) std::rethrow_exception(other_error);
  const OtherTree& other = *other_opened;

  CompareResult result;
  result.source = options.source;
  result.other = options.other;
  result.format = other.format;
  result.source_names = opened;
  std::vector<OtherModule> others;
  const auto pairs = match_modules(source.modules, other, others, selected, result);
  for (const auto& [s, o] : pairs) check_other_module(source.modules.modules[s], others[o], other.format);

  release_free_heap();  // the key tables
  result.modules.resize(pairs.size());
  progress.phase(ProgressPhase::Shards, 0, pairs.size());
  // Pairs visited in SRC's file order (modules_in_file_order), reported in theirs.
  std::vector<std::size_t> order(pairs.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return before_in_file(source.modules.modules[pairs[a].first], source.modules.modules[pairs[b].first]);
  });
  const auto workers = static_cast<unsigned>(std::min<std::size_t>(std::max(1u, options.threads), order.size()));
  // A module's largest read: SRC's codes, or OTHER's weight (larger when unquantized).
  std::vector<bool> may_wait(order.size());
  for (std::size_t k = 0; k < order.size(); ++k) {
    const OtherModule& om = others[pairs[order[k]].second];
    const QuantModule& m = source.modules.modules[pairs[order[k]].first];
    may_wait[k] = ReadOrder::may_wait(std::max(m.packed.nbytes(), om.weight->nbytes));
  }
  ReadOrder read_order(std::move(may_wait), workers);
  const unsigned readers = read_order.readers();  // chunks sized for them all
  parallel_for_with<CompareBuffers>(order.size(), readers, [&](CompareBuffers& buffers, std::size_t k) {
    ReadOrder::Turn turn(read_order, k, buffers.place);
    const std::size_t i = order[k];
    const QuantModule& m = source.modules.modules[pairs[i].first];
    const OtherModule& om = others[pairs[i].second];
    ModuleComparison& r = result.modules[i];
    r.name = m.name;
    if (om.name != m.name) r.other_name = om.name;
    r.quantized = om.quantized;
    if (const auto e = routed_expert(m.name)) {
      r.layer = e->layer;
      r.expert = e->expert;
      r.projection = e->projection;
    }
    compare_module_values(source.checkpoint, m, other, om, readers, buffers, turn, r);
    progress.unit_done(0);
  });
  pair_gate_up_globals(result.modules);
  progress.phase(ProgressPhase::Finalize);
  result.seconds = seconds_since(started);
  progress.done();
  return result;
}

}  // namespace mx2nv

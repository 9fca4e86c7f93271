// verify: modules convert --overspan rewrote. What DST holds decides the
// choice it was converted with (a BF16 weight: bf16; a second-level scale
// that is no power of two, which a lossless transcode always writes and
// neither compressed-tensors' 2688 / amax nor ModelOpt's amax / 2688 ever
// does: requantize); the plan for SRC
// under the window, resolved with that choice, then says exactly which
// modules may be rewritten and how, and every value is checked against it.
#include "common/error.hpp"
#include "common/parallel.hpp"
#include "plan/overspan.hpp"
#include "scan/requantizer.hpp"
#include "scan/overspan_values.hpp"
#include "scan/planner.hpp"
#include "verify/checks.hpp"

#include <bit>
#include <cmath>

namespace mx2nv {
namespace {

bool power_of_two(float v) {
  int e = 0;
  return std::frexp(v, &e) == 0.5f;
}

std::string_view treatment_name(Treatment t) {
  switch (t) {
    case Treatment::Requantized: return "requantized";
    case Treatment::Bf16: return "BF16";
    case Treatment::Exact: break;
  }
  return "exact NVFP4";
}

}  // namespace

void check_overspan(VerifyContext& ctx, Report& report) {
  const auto& modules = ctx.source.modules.modules;
  std::vector<Treatment> found(modules.size(), Treatment::Exact);
  bool any_bf16 = false, any_rewritten = false;
  for (std::size_t i = 0; i < modules.size(); ++i) {
    const TargetModule& t = ctx.modules[i];
    if (t.bf16_offset) {
      found[i] = Treatment::Bf16;
      any_bf16 = true;
    } else if (t.stored && !power_of_two(*t.stored)) {
      found[i] = Treatment::Requantized;
    }
    any_rewritten = any_rewritten || found[i] != Treatment::Exact;
  }
  if (!any_rewritten) {
    for (std::size_t i = 0; i < modules.size(); ++i) {
      if (ctx.modules[i].scale_absent) ctx.diff.add("tensor \"{}\" missing from DST", modules[i].scale_name());
    }
    return;
  }
  const OverSpanChoice choice = any_bf16 ? OverSpanChoice::Bf16 : OverSpanChoice::Requantize;
  Plan plan = plan_conversion(ctx.source, scan_modules(ctx.source, ctx.options.threads), ctx.options.window, ctx.format);
  apply_overspan(ctx.source, plan, choice, ctx.options.threads);
  if (plan.refused()) {
    ctx.diff.add("SRC cannot be converted under the {} window even with --overspan {}", window_name(ctx.options.window),
                 choice_name(choice));
  }
  ctx.treatments.resize(modules.size());
  for (std::size_t i = 0; i < modules.size(); ++i) {
    const Treatment expected = plan.modules[i].treatment;
    ctx.treatments[i] = expected;
    if (found[i] != expected) {
      ctx.diff.add("\"{}\" is {} in DST, but convert --overspan {} writes it {} under the {} window", modules[i].name,
                   treatment_name(found[i]), choice_name(choice), treatment_name(expected),
                   window_name(ctx.options.window));
      ctx.treatments[i] = found[i];  // check the values as what they are
    }
    if (expected == Treatment::Bf16) ctx.bf16_modules.emplace_back(modules[i].name);
    if (expected == Treatment::Requantized) {
      ctx.requantized_modules.emplace_back(modules[i].name);
      // The F32 the quantizer gives the module's scale group, bit for bit:
      // values that agree with another scale do not make it right.
      const float want = plan.modules[i].divisor;
      const auto& have = ctx.modules[i].stored;
      if (found[i] == expected && have && std::bit_cast<std::uint32_t>(*have) != std::bit_cast<std::uint32_t>(want)) {
        ctx.diff.add("\"{}\": requantized with the second-level scale {}, but its layout's quantizer gives {}",
                     modules[i].name, *have, want);
      }
    }
    if (ctx.modules[i].scale_absent && found[i] != Treatment::Bf16) {
      ctx.diff.add("tensor \"{}\" missing from DST", modules[i].scale_name());
    }
  }
  report.over_span_choice = choice;
  report.resolved_spans = plan.resolved_spans;
  report.bf16_layers = bf16_layers(ctx.source.modules, plan);
}

void check_rewritten_values(const VerifyContext& ctx, Report& report) {
  const auto& modules = ctx.source.modules.modules;
  if (ctx.treatments.empty()) return;
  report.requantized_marlin_zeroed_blocks = 0;  // this part's, possibly none
  std::vector<std::size_t> rewritten;
  for (std::size_t i = 0; i < modules.size(); ++i) {
    if (ctx.treatment(i) != Treatment::Exact && ctx.selected[modules[i].packed_shard]) rewritten.push_back(i);
  }
  std::vector<std::optional<ModuleError>> rows(rewritten.size());
  std::vector<std::uint64_t> values(rewritten.size(), 0);
  parallel_for(rewritten.size(), ctx.options.threads, [&](std::size_t r) {
    const std::size_t i = rewritten[r];
    const QuantModule& m = modules[i];
    const TargetModule& t = ctx.modules[i];
    if (ctx.treatment(i) == Treatment::Bf16) {
      if (!t.bf16_offset) return;  // reported by the shard pass
      const auto file = ctx.target.files->open(t.bf16_shard);
      const std::uint64_t base = *t.bf16_offset;
      const std::uint64_t differing = count_bf16_differences(
          ctx.source, i, [&](std::uint64_t off, std::span<std::byte> out) { file->read_at(base + off, out); });
      if (differing) ctx.diff.add("\"{}\": {} BF16 values differ from SRC's decoded values", m.name, differing);
      values[r] = m.group_count() * kMxGroup;
      return;
    }
    if (!t.stored || !t.packed_offset || !t.scale_offset) return;  // reported by the shard pass
    const auto packed = ctx.target.files->open(t.packed_shard);
    const auto scales = ctx.target.files->open(t.scale_shard);
    const std::uint64_t p = *t.packed_offset, s = *t.scale_offset;
    const SecondLevel level{recipe_of(ctx.format), *t.stored};
    const RequantizedCheck c = check_requantized(
        ctx.source, i, level, [&](std::uint64_t off, std::span<std::byte> out) { packed->read_at(p + off, out); },
        [&](std::uint64_t off, std::span<std::byte> out) { scales->read_at(s + off, out); });
    if (c.packed_bytes_differing || c.scale_bytes_differing) {
      ctx.diff.add("\"{}\": requantized, but {} packed and {} scale bytes differ from the documented recomputation",
                   m.name, c.packed_bytes_differing, c.scale_bytes_differing);
    }
    rows[r] = ModuleError{std::string(m.name), *t.stored, c.error.values, c.error.relative_rmse(), c.error.cosine(),
                          c.error.max_abs, c.error.marlin_zeroed_blocks};
  });
  for (std::size_t r = 0; r < rewritten.size(); ++r) {
    report.values_compared += values[r];  // BF16 values, exact when no difference was reported
    if (rows[r]) {
      report.requantized.push_back(*rows[r]);
      report.requantized_marlin_zeroed_blocks += rows[r]->marlin_zeroed_blocks;
    }
  }
}

}  // namespace mx2nv

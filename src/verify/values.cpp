// verify: every value of every module, decoded on both sides with the general
// bit-field decoders (value_compare.hpp), in chunks of groups, the modules
// visited in SRC's file order.
#include "common/cancel.hpp"
#include "common/error.hpp"
#include "common/parallel.hpp"
#include "numerics/formats.hpp"
#include "sys/ordered_reads.hpp"
#include "verify/checks.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

namespace mx2nv {
namespace {

struct ChunkBuffers {  // a worker's, kept from one module to the next
  ReadBuffer a_packed, a_scale, b_packed, b_scale;
  ReadOrder::Place place;
};

void compare_module(const VerifyContext& ctx, std::size_t i, unsigned workers, ChunkBuffers& buffers,
                    CompareTally& tally, ReadOrder::Turn& turn) {
  const QuantModule& m = ctx.source.modules.modules[i];
  const TargetModule& t = ctx.modules[i];
  if (!ctx.selected[m.packed_shard]) return;  // another part's (verify --shards), not in this part's totals
  std::uint64_t counted = 0;  // bytes already reported to ctx.progress
  const auto finished = [&] {
    if (ctx.progress) ctx.progress->unit_done(module_compare_bytes(m) - counted);
  };
  if (ctx.treatment(i) != Treatment::Exact) return finished();  // check_rewritten_values
  if (!t.global || !t.packed_offset || !t.scale_offset) return finished();  // reported by the shard pass
  const Checkpoint& src = ctx.source.checkpoint;
  const auto sp = src.files->open(m.packed_shard);
  const auto ss = src.files->open(m.scale_shard);
  const auto dp = ctx.target.files->open(t.packed_shard);
  const auto ds = ctx.target.files->open(t.scale_shard);
  const std::uint64_t src_packed = src.shards[m.packed_shard].data_start + m.packed.begin;
  const std::uint64_t src_scale = src.shards[m.scale_shard].data_start + m.scale.begin;

  const std::uint64_t total = m.group_count();
  const std::uint64_t chunk = std::min(total, stream_chunk_bytes(workers) / kGroupBytes);
  for (std::uint64_t start = 0; start < total; start += chunk) {
    const std::uint64_t n = std::min(chunk, total - start);
    const auto a_packed = turn.read(*sp, src_packed + start * kGroupBytes, n * kGroupBytes, buffers.a_packed);
    const auto a_scale = turn.read(*ss, src_scale + start, n, buffers.a_scale);
    const auto b_packed = turn.read(*dp, *t.packed_offset + start * kGroupBytes, n * kGroupBytes, buffers.b_packed);
    const auto b_scale =
        turn.read(*ds, *t.scale_offset + start * kNvScalesPerMxScale, n * kNvScalesPerMxScale, buffers.b_scale);
    turn.pass();  // a module of several chunks reads the rest out of turn
    const std::size_t ns = a_scale.size();
    for (std::size_t k = 0; k < ns; ++k) {
      if (std::to_integer<std::uint8_t>(a_scale[k]) == kE8M0NaN) {
        fail_input("{}: tensor \"{}\" row {} group {}: scale byte 0xFF is NaN in E8M0", src.shards[m.scale_shard].file,
                   m.scale_name(), (start + k) / m.groups, (start + k) % m.groups);
      }
    }
    compare_groups(a_packed, a_scale, b_packed, b_scale, static_cast<double>(*t.global), start, m.groups, tally);
    counted += 2 * a_packed.size() + 3 * ns;
    if (ctx.progress) ctx.progress->add_bytes(2 * a_packed.size() + 3 * ns);
    throw_if_stopped();
  }
  finished();
}

// The largest source E8M0 byte over a module's active groups (-1: none),
// read from SRC alone: for a module of a scale group whose other members this
// verify --shards part compares.
int source_max_active_scale(const VerifyContext& ctx, std::size_t i) {
  const QuantModule& m = ctx.source.modules.modules[i];
  const Checkpoint& src = ctx.source.checkpoint;
  const auto sp = src.files->open(m.packed_shard);
  const auto ss = src.files->open(m.scale_shard);
  const std::uint64_t total = m.group_count();
  const std::uint64_t chunk = std::min<std::uint64_t>(total, stream_chunk_bytes(1) / kGroupBytes);
  std::vector<std::byte> packed, scales;
  int best = -1;
  for (std::uint64_t start = 0; start < total; start += chunk) {
    const std::uint64_t n = std::min(chunk, total - start);
    packed.resize(n * kGroupBytes);
    scales.resize(n);
    sp->read_at(src.shards[m.packed_shard].data_start + m.packed.begin + start * kGroupBytes, packed);
    ss->read_at(src.shards[m.scale_shard].data_start + m.scale.begin + start, scales);
    for (std::size_t g = 0; g < n; ++g) {
      bool active = false;
      for (std::size_t b = 0; b < kGroupBytes && !active; ++b) active = (std::to_integer<unsigned>(packed[g * kGroupBytes + b]) & 0x77u) != 0;
      if (active) best = std::max(best, static_cast<int>(std::to_integer<unsigned>(scales[g])));
    }
    throw_if_stopped();
  }
  return best;
}

// Scale groups (a gate/up pair counts once) whose global is above the
// lowest the window allows, k_max - max_exp, k_max being the group's largest
// source exponent over active groups: what convert reports as raised_globals,
// decided here from the two trees. Groups with no active group, or with a
// module not exact (convert --overspan), are not counted. A verify --shards
// part counts the groups whose first module it holds.
std::uint64_t raised_globals(const VerifyContext& ctx, const std::vector<CompareTally>& tallies) {
  const auto& modules = ctx.source.modules.modules;
  const int max_exp = window_limits(ctx.options.window).max_exp;
  std::uint64_t raised = 0;
  for (const auto& members : ctx.source.modules.scale_groups) {
    if (!ctx.selected[modules[members[0]].packed_shard]) continue;  // another part's
    int k_max_byte = -1;
    bool exact = true;
    std::optional<float> global;
    for (const std::size_t i : members) {
      if (ctx.treatment(i) != Treatment::Exact || !ctx.modules[i].global) exact = false;
      if (ctx.modules[i].global) global = ctx.modules[i].global;
    }
    if (!exact || !global) continue;
    for (const std::size_t i : members) {
      const int k = ctx.selected[modules[i].packed_shard] ? tallies[i].max_active_scale : source_max_active_scale(ctx, i);
      k_max_byte = std::max(k_max_byte, k);
    }
    if (k_max_byte < 0) continue;
    // global = 2^-m: raised when m > k_max - max_exp.
    const double m = -std::log2(static_cast<double>(*global));
    if (m > static_cast<double>(k_max_byte - kE8M0Bias - max_exp)) ++raised;
  }
  return raised;
}

}  // namespace

void check_values(const VerifyContext& ctx, Report& report) {
  const auto& modules = ctx.source.modules.modules;
  const Checkpoint& src = ctx.source.checkpoint;
  std::vector<CompareTally> tallies(modules.size());
  const std::vector<std::size_t> order = modules_in_file_order(ctx.source.modules);
  const auto workers = static_cast<unsigned>(std::min<std::size_t>(std::max(1u, ctx.options.threads), order.size()));
  std::vector<bool> may_wait(order.size());
  for (std::size_t k = 0; k < order.size(); ++k) may_wait[k] = ReadOrder::may_wait(modules[order[k]].packed.nbytes());
  ReadOrder read_order(std::move(may_wait), workers);
  const unsigned readers = read_order.readers();  // chunks sized for them all
  parallel_for_with<ChunkBuffers>(order.size(), readers, [&](ChunkBuffers& buffers, std::size_t k) {
    ReadOrder::Turn turn(read_order, k, buffers.place);
    compare_module(ctx, order[k], readers, buffers, tallies[order[k]], turn);
  });
  report.values_compared = 0;
  report.mismatches = 0;
  report.max_abs_error = 0;
  report.active_groups = 0;
  report.zero_groups = 0;
  report.marlin_zeroed_groups = 0;
  report.canonicalised_zero_groups = 0;
  for (std::size_t i = 0; i < modules.size(); ++i) {
    const CompareTally& t = tallies[i];
    const QuantModule& m = modules[i];
    report.canonicalised_zero_groups += t.canonical_zero_groups;
    report.values_compared += t.values;
    report.mismatches += t.mismatches;
    report.active_groups += t.active_groups;
    report.zero_groups += t.zero_groups;
    report.marlin_zeroed_groups += t.marlin_zeroed_groups;
    report.max_abs_error = std::max(*report.max_abs_error, t.max_abs_error);
    if (t.packed_bytes_differing) {
      ctx.diff.add("{}: \"{}\": {} packed bytes differ from SRC", src.shards[m.packed_shard].file, m.packed_name(),
                   t.packed_bytes_differing);
    }
    for (const auto& v : t.first_mismatches) {
      ctx.diff.add("{}: \"{}\" row {} group {} element {}: SRC {} DST {}", src.shards[m.scale_shard].file, m.name,
                   v.row, v.group, v.element, v.expected, v.actual);
    }
    if (t.mismatches > t.first_mismatches.size()) {
      ctx.diff.add("\"{}\": {} more value mismatches", m.name, t.mismatches - t.first_mismatches.size());
    }
    if (ctx.options.window == Window::Marlin && t.marlin_zeroed_groups) {
      ctx.diff.add("\"{}\": {} active groups have block scales below 2^-6, which vLLM's Marlin path flushes to zero "
                   "(outside the marlin window)",
                   m.name, t.marlin_zeroed_groups);
    }
  }
  report.raised_globals = raised_globals(ctx, tallies);
}

}  // namespace mx2nv

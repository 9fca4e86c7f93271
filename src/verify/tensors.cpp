// verify: shard by shard, the tensors of DST against SRC's. Holds one SRC and
// one DST header per worker; everything later checks needs per module goes
// into ctx.modules.
#include "common/cancel.hpp"
#include "common/error.hpp"
#include "common/parallel.hpp"
#include "verify/checks.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace mx2nv {
namespace {

std::optional<std::size_t> shard_named(const Checkpoint& c, const std::string& file) {
  const auto it = std::lower_bound(c.shards.begin(), c.shards.end(), file,
                                   [](const ShardSummary& s, const std::string& f) { return s.file < f; });
  if (it == c.shards.end() || it->file != file) return std::nullopt;
  return static_cast<std::size_t>(it - c.shards.begin());
}

float read_f32(const File& file, std::uint64_t offset) {
  std::byte le[4];
  file.read_at(offset, le);
  float v = 0;
  std::memcpy(&v, le, 4);  // host is little-endian (safetensors.hpp)
  return v;
}

// A tensor of SRC's shard that DST's same-named shard lacks: moved or
// missing, told apart by name_absent() after the shard pass.
void report_absent(VerifyContext& ctx, const std::string& shard, const std::string& tensor) {
  {
    std::lock_guard lock(ctx.absent_mutex);
    if (ctx.target.index && ctx.absent.size() < kMaxReportedDifferences) {
      ctx.absent.emplace_back(shard, tensor);
      return;
    }
  }
  ctx.diff.add("{}: tensor \"{}\" missing from DST", shard, tensor);
}

void name_absent(VerifyContext& ctx) {
  if (ctx.absent.empty()) return;
  std::vector<std::string> tensors;
  for (const auto& a : ctx.absent) tensors.push_back(a.second);
  std::vector<std::string> elsewhere(tensors.size());
  try {
    const File index = File::open_read(ctx.target.root / std::string(kIndexFileName));
    elsewhere = find_indexed_shards(FileSource(index), index.size(), kIndexFileName, tensors);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::InvalidInput && e.kind() != ErrorKind::Io) throw;
    // DST's index changed since it was opened: the tensors are missing, whatever it says now
  }
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& [shard, tensor] = ctx.absent[i];
    if (!elsewhere[i].empty()) {
      ctx.diff.add("tensor \"{}\" moved from {} to {}", tensor, shard, elsewhere[i]);
    } else {
      ctx.diff.add("{}: tensor \"{}\" missing from DST", shard, tensor);
    }
  }
  ctx.absent = {};
}

// A module tensor of SRC found in DST: the right dtype and shape, then remembered.
void note_module_tensor(VerifyContext& ctx, const OpenShard& out, std::size_t dst_shard, const TensorInfo& d,
                        std::size_t module, bool packed) {
  const QuantModule& m = ctx.source.modules.modules[module];
  TargetModule& t = ctx.modules[module];
  const std::string& file = out.summary->file;
  if (packed) {
    if (d.dtype != Dtype::U8 || d.shape != m.packed_shape()) {
      ctx.diff.add("{}: \"{}\" changed dtype or shape", file, d.name);
      return;
    }
    t.packed_shard = static_cast<std::uint32_t>(dst_shard);
    t.packed_offset = out.header.data_start() + d.begin;
    return;
  }
  const auto expected = m.target_scale_shape();
  if (d.dtype != Dtype::F8_E4M3 || d.shape != expected) {
    ctx.diff.add("{}: \"{}\" is {} {}, expected F8_E4M3 [{}, {}]", file, d.name, dtype_name(d.dtype),
                 Json(d.shape).dump(), expected[0], expected[1]);
    return;
  }
  t.scale_shard = static_cast<std::uint32_t>(dst_shard);
  t.scale_offset = out.header.data_start() + d.begin;
}

// A tensor only DST has: the global of a module whose scale is in this shard,
// a module's BF16 weight, a ModelOpt module's packed `weight` (noted with
// SRC's tensors), or a difference.
void note_added_tensor(VerifyContext& ctx, const OpenShard& out, std::size_t src_shard, std::size_t dst_shard,
                       const TensorInfo& d) {
  const auto& set = ctx.source.modules;
  const FormatNames& names = format_names(ctx.format);
  const std::string& file = out.summary->file;
  if (const auto module = set.module_of(d.name, kBf16WeightSuffix)) {
    if (names.packed == kBf16WeightSuffix && d.dtype != Dtype::BF16) return;  // ModelOpt's packed weight
    const QuantModule& m = set.modules[*module];
    if (m.packed_shard != src_shard) {
      ctx.diff.add("\"{}\" is in {}, not where its weight_packed was ({})", d.name, file,
                   ctx.source.checkpoint.shards[m.packed_shard].file);
      return;
    }
    if (d.dtype != Dtype::BF16 || d.shape != std::vector<std::uint64_t>{m.rows, m.groups * kMxGroup}) {
      ctx.diff.add("{}: \"{}\" is {} {}, expected BF16 [{}, {}]", file, d.name, dtype_name(d.dtype),
                   Json(d.shape).dump(), m.rows, m.groups * kMxGroup);
      return;
    }
    ctx.modules[*module].bf16_shard = static_cast<std::uint32_t>(dst_shard);
    ctx.modules[*module].bf16_offset = out.header.data_start() + d.begin;
    return;
  }
  const auto module = set.module_of(d.name, names.global);
  if (!module) {
    ctx.diff.add("{}: unexpected tensor \"{}\"", file, d.name);
    return;
  }
  const QuantModule& m = set.modules[*module];
  TargetModule& t = ctx.modules[*module];
  t.global_seen = true;
  if (m.scale_shard != src_shard) {
    ctx.diff.add("\"{}\" is in {}, not beside its weight_scale in {}", d.name, file,
                 ctx.source.checkpoint.shards[m.scale_shard].file);
    return;
  }
  if (d.dtype != Dtype::F32 || d.shape != names.global_shape) {
    ctx.diff.add("{}: \"{}\" is not F32 {}", file, d.name, Json(names.global_shape).dump());
    return;
  }
  const float stored = read_f32(out.handle, out.header.data_start() + d.begin);
  if (!std::isfinite(stored) || stored <= 0 || !std::isnormal(stored)) {
    ctx.diff.add("{}: \"{}\" = {} is not a positive normal float", file, d.name, stored);
    return;
  }
  t.stored = stored;
  if (const double multiplier = multiplier_of_stored(ctx.format, stored);
      !global_multiplier_fits(ctx.options.window, multiplier)) {
    ctx.diff.add("{}: \"{}\" = {}: its multiplier {} is outside the {} window's global range (runtimes fold it "
                 "into fp16: see README \"Windows\")",
                 file, d.name, stored, multiplier, window_name(ctx.options.window));
  }
  // A multiplier stands for an exact divisor only when it is a power of two,
  // which every exact conversion writes; one that is not is a requantized
  // module's (lossy_modules.cpp checks it as that).
  int exponent = 0;
  if (!names.global_is_divisor && std::frexp(stored, &exponent) != 0.5f) return;
  const float v = *divisor_of_stored(ctx.format, stored);
  if (!std::isnormal(v)) {
    ctx.diff.add("{}: \"{}\" = {}: its reciprocal is not a normal float", file, d.name, stored);
    return;
  }
  t.global = v;
}

void check_shard_pair(VerifyContext& ctx, std::size_t s, std::size_t d) {
  const auto& set = ctx.source.modules;
  const OpenShard in = ctx.source.checkpoint.read_shard(s);
  const OpenShard out = ctx.target.read_shard(d);
  const std::string& file = in.summary->file;
  const FormatNames& names = format_names(ctx.format);
  const bool renamed = names.packed != kPackedSuffix;  // ModelOpt: M.weight_packed is M.weight

  // Header order is kept: the target's order minus inserted globals.
  {
    const auto& a = in.header.tensors();
    std::size_t i = 0;
    bool same = true;
    for (const TensorInfo& t : out.header.tensors()) {
      if (set.module_of(t.name, names.global)) continue;
      // A BF16 module (--overspan bf16), or any module in ModelOpt's layout:
      // its weight stands where weight_packed was (a BF16 module's scale is gone).
      std::string_view name = t.name;
      std::string packed;
      if (const auto m = set.module_of(t.name, kBf16WeightSuffix); m && in.header.find(t.name) == nullptr) {
        packed = set.modules[*m].packed_name();
        name = packed;
      }
      while (i < a.size() && set.module_of(a[i].name, kScaleSuffix) && out.header.find(a[i].name) == nullptr) ++i;
      if (i >= a.size() || a[i].name != name) {
        same = false;
        break;
      }
      ++i;
    }
    while (i < a.size() && set.module_of(a[i].name, kScaleSuffix) && out.header.find(a[i].name) == nullptr) ++i;
    if (!same || i != a.size()) ctx.diff.add("{}: tensor order differs from SRC", file);
  }

  for (const TensorInfo& t : in.header.tensors()) {
    const TensorInfo* dt = out.header.find(t.name);
    if (renamed) {
      if (const auto m = set.module_of(t.name, kPackedSuffix)) {
        if (dt != nullptr) ctx.diff.add("{}: \"{}\" keeps its compressed-tensors name in a ModelOpt DST", file, t.name);
        const std::string weight = std::string(set.modules[*m].name) + std::string(names.packed);
        dt = out.header.find(weight);
        if (dt != nullptr && dt->dtype == Dtype::BF16) continue;  // a BF16 module's (noted as a tensor only DST has)
        if (dt == nullptr) {
          report_absent(ctx, file, weight);
          continue;
        }
        note_module_tensor(ctx, out, d, *dt, *m, true);
        continue;
      }
    }
    if (dt == nullptr) {
      if (const auto m = set.module_of(t.name, kPackedSuffix);
          m && out.header.find(std::string(set.modules[*m].name) + std::string(kBf16WeightSuffix)) != nullptr) {
        continue;  // replaced by a BF16 weight (noted below as a tensor only DST has)
      }
      if (const auto m = set.module_of(t.name, kScaleSuffix)) {
        ctx.modules[*m].scale_absent = true;  // judged once the modules' treatments are known
        continue;
      }
      report_absent(ctx, file, t.name);
      continue;
    }
    if (const auto m = set.module_of(t.name, kPackedSuffix)) {
      note_module_tensor(ctx, out, d, *dt, *m, true);
      continue;
    }
    if (const auto m = set.module_of(t.name, kScaleSuffix)) {
      note_module_tensor(ctx, out, d, *dt, *m, false);
      continue;
    }
    if (renamed && t.name.ends_with(kBf16WeightSuffix)) {
      std::lock_guard lock(ctx.unquantized_mutex);
      ctx.unquantized_weights.emplace_back(t.name.substr(0, t.name.size() - kBf16WeightSuffix.size()));
    }
    if (!ctx.selected[s]) continue;  // another part of verify --shards compares its bytes
    ++ctx.passthrough_tensors;
    if (dt->dtype != t.dtype || dt->shape != t.shape) {
      ctx.diff.add("{}: tensor \"{}\" is {} {} in DST, {} {} in SRC", file, t.name, dtype_name(dt->dtype),
                   Json(dt->shape).dump(), dtype_name(t.dtype), Json(t.shape).dump());
      continue;
    }
    compare_bytes(in.handle, in.header.data_start() + t.begin, out.handle, out.header.data_start() + dt->begin,
                  t.nbytes(), file + ": tensor \"" + t.name + "\"", ctx.diff);
    if (ctx.progress) ctx.progress->add_bytes(2 * t.nbytes());
    throw_if_stopped();
  }
  for (const TensorInfo& t : out.header.tensors()) {
    if (in.header.find(t.name) == nullptr) note_added_tensor(ctx, out, s, d, t);
  }
}

}  // namespace

VerifyWork verify_work(const SourceCheckpoint& source, const std::vector<bool>& selected) {
  // Shards tile their data section with tensors (safetensors.cpp), so a
  // shard's pass-through bytes are its data size less its module tensors'.
  const Checkpoint& src = source.checkpoint;
  std::vector<std::uint64_t> passthrough(src.shards.size());
  for (std::size_t s = 0; s < src.shards.size(); ++s) passthrough[s] = src.shards[s].data_size;
  VerifyWork work;
  for (const QuantModule& m : source.modules.modules) {
    passthrough[m.packed_shard] -= std::min(passthrough[m.packed_shard], m.packed.nbytes());
    passthrough[m.scale_shard] -= std::min(passthrough[m.scale_shard], m.scale.nbytes());
    if (!selected[m.packed_shard]) continue;
    work.bytes += module_compare_bytes(m);
    ++work.modules;
  }
  for (std::size_t s = 0; s < src.shards.size(); ++s) {
    if (selected[s]) work.bytes += 2 * passthrough[s];
  }
  return work;
}

void check_shards(VerifyContext& ctx) {
  const Checkpoint& src = ctx.source.checkpoint;
  ctx.modules.assign(ctx.source.modules.modules.size(), {});
  parallel_for(src.shards.size(), ctx.options.threads, [&](std::size_t s) {
    const auto d = shard_named(ctx.target, src.shards[s].file);
    if (!d) {
      ctx.diff.add("{}: shard missing from DST ({} tensors)", src.shards[s].file, src.shards[s].tensors);
      return;
    }
    check_shard_pair(ctx, s, *d);
  });
  name_absent(ctx);
  // Tensors in DST shards SRC does not have.
  for (const ShardSummary& d : ctx.target.shards) {
    if (!shard_named(src, d.file)) ctx.diff.add("{}: unexpected shard in DST ({} tensors)", d.file, d.tensors);
  }
  const auto& modules = ctx.source.modules.modules;
  for (std::size_t i = 0; i < modules.size(); ++i) {
    const TargetModule& t = ctx.modules[i];
    if (t.bf16_offset && (t.global_seen || t.packed_offset || t.scale_offset)) {
      ctx.diff.add("\"{}\" is in DST both as BF16 weight and as NVFP4 tensors", modules[i].name);
    }
    if (!t.global_seen && !t.bf16_offset) {
      ctx.diff.add("tensor \"{}{}\" missing from DST", modules[i].name, format_names(ctx.format).global);
    }
  }
}

void check_globals(const VerifyContext& ctx) {
  const auto& modules = ctx.source.modules.modules;
  for (const auto& members : ctx.source.modules.scale_groups) {
    // Bit for bit: the F32s as stored.
    const auto& first = ctx.modules[members[0]].stored;
    for (const std::size_t i : members) {
      const auto& g = ctx.modules[i].stored;
      if (g && first && std::bit_cast<std::uint32_t>(*g) != std::bit_cast<std::uint32_t>(*first)) {
        ctx.diff.add("\"{}\" and \"{}\" have different global scales ({} vs {}); vLLM applies the gate's to both",
                     modules[members[0]].name, modules[i].name, *first, *g);
      }
    }
  }
}

}  // namespace mx2nv

#include "io/verify.hpp"

#include "core/error.hpp"
#include "core/target_config_check.hpp"
#include "core/value_compare.hpp"
#include "io/checkpoint_reader.hpp"
#include "io/parallel.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <set>
#include <unordered_map>

namespace mx2nv {
namespace {

constexpr std::uint64_t kCompareGroups = 1 << 16;  // 32-groups per chunk: 1 MiB packed per side
constexpr std::size_t kCompareBytes = 4 << 20;

class Differences {
 public:
  template <typename... Args>
  void add(fmt::format_string<Args...> format, Args&&... args) {
    std::lock_guard lock(mutex_);
    ++count_;
    if (list_.size() < kMaxReportedDifferences) list_.push_back(fmt::format(format, std::forward<Args>(args)...));
  }
  std::uint64_t count() const { return count_; }
  std::vector<std::string> take() {
    if (count_ > list_.size()) list_.push_back(fmt::format("... and {} more", count_ - list_.size()));
    return std::move(list_);
  }

 private:
  std::mutex mutex_;
  std::uint64_t count_ = 0;
  std::vector<std::string> list_;
};

struct Located {
  const OpenShard* shard = nullptr;
  const TensorInfo* info = nullptr;
  std::uint64_t offset() const { return shard->header.data_start() + info->begin; }
};

std::unordered_map<std::string, Located> tensors_by_name(const Checkpoint& c) {
  std::unordered_map<std::string, Located> out;
  for (const auto& s : c.shards) {
    for (const auto& t : s.header.tensors()) out.emplace(t.name, Located{&s, &t});
  }
  return out;
}

// Byte-compares two ranges; reports the first differing offset.
void compare_bytes(const File& a, std::uint64_t a_off, const File& b, std::uint64_t b_off, std::uint64_t n,
                   const std::string& what, Differences& diff) {
  std::vector<std::byte> x(static_cast<std::size_t>(std::min<std::uint64_t>(n, kCompareBytes)));
  std::vector<std::byte> y(x.size());
  for (std::uint64_t done = 0; done < n; done += x.size()) {
    const auto len = static_cast<std::size_t>(std::min<std::uint64_t>(x.size(), n - done));
    a.read_at(a_off + done, {x.data(), len});
    b.read_at(b_off + done, {y.data(), len});
    if (std::memcmp(x.data(), y.data(), len) != 0) {
      const auto at = std::mismatch(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(len), y.begin()).first;
      diff.add("{}: byte {} differs", what, done + static_cast<std::uint64_t>(at - x.begin()));
      return;
    }
  }
}

float read_global(const Located& g) {
  std::byte le[4];
  g.shard->handle.read_at(g.offset(), le);
  float v = 0;
  std::memcpy(&v, le, 4);
  return v;
}

}  // namespace

Report verify_checkpoint(const VerifyOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  Report report = start_report("verify", options.window, options.source, &options.target);
  Differences diff;

  const SourceCheckpoint source = open_source_checkpoint(options.source);
  const Checkpoint& src = source.checkpoint;
  std::optional<Checkpoint> opened;
  try {
    opened = open_checkpoint(options.target, CheckpointRole::Target);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::InvalidInput) throw;
    diff.add("DST is not a valid checkpoint: {}", e.what());
  }
  report.shards = src.shards.size();
  std::vector<bool> selected(src.shards.size(), true);
  if (options.shards) {
    std::fill(selected.begin(), selected.end(), false);
    for (const std::size_t s : selected_shards(*options.shards, src.shards.size())) selected[s] = true;
    report.shard_subset = options.shards->stride == 0
                              ? fmt::format("{}", options.shards->index)
                              : fmt::format("{}/{}", options.shards->index, options.shards->stride);
  }
  report.modules = source.modules.modules.size();
  report.scale_groups = source.modules.scale_groups.size();
  report.companion_files = src.companions.size();
  report.source_tensor_bytes = src.tensor_bytes();

  if (opened) {
    const Checkpoint& dst = *opened;
    report.target_tensor_bytes = dst.tensor_bytes();
    for (const auto& d : check_target_config(source.quant, dst.config_text)) diff.add("{}", d);

    // Files: the same companions, byte for byte; the same shard files.
    if (src.companions != dst.companions) {
      std::set<std::string> a(src.companions.begin(), src.companions.end());
      std::set<std::string> b(dst.companions.begin(), dst.companions.end());
      for (const auto& f : a) if (!b.count(f)) diff.add("{}: companion file missing from DST", f);
      for (const auto& f : b) if (!a.count(f)) diff.add("{}: unexpected file in DST", f);
    }
    for (const auto& rel : src.companions) {
      if (!std::binary_search(dst.companions.begin(), dst.companions.end(), rel)) continue;
      const File a = File::open_read(src.root / rel);
      const File b = File::open_read(dst.root / rel);
      if (a.size() != b.size()) {
        diff.add("{}: {} bytes in SRC, {} in DST", rel, a.size(), b.size());
      } else {
        compare_bytes(a, 0, b, 0, a.size(), rel, diff);
      }
    }
    if (src.index.has_value() != dst.index.has_value()) diff.add("DST {} an index where SRC {}", dst.index ? "has" : "lacks", src.index ? "has one" : "does not");
    if (dst.index) {
      const Json& meta = dst.index->document.value("metadata", Json::object());
      if (meta.value("total_size", Json()) != Json(dst.tensor_bytes())) {
        diff.add("{}: metadata.total_size is {}, tensors hold {} bytes", kIndexFileName,
                 meta.value("total_size", Json()).dump(), dst.tensor_bytes());
      }
    }
    std::vector<std::string> src_files, dst_files;
    for (const auto& s : src.shards) src_files.push_back(s.file);
    for (const auto& s : dst.shards) dst_files.push_back(s.file);
    if (src_files != dst_files) diff.add("DST shard files differ from SRC's");

    // Tensors: every source tensor where it belongs, nothing else.
    const auto dst_tensors = tensors_by_name(dst);
    std::set<std::string> accounted;
    for (std::size_t si = 0; si < src.shards.size(); ++si) {
      const OpenShard& shard = src.shards[si];
      // Header order is kept: the target's order minus inserted globals.
      for (const auto& peer : dst.shards) {
        if (peer.file != shard.file) continue;
        std::vector<std::string> a, b;
        for (const auto& t : shard.header.tensors()) a.push_back(t.name);
        for (const auto& t : peer.header.tensors()) {
          if (!source.modules.module_of(t.name, kGlobalSuffix)) b.push_back(t.name);
        }
        if (a != b) diff.add("{}: tensor order differs from SRC", shard.file);
      }
      for (const auto& t : shard.header.tensors()) {
        const auto it = dst_tensors.find(t.name);
        if (it == dst_tensors.end()) {
          diff.add("{}: tensor \"{}\" missing from DST", shard.file, t.name);
          continue;
        }
        accounted.insert(t.name);
        const Located& d = it->second;
        if (d.shard->file != shard.file) diff.add("tensor \"{}\" moved from {} to {}", t.name, shard.file, d.shard->file);
        if (source.modules.is_module_tensor(t.name) || !selected[si]) continue;  // modules: by value below
        ++report.passthrough_tensors;
        if (d.info->dtype != t.dtype || d.info->shape != t.shape) {
          diff.add("{}: tensor \"{}\" is {} {} in DST, {} {} in SRC", d.shard->file, t.name, dtype_name(d.info->dtype),
                   Json(d.info->shape).dump(), dtype_name(t.dtype), Json(t.shape).dump());
          continue;
        }
        compare_bytes(shard.handle, shard.header.data_start() + t.begin, d.shard->handle, d.offset(), t.nbytes(),
                      d.shard->file + ": tensor \"" + t.name + "\"", diff);
      }
    }

    // Modules: value by value.
    const auto& modules = source.modules.modules;
    std::vector<std::optional<float>> globals(modules.size());
    std::vector<CompareTally> tallies(modules.size());
    std::vector<std::string> module_errors(modules.size());
    for (std::size_t i = 0; i < modules.size(); ++i) {
      const QuantModule& m = modules[i];
      const std::string gname = m.name + std::string(kGlobalSuffix);
      const auto g = dst_tensors.find(gname);
      if (g == dst_tensors.end()) {
        diff.add("tensor \"{}\" missing from DST", gname);
        continue;
      }
      accounted.insert(gname);
      if (g->second.info->dtype != Dtype::F32 || g->second.info->shape != std::vector<std::uint64_t>{1}) {
        diff.add("{}: \"{}\" is not F32 [1]", g->second.shard->file, gname);
        continue;
      }
      if (g->second.shard->file != src.shards[m.scale_shard].file) {
        diff.add("\"{}\" is in {}, not beside its weight_scale in {}", gname, g->second.shard->file, src.shards[m.scale_shard].file);
      }
      const float v = read_global(g->second);
      if (!std::isfinite(v) || v <= 0 || !std::isnormal(v)) {
        diff.add("{}: \"{}\" = {} is not a positive normal float", g->second.shard->file, gname, v);
        continue;
      }
      globals[i] = v;
    }
    for (const auto& [name, located] : dst_tensors) {
      if (!accounted.count(name)) diff.add("{}: unexpected tensor \"{}\"", located.shard->file, name);
    }
    for (const auto& members : source.modules.scale_groups) {
      for (const std::size_t i : members) {
        if (globals[i] && globals[members[0]] && *globals[i] != *globals[members[0]]) {
          diff.add("\"{}\" and \"{}\" have different global scales ({} vs {}); vLLM applies the gate's to both",
                   modules[members[0]].name, modules[i].name, *globals[members[0]], *globals[i]);
        }
      }
    }

    parallel_for(modules.size(), options.threads, [&](std::size_t i) {
      const QuantModule& m = modules[i];
      if (!globals[i] || !selected[m.packed_shard]) return;
      const auto dp = dst_tensors.find(m.packed.name);
      const auto ds = dst_tensors.find(m.scale.name);
      if (dp == dst_tensors.end() || ds == dst_tensors.end()) return;  // reported above
      if (dp->second.info->dtype != Dtype::U8 || dp->second.info->shape != m.packed.shape) {
        diff.add("{}: \"{}\" changed dtype or shape", dp->second.shard->file, m.packed.name);
        return;
      }
      if (ds->second.info->dtype != Dtype::F8_E4M3 ||
          ds->second.info->shape != std::vector<std::uint64_t>{m.rows, m.groups * 2}) {
        diff.add("{}: \"{}\" is {} {}, expected F8_E4M3 [{}, {}]", ds->second.shard->file, m.scale.name,
                 dtype_name(ds->second.info->dtype), Json(ds->second.info->shape).dump(), m.rows, m.groups * 2);
        return;
      }
      const OpenShard& sp = src.shards[m.packed_shard];
      const OpenShard& ss = src.shards[m.scale_shard];
      const std::uint64_t total = m.group_count();
      const std::uint64_t chunk = std::min(total, kCompareGroups);
      std::vector<std::byte> a_packed(static_cast<std::size_t>(chunk * 16)), b_packed(a_packed.size());
      std::vector<std::byte> a_scale(static_cast<std::size_t>(chunk)), b_scale(static_cast<std::size_t>(chunk * 2));
      CompareTally& tally = tallies[i];
      for (std::uint64_t start = 0; start < total; start += chunk) {
        const std::uint64_t n = std::min(chunk, total - start);
        const auto np = static_cast<std::size_t>(n * 16);
        const auto ns = static_cast<std::size_t>(n);
        sp.handle.read_at(sp.header.data_start() + m.packed.begin + start * 16, {a_packed.data(), np});
        ss.handle.read_at(ss.header.data_start() + m.scale.begin + start, {a_scale.data(), ns});
        dp->second.shard->handle.read_at(dp->second.offset() + start * 16, {b_packed.data(), np});
        ds->second.shard->handle.read_at(ds->second.offset() + start * 2, {b_scale.data(), 2 * ns});
        for (std::size_t k = 0; k < ns; ++k) {
          if (std::to_integer<std::uint8_t>(a_scale[k]) == kE8M0NaN) {
            fail_input("{}: tensor \"{}\" row {} group {}: scale byte 0xFF is NaN in E8M0", ss.file, m.scale.name,
                       (start + k) / m.groups, (start + k) % m.groups);
          }
        }
        compare_groups({a_packed.data(), np}, {a_scale.data(), ns}, {b_packed.data(), np}, {b_scale.data(), 2 * ns},
                       static_cast<double>(*globals[i]), start, m.groups, tally);
      }
    });
    for (std::size_t i = 0; i < modules.size(); ++i) {
      const CompareTally& t = tallies[i];
      const QuantModule& m = modules[i];
      report.values_compared += t.values;
      report.mismatches += t.mismatches;
      report.active_groups += t.active_groups;
      report.zero_groups += t.zero_groups;
      report.marlin_zeroed_groups += t.marlin_zeroed_groups;
      report.max_abs_error = std::max(report.max_abs_error, t.max_abs_error);
      if (t.packed_bytes_differing) {
        diff.add("{}: \"{}\": {} packed bytes differ from SRC", src.shards[m.packed_shard].file, m.packed.name,
                 t.packed_bytes_differing);
      }
      for (const auto& v : t.first_mismatches) {
        diff.add("{}: \"{}\" row {} group {} element {}: SRC {} DST {}", src.shards[m.scale_shard].file, m.name, v.row,
                 v.group, v.element, v.expected, v.actual);
      }
      if (t.mismatches > t.first_mismatches.size()) {
        diff.add("\"{}\": {} more value mismatches", m.name, t.mismatches - t.first_mismatches.size());
      }
      if (options.window == Window::Marlin && t.marlin_zeroed_groups) {
        diff.add("\"{}\": {} active groups have block scales below 2^-6, which vLLM's Marlin path flushes to zero "
                 "(outside the marlin window)",
                 m.name, t.marlin_zeroed_groups);
      }
    }
  }

  report.differences = diff.take();
  if (diff.count() > 0 || report.mismatches > 0) report.result = Outcome::Mismatch;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return report;
}

}  // namespace mx2nv

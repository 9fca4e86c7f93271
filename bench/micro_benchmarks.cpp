// Google Benchmark micro-benchmarks of the hot kernels, in bytes/s of the
// data each one touches: active-group detection (packed bytes), the
// E8M0 -> E4M3 scale map (source scale bytes), verify's value comparison
// (packed bytes of one side), and reading a plan file of Kimi K3's shape
// (plan file bytes), as every planned step does, and through the
// streaming reader alone.
#include "convert/scale_map.hpp"
#include "model/scale_scan.hpp"
#include "numerics/formats.hpp"
#include "plan/plan_file.hpp"
#include "json/json_stream.hpp"
#include "verify/value_compare.hpp"

#include <fmt/format.h>

#include <benchmark/benchmark.h>

#include <random>
#include <vector>

namespace {

using namespace mx2nv;

std::vector<std::byte> random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng() & 0xFF);
  return v;
}

void BM_ActiveGroupDetection(benchmark::State& state) {
  const auto packed = random_bytes(static_cast<std::size_t>(state.range(0)), 1);
  for (auto _ : state) {
    std::uint64_t zero = 0;
    for (std::size_t g = 0; g < packed.size(); g += 16) if (!group_is_active(packed.data() + g)) ++zero;
    benchmark::DoNotOptimize(zero);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}
BENCHMARK(BM_ActiveGroupDetection)->Arg(16 << 20);

void BM_ScaleMapE8M0ToE4M3(benchmark::State& state) {
  std::vector<std::byte> in(static_cast<std::size_t>(state.range(0)));
  std::mt19937_64 rng(2);
  for (auto& b : in) b = static_cast<std::byte>(117 + rng() % 12);
  std::vector<std::byte> out(2 * in.size());
  const ScaleLut lut = make_scale_lut(-10, false);
  for (auto _ : state) {
    map_scales(lut, in, out);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}
BENCHMARK(BM_ScaleMapE8M0ToE4M3)->Arg(4 << 20);

void BM_VerifyCompareGroups(benchmark::State& state) {
  const std::size_t groups = static_cast<std::size_t>(state.range(0)) / 16;
  const auto packed = random_bytes(groups * 16, 3);
  std::vector<std::byte> src_scale(groups), dst_scale(2 * groups);
  std::mt19937_64 rng(4);
  for (std::size_t g = 0; g < groups; ++g) {
    const int k = -10 + static_cast<int>(rng() % 12);
    src_scale[g] = static_cast<std::byte>(k + 127);
    dst_scale[2 * g] = dst_scale[2 * g + 1] = static_cast<std::byte>(e4m3_encode_pow2(k + 7).value());
  }
  for (auto _ : state) {
    CompareTally t;
    compare_groups(packed, src_scale, packed, dst_scale, std::ldexp(1.0, 7), 0, 112, t);
    benchmark::DoNotOptimize(t.mismatches);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}
BENCHMARK(BM_VerifyCompareGroups)->Arg(16 << 20);

// A plan of K3's shape: 92 layers x 896 experts x 3 projections, 96 shards.
std::string k3_plan_text() {
  PlanFile f;
  f.tool_version = "0.1.0";
  f.source = "/models/kimi-k3";
  f.target = "/shared/kimi-k3-nvfp4";
  for (int s = 1; s <= 96; ++s) {
    f.shards.push_back({fmt::format("model-{:05}-of-00096.safetensors", s), 3706416, 1796517529613500342,
                        13990716039194260174ull, 5203229435970978ull, 3153600, 7736});
  }
  std::mt19937_64 rng(3);
  for (int layer = 0; layer < 92; ++layer) {
    for (int expert = 0; expert < 896; ++expert) {
      for (const char* w : {"w1", "w2", "w3"}) {
        f.module_names.push_back(
            fmt::format("language_model.model.layers.{}.block_sparse_moe.experts.{}.{}", layer, expert, w));
        ModulePlan m;
        m.m = -13;
        m.divisor = *global_divisor_for(m.m);
        m.span = 10 + static_cast<int>(rng() % 3);
        m.canonical_zero_groups = rng() % 3;
        f.modules.push_back(m);
      }
    }
  }
  return plan_file_to_text(f);
}

void BM_PlanFileRead(benchmark::State& state) {
  static const std::string text = k3_plan_text();
  const MemorySource source(text);
  for (auto _ : state) {
    const PlanFile f = state.range(0) ? plan_file_from_source(source, text.size(), "plan")
                                      : plan_file_streamed(source, text.size(), "plan");
    benchmark::DoNotOptimize(f.modules.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(text.size()));
}
BENCHMARK(BM_PlanFileRead)->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();

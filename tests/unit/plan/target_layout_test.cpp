// The zero-copy layout rule (plan/target_layout.hpp): every unchanged tensor
// at its source offset modulo kShareBlock where the rules allow, the header
// padded with spaces only, the documented order, a valid safetensors file.
#include "common/error.hpp"
#include "plan/target_layout.hpp"
#include "safetensors/index.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace mx2nv {
namespace {

// A source shard built in the given order, its data section starting at
// `residue` modulo kShareBlock (as a real checkpoint's header length makes it).
struct SourceShard {
  std::vector<TensorInfo> tensors;
  std::uint64_t cursor = 0;
  std::uint64_t residue = 8;
  SourceShard& add(const std::string& name, Dtype d, std::vector<std::uint64_t> shape) {
    const std::uint64_t n = tensor_nbytes(d, shape).value();
    tensors.push_back({name, d, std::move(shape), cursor, cursor + n});
    cursor += n;
    return *this;
  }
  // An MXFP4 module: packed [n, k/2] and scale [n, k/32], in that order.
  SourceShard& module(const std::string& name, std::uint64_t n, std::uint64_t k) {
    add(name + ".weight_packed", Dtype::U8, {n, k / 2});
    return add(name + ".weight_scale", Dtype::U8, {n, k / 32});
  }
  ShardHeader build() const {
    const std::string h = serialize_header(std::nullopt, tensors, kShareBlock, residue);
    return ShardHeader::parse(std::string_view(h).substr(8), h.size() + cursor, "src");
  }
};

struct Laid {
  ShardHeader source;
  ModuleSet modules;
  TargetLayout layout;
  std::string header;
};

Laid lay_out(const SourceShard& s) {
  Laid l{s.build(), {}, {}, {}};
  l.modules = discover_modules({{"s.safetensors", &l.source}});
  l.layout = make_target_layout(l.source, 0, l.modules);
  l.header = serialize_target_header(l.layout);
  return l;
}

std::uint64_t source_residue(const Laid& l, const TargetTensor& t) {
  return (l.source.data_start() + l.source.tensors()[t.source].begin) % kShareBlock;
}
std::uint64_t target_residue(const Laid& l, const TargetTensor& t) {
  return (l.header.size() + t.info.begin) % kShareBlock;
}

// The target is a valid safetensors file (tiling, sizes) whose header is the
// JSON followed by spaces only, fewer than the alignment unit.
void expect_valid_target(const Laid& l) {
  const std::string_view json = std::string_view(l.header).substr(8);
  const ShardHeader parsed = ShardHeader::parse(json, l.header.size() + l.layout.data_size, "target");
  ASSERT_EQ(parsed.tensors().size(), l.layout.tensors.size());
  for (std::size_t i = 0; i < parsed.tensors().size(); ++i) {
    EXPECT_EQ(parsed.tensors()[i].name, l.layout.tensors[i].info.name);
    EXPECT_EQ(parsed.tensors()[i].begin, l.layout.tensors[i].info.begin);
  }
  const auto close = json.rfind('}');
  ASSERT_NE(close, std::string_view::npos);
  const std::string_view padding = json.substr(close + 1);
  EXPECT_EQ(padding.find_first_not_of(' '), std::string_view::npos);
  EXPECT_LT(padding.size(), l.layout.data_start_modulus);
  EXPECT_EQ(l.header.size() % l.layout.data_start_modulus, l.layout.data_start_residue);
}

// The `aligned` flags say exactly what the offsets say.
void expect_flags_truthful(const Laid& l) {
  for (const auto& t : l.layout.tensors) {
    if (!is_unchanged(t.role)) {
      EXPECT_FALSE(t.aligned) << t.info.name;
      continue;
    }
    EXPECT_EQ(t.aligned, source_residue(l, t) == target_residue(l, t)) << t.info.name;
  }
}

SourceShard k3_like_shard(std::uint64_t residue) {
  SourceShard s;
  s.residue = residue;
  // Pass-through tensors of sizes that are no multiple of anything useful.
  s.add("model.embed_tokens.weight", Dtype::BF16, {37, 129});
  s.add("model.layers.0.input_layernorm.weight", Dtype::BF16, {7});
  s.add("model.layers.0.mlp.gate.e_score_correction_bias", Dtype::F32, {3});
  // Expert modules whose scales are whole blocks (N*K/32 = 256*512/32 = 4096),
  // as in every real MoE shape; one pass-through tensor between them.
  for (int e = 0; e < 3; ++e) {
    const std::string p = "model.layers.0.mlp.experts." + std::to_string(e) + ".";
    s.module(p + "down_proj", 512, 256);
    s.module(p + "gate_proj", 256, 512);
    s.module(p + "up_proj", 256, 512);
  }
  s.add("model.layers.0.post_attention_layernorm.weight", Dtype::BF16, {11});
  s.module("model.layers.1.mlp.experts.0.down_proj", 512, 256);
  return s;
}

TEST(TargetLayout, EveryUnchangedTensorKeepsItsSourceOffsetModuloTheBlock) {
  for (const std::uint64_t residue : {0u, 8u, 1000u, 4088u}) {
    const Laid l = lay_out(k3_like_shard(residue));
    expect_valid_target(l);
    expect_flags_truthful(l);
    for (const auto& t : l.layout.tensors) {
      if (is_unchanged(t.role)) {
        EXPECT_TRUE(t.aligned) << t.info.name << " residue " << residue;
      }
    }
  }
}

TEST(TargetLayout, HeaderOrderIsTheSourcesWithEachGlobalAfterItsScale) {
  const Laid l = lay_out(k3_like_shard(8));
  std::size_t next_source = 0;
  for (std::size_t i = 0; i < l.layout.tensors.size(); ++i) {
    const TargetTensor& t = l.layout.tensors[i];
    if (t.role == TensorRole::Global) {
      ASSERT_GT(i, 0u);
      EXPECT_EQ(l.layout.tensors[i - 1].role, TensorRole::Scale);
      EXPECT_EQ(t.info.name, std::string(l.modules.modules[t.module].name) + ".weight_global_scale");
      continue;
    }
    EXPECT_EQ(t.source, next_source++);
    EXPECT_EQ(t.info.name, l.source.tensors()[t.source].name);
  }
  EXPECT_EQ(next_source, l.source.tensors().size());
}

TEST(TargetLayout, ModelOptNamesTheSameBytesOtherwise) {
  const SourceShard shard = k3_like_shard(8);
  const Laid ct = lay_out(shard);
  const TargetLayout mo = make_target_layout(ct.source, 0, ct.modules, {}, TargetFormat::ModelOpt);
  ASSERT_EQ(mo.tensors.size(), ct.layout.tensors.size());
  EXPECT_EQ(mo.data_size, ct.layout.data_size);
  EXPECT_EQ(mo.data_order, ct.layout.data_order);
  for (std::size_t i = 0; i < mo.tensors.size(); ++i) {
    const TargetTensor& a = ct.layout.tensors[i];
    const TargetTensor& b = mo.tensors[i];
    EXPECT_EQ(a.role, b.role);
    EXPECT_EQ(a.info.begin, b.info.begin);
    EXPECT_EQ(a.info.dtype, b.info.dtype);
    const std::string module = a.role == TensorRole::PassThrough ? "" : std::string(ct.modules.modules[a.module].name);
    switch (a.role) {
      case TensorRole::Packed: EXPECT_EQ(b.info.name, module + ".weight"); break;
      case TensorRole::Global:
        EXPECT_EQ(b.info.name, module + ".weight_scale_2");
        EXPECT_TRUE(b.info.shape.empty()) << "a scalar, as ModelOpt writes it";
        EXPECT_EQ(a.info.shape, std::vector<std::uint64_t>{1});
        break;
      default: EXPECT_EQ(a.info.name, b.info.name); EXPECT_EQ(a.info.shape, b.info.shape);
    }
  }
  // A tensor already bearing a name the layout gives is refused.
  SourceShard clash = shard;
  clash.add(std::string(ct.modules.modules[0].name) + ".weight", Dtype::BF16, {2, 2});
  const ShardHeader h = clash.build();
  const ModuleSet set = discover_modules({{"s.safetensors", &h}});
  EXPECT_THROW(make_target_layout(h, 0, set, {}, TargetFormat::ModelOpt), Error);
  EXPECT_NO_THROW(make_target_layout(h, 0, set));
}

TEST(TargetLayout, DataOrderIsUnchangedTensorsInSourceOrderThenScaleGlobalPairs) {
  const Laid l = lay_out(k3_like_shard(1000));
  const auto& order = l.layout.data_order;
  std::size_t i = 0;
  std::size_t last_source = 0;
  for (; i < order.size() && is_unchanged(l.layout.tensors[order[i]].role); ++i) {
    if (i > 0) {
        EXPECT_GT(l.layout.tensors[order[i]].source, last_source);
      }
    last_source = l.layout.tensors[order[i]].source;
  }
  EXPECT_EQ(i, l.source.tensors().size() - l.modules.modules.size());  // every unchanged tensor first
  for (; i < order.size(); i += 2) {
    ASSERT_LT(i + 1, order.size());
    EXPECT_EQ(l.layout.tensors[order[i]].role, TensorRole::Scale);
    EXPECT_EQ(l.layout.tensors[order[i + 1]].role, TensorRole::Global);
    EXPECT_EQ(l.layout.tensors[order[i + 1]].module, l.layout.tensors[order[i]].module);
  }
  // Scales: F8_E4M3 [N, K/16]; globals F32 [1].
  for (const auto& t : l.layout.tensors) {
    if (t.role == TensorRole::Scale) {
      const QuantModule& m = l.modules.modules[t.module];
      EXPECT_EQ(t.info.dtype, Dtype::F8_E4M3);
      EXPECT_EQ(t.info.shape, (std::vector<std::uint64_t>{m.rows, m.groups * 2}));
    }
    if (t.role == TensorRole::Global) {
        EXPECT_EQ(t.info.shape, (std::vector<std::uint64_t>{1}));
      }
  }
}

// Positions of `part` (unchanged or not) in `order`, in the order taken.
std::vector<std::size_t> part_of(const TargetLayout& layout, const std::vector<std::size_t>& order, bool unchanged) {
  std::vector<std::size_t> out;
  for (const std::size_t i : order) {
    if (is_unchanged(layout.tensors[layout.data_order[i]].role) == unchanged) out.push_back(i);
  }
  return out;
}

// Every position once; each part of data_order in its own order.
void expect_merge_of_parts(const TargetLayout& layout, const std::vector<std::size_t>& order) {
  std::vector<std::size_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::size_t> all(layout.data_order.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
  EXPECT_EQ(sorted, all);
  for (const bool unchanged : {true, false}) {
    const std::vector<std::size_t> part = part_of(layout, order, unchanged);
    EXPECT_TRUE(std::is_sorted(part.begin(), part.end())) << (unchanged ? "unchanged" : "changed");
  }
}

TEST(TargetLayout, SourceReadOrderReadsTheSourceOnceFrontToBack) {
  for (const std::uint64_t residue : {8u, 1000u, 4095u}) {
    const Laid l = lay_out(k3_like_shard(residue));
    const std::vector<std::size_t> order = source_read_order(l.source, l.layout);
    expect_merge_of_parts(l.layout, order);
    std::uint64_t last = 0;
    for (std::size_t k = 0; k < order.size(); ++k) {
      const TargetTensor& t = l.layout.tensors[l.layout.data_order[order[k]]];
      if (t.role == TensorRole::Global) {
        // Right after its own scale.
        ASSERT_GT(k, 0u);
        const TargetTensor& before = l.layout.tensors[l.layout.data_order[order[k - 1]]];
        EXPECT_EQ(before.role, TensorRole::Scale);
        EXPECT_EQ(before.module, t.module);
        continue;
      }
      const std::uint64_t begin = l.source.tensors()[t.source].begin;
      EXPECT_GE(begin, last) << t.info.name;
      last = begin;
    }
    // Not data_order itself: the scales are taken among the packed tensors.
    EXPECT_NE(part_of(l.layout, order, true).size(), 0u);
    EXPECT_FALSE(std::is_sorted(order.begin(), order.end()));
  }
}

TEST(TargetLayout, SourceReadOrderKeepsAChangedPartThatIsNotInSourceOrder) {
  // A requantize layout's changed part is every packed tensor, then every
  // scale (make_target_layout for PlanKind::Requantize): the writer hashes
  // the new bytes in that order, so the read order must keep it.
  Laid l = lay_out(k3_like_shard(1000));
  for (TargetTensor& t : l.layout.tensors) {
    if (t.role == TensorRole::Packed) t.role = TensorRole::Requantized;
  }
  const std::vector<std::size_t> order = source_read_order(l.source, l.layout);
  expect_merge_of_parts(l.layout, order);
  const std::vector<std::size_t> changed = part_of(l.layout, order, false);
  EXPECT_EQ(changed.size(), l.layout.data_order.size() - part_of(l.layout, order, true).size());
}

// Whole source blocks inside unchanged tensors that line up in the target,
// and the most any header padding could line up (brute force over residues).
std::pair<std::uint64_t, std::uint64_t> aligned_and_best_blocks(const Laid& l) {
  std::vector<std::uint64_t> by_residue(kShareBlock, 0);
  std::uint64_t aligned = 0;
  for (const auto& t : l.layout.tensors) {
    if (!is_unchanged(t.role)) continue;
    const std::uint64_t from = l.source.data_start() + l.source.tensors()[t.source].begin;
    const std::uint64_t first = (from + kShareBlock - 1) / kShareBlock, end = (from + t.info.nbytes()) / kShareBlock;
    const std::uint64_t blocks = end > first ? end - first : 0;
    by_residue[(from + kShareBlock * 4 - t.info.begin % kShareBlock) % kShareBlock] += blocks;
    if (t.aligned) aligned += blocks;
  }
  return {aligned, *std::max_element(by_residue.begin(), by_residue.end())};
}

TEST(TargetLayout, WhenNotEveryTensorCanAlignThePaddingLinesUpTheMostBlocks) {
  // Scales of 2 KiB: in the target every second packed tensor is half a block
  // off whatever the padding; the larger class wins.
  SourceShard s;
  for (int e = 0; e < 7; ++e) s.module("m." + std::to_string(e) + ".down_proj", 512, 128);  // packed 32 KiB, scale 2 KiB
  const Laid l = lay_out(s);
  expect_valid_target(l);
  expect_flags_truthful(l);
  const auto [aligned, best] = aligned_and_best_blocks(l);
  EXPECT_EQ(aligned, best);
  std::vector<std::string> aligned_names;
  for (const auto& t : l.layout.tensors) {
    if (t.aligned) aligned_names.push_back(t.info.name);
  }
  EXPECT_EQ(aligned_names, (std::vector<std::string>{"m.0.down_proj.weight_packed", "m.2.down_proj.weight_packed",
                                                      "m.4.down_proj.weight_packed", "m.6.down_proj.weight_packed"}));
}

TEST(TargetLayout, WithoutUnchangedTensorsTheHeaderIsPaddedToEightLikeTheReferenceWriter) {
  // The packed half lives in another shard: this shard has nothing unchanged.
  SourceShard a, b;
  a.add("m.weight_packed", Dtype::U8, {64, 128});
  b.add("m.weight_scale", Dtype::U8, {64, 8});
  const ShardHeader ha = a.build(), hb = b.build();
  const ModuleSet modules = discover_modules({{"a.safetensors", &ha}, {"b.safetensors", &hb}});
  const TargetLayout layout = make_target_layout(hb, 1, modules);
  EXPECT_EQ(layout.data_start_modulus, 8u);
  EXPECT_EQ(serialize_target_header(layout).size() % 8, 0u);
}

TEST(TargetLayout, TotalsFromTheModuleTableEqualTheSumOfEveryShardsLayout) {
  // Three shards: modules whole in one shard, a module split across two
  // (packed in a, scale in b), pass-through tensors everywhere.
  std::mt19937_64 rng(11);
  const auto below = [&](std::uint64_t n) { return std::uniform_int_distribution<std::uint64_t>(0, n - 1)(rng); };
  for (int round = 0; round < 50; ++round) {
    std::vector<SourceShard> shards(3);
    for (std::size_t s = 0; s < shards.size(); ++s) {
      shards[s].residue = below(kShareBlock);
      for (int i = 0; i < static_cast<int>(below(6)); ++i) {
        const std::string name = "s" + std::to_string(s) + ".t" + std::to_string(i);
        if (below(2) == 0) {
          shards[s].add(name + ".bias", Dtype::BF16, {1 + below(500)});
        } else {
          shards[s].module(name, 1 + below(200), 32 * (1 + below(20)));
        }
      }
    }
    shards[0].add("split.weight_packed", Dtype::U8, {64, 64});
    shards[1].add("split.weight_scale", Dtype::U8, {64, 4});
    std::vector<ShardHeader> headers;
    for (const auto& s : shards) headers.push_back(s.build());
    std::vector<ShardTensors> views;
    for (std::size_t s = 0; s < headers.size(); ++s) views.push_back({"s" + std::to_string(s), &headers[s]});
    const ModuleSet modules = discover_modules(views);
    std::uint64_t source_bytes = 0, source_tensors = 0, target_bytes = 0, passthrough = 0;
    for (std::size_t s = 0; s < headers.size(); ++s) {
      source_bytes += headers[s].data_size();
      source_tensors += headers[s].tensors().size();
      const TargetLayout layout = make_target_layout(headers[s], s, modules);
      target_bytes += layout.data_size;
      for (const auto& t : layout.tensors) passthrough += t.role == TensorRole::PassThrough ? 1 : 0;
    }
    const TargetTotals totals = target_totals(source_bytes, source_tensors, modules);
    SCOPED_TRACE("round " + std::to_string(round));
    EXPECT_EQ(totals.tensor_bytes, target_bytes);
    EXPECT_EQ(totals.passthrough_tensors, passthrough);
  }
}

TEST(TargetLayout, RandomShardsAlwaysGiveValidDeterministicTargets) {
  std::mt19937_64 rng(7);
  const auto below = [&](std::uint64_t n) { return std::uniform_int_distribution<std::uint64_t>(0, n - 1)(rng); };
  for (int round = 0; round < 300; ++round) {
    SourceShard s;
    s.residue = below(kShareBlock);
    const bool whole_block_scales = round % 2 == 0;
    const int count = static_cast<int>(1 + below(20));
    for (int i = 0; i < count; ++i) {
      const std::string name = "t" + std::to_string(i);
      if (below(3) == 0) {
        s.add(name + ".bias", below(2) ? Dtype::BF16 : Dtype::F32, {1 + below(3000)});
      } else if (whole_block_scales) {
        s.module(name, 128 * (1 + below(4)), 1024 * (1 + below(3)));  // scales: multiples of 4096
      } else {
        s.module(name, 1 + below(300), 32 * (1 + below(40)));
      }
    }
    const Laid l = lay_out(s);
    SCOPED_TRACE("round " + std::to_string(round));
    expect_valid_target(l);
    expect_flags_truthful(l);
    if (whole_block_scales) {
      for (const auto& t : l.layout.tensors) {
        if (is_unchanged(t.role)) {
        EXPECT_TRUE(t.aligned) << t.info.name;
      }
      }
    }
    const auto [aligned, best] = aligned_and_best_blocks(l);
    EXPECT_EQ(aligned, best);
    const Laid again = lay_out(s);
    EXPECT_EQ(again.header, l.header);
    EXPECT_EQ(again.layout.data_order, l.layout.data_order);
  }
}

}  // namespace
}  // namespace mx2nv

namespace mx2nv {
namespace {

// A converted shard or index must be readable under the caps its source
// passed: past them, conversion is refused (invalid input), never written.
TEST(TargetLayout, AConvertedHeaderOverTheReadersCapsIsRefused) {
  TargetLayout layout;
  const auto add = [&](std::size_t n, std::size_t name_length) {
    for (std::size_t i = 0; i < n; ++i) {
      TargetTensor t;
      t.info.name = std::to_string(layout.tensors.size()) + std::string(name_length, 'x');
      t.info.dtype = Dtype::U8;
      t.info.shape = {0};
      layout.tensors.push_back(std::move(t));
    }
  };
  add(1000, 8);
  EXPECT_NO_THROW(serialize_target_header(layout));
  add(kMaxTensorsPerShard + 1 - layout.tensors.size(), 0);
  try {
    serialize_target_header(layout);
    ADD_FAILURE() << "a header over the tensor cap was written";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
    EXPECT_NE(std::string(e.what()).find("converted shard header"), std::string::npos) << e.what();
  }
}

TEST(TargetLayout, AConvertedIndexOverTheReadersCapsIsRefused) {
  EXPECT_NO_THROW(check_converted_index_caps(kMaxIndexTensors, kMaxIndexNameBytes));
  EXPECT_THROW(check_converted_index_caps(kMaxIndexTensors + 1, 10), Error);
  EXPECT_THROW(check_converted_index_caps(10, kMaxIndexNameBytes + 1), Error);
}

}  // namespace
}  // namespace mx2nv

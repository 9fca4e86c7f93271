// End to end on generated checkpoints: convert -> verify in K3 and flat
// layouts, single-file, determinism, windows, refusals, and verify catching a
// flipped byte anywhere in the output.
#include "common/error.hpp"
#include "compare/compare.hpp"
#include "convert/convert.hpp"
#include "e2e_support.hpp"
#include "fixture/fixture.hpp"
#include "inspect/inspect.hpp"
#include "safetensors/header.hpp"
#include "safetensors/index.hpp"
#include "sys/file.hpp"
#include "sys/read_buffer.hpp"
#include "verify/verify.hpp"

#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace mx2nv::e2e {
namespace {

using nlohmann::json;

FixtureSpec small(FixtureLayout layout, unsigned shards) {
  FixtureSpec s;
  s.layout = layout;
  s.layers = 2;
  s.experts = 3;
  s.hidden = 128;
  s.intermediate = 64;
  s.shards = shards;
  return s;
}

Report convert(const fs::path& src, const fs::path& dst, Window w = Window::Marlin, unsigned threads = 2,
               CopyMode copy = CopyMode::Auto) {
  return convert_checkpoint({src, dst, w, threads, false, copy});
}

Report verify(const fs::path& src, const fs::path& dst, Window w = Window::Marlin) {
  return verify_checkpoint({src, dst, w, 2, std::nullopt});
}

std::uint64_t expected_values(const FixtureSpec& s) {
  return std::uint64_t{s.layers} * s.experts * 3 * s.hidden * s.intermediate;
}

TEST(ConvertVerify, K3LayoutWithGateUpSplitAcrossShards) {
  ScratchDir d;
  const FixtureSpec spec = small(FixtureLayout::K3, 3);
  write_fixture(d / "src", spec);
  // The fixture must really straddle a pair across shards for this test to mean anything.
  const json index = json::parse(read_file(d / "src" / std::string(kIndexFileName)));
  bool split = false;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    if (name.ends_with(".w1.weight_scale")) {
      const std::string w3 = name.substr(0, name.size() - 16) + ".w3.weight_scale";
      split = split || index["weight_map"][w3] != shard;
    }
  }
  ASSERT_TRUE(split);

  // --copy copy: mx2nv reads every packed byte itself, so it counts groups.
  const Report c = convert(d / "src", d / "dst", Window::Marlin, 2, CopyMode::Copy);
  ASSERT_EQ(c.result, Outcome::Ok);
  ASSERT_TRUE(c.active_groups.has_value() && c.zero_groups.has_value());
  EXPECT_EQ(c.modules, 18u);
  EXPECT_EQ(c.scale_groups, 12u);
  EXPECT_GT(c.canonicalised_zero_groups, 0u);  // the fixture plants out-of-window zero-group scales
  EXPECT_GT(c.zero_groups, 0u);
  EXPECT_EQ(*c.active_groups + *c.zero_groups, expected_values(spec) / 32);
  EXPECT_GT(*c.target_tensor_bytes, *c.source_tensor_bytes);
  EXPECT_FALSE(c.values_compared.has_value());  // convert compares no values: null, not 0

  const Report v = verify(d / "src", d / "dst");
  EXPECT_EQ(v.result, Outcome::Ok) << (v.differences.empty() ? "" : v.differences[0]);
  EXPECT_EQ(v.values_compared, expected_values(spec));
  EXPECT_EQ(v.mismatches, 0u);
  EXPECT_EQ(v.max_abs_error, 0.0);
  EXPECT_EQ(v.zero_groups, c.zero_groups);
  EXPECT_EQ(v.target_tensor_bytes, c.target_tensor_bytes);
  // verify decides from the two trees what convert planned.
  EXPECT_EQ(v.canonicalised_zero_groups, c.canonicalised_zero_groups);
  EXPECT_EQ(v.raised_globals, c.raised_globals);
  EXPECT_FALSE(v.resumed_shards.has_value());
  EXPECT_FALSE(v.written_bytes.has_value());

  // Index regenerated: globals indexed beside their scales, total_size right.
  const json out = json::parse(read_file(d / "dst" / std::string(kIndexFileName)));
  EXPECT_EQ(out["metadata"]["total_size"], *c.target_tensor_bytes);
  const std::string m = fixture_module_name(spec, 1, 2, 1);
  EXPECT_EQ(out["weight_map"][m + ".weight_global_scale"], out["weight_map"][m + ".weight_scale"]);
  // Companion files and subfolders copied.
  EXPECT_EQ(read_file(d / "src/assets/LICENSE.txt"), read_file(d / "dst/assets/LICENSE.txt"));
  EXPECT_EQ(read_file(d / "src/tiktoken.model"), read_file(d / "dst/tiktoken.model"));
}

TEST(ConvertVerify, FlatLayout) {
  ScratchDir d;
  const FixtureSpec spec = small(FixtureLayout::Flat, 2);
  write_fixture(d / "src", spec);
  const Report c = convert(d / "src", d / "dst");
  ASSERT_EQ(c.result, Outcome::Ok);
  EXPECT_EQ(c.scale_groups, 12u);  // gate_proj/up_proj pairs
  const Report v = verify(d / "src", d / "dst");
  EXPECT_EQ(v.result, Outcome::Ok) << (v.differences.empty() ? "" : v.differences[0]);
  EXPECT_EQ(v.values_compared, expected_values(spec));
  const json cfg = json::parse(read_file(d / "dst/config.json"));
  EXPECT_EQ(cfg["quantization_config"]["format"], "nvfp4-pack-quantized");
}

TEST(ConvertVerify, SingleFileCheckpoint) {
  ScratchDir d;
  write_fixture(d / "src", small(FixtureLayout::Flat, 1));
  ASSERT_FALSE(fs::exists(d / "src" / std::string(kIndexFileName)));
  ASSERT_EQ(convert(d / "src", d / "dst").result, Outcome::Ok);
  EXPECT_FALSE(fs::exists(d / "dst" / std::string(kIndexFileName)));
  EXPECT_EQ(verify(d / "src", d / "dst").result, Outcome::Ok);
}

TEST(ConvertVerify, SameInputGivesByteIdenticalOutputWhateverTheThreads) {
  ScratchDir d;
  write_fixture(d / "src", small(FixtureLayout::K3, 4));
  ASSERT_EQ(convert(d / "src", d / "a", Window::Marlin, 1).result, Outcome::Ok);
  ASSERT_EQ(convert(d / "src", d / "b", Window::Marlin, 4).result, Outcome::Ok);
  const auto a = snapshot(d / "a");
  const auto b = snapshot(d / "b");
  ASSERT_EQ(a.size(), b.size());
  EXPECT_TRUE(a == b);
}

TEST(ConvertVerify, PackedBytesAreUntouched) {
  ScratchDir d;
  const FixtureSpec spec = small(FixtureLayout::K3, 1);
  write_fixture(d / "src", spec);
  ASSERT_EQ(convert(d / "src", d / "dst").result, Outcome::Ok);
  const std::string name = fixture_module_name(spec, 0, 1, 2) + ".weight_packed";
  EXPECT_EQ(tensor_bytes(d / "src/model.safetensors", name), tensor_bytes(d / "dst/model.safetensors", name));
}

TEST(Windows, OverSpanIsRefusedUnderMarlinAndExactUnderE4m3) {
  ScratchDir d;
  FixtureSpec spec = small(FixtureLayout::K3, 2);
  const std::string hot = fixture_module_name(spec, 1, 0, 2);  // a down projection: its own global
  spec.overrides[hot].span = 16;
  spec.overrides[hot].k_max = -4;
  write_fixture(d / "src", spec);

  const Report refused = convert(d / "src", d / "marlin");
  ASSERT_EQ(refused.result, Outcome::Refused);
  ASSERT_EQ(refused.refused_spans.size(), 1u);
  EXPECT_EQ(refused.refused_spans[0].module, hot);
  EXPECT_EQ(refused.refused_spans[0].span, 16);
  EXPECT_EQ(refused.refused_spans[0].limit, 14);
  EXPECT_GT(refused.refused_spans[0].groups_outside, 0u);
  EXPECT_FALSE(fs::exists(d / "marlin"));  // nothing that looks like a checkpoint

  const Report e4m3 = convert(d / "src", d / "e4m3", Window::E4M3);
  ASSERT_EQ(e4m3.result, Outcome::Ok);
  EXPECT_GT(e4m3.marlin_zeroed_groups, 0u);
  EXPECT_EQ(verify(d / "src", d / "e4m3", Window::E4M3).result, Outcome::Ok);
  // Under the marlin window the same output is a difference, and verify counts
  // exactly the groups the plan predicted Marlin would flush.
  const Report vm = verify(d / "src", d / "e4m3", Window::Marlin);
  EXPECT_EQ(vm.result, Outcome::Mismatch);
  EXPECT_EQ(vm.mismatches, 0u);
  EXPECT_EQ(vm.marlin_zeroed_groups, e4m3.marlin_zeroed_groups);

  const Inspection in = inspect_checkpoint(d / "src", Window::Marlin, 2);
  EXPECT_EQ(in.report.result, Outcome::Refused);
  ASSERT_EQ(in.outcomes.size(), 2u);
  EXPECT_TRUE(in.outcomes[0].refused);
  EXPECT_FALSE(in.outcomes[1].refused);
  EXPECT_EQ(in.outcomes[1].marlin_zeroed_groups, e4m3.marlin_zeroed_groups);
  EXPECT_EQ(in.outcomes[0].over_span[0].groups_outside, refused.refused_spans[0].groups_outside);
  EXPECT_EQ(in.report.target_tensor_bytes, e4m3.target_tensor_bytes);  // size predicted exactly
  EXPECT_EQ(in.max_span, 16);
}

TEST(Windows, BeyondE4m3IsRefusedEverywhere) {
  ScratchDir d;
  FixtureSpec spec = small(FixtureLayout::Flat, 1);
  spec.overrides[fixture_module_name(spec, 0, 0, 2)].span = 18;
  write_fixture(d / "src", spec);
  EXPECT_EQ(convert(d / "src", d / "dst", Window::E4M3).result, Outcome::Refused);
  EXPECT_FALSE(fs::exists(d / "dst"));
}

TEST(Windows, GateUpSharingCanPushAModuleOverTheSpan) {
  ScratchDir d;
  FixtureSpec spec = small(FixtureLayout::K3, 2);
  const std::string gate = fixture_module_name(spec, 0, 1, 0), up = fixture_module_name(spec, 0, 1, 1);
  spec.overrides[gate] = {-10, 10, false, false};  // alone: span 10
  spec.overrides[up] = {-4, 4, false, false};      // raises the shared k_max: gate spans 16
  write_fixture(d / "src", spec);
  const Report r = convert(d / "src", d / "dst");
  ASSERT_EQ(r.result, Outcome::Refused);
  ASSERT_EQ(r.refused_spans.size(), 1u);
  EXPECT_EQ(r.refused_spans[0].module, gate);
  EXPECT_EQ(r.refused_spans[0].span, 16);
}

TEST(Windows, QuietExpertsGetANormalFp16GlobalUnderMarlin) {
  ScratchDir d;
  FixtureSpec spec = small(FixtureLayout::K3, 2);
  spec.k_max = -16;  // every module quiet: m = k_max - 8 = -24 would be subnormal in fp16 after x 2^7
  spec.span = 5;
  write_fixture(d / "src", spec);
  const Report r = convert(d / "src", d / "marlin");
  ASSERT_EQ(r.result, Outcome::Ok);
  EXPECT_EQ(r.raised_globals, r.scale_groups);
  EXPECT_EQ(verify(d / "src", d / "marlin").result, Outcome::Ok);
  // The e4m3 window keeps m = k_max - 8: exact on disk, outside Marlin's global range.
  ASSERT_EQ(convert(d / "src", d / "e4m3", Window::E4M3).result, Outcome::Ok);
  EXPECT_EQ(verify(d / "src", d / "e4m3", Window::E4M3).result, Outcome::Ok);
  const Report vm = verify(d / "src", d / "e4m3", Window::Marlin);
  EXPECT_EQ(vm.result, Outcome::Mismatch);
  EXPECT_EQ(vm.mismatches, 0u);  // every value is right on disk; the globals are not
  bool named = false;
  for (const auto& diff : vm.differences) named = named || diff.find("global range") != std::string::npos;
  EXPECT_TRUE(named);
}

TEST(Windows, AQuietExpertNoGlobalServesIsRefusedWithItsRanges) {
  ScratchDir d;
  FixtureSpec spec = small(FixtureLayout::K3, 2);
  const std::string quiet = fixture_module_name(spec, 1, 0, 2);
  spec.overrides[quiet].k_max = -30;  // block scales need m in [-38, -34]; fp16 needs m >= -21
  spec.overrides[quiet].span = 10;
  write_fixture(d / "src", spec);
  const Report r = convert(d / "src", d / "dst");
  ASSERT_EQ(r.result, Outcome::Refused);
  EXPECT_TRUE(r.refused_spans.empty());
  ASSERT_EQ(r.global_conflicts.size(), 1u);
  EXPECT_EQ(r.global_conflicts[0].scale_group, quiet);
  EXPECT_EQ(r.global_conflicts[0].needed_min, -38);
  EXPECT_EQ(r.global_conflicts[0].needed_max, -34);
  EXPECT_EQ(r.global_conflicts[0].allowed_min, -21);
  EXPECT_FALSE(fs::exists(d / "dst"));
  const Inspection in = inspect_checkpoint(d / "src", Window::Marlin, 2);
  EXPECT_EQ(in.report.result, Outcome::Refused);
  EXPECT_EQ(in.outcomes[0].global_conflicts.size(), 1u);
  EXPECT_FALSE(in.outcomes[1].refused);  // e4m3 takes it
  EXPECT_EQ(convert(d / "src", d / "e4m3", Window::E4M3).result, Outcome::Ok);
}

TEST(Inputs, NaNScaleIsInvalidInputAndWritesNothing) {
  ScratchDir d;
  FixtureSpec spec = small(FixtureLayout::K3, 2);
  spec.overrides[fixture_module_name(spec, 1, 1, 1)].nan_scale = true;
  write_fixture(d / "src", spec);
  try {
    convert(d / "src", d / "dst");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
    EXPECT_NE(std::string(e.what()).find("0xFF"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("row 0 group"), std::string::npos);
  }
  EXPECT_FALSE(fs::exists(d / "dst"));
}

TEST(Inputs, AllZeroModuleGetsUnitGlobalAndZeroScales) {
  ScratchDir d;
  FixtureSpec spec = small(FixtureLayout::Flat, 1);
  const std::string m = fixture_module_name(spec, 0, 0, 2);
  spec.overrides[m].all_zero = true;
  write_fixture(d / "src", spec);
  ASSERT_EQ(convert(d / "src", d / "dst").result, Outcome::Ok);
  EXPECT_EQ(verify(d / "src", d / "dst").result, Outcome::Ok);
  const fs::path shard = d / "dst/model.safetensors";
  const std::string global = tensor_bytes(shard, m + ".weight_global_scale");
  float g = 0;
  std::memcpy(&g, global.data(), 4);
  EXPECT_EQ(g, 1.0f);
  const std::string scales = tensor_bytes(shard, m + ".weight_scale");
  EXPECT_EQ(scales, std::string(scales.size(), '\0'));
}

TEST(Destination, UsageErrors) {
  ScratchDir d;
  write_fixture(d / "src", small(FixtureLayout::Flat, 1));
  fs::create_directories(d / "full");
  write_file(d / "full/x", "x");
  const auto kind = [&](const fs::path& dst) {
    try {
      convert(d / "src", dst);
    } catch (const Error& e) {
      return e.kind();
    }
    return ErrorKind::Io;
  };
  EXPECT_EQ(kind(d / "full"), ErrorKind::Usage);
  EXPECT_EQ(kind(d / "src"), ErrorKind::Usage);
  EXPECT_EQ(kind(d / "src/sub"), ErrorKind::Usage);
  EXPECT_EQ(kind(d.path()), ErrorKind::Usage);  // contains SRC (and is non-empty)
  EXPECT_FALSE(fs::exists(d / "src/sub"));
}

TEST(Inputs, HuggingFaceSnapshotOfSymlinks) {
  ScratchDir d;
  write_fixture(d / "plain", small(FixtureLayout::K3, 2));
  const fs::path snap = d / "hub/models--acme--k3/snapshots/0123abcd";
  fs::create_directories(snap);
  fs::create_directories(d / "hub/models--acme--k3/blobs");
  int i = 0;
  for (const auto& e : fs::recursive_directory_iterator(d / "plain")) {
    if (!e.is_regular_file()) continue;
    const fs::path rel = fs::relative(e.path(), d / "plain");
    const fs::path blob = d / "hub/models--acme--k3/blobs" / ("blob" + std::to_string(i++));
    fs::copy_file(e.path(), blob);
    fs::create_directories((snap / rel).parent_path());
    fs::create_symlink(blob, snap / rel);
  }
  const Report r = convert(snap, d / "dst");
  ASSERT_EQ(r.result, Outcome::Ok);
  EXPECT_EQ(r.provenance.revision, "0123abcd");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(d / "dst/config.json")));
  EXPECT_EQ(verify(snap, d / "dst").result, Outcome::Ok);
}

// One flipped byte anywhere in DST (headers, packed codes, scales, globals,
// pass-through tensors, config, index, companions) is found by verify.
TEST(Verify, CatchesAFlippedByteAnywhere) {
  ScratchDir d;
  write_fixture(d / "src", small(FixtureLayout::K3, 2));
  ASSERT_EQ(convert(d / "src", d / "dst").result, Outcome::Ok);
  const auto files = snapshot(d / "dst");
  int cases = 0;
  for (const auto& [rel, bytes] : files) {
    if (rel.starts_with(".mx2nv/")) continue;  // mx2nv's record of the run, not part of the checkpoint
    std::vector<std::size_t> positions = {0, bytes.size() / 7, bytes.size() / 3, bytes.size() / 2,
                                          bytes.size() * 5 / 6, bytes.size() - 1};
    if (rel.ends_with(".safetensors")) {
      for (std::size_t p = 8; p < 400; p += 37) positions.push_back(p);  // inside the JSON header
    }
    for (const std::size_t pos : positions) {
      for (const int mask : {0x01, 0x80}) {
        std::string broken = bytes;
        broken[pos] = static_cast<char>(broken[pos] ^ mask);
        write_file(d / "dst" / rel, broken);
        Report v;
        bool errored = false;
        try {
          v = verify(d / "src", d / "dst");
        } catch (const Error&) {
          errored = true;  // only acceptable for the source; DST damage must be a mismatch
        }
        EXPECT_FALSE(errored) << rel << " byte " << pos;
        EXPECT_EQ(v.result, Outcome::Mismatch) << rel << " byte " << pos << " mask " << int(mask);
        ++cases;
      }
    }
    write_file(d / "dst" / rel, bytes);
  }
  EXPECT_GT(cases, 100);
  EXPECT_EQ(verify(d / "src", d / "dst").result, Outcome::Ok);
}

// Drops every file of `dir` from the page cache (synced first: only clean
// pages can be dropped).
void evict_tree(const fs::path& dir) {
  ::sync();
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const File f = File::open_read(e.path());
    (void)::posix_fadvise(f.fd(), 0, 0, POSIX_FADV_DONTNEED);
  }
}

// Modules of a megabyte, read from a cold cache past the page cache
// (sys/ordered_reads.hpp): verify and compare still see every value at any
// number of workers, leave the packed tensors uncached where the file
// system reads direct, and a changed code is still found.
TEST(Verify, ColdLargeModulesAreReadWholeAtAnyThreadCount) {
  ScratchDir d;
  FixtureSpec s;
  s.layers = 1;
  s.experts = 3;
  s.hidden = 2048;  // every packed tensor 1 MiB: kOrderedReadBytes
  s.intermediate = 1024;
  s.shards = 2;
  write_fixture(d / "src", s);
  ASSERT_EQ(convert(d / "src", d / "dst").result, Outcome::Ok);
  const auto check = [&](bool intact) {
    for (const unsigned threads : {1u, 2u, 3u, 8u}) {
      evict_tree(d / "src");
      evict_tree(d / "dst");
      // The middle of the last shard (packed tensors): uncached now where the
      // file system lets pages be evicted (not tmpfs).
      const File f = File::open_read(d / "dst" / "model-00002-of-00002.safetensors");
      const std::uint64_t middle = f.size() / 2 - (1 << 19);
      const bool cold = f.cached(middle, 1 << 20) == false;
      const Report v = verify_checkpoint({d / "src", d / "dst", Window::Marlin, threads, std::nullopt});
      EXPECT_EQ(v.result, intact ? Outcome::Ok : Outcome::Mismatch) << threads;
      EXPECT_EQ(v.values_compared, expected_values(s)) << threads;
      if (ReadBuffer probe; cold && probe.read_direct(f, 0, 4096)) {
        EXPECT_EQ(f.cached(middle, 1 << 20), false) << threads;  // read past the cache
      }
      evict_tree(d / "src");
      evict_tree(d / "dst");
      const CompareResult c = compare_checkpoints({d / "src", d / "dst", threads, "", {}});
      EXPECT_EQ(c.modules.size(), 9u);
      EXPECT_EQ(c.all_exact(), intact) << threads;
    }
  };
  check(true);
  // A code in the middle of the last shard (its packed tensors fill it).
  const fs::path last = d / "dst" / "model-00002-of-00002.safetensors";
  std::string bytes = read_file(last);
  bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x01);
  write_file(last, bytes);
  check(false);
}

TEST(Verify, ExtraOrMissingFilesAreDifferences) {
  ScratchDir d;
  write_fixture(d / "src", small(FixtureLayout::Flat, 2));
  ASSERT_EQ(convert(d / "src", d / "dst").result, Outcome::Ok);
  write_file(d / "dst/extra.txt", "x");
  EXPECT_EQ(verify(d / "src", d / "dst").result, Outcome::Mismatch);
  fs::remove(d / "dst/extra.txt");
  fs::remove(d / "dst/generation_config.json");
  EXPECT_EQ(verify(d / "src", d / "dst").result, Outcome::Mismatch);
}


// A shard of DST as tensors and their bytes, to move tensors between shards.
struct RawShard {
  std::optional<std::map<std::string, std::string>> metadata;
  std::vector<TensorInfo> tensors;
  std::vector<std::string> data;
};

RawShard read_raw(const fs::path& path) {
  const std::string bytes = read_file(path);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), sizeof n);
  const ShardHeader h = ShardHeader::parse(std::string_view(bytes).substr(8, n), bytes.size(), path.string());
  RawShard r{h.metadata(), {}, {}};
  for (const TensorInfo& t : h.tensors()) {
    r.tensors.push_back(t);
    r.data.push_back(bytes.substr(h.data_start() + t.begin, t.nbytes()));
  }
  return r;
}

void write_raw(const fs::path& path, RawShard r) {
  std::string data;
  for (std::size_t i = 0; i < r.tensors.size(); ++i) {
    r.tensors[i].begin = data.size();
    data += r.data[i];
    r.tensors[i].end = data.size();
  }
  write_file(path, serialize_header(r.metadata, r.tensors) + data);
}

// verify drops DST's index names after opening it and looks them up again
// (streaming the index) only for tensors a shard lacks: a tensor moved to
// another shard is named with both, one dropped from shard and index is missing.
TEST(Verify, AMovedTensorIsNamedWithBothShardsAndADroppedOneIsMissing) {
  ScratchDir d;
  write_fixture(d / "src", small(FixtureLayout::K3, 3));
  ASSERT_EQ(convert(d / "src", d / "dst").result, Outcome::Ok);
  json index = json::parse(read_file(d / "dst" / std::string(kIndexFileName)));
  std::string moved, dropped, from, to, dropped_from;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    if (name.ends_with(kPackedSuffix) || name.ends_with(kScaleSuffix) || name.ends_with(kGlobalSuffix)) continue;
    if (moved.empty()) {
      moved = name;
      from = shard.get<std::string>();
    } else if (dropped.empty() && shard.get<std::string>() != from) {
      dropped = name;
      dropped_from = shard.get<std::string>();
    }
  }
  ASSERT_FALSE(moved.empty());
  ASSERT_FALSE(dropped.empty());
  for (const auto& [name, shard] : index["weight_map"].items()) {
    if (shard.get<std::string>() != from && shard.get<std::string>() != dropped_from) to = shard.get<std::string>();
  }
  ASSERT_FALSE(to.empty());
  RawShard a = read_raw(d / "dst" / from), b = read_raw(d / "dst" / to), c = read_raw(d / "dst" / dropped_from);
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    if (a.tensors[i].name != moved) continue;
    b.tensors.push_back(a.tensors[i]);
    b.data.push_back(a.data[i]);
    a.tensors.erase(a.tensors.begin() + static_cast<std::ptrdiff_t>(i));
    a.data.erase(a.data.begin() + static_cast<std::ptrdiff_t>(i));
    break;
  }
  for (std::size_t i = 0; i < c.tensors.size(); ++i) {
    if (c.tensors[i].name != dropped) continue;
    c.tensors.erase(c.tensors.begin() + static_cast<std::ptrdiff_t>(i));
    c.data.erase(c.data.begin() + static_cast<std::ptrdiff_t>(i));
    break;
  }
  write_raw(d / "dst" / from, a);
  write_raw(d / "dst" / to, b);
  write_raw(d / "dst" / dropped_from, c);
  index["weight_map"][moved] = to;
  index["weight_map"].erase(dropped);
  write_file(d / "dst" / std::string(kIndexFileName), index.dump(2) + "\n");

  const Report v = verify(d / "src", d / "dst");
  EXPECT_EQ(v.result, Outcome::Mismatch);
  const auto has = [&](const std::string& text) {
    return std::any_of(v.differences.begin(), v.differences.end(),
                       [&](const std::string& diff) { return diff.find(text) != std::string::npos; });
  };
  EXPECT_TRUE(has("tensor \"" + moved + "\" moved from " + from + " to " + to));
  EXPECT_TRUE(has(dropped_from + ": tensor \"" + dropped + "\" missing from DST"));
}

}  // namespace
}  // namespace mx2nv::e2e

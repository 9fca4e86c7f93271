// Resume records round-trip and never throw on damaged text; the JSON report
// matches a checked-in golden file field for field.
#include "destination/records.hpp"
#include "report/report.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

namespace mx2nv {
namespace {

ShardRecord sample() {
  ShardRecord r;
  r.shard = "model-00001-of-00002.safetensors";
  r.source_size = 123456789;
  r.source_mtime_ns = 1700000000123456789;
  r.source_header_hash = 0xfedcba9876543210ull;
  r.plan_hash = 42;
  r.output_size = 987654321;
  r.written_hash = 0x0123456789abcdefull;
  r.output_inode = 77;
  r.output_ctime_ns = 1700000000987654321;
  r.groups_counted = true;
  r.zero_groups = 3;
  r.groups = 1000;
  r.shared_bytes = 900000000;
  r.copied_bytes = 1000;
  r.written_bytes = 87653321;
  r.passthrough_tensors = 7;
  r.target_bytes = 555;
  return r;
}

TEST(Records, ShardRecordRoundTrips) {
  const ShardRecord r = sample();
  const auto back = shard_record_from_text(shard_record_to_text(r));
  ASSERT_TRUE(back.has_value());
  EXPECT_TRUE(back->same_source(r));
  EXPECT_EQ(back->plan_hash, r.plan_hash);
  EXPECT_EQ(back->output_size, r.output_size);
  EXPECT_EQ(back->written_hash, r.written_hash);
  EXPECT_EQ(back->output_inode, r.output_inode);
  EXPECT_EQ(back->output_ctime_ns, r.output_ctime_ns);
  EXPECT_TRUE(back->groups_counted);
  EXPECT_EQ(back->zero_groups, r.zero_groups);
  EXPECT_EQ(back->groups, r.groups);
  EXPECT_EQ(back->shared_bytes, r.shared_bytes);
  EXPECT_EQ(back->copied_bytes, r.copied_bytes);
  EXPECT_EQ(back->written_bytes, r.written_bytes);
  EXPECT_EQ(back->passthrough_tensors, r.passthrough_tensors);
  EXPECT_EQ(back->target_bytes, r.target_bytes);
}

TEST(Records, FinishedRecordRoundTrips) {
  FinishedRecord f;
  f.tool_version = "0.1.0";
  f.window = "e4m3";
  f.shards = {sample(), sample()};
  f.shards[1].shard = "b.safetensors";
  f.companions = {{"tokenizer.json", 17}, {"sub/notes.txt", 3}};
  f.config_hash = 11;
  f.index_hash = 12;
  f.canonicalised_zero_groups = 13;
  f.marlin_zeroed_groups = 14;
  const auto back = finished_record_from_text(finished_record_to_text(f));
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->tool_version, f.tool_version);
  EXPECT_EQ(back->window, f.window);
  ASSERT_EQ(back->shards.size(), 2u);
  EXPECT_EQ(back->shards[1].shard, "b.safetensors");
  ASSERT_EQ(back->companions.size(), 2u);
  EXPECT_EQ(back->companions[1].name, "sub/notes.txt");
  EXPECT_EQ(back->companions[1].size, 3u);
  EXPECT_EQ(back->config_hash, 11u);
  EXPECT_EQ(back->index_hash, 12u);
  EXPECT_EQ(back->canonicalised_zero_groups, 13u);
  EXPECT_EQ(back->marlin_zeroed_groups, 14u);
  // The finished record stays in DST: nothing in it may depend on the run
  // (inode, ctime) or on --copy (shared/copied bytes, whether groups were counted).
  EXPECT_EQ(back->shards[0].written_hash, f.shards[0].written_hash);
  EXPECT_EQ(back->shards[0].output_inode, 0u);
  EXPECT_EQ(back->shards[0].output_ctime_ns, 0);
  EXPECT_FALSE(back->shards[0].groups_counted);
  EXPECT_EQ(back->shards[0].shared_bytes, 0u);
  FinishedRecord g = f;
  for (auto& r : g.shards) {
    r.output_inode += 1;
    r.output_ctime_ns += 1;
    r.shared_bytes = 0;
    r.copied_bytes = 5;
    r.groups_counted = false;
  }
  EXPECT_EQ(finished_record_to_text(g), finished_record_to_text(f));
}

TEST(Records, DamagedRecordsAreNoRecordNeverAnException) {
  // Records live in DST, which is untrusted: every prefix, and the record with
  // each value swapped for another JSON type, parses to "no record".
  const std::string text = shard_record_to_text(sample());
  for (std::size_t n = 0; n + 1 < text.size(); ++n) {
    const std::string prefix = text.substr(0, n);
    EXPECT_NO_THROW((void)shard_record_from_text(prefix));
  }
  for (const char* wrong : {"\"x\"", "-1", "null", "[]", "{}", "1.5", "true"}) {
    for (const char* key : {"shard", "source_size", "source_mtime_ns", "plan_hash", "written_hash", "groups", "output_ctime_ns"}) {
      const std::string needle = std::string("\"") + key + "\": ";
      std::string t = text;
      const auto at = t.find(needle) + needle.size();
      const auto end = t.find_first_of(",\n", at);
      t.replace(at, end - at, wrong);
      std::optional<ShardRecord> r;
      EXPECT_NO_THROW(r = shard_record_from_text(t)) << t;
    }
  }
  EXPECT_FALSE(shard_record_from_text("[1,2]").has_value());
  EXPECT_FALSE(finished_record_from_text("{\"shards\": 5}").has_value());
  EXPECT_FALSE(finished_record_from_text("\xff").has_value());
}

TEST(Report, MatchesTheGoldenFile) {
  Report r;
  r.command = Command::Convert;
  r.window = Window::Marlin;
  r.provenance.tool_version = "0.1.0";  // the golden file must not change with the version
  r.provenance.source = "/data/hub/models--org--m/snapshots/abc123/\xff";
  r.provenance.revision = "abc123";
  r.provenance.target = "/data/out";
  r.modules = 6;
  r.scale_groups = 4;
  r.active_groups = 729;
  r.zero_groups = 39;
  r.canonicalised_zero_groups = 5;
  r.marlin_zeroed_groups = 0;
  r.resumed_shards = 0;
  r.passthrough_tensors = 12;
  r.companion_files = 4;
  r.shards = 2;
  r.source_tensor_bytes = 1000;
  r.target_tensor_bytes = 1010;
  r.refused_spans = {{"layers.0.experts.1.w2", 15, 14, 3}};
  r.copy_mode = CopyMode::Auto;
  r.shared_bytes = 900;
  r.copied_bytes = 20;
  r.written_bytes = 100;
  r.global_conflicts = {{"layers.0.experts.2.w2", -30, -40, -38, -34, -21, 8}};
  r.unrepresentable_globals = {"layers.0.experts.2.w2"};
  r.raised_globals = 2;
  r.seconds = 1.23456;
  // convert compares no values: values_compared, mismatches and max_abs_error are null.
  const std::string golden_path = std::string(MX2NV_SOURCE_DIR) + "/tests/unit/golden/report.json";
  const std::string got = report_to_json(r).dump(2) + "\n";
  if (std::getenv("MX2NV_UPDATE_GOLDEN") != nullptr) std::ofstream(golden_path) << got;
  std::ifstream in(golden_path);
  const std::string want{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  EXPECT_EQ(got, want) << "a deliberate change of the report contract? regenerate with MX2NV_UPDATE_GOLDEN=1 "
                          "build/mx2nv_unit_tests --gtest_filter=Report.* and document the field in README";

  r.set_error(Error(ErrorKind::InvalidInput, "bad"));
  const Json e = report_to_json(r);
  EXPECT_EQ(e["result"], "error");
  EXPECT_EQ(e["error_kind"], "invalid input");
  EXPECT_EQ(e["exit_code"], 3);
}

}  // namespace
}  // namespace mx2nv

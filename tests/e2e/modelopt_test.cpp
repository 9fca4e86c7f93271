// convert --format modelopt: ModelOpt's W4A16_NVFP4 layout. The same packed
// and block-scale bytes as the compressed-tensors output of the same SRC under
// ModelOpt's names, weight_scale_2 = 1/weight_global_scale exactly, ModelOpt's
// config at the top level and where SRC keeps its own, hf_quant_config.json;
// verify follows the format DST is in and catches what is wrong with it;
// resume, retry, plan/shards/finalize and --overspan bf16 work as for the
// default layout, and a DST of one layout is never continued as the other.
#include "e2e_support.hpp"
#include "safetensors/file_names.hpp"

#include <signal.h>

#include <nlohmann/json.hpp>

#include <bit>
#include <chrono>
#include <cmath>
#include <map>
#include <set>
#include <cstring>
#include <thread>

namespace mx2nv::e2e {
namespace {

using nlohmann::json;

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

json header_of(const fs::path& shard) {
  const std::string all = read_file(shard);
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t(static_cast<unsigned char>(all[static_cast<std::size_t>(i)])) << (8 * i);
  return json::parse(all.substr(8, n));
}

float f32_of(const std::string& bytes) {
  float v = 0;
  std::memcpy(&v, bytes.data(), 4);
  return v;
}

// The shard file holding `tensor`, from DST's index (or the single file).
fs::path shard_of(const fs::path& dst, const std::string& tensor) {
  if (!fs::exists(dst / "model.safetensors.index.json")) return dst / "model.safetensors";
  const json index = json::parse(read_file(dst / "model.safetensors.index.json"));
  return dst / index["weight_map"][tensor].get<std::string>();
}

std::vector<std::string> module_names(const FixtureSpec& spec) {
  std::vector<std::string> out;
  for (unsigned l = 0; l < spec.layers; ++l) {
    for (unsigned e = 0; e < spec.experts; ++e) {
      for (unsigned p = 0; p < 3; ++p) out.push_back(fixture_module_name(spec, l, e, p));
    }
  }
  return out;
}

class ModelOpt : public ::testing::TestWithParam<FixtureLayout> {
 protected:
  void SetUp() override {
    spec = tiny_spec();
    spec.layout = GetParam();
    spec.layers = 2;
    spec.experts = 3;
    spec.shards = 3;
    write_fixture(d / "src", spec);
  }
  CliResult convert(const fs::path& dst, const std::string& options = "") {
    return run_cli("convert --threads 2 " + options + " " + q(d / "src") + " " + q(dst));
  }
  CliResult verify(const fs::path& dst) { return run_cli("verify " + q(d / "src") + " " + q(dst)); }
  ScratchDir d;
  FixtureSpec spec;
};

TEST_P(ModelOpt, SameBytesUnderModelOptNamesAndVerified) {
  ASSERT_EQ(convert(d / "ct").exit_code, 0);
  const CliResult r = convert(d / "mo", "--format modelopt");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const CliResult v = verify(d / "mo");
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
  for (const std::string& m : module_names(spec)) {
    SCOPED_TRACE(m);
    const fs::path ct_shard = shard_of(d / "ct", m + ".weight_packed");
    const fs::path mo_shard = shard_of(d / "mo", m + ".weight");
    EXPECT_EQ(tensor_bytes(mo_shard, m + ".weight"), tensor_bytes(ct_shard, m + ".weight_packed"));
    EXPECT_EQ(tensor_bytes(shard_of(d / "mo", m + ".weight_scale"), m + ".weight_scale"),
              tensor_bytes(shard_of(d / "ct", m + ".weight_scale"), m + ".weight_scale"));
    const fs::path mo_global = shard_of(d / "mo", m + ".weight_scale_2");
    const json h = header_of(mo_global);
    EXPECT_EQ(h[m + ".weight_scale_2"]["dtype"], "F32");
    EXPECT_EQ(h[m + ".weight_scale_2"]["shape"], json::array());
    EXPECT_FALSE(header_of(mo_shard).contains(m + ".weight_packed"));
    const float multiplier = f32_of(tensor_bytes(mo_global, m + ".weight_scale_2"));
    const float divisor = f32_of(tensor_bytes(shard_of(d / "ct", m + ".weight_global_scale"), m + ".weight_global_scale"));
    EXPECT_EQ(static_cast<double>(multiplier) * static_cast<double>(divisor), 1.0);
  }
  const json config = json::parse(read_file(d / "mo" / "config.json"));
  const json& qc = config["quantization_config"];
  EXPECT_EQ(qc["quant_method"], "modelopt");
  EXPECT_EQ(qc["quant_algo"], "W4A16_NVFP4");
  EXPECT_EQ(qc["group_size"], 16);
  EXPECT_EQ(qc["ignore"], qc["exclude_modules"]);
  if (spec.layout == FixtureLayout::K3) {
    EXPECT_EQ(config["text_config"]["quantization_config"], qc);
  }
  for (const auto& entry : qc["ignore"]) EXPECT_EQ(entry.get<std::string>().find(".experts."), std::string::npos) << entry;
  const json hf = json::parse(read_file(d / "mo" / "hf_quant_config.json"));
  EXPECT_EQ(hf["quantization"]["quant_algo"], "W4A16_NVFP4");
  EXPECT_EQ(hf["quantization"]["exclude_modules"], qc["exclude_modules"]);
  EXPECT_TRUE(hf["quantization"].contains("kv_cache_quant_algo"));
  // Everything but the config, the index, ModelOpt's file and the shards is SRC's.
  for (const auto& [rel, bytes] : snapshot(d / "src")) {
    if (rel == "config.json" || rel.ends_with(".safetensors") || rel.ends_with(".index.json")) continue;
    EXPECT_EQ(read_file(d / "mo" / rel), bytes) << rel;
  }
}

TEST_P(ModelOpt, VerifyCatchesWhatIsWrong) {
  ASSERT_EQ(convert(d / "mo", "--format modelopt").exit_code, 0);
  const std::string m = fixture_module_name(spec, 1, 0, 2);
  const auto copy_of = [&](const std::string& name) {
    const fs::path to = d / name;
    fs::copy(d / "mo", to, fs::copy_options::recursive);
    return to;
  };
  {  // a multiplier that is no power of two
    const fs::path dst = copy_of("not_pow2");
    const fs::path shard = shard_of(dst, m + ".weight_scale_2");
    std::string all = read_file(shard);
    const std::string old = tensor_bytes(shard, m + ".weight_scale_2");
    const float bad = f32_of(old) * 1.5f;
    std::string now(4, '\0');
    std::memcpy(now.data(), &bad, 4);
    all.replace(all.find(old), 4, now);  // the first occurrence is the tensor's (the header is text)
    write_file(shard, all);
    const CliResult v = verify(dst);
    EXPECT_EQ(v.exit_code, 1);
    // No power of two: what only a requantized module holds, and convert writes this one exact.
    EXPECT_NE(v.err.find("is requantized in DST, but"), std::string::npos) << v.err;
  }
  {  // an exclude list missing a module that stays unquantized
    const fs::path dst = copy_of("short_ignore");
    json config = json::parse(read_file(dst / "config.json"));
    config["quantization_config"]["ignore"].erase(0);
    write_file(dst / "config.json", config.dump(2));
    const CliResult v = verify(dst);
    EXPECT_EQ(v.exit_code, 1);
    EXPECT_NE(v.err.find("quantization_config.ignore"), std::string::npos) << v.err;
  }
  {  // ModelOpt's settings file missing
    const fs::path dst = copy_of("no_hf");
    fs::remove(dst / "hf_quant_config.json");
    const CliResult v = verify(dst);
    EXPECT_EQ(v.exit_code, 1);
    EXPECT_NE(v.err.find("hf_quant_config.json: missing"), std::string::npos) << v.err;
  }
}

TEST_P(ModelOpt, NeverContinuedAsTheOtherLayout) {
  ASSERT_EQ(convert(d / "ct").exit_code, 0);
  ASSERT_EQ(convert(d / "mo", "--format modelopt").exit_code, 0);
  EXPECT_EQ(convert(d / "ct", "--resume --format modelopt").exit_code, 2);
  EXPECT_EQ(convert(d / "mo", "--resume").exit_code, 2);
  const CliResult again = convert(d / "mo", "--resume --format modelopt");
  EXPECT_EQ(again.exit_code, 0);
  EXPECT_NE(again.out.find("already complete"), std::string::npos) << again.out;
  // An interrupted one: continued only in its own layout.
  const pid_t w = spawn_cli({"convert", "--threads", "1", "--format", "modelopt", (d / "src").string(),
                             (d / "killed").string()});
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  kill(w, SIGKILL);
  wait_exit(w);
  // Killed after it recorded which conversion DST holds (its layout among
  // it), DST is refused to the other layout; killed before, nothing of it is
  // DST's yet, and another layout could rightly take DST over (so it is not
  // tried: the kill's timing decides which, not the test).
  if (fs::exists(d / "killed" / ".mx2nv" / "state" / std::string(kConversionFileName))) {
    const CliResult other = convert(d / "killed", "--resume");
    EXPECT_EQ(other.exit_code, 2) << other.err;
  }
  ASSERT_EQ(convert(d / "killed", "--resume --format modelopt").exit_code, 0);
  EXPECT_EQ(snapshot(d / "killed"), snapshot(d / "mo"));
}

TEST_P(ModelOpt, PlannedStepsWriteTheSameBytes) {
  ASSERT_EQ(convert(d / "mo", "--format modelopt").exit_code, 0);
  const fs::path dst = d / "planned";
  ASSERT_EQ(run_cli("plan --format modelopt " + q(d / "src") + " " + q(dst)).exit_code, 0);
  const std::string plan = q(dst / ".mx2nv" / "plan.json");
  EXPECT_NE(read_file(dst / ".mx2nv" / "plan.json").find("\"output_format\": \"modelopt\""), std::string::npos);
  EXPECT_EQ(run_cli("convert --plan " + plan + " --shards 0/2 --format compressed-tensors").exit_code, 2);
  ASSERT_EQ(run_cli("convert --plan " + plan + " --shards 1/2").exit_code, 0);
  ASSERT_EQ(run_cli("convert --plan " + plan + " --shards 0/2 --format modelopt").exit_code, 0);
  ASSERT_EQ(run_cli("convert --plan " + plan + " --finalize").exit_code, 0);
  EXPECT_EQ(snapshot(dst), snapshot(d / "mo"));
}

// --overspan requantize and mx2nv requantize in ModelOpt's layout follow
// ModelOpt's own quantizer (numerics/nvfp4_quantizer.hpp; the conformance
// suite checks the bytes against nvidia-modelopt's code): a weight_scale_2
// that is no power of two, one per gate/up pair, the same in the report's
// table, and verify checks every byte and the scale itself.
TEST_P(ModelOpt, RequantizedModulesFollowModelOptsQuantizerBf16LayersExcluded) {
  spec = spec_with_over_span();
  spec.overrides.clear();
  spec.layout = GetParam();
  const std::string gate = fixture_module_name(spec, 0, 1, 0), up = fixture_module_name(spec, 0, 1, 1);
  const std::string down = fixture_module_name(spec, 1, 2, 2);
  spec.overrides[gate].span = 20;  // the pair goes together
  spec.overrides[down].span = 30;
  write_fixture(d / "wide", spec);
  const CliResult lossy = run_cli("convert --format modelopt --overspan requantize " + q(d / "wide") + " " + q(d / "x") +
                                  " --report " + q(d / "x.json"));
  ASSERT_EQ(lossy.exit_code, 0) << lossy.err;
  EXPECT_EQ(run_cli("verify " + q(d / "wide") + " " + q(d / "x")).exit_code, 0);
  const json report = json::parse(read_file(d / "x.json"));
  std::set<std::string> listed;
  std::map<std::string, double> reported;
  for (const auto& row : report["requantized"]) {
    listed.insert(row["module"].get<std::string>());
    reported[row["module"].get<std::string>()] = row["global_scale"].get<double>();
  }
  EXPECT_EQ(listed, (std::set<std::string>{gate, up, down}));
  const auto scale_2 = [&](const fs::path& dst, const std::string& m) {
    return f32_of(tensor_bytes(shard_of(dst, m + ".weight_scale_2"), m + ".weight_scale_2"));
  };
  for (const std::string& m : listed) {
    const float w = scale_2(d / "x", m);
    int e = 0;
    EXPECT_NE(std::frexp(w, &e), 0.5f) << m << ": amax / 2688 is no power of two";
    EXPECT_EQ(reported[m], static_cast<double>(w)) << m << ": the table's global_scale is the stored multiplier";
    EXPECT_FALSE(header_of(shard_of(d / "x", m + ".weight")).contains(m + ".input_scale")) << m;
  }
  EXPECT_EQ(std::bit_cast<std::uint32_t>(scale_2(d / "x", gate)), std::bit_cast<std::uint32_t>(scale_2(d / "x", up)));
  const json config = json::parse(read_file(d / "x" / "config.json"));
  EXPECT_EQ(config["quantization_config"]["quant_method"], "modelopt");
  const json& names = config["quantization_config"]["mx2nv_requantized_modules"];
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), listed);

  // A retry is answered; the other layout's lossy DST is not this conversion.
  EXPECT_EQ(run_cli("convert --resume --format modelopt --overspan requantize " + q(d / "wide") + " " + q(d / "x")).exit_code,
            0);
  EXPECT_EQ(run_cli("convert --resume --overspan requantize " + q(d / "wide") + " " + q(d / "x")).exit_code, 2);

  // verify: a changed weight_scale_2 (one bit), block scale or code is found.
  const auto copy_of = [&](const std::string& name) {
    const fs::path to = d / name;
    fs::copy(d / "x", to, fs::copy_options::recursive);
    return to;
  };
  const auto flip = [&](const fs::path& dst, const std::string& tensor, std::size_t at, unsigned char bit) {
    const fs::path shard = shard_of(dst, tensor);
    const json h = header_of(shard);
    std::string all = read_file(shard);
    std::uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= std::uint64_t(static_cast<unsigned char>(all[static_cast<std::size_t>(i)])) << (8 * i);
    const std::size_t pos = 8 + n + h[tensor]["data_offsets"][0].get<std::size_t>() + at;
    all[pos] = static_cast<char>(static_cast<unsigned char>(all[pos]) ^ bit);
    write_file(shard, all);
  };
  const struct {
    const char* name;
    std::string tensor;
    std::size_t at;
    unsigned char bit;
    const char* says;
  } damages[] = {{"scale2_bit", down + ".weight_scale_2", 0, 0x01, "its layout's quantizer gives"},
                 {"block_scale", down + ".weight_scale", 3, 0x01, "differ from the documented recomputation"},
                 {"code", gate + ".weight", 5, 0x10, "differ from the documented recomputation"}};
  for (const auto& damage : damages) {
    const fs::path dst = copy_of(damage.name);
    flip(dst, damage.tensor, damage.at, damage.bit);
    const CliResult v = run_cli("verify " + q(d / "wide") + " " + q(dst));
    EXPECT_EQ(v.exit_code, 1) << damage.name;
    EXPECT_NE(v.err.find(damage.says), std::string::npos) << damage.name << ": " << v.err;
  }

  // mx2nv requantize --format modelopt, and the same as planned steps.
  ASSERT_EQ(run_cli("requantize --format modelopt " + q(d / "wide") + " " + q(d / "rq")).exit_code, 0);
  EXPECT_EQ(json::parse(read_file(d / "rq" / "config.json"))["quantization_config"]["quant_algo"], "W4A16_NVFP4");
  EXPECT_TRUE(fs::exists(d / "rq" / "hf_quant_config.json"));
  EXPECT_EQ(std::bit_cast<std::uint32_t>(scale_2(d / "rq", down)), std::bit_cast<std::uint32_t>(scale_2(d / "x", down)));
  EXPECT_EQ(tensor_bytes(shard_of(d / "rq", down + ".weight"), down + ".weight"),
            tensor_bytes(shard_of(d / "x", down + ".weight"), down + ".weight"));
  ASSERT_EQ(run_cli("plan --requantize --format modelopt " + q(d / "wide") + " " + q(d / "y")).exit_code, 0);
  const std::string plan = q(d / "y" / ".mx2nv" / "plan.json");
  ASSERT_EQ(run_cli("convert --plan " + plan + " --shards 0/1").exit_code, 0);
  ASSERT_EQ(run_cli("convert --plan " + plan + " --finalize").exit_code, 0);
  EXPECT_TRUE(snapshot(d / "y") == snapshot(d / "rq"));
  // A DST requantized in one layout is never continued in the other.
  EXPECT_EQ(run_cli("requantize --resume --format modelopt " + q(d / "wide") + " " + q(d / "rq")).exit_code, 0);
  EXPECT_EQ(run_cli("requantize --resume " + q(d / "wide") + " " + q(d / "rq")).exit_code, 2);

  const CliResult bf16 = run_cli("convert --format modelopt --overspan bf16 " + q(d / "wide") + " " + q(d / "b"));
  ASSERT_EQ(bf16.exit_code, 0) << bf16.err;
  EXPECT_EQ(run_cli("verify " + q(d / "wide") + " " + q(d / "b")).exit_code, 0);
  const json qc = json::parse(read_file(d / "b" / "config.json"))["quantization_config"];
  const std::string layer = down.substr(0, down.rfind(".experts.") + std::string(".experts").size());
  bool module_listed = false, layer_listed = false;
  for (const auto& e : qc["ignore"]) {
    module_listed = module_listed || e == down;
    layer_listed = layer_listed || e == layer;
  }
  EXPECT_TRUE(module_listed);
  EXPECT_TRUE(layer_listed) << "SGLang judges a fused MoE layer by its own name";
}

INSTANTIATE_TEST_SUITE_P(Layouts, ModelOpt, ::testing::Values(FixtureLayout::K3, FixtureLayout::Flat),
                         [](const auto& layout) { return std::string(choice_name(layout.param)); });

}  // namespace
}  // namespace mx2nv::e2e

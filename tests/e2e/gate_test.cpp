// mx2nv gate through the CLI: documented verdicts and exit codes on mx2nv's
// own output, an over-TP case, and an NVFP4 checkpoint whose gate and up
// globals differ (made by hand here: values right on disk, wrong in vLLM's
// Marlin path, refused by SGLang, exact through vLLM's Humming path).
#include "e2e_support.hpp"

#include <cstring>

namespace mx2nv::e2e {
namespace {

using nlohmann::json;

// A converted checkpoint: hidden 256, intermediate 128, 2 MoE layers; the
// flat layout is DeepseekV3ForCausalLM, whose loaders both runtimes run.
fs::path converted(const ScratchDir& d, FixtureLayout layout = FixtureLayout::Flat) {
  FixtureSpec spec;
  spec.layout = layout;
  spec.hidden = 256;
  spec.intermediate = 128;
  spec.shards = 2;
  write_fixture(d / "src", spec);
  const CliResult c = run_cli("convert " + (d / "src").string() + " " + (d / "dst").string());
  EXPECT_EQ(c.exit_code, 0) << c.err;
  return d / "dst";
}

json gate_json(const fs::path& ck, const std::string& args, int expected_exit) {
  const CliResult r = run_cli("gate " + ck.string() + " --json " + args);
  EXPECT_EQ(r.exit_code, expected_exit) << r.out << r.err;
  return json::parse(r.out);
}

std::map<std::string, std::string> verdicts(const json& j) {
  std::map<std::string, std::string> out;
  for (const auto& v : j["verdicts"]) {
    out[v["runtime"].get<std::string>() + "/" + v["backend"].get<std::string>() + "/" + v["dtype"].get<std::string>()] =
        v["verdict"];
  }
  return out;
}

TEST(Gate, Mx2nvOutputRunsOnEveryBackend) {
  ScratchDir d;
  const json j = gate_json(converted(d), "", 0);
  const auto v = verdicts(j);
  for (const char* key : {"vllm/marlin/fp16", "vllm/marlin/bf16", "vllm/humming/fp16", "vllm/humming/bf16",
                          "sglang/marlin/fp16", "sglang/marlin/bf16"}) {
    EXPECT_EQ(v.at(key), "RUN") << key;
  }
  EXPECT_EQ(j["dims"]["hidden"], 256);
  EXPECT_EQ(j["dims"]["intermediate"], 128);
  EXPECT_EQ(j["scales"]["gate_up_globals_differ"], 0);
  EXPECT_EQ(j["result"], "RUN");
}

// Kimi K3's model class: vLLM 0.34.0's loader reads every expert tensor,
// SGLang 0.5.23's renames weight_packed and never loads the packed codes.
TEST(Gate, K3OnSglangIsBlockedByItsModelClassLoader) {
  ScratchDir d;
  const fs::path ck = converted(d, FixtureLayout::K3);
  const json j = gate_json(ck, "", 1);
  EXPECT_EQ(j["architecture"], "KimiK3ForConditionalGeneration");
  for (const auto& v : j["verdicts"]) {
    if (v["runtime"] == "sglang") {
      EXPECT_EQ(v["verdict"], "BLOCKED");
      EXPECT_EQ(v["model_class"], "KimiK3ForConditionalGeneration");
      EXPECT_NE(v["reasons"][0].get<std::string>().find("kimi_k3.py:3207-3210"), std::string::npos);
    } else {
      EXPECT_EQ(v["verdict"], "RUN");
    }
  }
  EXPECT_EQ(j["result"], "BLOCKED");
  EXPECT_EQ(gate_json(ck, "--runtime vllm", 0)["result"], "RUN");
  // An architecture gate has no loader rule for: UNKNOWN, never RUN.
  std::string config = read_file(ck / "config.json");
  const std::string arch = "\"KimiK3ForConditionalGeneration\"";
  config.replace(config.find(arch), arch.size(), "\"SomeNewMoeForCausalLM\"");
  write_file(ck / "config.json", config);
  const json unknown = gate_json(ck, "--runtime vllm", 0);
  EXPECT_EQ(unknown["result"], "UNKNOWN");
  for (const auto& v : unknown["verdicts"]) {
    EXPECT_EQ(v["verdict"], "UNKNOWN");
    EXPECT_TRUE(v["model_class"].is_null());
  }
}

// --ep: what one GPU holds, and SGLang's even split of the experts.
TEST(Gate, ExpertParallelismPerGpu) {
  ScratchDir d;
  const fs::path ck = converted(d);
  const json ep2 = gate_json(ck, "--tp 2 --ep 2", 0);
  for (const auto& v : ep2["verdicts"]) {
    EXPECT_EQ(v["ep"], 2);
    EXPECT_EQ(v["per_rank"]["experts"], 2);  // 4 experts a layer over 2 ranks
  }
  const json ep3 = gate_json(ck, "--tp 3 --ep 3 --runtime sglang", 1);
  EXPECT_EQ(ep3["verdicts"][0]["verdict"], "BLOCKED");
  EXPECT_TRUE(ep3["verdicts"][0]["per_rank"]["experts"].is_null());
}

TEST(Gate, TooMuchTensorParallelismIsBlockedWithTheRule) {
  ScratchDir d;
  const fs::path ck = converted(d);
  // intermediate 128 / TP 4 = 32: SGLang needs a multiple of 64, vLLM of 16.
  const json at4 = gate_json(ck, "--tp 4", 1);
  EXPECT_EQ(verdicts(at4).at("sglang/marlin/bf16"), "BLOCKED");
  EXPECT_EQ(verdicts(at4).at("vllm/marlin/bf16"), "RUN");
  EXPECT_EQ(gate_json(ck, "--tp 4 --runtime vllm", 0)["result"], "RUN");
  // TP 16: 8 per rank, below one NVFP4 group: vLLM too.
  const json at16 = gate_json(ck, "--tp 16 --runtime vllm --dtype fp16", 1);
  ASSERT_EQ(at16["verdicts"].size(), 2u);  // marlin and humming, fp16 only
  EXPECT_NE(at16["verdicts"][0]["reasons"][0].get<std::string>().find("% 16"), std::string::npos);
  // The TP table shows the same.
  bool found = false;
  for (const auto& row : at16["tp_table"]) {
    if (row["tp"] == 4) {
      found = true;
      EXPECT_EQ(row["vllm-marlin"], "ok");
      EXPECT_NE(row["sglang-marlin"], "ok");
    }
  }
  EXPECT_TRUE(found);
}

TEST(Gate, GateAndUpGlobalsThatDifferAreBlocked) {
  ScratchDir d;
  const fs::path ck = converted(d);
  // Halve one expert's w3 divisor and every one of its block scales (E4M3 byte
  // - 8 halves a normal power of two): the file's values stay right.
  const std::string up = "model.layers.0.mlp.experts.1.up_proj";
  for (const auto& entry : fs::directory_iterator(ck)) {
    if (entry.path().extension() != ".safetensors") continue;
    std::string all = read_file(entry.path());
    std::uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= std::uint64_t(static_cast<unsigned char>(all[static_cast<std::size_t>(i)])) << (8 * i);
    const json header = json::parse(all.substr(8, n));
    if (!header.contains(up + ".weight_global_scale")) continue;
    const auto at = [&](const std::string& t) { return 8 + n + header[t]["data_offsets"][0].get<std::uint64_t>(); };
    float g = 0;
    std::memcpy(&g, all.data() + at(up + ".weight_global_scale"), 4);
    g /= 2;
    std::memcpy(all.data() + at(up + ".weight_global_scale"), &g, 4);
    const auto end = 8 + n + header[up + ".weight_scale"]["data_offsets"][1].get<std::uint64_t>();
    for (auto i = at(up + ".weight_scale"); i < end; ++i) {
      auto& b = reinterpret_cast<unsigned char&>(all[i]);
      if (b >= 0x10) b = static_cast<unsigned char>(b - 8);
    }
    write_file(entry.path(), all);
  }
  const json j = gate_json(ck, "", 1);
  EXPECT_EQ(j["scales"]["gate_up_globals_differ"], 1);
  const auto v = verdicts(j);
  EXPECT_EQ(v.at("vllm/marlin/bf16"), "BLOCKED");
  EXPECT_EQ(v.at("sglang/marlin/fp16"), "BLOCKED");
  // Humming keeps each half's global (per channel in the activation dtype):
  // powers of two inside the fp16 normal range stay exact.
  EXPECT_EQ(v.at("vllm/humming/fp16"), "RUN");
  EXPECT_EQ(v.at("vllm/humming/bf16"), "RUN");
  for (const auto& verdict : j["verdicts"]) {
    if (verdict["backend"] == "marlin") {
      EXPECT_NE(verdict["reasons"][0].get<std::string>().find("gate/up globals differ"), std::string::npos);
    }
  }
}

// Sets one expert module's first block scale to NaN (0x7F) in place.
void nan_block_scale(const fs::path& ck, const std::string& module) {
  for (const auto& entry : fs::directory_iterator(ck)) {
    if (entry.path().extension() != ".safetensors") continue;
    std::string all = read_file(entry.path());
    std::uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= std::uint64_t(static_cast<unsigned char>(all[static_cast<std::size_t>(i)])) << (8 * i);
    const json header = json::parse(all.substr(8, n));
    if (!header.contains(module + ".weight_scale")) continue;
    all[8 + n + header[module + ".weight_scale"]["data_offsets"][0].get<std::uint64_t>()] = 0x7F;
    write_file(entry.path(), all);
  }
}

TEST(Gate, QuickReadsNoBlockScaleAndSaysWhatItDidNotCheck) {
  ScratchDir d;
  const fs::path ck = converted(d);
  const json full = gate_json(ck, "", 0);
  const json quick = gate_json(ck, "--quick", 0);
  EXPECT_FALSE(full.contains("quick"));
  EXPECT_EQ(quick["quick"], true);
  EXPECT_EQ(quick["dims"], full["dims"]);
  EXPECT_EQ(quick["tp_table"], full["tp_table"]);
  for (const char* key : {"active_blocks_below_2^-6_fp16", "active_blocks_below_2^-6_bf16_after_rescale",
                          "negative_block_scales"}) {
    EXPECT_TRUE(quick["scales"][key].is_null()) << key;
    EXPECT_EQ(full["scales"][key], 0) << key;
  }
  // The globals are read: their facts are the full gate's.
  for (const char* key : {"gate_up_globals_differ", "min_global_multiplier", "max_global_multiplier",
                          "globals_not_power_of_two"}) {
    EXPECT_EQ(quick["scales"][key], full["scales"][key]) << key;
  }
  const auto v = verdicts(quick);
  EXPECT_EQ(v.at("vllm/marlin/fp16"), "UNVERIFIED");
  EXPECT_EQ(v.at("sglang/marlin/bf16"), "UNVERIFIED");
  EXPECT_EQ(v.at("vllm/humming/bf16"), "RUN");  // no block-scale rule: complete without them
  for (const auto& verdict : quick["verdicts"]) {
    if (verdict["backend"] != "marlin") continue;
    EXPECT_NE(verdict["reasons"].back().get<std::string>().find("block scales not read (gate --quick)"),
              std::string::npos);
  }
  // Something quick mode does check still blocks: UNVERIFIED never hides BLOCKED.
  EXPECT_EQ(verdicts(gate_json(ck, "--quick --tp 4", 1)).at("sglang/marlin/bf16"), "BLOCKED");
  // A NaN block scale: the full gate refuses it; quick mode never reads it.
  nan_block_scale(ck, "model.layers.1.mlp.experts.2.down_proj");
  const CliResult refused = run_cli("gate " + ck.string());
  EXPECT_EQ(refused.exit_code, 3) << refused.err;
  EXPECT_NE(refused.err.find("experts.2.down_proj.weight_scale\" row 0 block 0: block scale is NaN"), std::string::npos)
      << refused.err;
  EXPECT_EQ(run_cli("gate " + ck.string() + " --quick").exit_code, 0);
}

TEST(Gate, NotAnNvfp4CheckpointIsInvalidInput) {
  ScratchDir d;
  write_fixture(d / "src", tiny_spec());  // MXFP4
  EXPECT_EQ(run_cli("gate " + (d / "src").string()).exit_code, 3);
  EXPECT_EQ(run_cli("gate " + (d / "src").string() + " --tp 0").exit_code, 2);
}

// A stand-in interpreter answering the runtime probe's protocol with `vllm`
// as the vLLM entry (the real probe against the real vLLM code is
// tests/conformance/test_runtime_probe.py); here: how gate reports it.
fs::path fake_python(const ScratchDir& d, const std::string& vllm) {
  const fs::path p = d / "fake-python";
  std::ofstream(p) << "#!/bin/sh\ncat >/dev/null\necho '{\"probe\": 1, \"python\": \"3.99\", \"runtimes\": [" << vllm
                   << "]}'\n";
  fs::permissions(p, fs::perms::owner_all);
  return p;
}

TEST(Gate, ARuntimeThatRefusesWhatGateRunsDisagreesAndExitsOne) {
  ScratchDir d;
  const fs::path ck = converted(d);
  const fs::path py = fake_python(d, R"({"runtime": "vllm", "version": "0.35.0", "outcome": "refused", )"
                                     R"("reason": "ValueError: unsupported"})");
  const json j = gate_json(ck, "--runtime vllm --python " + py.string(), 1);
  EXPECT_EQ(j["result"], "RUN");  // gate's verdict stays gate's
  EXPECT_EQ(j["exit_code"], 1);
  const json& asked = j["runtime_selectors"];
  EXPECT_TRUE(asked["disagreement"]);
  EXPECT_EQ(asked["python_version"], "3.99");
  ASSERT_EQ(asked["runtimes"].size(), 1u);
  EXPECT_EQ(asked["runtimes"][0]["agreement"], "DISAGREES");
  EXPECT_EQ(asked["runtimes"][0]["version_differs"], true);
  const CliResult text = run_cli("gate " + ck.string() + " --runtime vllm --python " + py.string());
  EXPECT_EQ(text.exit_code, 1);
  EXPECT_NE(text.out.find("vllm 0.35.0 (gate's rules were read from 0.34.0)"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("DISAGREES"), std::string::npos) << text.out;
}

TEST(Gate, ARuntimeThatSelectsTheSameAgrees) {
  ScratchDir d;
  const fs::path py = fake_python(d, R"({"runtime": "vllm", "version": "0.33.0", "outcome": "selected", "reason": "", )"
                                     R"("selected": {"class": "CompressedTensorsW4A4Nvfp4MoEMethod", "args": {"use_a16": true}}})");
  const json j = gate_json(converted(d), "--python " + py.string(), 0);
  const json& r = j["runtime_selectors"]["runtimes"];
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0]["agreement"], "AGREES");
  EXPECT_EQ(r[0]["selected"], "CompressedTensorsW4A4Nvfp4MoEMethod(use_a16=True)");
  EXPECT_EQ(r[1]["outcome"], "could-not-ask");  // the fake says nothing about sglang
  EXPECT_EQ(r[1]["agreement"], "NO OPINION");
}

TEST(Gate, NoInterpreterOrAskingOffChangesNothing) {
  ScratchDir d;
  const fs::path ck = converted(d);
  const json missing = gate_json(ck, "--python /nonexistent/python3", 0);
  EXPECT_EQ(missing["result"], "RUN");
  for (const auto& r : missing["runtime_selectors"]["runtimes"]) {
    EXPECT_EQ(r["outcome"], "could-not-ask");
    EXPECT_NE(r["reason"].get<std::string>().find("could not be started"), std::string::npos);
  }
  const json off = gate_json(ck, "--ask-runtimes never", 0);
  EXPECT_FALSE(off["runtime_selectors"]["asked"]);
  EXPECT_TRUE(off["runtime_selectors"]["runtimes"].empty());
  // Options for asking, with asking off, could only be ignored: refused.
  for (const char* extra : {"--python /nonexistent/python3", "--ask-timeout 5",
                           "--python python3 --ask-timeout 5"}) {
    const CliResult r = run_cli("gate " + ck.string() + " --ask-runtimes never " + extra);
    EXPECT_EQ(r.exit_code, 2) << extra;
    EXPECT_NE(r.err.find("does not apply with --ask-runtimes never"), std::string::npos) << r.err;
  }
  EXPECT_EQ(run_cli("gate " + ck.string() + " --ask-runtimes sometimes").exit_code, 2);
  EXPECT_EQ(run_cli("gate " + ck.string() + " --ask-timeout 0").exit_code, 2);
}

}  // namespace
}  // namespace mx2nv::e2e

// core/overspan: which modules each --overspan choice rewrites, how the plan
// file carries it, and the size arithmetic of BF16 layers.
#include "common/error.hpp"
#include "plan/overspan.hpp"
#include "plan/plan_file.hpp"

#include <gtest/gtest.h>

namespace mx2nv {
namespace {

constexpr TargetFormat kCt = TargetFormat::CompressedTensors;

// Two MoE layers of two experts (gate/up pair + down each); layer 1 expert 0's
// down projection and layer 0 expert 1's pair are over the window.
ModuleSet two_layers() {
  ModuleSet set;
  for (int layer = 0; layer < 2; ++layer) {
    for (int e = 0; e < 2; ++e) {
      for (const char* p : {"down_proj", "gate_proj", "up_proj"}) {
        QuantModule m;
        m.name = set.names.store("model.layers." + std::to_string(layer) + ".mlp.experts." + std::to_string(e) + "." + p);
        m.rows = 4;
        m.groups = 2;
        set.modules.push_back(m);
      }
      const std::size_t base = set.modules.size() - 3;
      set.scale_groups.push_back({base});
      set.scale_groups.push_back({base + 1, base + 2});
    }
  }
  return set;
}

Plan refused_plan(const ModuleSet& set) {
  Plan plan;
  plan.window = Window::Marlin;
  plan.modules.resize(set.modules.size());
  for (auto& m : plan.modules) {
    m.m = -10;
    m.divisor = 1024.0f;
  }
  plan.refused_spans.push_back({"model.layers.1.mlp.experts.0.down_proj", 20, 14, 3});
  plan.refused_spans.push_back({"model.layers.0.mlp.experts.1.gate_proj", 16, 14, 1});
  return plan;
}

TEST(OverSpanChoice, NamesRoundTrip) {
  for (const auto c : {OverSpanChoice::Fail, OverSpanChoice::Bf16, OverSpanChoice::Requantize}) {
    EXPECT_EQ(parse_choice<OverSpanChoice>(choice_name(c)), c);
  }
  EXPECT_FALSE(parse_choice<OverSpanChoice>("BF16").has_value());
  EXPECT_FALSE(parse_choice<OverSpanChoice>("").has_value());
}

TEST(OverSpanChoice, MoeLayerIsTheExpertsList) {
  EXPECT_EQ(moe_layer_of("model.layers.3.mlp.experts.5.down_proj"), "model.layers.3.mlp.experts");
  EXPECT_EQ(moe_layer_of("a.experts.1.b.experts.2.w1"), "a.experts.1.b.experts");
  EXPECT_EQ(moe_layer_of("model.layers.3.mlp.down_proj"), "model.layers.3.mlp.down_proj");  // its own layer
}

TEST(OverSpanChoice, RequantizeRewritesOnlyTheRefusedScaleGroupsWithTheirOwnGlobal) {
  const ModuleSet set = two_layers();
  Plan plan = refused_plan(set);
  ASSERT_EQ(refused_scale_groups(set, plan), (std::vector<std::size_t>{3, 4}));
  resolve_over_span(set, plan, OverSpanChoice::Requantize, [](std::size_t sg) { return 100.0f + static_cast<float>(sg); });
  EXPECT_FALSE(plan.refused());
  ASSERT_EQ(plan.resolved_spans.size(), 2u);
  for (std::size_t i = 0; i < set.modules.size(); ++i) {
    const bool lossy = set.modules[i].name == "model.layers.1.mlp.experts.0.down_proj" ||
                       set.modules[i].name.starts_with("model.layers.0.mlp.experts.1.g") ||
                       set.modules[i].name.starts_with("model.layers.0.mlp.experts.1.u");
    EXPECT_EQ(plan.modules[i].treatment, lossy ? Treatment::Requantized : Treatment::Exact) << set.modules[i].name;
    if (!lossy) {
      EXPECT_EQ(plan.modules[i].divisor, 1024.0f);
    }
  }
  EXPECT_EQ(plan.modules[4].divisor, plan.modules[5].divisor);  // the pair keeps one global
  EXPECT_EQ(mode_name(plan_mode(plan)), "marlin+requantize");
  EXPECT_TRUE(mode_matches(*parse_mode("marlin+requantize"), Window::Marlin, OverSpanChoice::Requantize, kCt));
  EXPECT_FALSE(mode_matches(*parse_mode("marlin+requantize"), Window::Marlin, OverSpanChoice::Fail, kCt));
  EXPECT_FALSE(mode_matches(*parse_mode("marlin+requantize"), Window::Marlin, OverSpanChoice::Bf16, kCt));
  EXPECT_TRUE(mode_matches(*parse_mode("marlin"), Window::Marlin, OverSpanChoice::Bf16, kCt));
  EXPECT_FALSE(mode_matches(*parse_mode("e4m3"), Window::Marlin, OverSpanChoice::Fail, kCt));
  EXPECT_FALSE(mode_matches(*parse_mode("requantize"), Window::Marlin, OverSpanChoice::Requantize, kCt));
  // A layout is part of the mode: never matched by the other.
  EXPECT_TRUE(mode_matches(*parse_mode("marlin+requantize@modelopt"), Window::Marlin, OverSpanChoice::Requantize,
                           TargetFormat::ModelOpt));
  EXPECT_FALSE(mode_matches(*parse_mode("marlin@modelopt"), Window::Marlin, OverSpanChoice::Fail, kCt));
  EXPECT_FALSE(mode_matches(*parse_mode("marlin"), Window::Marlin, OverSpanChoice::Fail, TargetFormat::ModelOpt));
}

TEST(ConversionMode, EveryModeRoundTripsAndNothingElseParses) {
  for (const WindowInfo& w : windows()) {
    for (const auto& c : choices<OverSpanChoice>()) {
      for (const auto& f : choices<TargetFormat>()) {
        const ConversionMode m{PlanKind::Convert, w.window, c.value, f.value};
        EXPECT_EQ(parse_mode(mode_name(m)), m) << mode_name(m);
      }
    }
  }
  // The default layout is never spelled, so every record written before it existed reads the same.
  EXPECT_EQ(mode_name({PlanKind::Convert, Window::E4M3, OverSpanChoice::Bf16, kCt}), "e4m3+bf16");
  EXPECT_EQ(mode_name({PlanKind::Convert, Window::E4M3, OverSpanChoice::Bf16, TargetFormat::ModelOpt}),
            "e4m3+bf16@modelopt");
  EXPECT_EQ(mode_name({PlanKind::Requantize, Window::Marlin, OverSpanChoice::Fail, TargetFormat::ModelOpt}),
            "requantize@modelopt");
  const ConversionMode requantize{PlanKind::Requantize, Window::Marlin, OverSpanChoice::Fail};
  EXPECT_EQ(mode_name(requantize), "requantize");
  EXPECT_EQ(parse_mode("requantize"), requantize);
  for (const char* bad : {"", "+", "marlin+", "marlin+fail", "marlin+bf16+requantize", "Marlin", "marlin ", "e4m3+x",
                          "requantize+bf16", "+bf16", "marlin@", "marlin@compressed-tensors", "marlin@modelopt@modelopt",
                          "@modelopt", "marlin@ModelOpt", "marlin@modelopt+bf16"}) {
    EXPECT_FALSE(parse_mode(bad).has_value()) << bad;
  }
}

TEST(OverSpanChoice, ARequantizedGlobalOutsideTheWindowStaysRefused) {
  const ModuleSet set = two_layers();
  Plan plan = refused_plan(set);
  resolve_over_span(set, plan, OverSpanChoice::Requantize, [](std::size_t) { return 1e-30f; });  // multiplier 1e30
  EXPECT_TRUE(plan.refused());
  EXPECT_EQ(plan.bad_globals.size(), 2u);
}

TEST(OverSpanChoice, Bf16RewritesEveryModuleOfEachAffectedLayer) {
  const ModuleSet set = two_layers();
  Plan plan = refused_plan(set);
  plan.refused_spans.pop_back();  // only layer 1
  resolve_over_span(set, plan, OverSpanChoice::Bf16, nullptr);
  EXPECT_FALSE(plan.refused());
  for (std::size_t i = 0; i < set.modules.size(); ++i) {
    const bool layer1 = set.modules[i].name.starts_with("model.layers.1.");
    EXPECT_EQ(plan.modules[i].treatment, layer1 ? Treatment::Bf16 : Treatment::Exact) << set.modules[i].name;
  }
  const auto layers = bf16_layers(set, plan);
  ASSERT_EQ(layers.size(), 1u);
  EXPECT_EQ(layers[0].layer, "model.layers.1.mlp.experts");
  EXPECT_EQ(layers[0].modules.size(), 6u);
  EXPECT_EQ(layers[0].refused, std::vector<std::string>{"model.layers.1.mlp.experts.0.down_proj"});
  // 4 x 64 values: BF16 512 bytes; NVFP4 128 packed + 16 scale + 4 global.
  EXPECT_EQ(bf16_weight_bytes(set.modules[0]), 512u);
  EXPECT_EQ(nvfp4_module_bytes(set.modules[0]), 148u);
  EXPECT_EQ(layers[0].bf16_bytes, 6u * 512u);
  EXPECT_EQ(layers[0].nvfp4_bytes, 6u * 148u);
  EXPECT_EQ(mode_name(plan_mode(plan)), "marlin+bf16");
}

TEST(OverSpanChoice, FailAndAPlanThatFitsAreLeftAlone) {
  const ModuleSet set = two_layers();
  Plan plan = refused_plan(set);
  resolve_over_span(set, plan, OverSpanChoice::Fail, nullptr);
  EXPECT_TRUE(plan.refused());
  Plan fits = refused_plan(set);
  fits.refused_spans.clear();
  resolve_over_span(set, fits, OverSpanChoice::Bf16, nullptr);
  for (const auto& m : fits.modules) EXPECT_EQ(m.treatment, Treatment::Exact);
  EXPECT_EQ(mode_name(plan_mode(fits)), "marlin");
}

TEST(OverSpanChoice, ThePlanFileCarriesTheChoiceAndEachTreatment) {
  const ModuleSet set = two_layers();
  Plan plan = refused_plan(set);
  resolve_over_span(set, plan, OverSpanChoice::Requantize, [](std::size_t) { return 3.5f; });
  PlanFile f;
  f.tool_version = "t";
  f.window = plan.window;
  f.over_span_choice = plan.over_span_choice;
  f.source = "/src";
  f.target = "/dst";
  f.shards.push_back({"model.safetensors", 1, 2, 3, 4, 5, 6});
  for (const auto& m : set.modules) f.module_names.emplace_back(m.name);
  f.modules = plan.modules;
  const std::string text = plan_file_to_text(f);
  const PlanFile back = plan_file_from_text(text, "plan");
  EXPECT_EQ(back.over_span_choice, OverSpanChoice::Requantize);
  for (std::size_t i = 0; i < plan.modules.size(); ++i) {
    EXPECT_EQ(back.modules[i].treatment, plan.modules[i].treatment);
    EXPECT_EQ(back.modules[i].divisor, plan.modules[i].divisor);
  }
  // A rewritten module in a plan whose choice is fail is refused, even with a valid checksum.
  PlanFile bad = f;
  bad.over_span_choice = OverSpanChoice::Fail;
  try {
    plan_file_from_text(plan_file_to_text(bad), "plan");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
  }
}

}  // namespace
}  // namespace mx2nv

// model/module_names: the one reading of module names, on both layouts and
// on names a hostile checkpoint may carry.
#include "model/module_names.hpp"

#include <gtest/gtest.h>

#include <string>

namespace mx2nv {
namespace {

TEST(ModuleNames, K3Layout) {
  const std::string_view layer = "language_model.model.layers.7.block_sparse_moe.experts";
  const struct {
    std::string_view suffix;
    Projection projection;
    std::string_view partner;
  } cases[] = {{"w1", Projection::Gate, "w3"}, {"w3", Projection::Up, "w1"}, {"w2", Projection::Down, ""}};
  for (const auto& c : cases) {
    const std::string name = std::string(layer) + ".12." + std::string(c.suffix);
    const auto e = parse_expert_module(name);
    ASSERT_TRUE(e) << name;
    EXPECT_EQ(e->layer, layer);
    EXPECT_EQ(e->expert, 12u);
    EXPECT_EQ(e->projection.projection, c.projection);
    EXPECT_EQ(e->projection.suffix, c.suffix);
    EXPECT_EQ(e->projection.parent, std::string(layer) + ".12");
    EXPECT_EQ(moe_layer_of(name), layer);
    EXPECT_EQ(gate_up_partner(name), c.partner.empty() ? "" : std::string(layer) + ".12." + std::string(c.partner));
    const auto pos = expert_position(name);
    ASSERT_TRUE(pos) << name;
    EXPECT_EQ(pos->layer, 7u);
    EXPECT_EQ(pos->expert, 12u);
    EXPECT_EQ(pos->pattern, "language_model.model.layers.*.block_sparse_moe.experts.*." + std::string(c.suffix));
  }
}

TEST(ModuleNames, FlatLayout) {
  const struct {
    std::string_view suffix;
    Projection projection;
    std::string_view partner;
  } cases[] = {{"gate_proj", Projection::Gate, "up_proj"},
               {"up_proj", Projection::Up, "gate_proj"},
               {"down_proj", Projection::Down, ""}};
  for (const auto& c : cases) {
    const std::string name = "model.layers.0.mlp.experts.255." + std::string(c.suffix);
    const auto e = parse_expert_module(name);
    ASSERT_TRUE(e) << name;
    EXPECT_EQ(e->layer, "model.layers.0.mlp.experts");
    EXPECT_EQ(e->expert, 255u);
    EXPECT_EQ(e->projection.projection, c.projection);
    EXPECT_EQ(moe_layer_of(name), "model.layers.0.mlp.experts");
    EXPECT_EQ(gate_up_partner(name), c.partner.empty() ? "" : "model.layers.0.mlp.experts.255." + std::string(c.partner));
    const auto pos = expert_position(name);
    ASSERT_TRUE(pos) << name;
    EXPECT_EQ(pos->layer, 0u);
    EXPECT_EQ(pos->expert, 255u);
    EXPECT_EQ(pos->pattern, "model.layers.*.mlp.experts.*." + std::string(c.suffix));
  }
}

TEST(ModuleNames, MoeLayerIsTheExpertsList) {
  EXPECT_EQ(moe_layer_of("a.experts.1.b.experts.2.w1"), "a.experts.1.b.experts");
  EXPECT_EQ(moe_layer_of("model.layers.3.mlp.down_proj"), "model.layers.3.mlp.down_proj");  // no expert index
  EXPECT_EQ(moe_layer_of("model.layers.3.self_attn.q_proj"), "model.layers.3.self_attn.q_proj");
  // A module that is no routed expert is a layer of its own, whatever it holds.
  EXPECT_EQ(moe_layer_of("model.layers.3.mlp.experts.gate_up_proj"), "model.layers.3.mlp.experts.gate_up_proj");
  EXPECT_EQ(moe_layer_of("model.layers.3.mlp.experts.5.w1.lora"), "model.layers.3.mlp.experts.5.w1.lora");
}

TEST(ModuleNames, PairsOnlyGateAndUpOfOneParentInOneSpelling) {
  EXPECT_EQ(gate_up_partner("x.w1"), "x.w3");
  EXPECT_EQ(gate_up_partner("x.w3"), "x.w1");
  EXPECT_EQ(gate_up_partner("x.gate_proj"), "x.up_proj");
  EXPECT_EQ(gate_up_partner("x.w1.gate_proj"), "x.w1.up_proj");  // the last component decides
  EXPECT_EQ(gate_up_partner("x.w2"), "");
  EXPECT_EQ(gate_up_partner("x.down_proj"), "");
  EXPECT_EQ(gate_up_partner("x.w1x"), "");
  EXPECT_EQ(gate_up_partner("x_w1"), "");
  EXPECT_EQ(gate_up_partner("w1"), "");   // no parent
  EXPECT_EQ(gate_up_partner(".w1"), "");  // an empty parent
  EXPECT_EQ(gate_up_partner("..w1"), "..w3");
}

TEST(ModuleNames, HostileNamesAreNoExperts) {
  for (const std::string_view name : {
           "", ".", "..", "w1", ".w1", "5.w1", ".5.w1",  // no layer before the expert index
           "a..w1",                                      // an empty expert index
           "a.1234567890.w1",                            // ten digits
           "a.-1.w1", "a.+1.w1", "a. 1.w1", "a.1 .w1", "a.0x1.w1", "a.1e3.w1", "a.٣.w1",
           "a.5.W1", "a.5.w1 ", "a.5.w4", "a.5.gate", "a.5.gate_proj.", "a.5.",
       }) {
    EXPECT_FALSE(parse_expert_module(name)) << name;
    EXPECT_EQ(moe_layer_of(name), name);
    EXPECT_FALSE(expert_position(name)) << name;
  }
  const auto nine = parse_expert_module("a.999999999.w2");
  ASSERT_TRUE(nine);
  EXPECT_EQ(nine->expert, 999999999u);
  const auto zeros = parse_expert_module("a.007.w2");
  ASSERT_TRUE(zeros);
  EXPECT_EQ(zeros->expert, 7u);
}

TEST(ModuleNames, AnyBytesAroundTheRulesAreKept) {
  // NUL, invalid UTF-8, '+' (the reports join a pair's names with it) and a
  // long prefix are just bytes of the layer.
  const std::string odd("we\0ird\xff+layer", 13);
  const std::string name = odd + ".3.w1";
  const auto e = parse_expert_module(name);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->layer, odd);
  EXPECT_EQ(gate_up_partner(name), odd + ".3.w3");
  const std::string long_name = std::string(1 << 20, 'x') + ".layers.4.experts.2.w2";
  const auto pos = expert_position(long_name);
  ASSERT_TRUE(pos);
  EXPECT_EQ(pos->layer, 4u);
  EXPECT_EQ(pos->expert, 2u);
  EXPECT_EQ(pos->pattern.size(), long_name.size());  // each index becomes one '*'
}

TEST(ModuleNames, GridNeedsALayerIndexBeforeTheExpert) {
  const auto h = expert_position("transformer.h.3.moe.experts.2.w1");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->layer, 3u);
  EXPECT_EQ(h->pattern, "transformer.h.*.moe.experts.*.w1");
  const auto blocks = expert_position("blocks.x.layers.4.experts.1.down_proj");  // the first index after a keyword
  ASSERT_TRUE(blocks);
  EXPECT_EQ(blocks->layer, 4u);
  EXPECT_EQ(blocks->pattern, "blocks.x.layers.*.experts.*.down_proj");
  const auto twice = expert_position("layers.layers.6.experts.0.w3");
  ASSERT_TRUE(twice);
  EXPECT_EQ(twice->layer, 6u);
  EXPECT_EQ(twice->pattern, "layers.layers.*.experts.*.w3");
  EXPECT_FALSE(expert_position("model.mlp.experts.2.w1"));    // no layer index
  EXPECT_FALSE(expert_position("model.layers.5.w1"));         // the index is the expert's
  EXPECT_FALSE(expert_position("model.layers.x.experts.2.w1"));
  // An expert is "X.E.proj": the experts component is the runtimes' naming, not a rule.
  const auto bare = expert_position("model.layers.2.mlp.5.w1");
  ASSERT_TRUE(bare);
  EXPECT_EQ(bare->pattern, "model.layers.*.mlp.*.w1");
  EXPECT_FALSE(expert_position("model.layers.0.mlp.experts.3.fc1"));  // no projection
}

}  // namespace
}  // namespace mx2nv

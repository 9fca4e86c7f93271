// What a quantized module's name says about where it sits in a MoE model, by
// one set of rules for every reader: the gate/up pairs that share a global
// (model/modules), the MoE layers --overspan bf16 writes whole
// (plan/overspan), the routed experts `mx2nv gate` judges (gate/), and the
// layer x expert grid of the HTML page (html/).
//
// The layouts mx2nv meets (and writes, fixture/):
//   K3    language_model.model.layers.L.block_sparse_moe.experts.E.w1|w3|w2
//   flat  model.layers.L.mlp.experts.E.gate_proj|up_proj|down_proj
//
// The rules, on the name's '.'-separated components:
//   projection  the last component is w1|gate_proj (gate), w3|up_proj (up)
//               or w2|down_proj (down), after a non-empty parent P ("P.w1").
//   expert      the parent is "X.E", X non-empty and E 1 to 9 decimal
//               digits: expert E of the MoE layer X. This is how the
//               runtimes name the experts of a fused MoE layer (vLLM 0.34.0
//               checks `<layer>.0.<proj>` against `ignore`,
//               compressed_tensors_moe.py:28-58), and the rule gate's
//               runtime probe reads (python/mx2nv/runtime_probe.py).
//   MoE layer   an expert's X; any other module is a layer of its own.
//   grid        an expert whose X holds a component layers|h|blocks followed
//               by 1 to 9 decimal digits (the first such): its layer index.
//
// Names come from a hostile checkpoint: any bytes. Nothing here trusts a
// name's length or content beyond these rules; views point into the name.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace mx2nv {

enum class Projection : std::uint8_t { Gate = 0, Up = 1, Down = 2 };

struct ProjectionName {
  std::string_view parent;  // P, non-empty
  std::string_view suffix;  // the checkpoint's spelling: "w1", "gate_proj", ...
  Projection projection = Projection::Gate;
};
std::optional<ProjectionName> parse_projection(std::string_view module);

struct ExpertName {
  std::string_view layer;  // X, non-empty
  std::uint64_t expert = 0;
  ProjectionName projection;
};
std::optional<ExpertName> parse_expert_module(std::string_view module);

// The MoE layer a module belongs to (the rules above):
// model.layers.3.mlp.experts.5.down_proj -> model.layers.3.mlp.experts.
std::string_view moe_layer_of(std::string_view module);

// The name of a gate or up projection's partner, in the same spelling
// (P.w1 <-> P.w3, P.gate_proj <-> P.up_proj), or "" for any other module.
std::string gate_up_partner(std::string_view module);

// An expert's place on the HTML page's grid; `pattern` is the name with the
// layer and expert components replaced by '*' (one heatmap per pattern).
struct ExpertPosition {
  std::string pattern;
  std::uint64_t layer = 0, expert = 0;
};
std::optional<ExpertPosition> expert_position(std::string_view module);

}  // namespace mx2nv

#include "compare/compare_json.hpp"

#include "numerics/compensated_sum.hpp"

#include <nlohmann/json.hpp>

#include <fmt/core.h>

#include <algorithm>

namespace mx2nv {
namespace {

using OJson = nlohmann::ordered_json;

constexpr std::string_view kBelow = "active_block_scales_below_2^-6";

OJson optional_number(const std::optional<double>& v) { return v ? OJson(*v) : OJson(nullptr); }

void put_figures(OJson& o, const CompareSums& s) {
  o["values"] = s.values;
  o["exact_values"] = s.exact_values;
  o["max_abs_error"] = s.max_abs_error;
  o["rel_rmse"] = optional_number(relative_rmse(s.sum_d2, s.sum_s2));
  o["cosine"] = cosine_similarity(s.exact(), s.sum_os, s.sum_o2, s.sum_s2);
  o["packed_bytes"] = s.packed_bytes;
  o["packed_bytes_identical"] = s.packed_bytes_identical;
  o["zero_sign_rewrites"] = s.zero_sign_rewrites;
  o["zero_sign_rewrite_bytes"] = s.zero_sign_rewrite_bytes;
  o[std::string(kBelow)] = s.active_block_scales_below_min_normal;
}

OJson totals_object(const CompareResult& r, std::string_view projection) {
  OJson o = OJson::object();
  put_figures(o, compare_totals(r, projection));
  std::uint64_t compared = 0, exact = 0, quantized = 0, non_pow2 = 0, pairs = 0, differ = 0;
  for (const auto& m : r.modules) {
    const std::string_view p = m.projection.empty() ? "other" : std::string_view(m.projection);
    if (!projection.empty() && p != projection) continue;
    ++compared;
    exact += m.sums.exact();
    quantized += m.quantized;
    if (m.global_bits && !f32_is_power_of_two(*m.global_bits)) ++non_pow2;
    if (m.projection == "gate" && m.gate_up_globals_bit_equal) {
      ++pairs;
      differ += !*m.gate_up_globals_bit_equal;
    }
  }
  o["modules_compared"] = compared;
  o["modules_exact"] = exact;
  o["modules_quantized"] = quantized;
  o["modules_unquantized"] = compared - quantized;
  o["non_power_of_two_globals"] = non_pow2;
  o["gate_up_pairs"] = pairs;
  o["gate_up_pairs_globals_differ"] = differ;
  return o;
}

OJson module_object(const ModuleComparison& m) {
  OJson o = OJson::object();
  o["name"] = std::string(m.name);
  o["other_name"] = m.other_name.empty() ? std::string(m.name) : m.other_name;
  o["quantized"] = m.quantized;
  o["layer"] = m.layer ? OJson(*m.layer) : OJson(nullptr);
  o["expert"] = m.expert ? OJson(*m.expert) : OJson(nullptr);
  o["projection"] = m.projection.empty() ? OJson(nullptr) : OJson(std::string(m.projection));
  put_figures(o, m.sums);
  o["global_scale"] = m.global_bits ? OJson(static_cast<double>(f32_from_bits(*m.global_bits))) : OJson(nullptr);
  o["global_power_of_two"] = m.global_bits ? OJson(f32_is_power_of_two(*m.global_bits)) : OJson(nullptr);
  o["input_scale"] = optional_number(m.input_scale);
  o["gate_up_globals_bit_equal"] =
      m.gate_up_globals_bit_equal ? OJson(*m.gate_up_globals_bit_equal) : OJson(nullptr);
  return o;
}

}  // namespace

std::string compare_activations(const CompareResult& r) {
  std::size_t quantized = 0, with_input = 0;
  for (const auto& m : r.modules) {
    if (!m.quantized) continue;
    ++quantized;
    with_input += m.input_scale.has_value();
  }
  if (with_input > 0 && with_input == quantized) return "A4";
  return with_input > 0 ? "mixed" : "A16";
}

CompareSums compare_totals(const CompareResult& r, std::string_view projection) {
  CompareSums t;
  CompensatedSum d2, s2, o2, os;  // as the per-module sums are
  for (const auto& m : r.modules) {
    const std::string_view p = m.projection.empty() ? "other" : std::string_view(m.projection);
    if (!projection.empty() && p != projection) continue;
    const CompareSums& s = m.sums;
    t.values += s.values;
    t.exact_values += s.exact_values;
    t.max_abs_error = std::max(t.max_abs_error, s.max_abs_error);
    d2.add(s.sum_d2);
    s2.add(s.sum_s2);
    o2.add(s.sum_o2);
    os.add(s.sum_os);
    t.packed_bytes += s.packed_bytes;
    t.packed_bytes_identical += s.packed_bytes_identical;
    t.zero_sign_rewrites += s.zero_sign_rewrites;
    t.zero_sign_rewrite_bytes += s.zero_sign_rewrite_bytes;
    t.active_block_scales_below_min_normal += s.active_block_scales_below_min_normal;
  }
  t.sum_d2 = d2.value();
  t.sum_s2 = s2.value();
  t.sum_o2 = o2.value();
  t.sum_os = os.value();
  return t;
}

void write_compare_json(const CompareResult& r, const std::function<void(std::string_view)>& out) {
  // The document is written key by key and module by module, so a
  // checkpoint with hundreds of thousands of modules never has its whole
  // document in memory: each top-level value is dumped compactly on a line.
  const auto field = [&](std::string_view key, const OJson& value, bool last = false) {
    out(fmt::format(" {}: {}{}\n", OJson(key).dump(), value.dump(-1, ' ', false, OJson::error_handler_t::replace),
                    last ? "" : ","));
  };
  out("{\n");
  field("command", "compare");
  field("source", r.source.string());
  field("other", r.other.string());
  field("format", r.format == OtherFormat::CompressedTensors ? "compressed-tensors" : "modelopt");
  field("activations", compare_activations(r));
  field("totals", totals_object(r, {}));
  OJson projections = OJson::object();
  for (const std::string_view p : {"down", "gate", "other", "up"}) {
    const bool any = std::any_of(r.modules.begin(), r.modules.end(), [&](const ModuleComparison& m) {
      return (m.projection.empty() ? std::string_view("other") : std::string_view(m.projection)) == p;
    });
    if (any) projections[std::string(p)] = totals_object(r, p);
  }
  field("projections", projections);
  out(" \"modules\": [");
  for (std::size_t i = 0; i < r.modules.size(); ++i) {
    out(i == 0 ? "\n  " : ",\n  ");
    out(module_object(r.modules[i]).dump(-1, ' ', false, OJson::error_handler_t::replace));
  }
  out(r.modules.empty() ? "],\n" : "\n ],\n");
  field("missing_in_other", r.missing_in_other);
  field("extra_in_other", r.extra_in_other);
  OJson unquantized = OJson::array();
  for (const auto& m : r.modules) {
    if (!m.quantized) unquantized.push_back(std::string(m.name));
  }
  field("unquantized_in_other", unquantized);
  field("exit_code", r.exit_code());
  field("seconds", r.seconds, true);
  out("}\n");
}

std::string compare_json_text(const CompareResult& r) {
  std::string text;
  write_compare_json(r, [&](std::string_view piece) { text += piece; });
  return text;
}

}  // namespace mx2nv

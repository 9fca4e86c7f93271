#include "card/card_render.hpp"

#include "card/card_text.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>

namespace mx2nv {
namespace {

// What the card says of DST's layout (model/target_format.hpp).
struct FormatText {
  std::string_view name;    // in the summary
  std::string_view row;     // the Format row
  std::string_view second;  // the second-level scale, in the summary
  std::string_view seconds; // the Global scales row, after the count
  std::string_view recipe;  // whose quantization a requantized DST reproduces, in the summary
};

const FormatText& format_text(TargetFormat format) {
  static const FormatText compressed{"compressed-tensors NVFP4A16",
                                     "`compressed-tensors` `nvfp4-pack-quantized` (NVFP4A16)", "an FP32 global",
                                     "FP32 global scales", "compressed-tensors 0.20.1 quantizes NVFP4"};
  static const FormatText modelopt{"ModelOpt W4A16_NVFP4",
                                   "ModelOpt `W4A16_NVFP4` (`weight`, `weight_scale`, `weight_scale_2`)",
                                   "an exact FP32 multiplier (`weight_scale_2`)", "FP32 `weight_scale_2` multipliers",
                                   "nvidia-modelopt 0.47.0's dynamic NVFP4 weight quantizer quantizes them"};
  return format == TargetFormat::ModelOpt ? modelopt : compressed;
}

std::string front_matter(const CardFacts& f) {
  std::string out = "---\n";
  if (!f.base_model.empty()) {
    out += "base_model: " + yaml_quoted(f.base_model) + "\n";
    out += "base_model_relation: \"quantized\"\n";
  }
  for (const auto& [key, value] : f.source.inherited) {
    if (const auto* s = std::get_if<std::string>(&value)) {
      out += key + ": " + yaml_quoted(*s) + "\n";
    } else {
      out += key + ":\n";
      for (const auto& item : std::get<std::vector<std::string>>(value)) out += "- " + yaml_quoted(item) + "\n";
    }
  }
  out += "tags:\n";
  for (const auto& tag : card_tags(f)) out += "- " + yaml_quoted(tag) + "\n";
  return out + "---\n";
}

std::size_t bf16_module_count(const Report& r) {
  std::size_t n = 0;
  for (const auto& l : r.bf16_layers) n += l.modules.size();
  return n;
}

std::string linked_base(const CardFacts& f) {
  return f.base_model.empty() ? "An MXFP4 checkpoint"
                              : fmt::format("[{}](https://huggingface.co/{})'s MXFP4 checkpoint",
                                            code_span(f.base_model), f.base_model);
}

// Lower median / worst of a requantized field (§5.3); the first module
// wins a tie for worst.
struct Spread {
  double median = 0, worst = 0;
  std::string worst_module;
};
Spread spread(const std::vector<ModuleError>& modules, double ModuleError::*field, bool worst_is_max) {
  std::vector<double> sorted;
  sorted.reserve(modules.size());
  for (const auto& m : modules) sorted.push_back(m.*field);
  std::stable_sort(sorted.begin(), sorted.end());
  Spread s;
  s.median = sorted[(sorted.size() - 1) / 2];
  const ModuleError* w = &modules[0];
  for (const auto& m : modules) {
    if (worst_is_max ? m.*field > w->*field : m.*field < w->*field) w = &m;
  }
  s.worst = w->*field;
  s.worst_module = w->module;
  return s;
}

std::string summary(const CardFacts& f) {
  const Report& r = *f.report;
  if (f.kind == EvidenceKind::Requantize) {
    const Spread rmse = spread(r.requantized, &ModuleError::relative_rmse, true);
    return fmt::format(
        "{}, requantized to {} by mx2nv {} from the decoded MXFP4 values exactly as {} (lossy). Relative RMSE "
        "against the MXFP4 values: median {}, worst {}.\n",
        linked_base(f), format_text(f.format).name, f.version, format_text(f.format).recipe, number_text(rmse.median),
        number_text(rmse.worst));
  }
  // The figures of the sentence are the report's; one it did not compute
  // (null) is not cited.
  const std::string compared =
      !r.values_compared || !r.modules
          ? std::string("compared every value of the quantized modules with the source")
          : fmt::format("compared all {} values of the {} quantized modules with the source",
                        number_text(*r.values_compared), number_text(*r.modules));
  std::string out = fmt::format(
      "{}, transcoded to {} by mx2nv {}. The FP4 codes are the source's bytes and every block scale is the same "
      "power of two, re-expressed as an FP8 E4M3 scale and {}: `mx2nv verify` {} and found {} mismatches",
      linked_base(f), format_text(f.format).name, f.version, format_text(f.format).second, compared,
      number_text(*r.mismatches));
  if (r.over_span_choice == OverSpanChoice::Bf16 && bf16_module_count(r) > 0) {
    out += fmt::format("; {} modules in {} MoE layers are stored as BF16, exactly", bf16_module_count(r),
                       r.bf16_layers.size());
  } else if (r.over_span_choice == OverSpanChoice::Requantize && !r.requantized.empty()) {
    out += fmt::format("; {} modules did not fit the window and were requantized (lossy, see *Requantized modules*)",
                       r.requantized.size());
  }
  return out + ".\n";
}

std::string source_value(const CardFacts& f) {
  if (!f.snapshot_repo.empty()) {
    return fmt::format("{} at revision {}", code_span(f.snapshot_repo, true), code_span(f.snapshot_rev, true));
  }
  if (!f.base_model.empty()) return code_span(f.base_model, true) + " (given with --base-model; revision unknown)";
  return "a local MXFP4 checkpoint (not a Hugging Face cache snapshot; no base model given)";
}

std::string format_table(const CardFacts& f) {
  const Report& r = *f.report;
  const bool rq = f.kind == EvidenceKind::Requantize;
  const std::size_t lossy = r.requantized.size(), bf16 = bf16_module_count(r);
  std::string weights = "FP4 (E2M1), two per byte: the source's packed bytes, unchanged";
  if (rq) {
    weights = "FP4 (E2M1), two per byte, requantized (lossy)";
  } else {
    if (lossy > 0) weights += fmt::format(", except {} requantized modules", lossy);
    if (bf16 > 0) weights += fmt::format("; {} modules in BF16", bf16);
  }
  std::string policy = "none needed: every module fit the window";
  if (rq) {
    policy = "not applicable: every module was requantized";
  } else if (r.over_span_choice == OverSpanChoice::Bf16) {
    policy = fmt::format("`bf16`: {} modules in {} MoE layers stored as BF16 (see below)", bf16, r.bf16_layers.size());
  } else if (r.over_span_choice != OverSpanChoice::Fail) {
    policy = fmt::format("{}: {} modules requantized (see below)",
                         code_span(std::string(choice_name(r.over_span_choice)), true), lossy);
  }
  std::string out = "## Format\n\n| Property | Value |\n|---|---|\n";
  // A row whose figure the report did not compute (null) is left out.
  std::vector<std::pair<std::string, std::string>> rows = {
      {"Format", std::string(format_text(f.format).row)}, {"Weights", weights},
      {"Local scales", "FP8 (E4M3), one per 16 weights"}};
  if (r.scale_groups) {
    rows.push_back({"Global scales", fmt::format("{} {} (one per module; a gate/up pair shares one)",
                                                 number_text(*r.scale_groups), format_text(f.format).seconds)});
  }
  rows.push_back({"Activations", "not quantized (fp16 or bf16 at run time)"});
  if (r.modules) rows.push_back({"Quantized modules", fmt::format("{} routed-expert projections", number_text(*r.modules))});
  if (r.passthrough_tensors && r.companion_files) {
    rows.push_back({"Left bit-identical", fmt::format("{} pass-through tensors, {} companion files",
                                                      number_text(*r.passthrough_tensors),
                                                      number_text(*r.companion_files))});
  }
  rows.push_back({"Source", source_value(f)});
  rows.push_back({"Window", rq ? "not applicable (requantized)" : code_span(std::string(window_name(r.window)), true)});
  rows.push_back({"Over-span policy", policy});
  if (r.target_tensor_bytes && r.source_tensor_bytes) {
    rows.push_back({"Tensor data size", fmt::format("{} bytes (source: {} bytes)", number_text(*r.target_tensor_bytes),
                                                    number_text(*r.source_tensor_bytes))});
  }
  if (const auto change = r.written_size_change_percent()) {
    const double p = *change;
    rows.push_back({"Size change", (std::signbit(p) ? "" : "+") + python_float(p) + " %"});
  }
  for (const auto& [label, value] : rows) out += table_row({label, value});
  return out + "\n";
}

std::string error_table(const Report& r) {
  const std::vector<ModuleError>& mods = r.requantized;
  const Spread rmse = spread(mods, &ModuleError::relative_rmse, true), cos = spread(mods, &ModuleError::cosine, false);
  std::uint64_t flushed = 0, blocks = 0;
  for (const auto& m : mods) {
    flushed += m.marlin_zeroed_blocks > 0 ? 1 : 0;
    blocks += m.marlin_zeroed_blocks;
  }
  std::string out = "| Measure | Value |\n|---|---|\n";
  out += table_row({"Requantized modules", fmt::format("{}", mods.size())});
  if (r.values_compared) out += table_row({"Values compared", number_text(*r.values_compared)});
  out += table_row({"Relative RMSE, median", number_text(rmse.median)});
  out += table_row({"Relative RMSE, worst", number_text(rmse.worst) + " (" + code_span(rmse.worst_module, true) + ")"});
  out += table_row({"Cosine, median", number_text(cos.median)});
  out += table_row({"Cosine, worst", number_text(cos.worst) + " (" + code_span(cos.worst_module, true) + ")"});
  if (r.max_abs_error) out += table_row({"Max abs error", number_text(*r.max_abs_error)});
  out += table_row({"Modules with block scales below 2^-6",
                    fmt::format("{} of {} modules ({} blocks; vLLM's Marlin zeroes them)", flushed, mods.size(), blocks)});
  return out + "\n";
}

std::string overspan_subsections(const Report& r) {
  std::string out;
  if (!r.resolved_spans.empty()) {
    out += "### Modules outside the window\n\n| Module | Span | Limit | Groups outside |\n|---|---|---|---|\n";
    for (const auto& o : r.resolved_spans) {
      out += table_row({code_span(o.module, true), fmt::format("{}", o.span), fmt::format("{}", o.limit),
                        number_text(o.groups_outside)});
    }
    out += "\n";
  }
  if (!r.bf16_layers.empty()) {
    out += "### BF16 layers\n\n| Layer | Modules | Refused modules | Size cost (bytes) |\n|---|---|---|---|\n";
    for (const auto& l : r.bf16_layers) {
      std::string why;
      for (const auto& w : l.refused) why += (why.empty() ? "" : ", ") + code_span(w, true);
      // As the report writes it: both sizes are at most 2^63 - 1.
      const auto cost = static_cast<std::int64_t>(l.bf16_bytes) - static_cast<std::int64_t>(l.nvfp4_bytes);
      out += table_row({code_span(l.layer, true), fmt::format("{}", l.modules.size()), why, fmt::format("{}", cost)});
    }
    out += "\n";
  }
  if (!r.requantized.empty()) out += "### Requantized modules (lossy)\n\n" + error_table(r);
  return out;
}

std::string verified(const CardFacts& f) {
  const Report& r = *f.report;
  if (f.kind == EvidenceKind::Requantize) return "## Error against the source\n\n" + error_table(r);
  const std::uint64_t rewritten = bf16_module_count(r) + r.requantized.size();
  std::string out = "## Verified\n\n| Check | Result |\n|---|---|\n";
  // Every figure is a field of the report; one the command did not compute
  // (null) leaves its row out.
  const auto row = [&](const char* label, const auto& value) {
    if (value) out += table_row({label, number_text(*value)});
  };
  out += table_row({"Verify result", fmt::format("`ok` (mx2nv verify {})", r.provenance.tool_version)});
  out += table_row({"Window", code_span(std::string(window_name(r.window)), true)});
  row("Quantized modules", r.modules);
  row("Values compared", r.values_compared);
  row("Mismatches", r.mismatches);
  row("Max abs error", r.max_abs_error);
  if (r.modules) {
    const std::uint64_t modules = *r.modules;
    out += table_row({"Packed bytes identical", fmt::format("{} of {} modules", modules - std::min(rewritten, modules), modules)});
  }
  row("Pass-through tensors identical", r.passthrough_tensors);
  row("Companion files identical", r.companion_files);
  row("Shards", r.shards);
  row("Active 32-value groups", r.active_groups);
  row("All-zero 32-value groups", r.zero_groups);
  row("All-zero groups written with scale byte 0x00", r.canonicalised_zero_groups);
  row("Active groups below 2^-6 (zeroed by Marlin)", r.marlin_zeroed_groups);
  row("Globals raised for fp16", r.raised_globals);
  return out + "\n" + overspan_subsections(r);
}

}  // namespace

std::string number_text(std::uint64_t value) { return fmt::format("{}", value); }

std::string number_text(double value) { return std::isinf(value) ? "inf" : python_float(value); }

std::string table_row(const std::vector<std::string>& cells) {
  std::string out = "|";
  for (const auto& c : cells) out += " " + c + " |";
  return out + "\n";
}

std::vector<std::string> card_tags(const CardFacts& f) {
  std::vector<std::string> tags = {"nvfp4", std::string(choice_name(f.format)), "mx2nv"};
  if (f.kind == EvidenceKind::Requantize || !f.report->requantized.empty()) tags.push_back("requantized");
  return tags;
}

std::string render_card(const CardFacts& f) {
  std::string out = front_matter(f) + "\n";
  if (f.kind == EvidenceKind::Requantize) {
    out += "# NVFP4A16 requantization" + (f.base_model.empty() ? "" : " of " + code_span(f.base_model)) + " (lossy)\n\n";
  } else {
    out += "# NVFP4A16 transcode" + (f.base_model.empty() ? "" : " of " + code_span(f.base_model)) + "\n\n";
  }
  out += summary(f) + "\n";
  out += format_table(f);
  out += verified(f);
  out += render_gate_and_load(f);
  out += render_trailer(f);
  while (out.size() >= 2 && out[out.size() - 1] == '\n' && out[out.size() - 2] == '\n') out.pop_back();
  return out;
}

}  // namespace mx2nv

#include "card/card_render.hpp"

#include "card/card_text.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>

namespace mx2nv {
namespace {

double as_double(const Json& v) {
  if (v.is_string() && v == "inf") return std::numeric_limits<double>::infinity();
  return v.is_number() ? v.get<double>() : std::numeric_limits<double>::quiet_NaN();
}

// What the card says of DST's layout (model/target_format.hpp).
struct FormatText {
  std::string_view name;    // in the summary
  std::string_view row;     // the Format row
  std::string_view second;  // the second-level scale, in the summary
  std::string_view seconds; // the Global scales row, after the count
};

const FormatText& format_text(TargetFormat format) {
  static const FormatText compressed{"compressed-tensors NVFP4A16",
                                     "`compressed-tensors` `nvfp4-pack-quantized` (NVFP4A16)", "an FP32 global",
                                     "FP32 global scales"};
  static const FormatText modelopt{"ModelOpt W4A16_NVFP4",
                                   "ModelOpt `W4A16_NVFP4` (`weight`, `weight_scale`, `weight_scale_2`)",
                                   "an exact FP32 multiplier (`weight_scale_2`)", "FP32 `weight_scale_2` multipliers"};
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

std::size_t bf16_module_count(const Json& r) {
  std::size_t n = 0;
  for (const auto& l : member_or_null(member_or_null(r, "overspan"), "bf16_layers")) n += member_or_null(l, "modules").size();
  return n;
}

std::string linked_base(const CardFacts& f) {
  return f.base_model.empty() ? "An MXFP4 checkpoint"
                              : fmt::format("[{}](https://huggingface.co/{})'s MXFP4 checkpoint",
                                            code_span(f.base_model), f.base_model);
}

// Lower median / worst of a requantized field (§5.3).
struct Spread {
  Json median, worst;
  std::string worst_module;
};
Spread spread(const Json& modules, const char* field, bool worst_is_max) {
  std::vector<const Json*> rows;
  for (const auto& m : modules) rows.push_back(&m);
  std::vector<const Json*> sorted = rows;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [&](const Json* a, const Json* b) { return as_double(member_or_null(*a, field)) < as_double(member_or_null(*b, field)); });
  Spread s;
  s.median = member_or_null(*sorted[(sorted.size() - 1) / 2], field);
  const Json* w = rows[0];
  for (const Json* m : rows) {
    const double x = as_double(member_or_null(*m, field)), y = as_double(member_or_null(*w, field));
    if (worst_is_max ? x > y : x < y) w = m;
  }
  s.worst = member_or_null(*w, field);
  s.worst_module = member_or_null(*w, "module").get<std::string>();
  return s;
}

std::string summary(const CardFacts& f) {
  const Json& r = *f.report;
  if (f.kind == EvidenceKind::Requantize) {
    const Json& mods = member_or_null(r, "requantized");
    return fmt::format(
        "{}, requantized to {} by mx2nv {} from the decoded MXFP4 values exactly as "
        "compressed-tensors 0.20.1 quantizes NVFP4 (lossy). Relative RMSE against the MXFP4 values: median {}, "
        "worst {}.\n",
        linked_base(f), format_text(f.format).name, f.version, number_text(spread(mods, "relative_rmse", true).median),
        number_text(spread(mods, "relative_rmse", true).worst));
  }
  // The figures of the sentence are the report's; one it did not compute
  // (null) is not cited.
  const Json& values = member_or_null(r, "values_compared");
  const Json& modules = member_or_null(member_or_null(r, "counts"), "modules");
  const std::string compared =
      values.is_null() || modules.is_null()
          ? std::string("compared every value of the quantized modules with the source")
          : fmt::format("compared all {} values of the {} quantized modules with the source", number_text(values),
                        number_text(modules));
  std::string out = fmt::format(
      "{}, transcoded to {} by mx2nv {}. The FP4 codes are the source's bytes and every block scale is the same "
      "power of two, re-expressed as an FP8 E4M3 scale and {}: `mx2nv verify` {} and found {} mismatches",
      linked_base(f), format_text(f.format).name, f.version, format_text(f.format).second, compared,
      number_text(member_or_null(r, "mismatches")));
  const std::string choice = member_or_null(member_or_null(r, "overspan"), "choice").is_string() ? member_or_null(member_or_null(r, "overspan"), "choice").get<std::string>() : "";
  if (choice == "bf16" && bf16_module_count(r) > 0) {
    out += fmt::format("; {} modules in {} MoE layers are stored as BF16, exactly", bf16_module_count(r),
                       member_or_null(member_or_null(r, "overspan"), "bf16_layers").size());
  } else if (choice == "requantize" && !member_or_null(r, "requantized").empty()) {
    out += fmt::format("; {} modules did not fit the window and were requantized (lossy, see *Requantized modules*)",
                       member_or_null(r, "requantized").size());
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
  const Json& r = *f.report;
  const Json& c = member_or_null(r, "counts");
  const bool rq = f.kind == EvidenceKind::Requantize;
  const std::size_t lossy = member_or_null(r, "requantized").size(), bf16 = bf16_module_count(r);
  std::string weights = "FP4 (E2M1), two per byte: the source's packed bytes, unchanged";
  if (rq) {
    weights = "FP4 (E2M1), two per byte, requantized (lossy)";
  } else {
    if (lossy > 0) weights += fmt::format(", except {} requantized modules", lossy);
    if (bf16 > 0) weights += fmt::format("; {} modules in BF16", bf16);
  }
  std::string policy = "none needed: every module fit the window";
  const Json& os = member_or_null(r, "overspan");
  if (rq) {
    policy = "not applicable: every module was requantized";
  } else if (os.is_object()) {
    const std::string choice = member_or_null(os, "choice").get<std::string>();
    policy = choice == "bf16" ? fmt::format("`bf16`: {} modules in {} MoE layers stored as BF16 (see below)", bf16,
                                            member_or_null(os, "bf16_layers").size())
                              : fmt::format("{}: {} modules requantized (see below)", code_span(choice, true), lossy);
  }
  std::string out = "## Format\n\n| Property | Value |\n|---|---|\n";
  // A row whose figure the report did not compute (null) is left out.
  const auto known = [](std::initializer_list<const Json*> fields) {
    return std::none_of(fields.begin(), fields.end(), [](const Json* j) { return j->is_null(); });
  };
  const Json& pct = member_or_null(r, "size_change_percent");
  std::vector<std::pair<std::string, std::string>> rows = {
      {"Format", std::string(format_text(f.format).row)}, {"Weights", weights},
      {"Local scales", "FP8 (E4M3), one per 16 weights"}};
  if (known({&member_or_null(c, "scale_groups")})) {
    rows.push_back({"Global scales", fmt::format("{} {} (one per module; a gate/up pair shares one)",
                                                 number_text(member_or_null(c, "scale_groups")), format_text(f.format).seconds)});
  }
  rows.push_back({"Activations", "not quantized (fp16 or bf16 at run time)"});
  if (known({&member_or_null(c, "modules")})) {
    rows.push_back({"Quantized modules", fmt::format("{} routed-expert projections", number_text(member_or_null(c, "modules")))});
  }
  if (known({&member_or_null(c, "passthrough_tensors"), &member_or_null(c, "companion_files")})) {
    rows.push_back({"Left bit-identical", fmt::format("{} pass-through tensors, {} companion files",
                                                      number_text(member_or_null(c, "passthrough_tensors")),
                                                      number_text(member_or_null(c, "companion_files")))});
  }
  rows.push_back({"Source", source_value(f)});
  rows.push_back({"Window", rq ? "not applicable (requantized)" : code_span(member_or_null(r, "window").get<std::string>(), true)});
  rows.push_back({"Over-span policy", policy});
  if (known({&member_or_null(r, "target_tensor_bytes"), &member_or_null(r, "source_tensor_bytes")})) {
    rows.push_back({"Tensor data size", fmt::format("{} bytes (source: {} bytes)", number_text(member_or_null(r, "target_tensor_bytes")),
                                                    number_text(member_or_null(r, "source_tensor_bytes")))});
  }
  if (known({&pct})) {
    const double p = pct.get<double>();
    rows.push_back({"Size change", (std::signbit(p) ? "" : "+") + python_float(p) + " %"});
  }
  for (const auto& [label, value] : rows) out += table_row({label, value});
  return out + "\n";
}

std::string error_table(const Json& r) {
  const Json& mods = member_or_null(r, "requantized");
  const Spread rmse = spread(mods, "relative_rmse", true), cos = spread(mods, "cosine", false);
  std::uint64_t flushed = 0, blocks = 0;
  for (const auto& m : mods) {
    const auto b = member_or_null(m, "marlin_zeroed_blocks").get<std::uint64_t>();
    flushed += b > 0 ? 1 : 0;
    blocks += b;
  }
  std::string out = "| Measure | Value |\n|---|---|\n";
  out += table_row({"Requantized modules", fmt::format("{}", mods.size())});
  if (!member_or_null(r, "values_compared").is_null()) out += table_row({"Values compared", number_text(member_or_null(r, "values_compared"))});
  out += table_row({"Relative RMSE, median", number_text(rmse.median)});
  out += table_row({"Relative RMSE, worst", number_text(rmse.worst) + " (" + code_span(rmse.worst_module, true) + ")"});
  out += table_row({"Cosine, median", number_text(cos.median)});
  out += table_row({"Cosine, worst", number_text(cos.worst) + " (" + code_span(cos.worst_module, true) + ")"});
  if (!member_or_null(r, "max_abs_error").is_null()) out += table_row({"Max abs error", number_text(member_or_null(r, "max_abs_error"))});
  out += table_row({"Modules with block scales below 2^-6",
                    fmt::format("{} of {} modules ({} blocks; vLLM's Marlin zeroes them)", flushed, mods.size(), blocks)});
  return out + "\n";
}

std::string overspan_subsections(const Json& r) {
  std::string out;
  const Json& os = member_or_null(r, "overspan");
  if (!member_or_null(os, "resolved_over_span").empty()) {
    out += "### Modules outside the window\n\n| Module | Span | Limit | Groups outside |\n|---|---|---|---|\n";
    for (const auto& o : member_or_null(os, "resolved_over_span")) {
      out += table_row({code_span(member_or_null(o, "module").get<std::string>(), true), number_text(member_or_null(o, "span")),
                        number_text(member_or_null(o, "limit")), number_text(member_or_null(o, "groups_outside"))});
    }
    out += "\n";
  }
  if (!member_or_null(os, "bf16_layers").empty()) {
    out += "### BF16 layers\n\n| Layer | Modules | Refused modules | Size cost (bytes) |\n|---|---|---|---|\n";
    for (const auto& l : member_or_null(os, "bf16_layers")) {
      std::string why;
      for (const auto& w : member_or_null(l, "why")) why += (why.empty() ? "" : ", ") + code_span(w.get<std::string>(), true);
      out += table_row({code_span(member_or_null(l, "layer").get<std::string>(), true), fmt::format("{}", member_or_null(l, "modules").size()),
                        why, number_text(member_or_null(l, "size_cost_bytes"))});
    }
    out += "\n";
  }
  if (!member_or_null(r, "requantized").empty()) out += "### Requantized modules (lossy)\n\n" + error_table(r);
  return out;
}

std::string verified(const CardFacts& f) {
  const Json& r = *f.report;
  if (f.kind == EvidenceKind::Requantize) return "## Error against the source\n\n" + error_table(r);
  const Json& c = member_or_null(r, "counts");
  const std::uint64_t rewritten = bf16_module_count(r) + member_or_null(r, "requantized").size();
  std::string out = "## Verified\n\n| Check | Result |\n|---|---|\n";
  // Every figure is a field of the report; one the command did not compute
  // (null) leaves its row out.
  const auto row = [&](const char* label, const Json& value) {
    if (!value.is_null()) out += table_row({label, number_text(value)});
  };
  out += table_row({"Verify result", fmt::format("`ok` (mx2nv verify {})", member_or_null(member_or_null(r, "provenance"), "tool_version").get<std::string>())});
  out += table_row({"Window", code_span(member_or_null(r, "window").get<std::string>(), true)});
  row("Quantized modules", member_or_null(c, "modules"));
  row("Values compared", member_or_null(r, "values_compared"));
  row("Mismatches", member_or_null(r, "mismatches"));
  row("Max abs error", member_or_null(r, "max_abs_error"));
  if (!member_or_null(c, "modules").is_null()) {
    const auto modules = member_or_null(c, "modules").get<std::uint64_t>();
    out += table_row({"Packed bytes identical", fmt::format("{} of {} modules", modules - std::min(rewritten, modules), modules)});
  }
  row("Pass-through tensors identical", member_or_null(c, "passthrough_tensors"));
  row("Companion files identical", member_or_null(c, "companion_files"));
  row("Shards", member_or_null(c, "shards"));
  row("Active 32-value groups", member_or_null(c, "active_groups"));
  row("All-zero 32-value groups", member_or_null(c, "zero_groups"));
  row("All-zero groups written with scale byte 0x00", member_or_null(c, "canonicalised_zero_groups"));
  row("Active groups below 2^-6 (zeroed by Marlin)", member_or_null(c, "marlin_zeroed_groups"));
  row("Globals raised for fp16", member_or_null(c, "raised_globals"));
  return out + "\n" + overspan_subsections(r);
}

}  // namespace

std::string number_text(const Json& v) {
  if (v.is_number_integer()) return v.dump();
  if (v.is_number_float()) return python_float(v.get<double>());
  if (v.is_string() && v == "inf") return "inf";
  return "?";
}

std::string table_row(const std::vector<std::string>& cells) {
  std::string out = "|";
  for (const auto& c : cells) out += " " + c + " |";
  return out + "\n";
}

std::vector<std::string> card_tags(const CardFacts& f) {
  std::vector<std::string> tags = {"nvfp4", std::string(choice_name(f.format)), "mx2nv"};
  const Json& lossy = member_or_null(*f.report, "requantized");
  if (f.kind == EvidenceKind::Requantize || (lossy.is_array() && !lossy.empty())) tags.push_back("requantized");
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

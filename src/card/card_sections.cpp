// The card's sections after the evidence: the runtime gate, how to load,
// the companion, the source card, how it was made, what was not verified,
// the license (docs/reference/model-card.md §5.4-§5.9).
#include "card/card_render.hpp"
#include "card/card_text.hpp"
#include "common/printable.hpp"
#include "gate/gate.hpp"
#include "gate/rules.hpp"
#include "gate/runtime.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <set>
#include <tuple>

namespace mx2nv {
namespace {

// A reason or note as gate --json writes it (json_text: any byte shown).
std::vector<std::string> texts(const std::vector<std::string>& items) {
  std::vector<std::string> out;
  for (const auto& i : items) out.push_back(json_text(i));
  return out;
}

std::string runtime_of(const Verdict& v) { return std::string(choice_name(v.backend->runtime)); }
std::string backend_of(const Verdict& v) { return std::string(choice_name(v.backend->backend)); }
std::string dtype_of(const Verdict& v) { return std::string(choice_name(v.dtype)); }

std::string joined_spans(const std::vector<std::string>& items, bool in_table = false, const char* sep = ", ") {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : sep) + code_span(i, in_table);
  return out;
}

std::string gate_tables(const CardFacts& f) {
  const GateResult& g = *f.gate;
  std::string out = fmt::format(
      "## Runtime gate\n\n`mx2nv gate` at TP {} (mx2nv's rules for the pinned releases in the table; the runtimes "
      "were not run):\n\n| Runtime | Version | Backend | Dtype | TP | Verdict | Reasons |\n|---|---|---|---|---|---|---|\n",
      f.tp);
  std::vector<const RuntimeBackend*> backends;
  for (const Verdict& v : g.verdicts) {
    const std::vector<std::string> reasons = texts(v.reasons);
    out += table_row({runtime_of(v), std::string(v.backend->version), backend_of(v), dtype_of(v), fmt::format("{}", v.tp),
                      std::string(verdict_name(v.kind)), reasons.empty() ? "—" : joined_spans(reasons, true, "; ")});
    if (std::find(backends.begin(), backends.end(), v.backend) == backends.end()) backends.push_back(v.backend);
  }
  out += "\n| Runtime | Backend | Selected on |\n|---|---|---|\n";
  for (const RuntimeBackend* b : backends) {
    out += table_row({std::string(choice_name(b->runtime)), std::string(choice_name(b->backend)),
                      code_span(std::string(b->gpus), true)});
  }
  // What each backend of DST's layout says at every TP degree (gate's tp_table).
  out += "\n### Tensor parallelism\n\n";
  const std::vector<const RuntimeBackend*> columns = runtime_backends(g.format);
  std::vector<std::string> header = {"TP"};
  for (const RuntimeBackend* b : columns) {
    header.push_back(fmt::format("{}-{}", choice_name(b->runtime), choice_name(b->backend)));
  }
  out += table_row(header) + "|---|";
  for (std::size_t i = 0; i < columns.size(); ++i) out += "---|";
  out += "\n";
  for (const unsigned tp : tp_degrees()) {
    std::vector<std::string> cells = {fmt::format("{}", tp)};
    for (const RuntimeBackend* b : columns) {
      const std::optional<std::string> problem = dims_problem(*b, g.dims, tp);
      cells.push_back(problem ? code_span(*problem, true) : "ok");
    }
    out += table_row(cells);
  }
  return out + "\n";
}

using Runs = std::set<std::tuple<std::string, std::string, std::string>>;  // (runtime, backend, dtype) RUN at TP

// SGLang's weight-only MoE runners for a ModelOpt DST, named on the command
// line: with `auto`, SGLang 0.5.23 picks a W4A4 runner for ModelOpt NVFP4 on
// Blackwell (modelopt_quant.py:2377-2387, :3111-3125). The CuTe-DSL W4A16
// runner also needs its environment variable (:2812-2814).
struct SglangRunner {
  Backend backend;              // as gate names it
  std::string_view runner, env;  // SGLang's --moe-runner-backend value, its environment
};
constexpr SglangRunner kModelOptRunners[] = {
    {Backend::Marlin, "marlin", ""},
    {Backend::CuteDsl, "flashinfer_cutedsl", "SGLANG_FLASHINFER_CUTEDSL_NVFP4_W4A16=1 "}};

// The SGLang commands at one dtype: one without a runner for a
// compressed-tensors DST, one per RUN runner for a ModelOpt DST.
std::vector<std::string> sglang_lines(const CardFacts& f, const Runs& runs, const std::string& dtype,
                                      const std::string& flag, const std::string& model, const std::string& trc) {
  const auto run = [&](std::string_view backend) {
    return std::any_of(runs.begin(), runs.end(), [&](const auto& t) {
      return std::get<0>(t) == "sglang" && std::get<2>(t) == dtype && (backend.empty() || std::get<1>(t) == backend);
    });
  };
  const std::string launch = fmt::format("python -m sglang.launch_server --model-path {} --tp-size {} --dtype {}",
                                         model, f.tp, flag);
  if (f.format != TargetFormat::ModelOpt) return run("") ? std::vector<std::string>{launch + trc} : std::vector<std::string>{};
  std::vector<std::string> lines;
  for (const auto& r : kModelOptRunners) {
    if (run(choice_name(r.backend))) {
      lines.push_back(fmt::format("{}{} --moe-runner-backend {}{}", r.env, launch, r.runner, trc));
    }
  }
  return lines;
}

std::string load_section(const CardFacts& f) {
  std::set<std::string> judged_vllm;
  Runs runs;
  for (const Verdict& v : f.gate->verdicts) {
    if (v.backend->runtime == Runtime::Vllm) judged_vllm.insert(backend_of(v));
    if (v.kind == Verdict::Run && v.tp == f.tp) runs.insert({runtime_of(v), backend_of(v), dtype_of(v)});
  }
  const std::string model = f.repo_id.empty() ? "\"$MODEL\"" : f.repo_id;
  const std::string trc = f.trust_remote_code ? " --trust-remote-code" : "";
  std::vector<std::string> lines;
  bool backend_named = false, runner_named = false;
  const std::vector<std::pair<std::string, std::string>> dtypes = {{"bf16", "bfloat16"}, {"fp16", "float16"}};
  for (const auto& [dtype, flag] : dtypes) {
    std::set<std::string> vllm;
    for (const auto& [r, b, d] : runs) {
      if (r == "vllm" && d == dtype) vllm.insert(b);
    }
    if (vllm.empty()) continue;
    const std::string backend = vllm == judged_vllm ? "" : " --moe-backend " + *vllm.begin();
    backend_named = backend_named || !backend.empty();
    lines.push_back(fmt::format("vllm serve {} --tensor-parallel-size {} --dtype {}{}{}", model, f.tp, flag, backend, trc));
  }
  for (const auto& [dtype, flag] : dtypes) {
    for (auto& line : sglang_lines(f, runs, dtype, flag, model, trc)) {
      runner_named = runner_named || f.format == TargetFormat::ModelOpt;
      lines.push_back(std::move(line));
    }
  }
  std::string out = "## How to load\n\n";
  if (lines.empty()) {
    return out + fmt::format("No backend mx2nv gate judges runs this checkpoint at TP {}; see Runtime gate.\n\n", f.tp);
  }
  out += fmt::format("The commands for every runtime and dtype mx2nv gate says RUN at TP {}. Both runtimes read the "
                     "quantization method from `config.json`{}.{}\n\n```sh\n",
                     f.tp, backend_named ? "" : "; vLLM picks its MoE backend by GPU (see *Selected on* above)",
                     runner_named ? " SGLang's MoE runner is named: with `auto`, SGLang picks a W4A4 runner (FP4 "
                                    "activations) for ModelOpt NVFP4 on Blackwell."
                                  : "");
  if (f.repo_id.empty()) out += "MODEL=/path/to/this/checkpoint  # or its Hugging Face repo id\n";
  for (const auto& l : lines) out += l + "\n";
  return out + "```\n\n";
}

std::string companion_section(const CardFacts& f) {
  if (f.companion_repo.empty()) return {};
  const std::string url = "https://huggingface.co/" + f.companion_repo + (f.companion_rev.empty() ? "" : "/tree/" + f.companion_rev);
  const std::string where = f.companion_rev.empty() ? " (no revision pinned)" : " at revision " + code_span(f.companion_rev);
  if (f.kind == EvidenceKind::Requantize) {
    return fmt::format("## Lossless version\n\nThe lossless NVFP4A16 transcode of the same source is [{}]({}){}.\n\n",
                       code_span(f.companion_repo), url, where);
  }
  return fmt::format("## Companion\n\nA requantized NVFP4A16 version (lossy; its card has the error table) is [{}]({}){}.\n\n",
                     code_span(f.companion_repo), url, where);
}

std::string source_section(const CardFacts& f) {
  const SourceCard& s = f.source;
  std::string out = "## Source card\n\n";
  if (!s.present) return out + "The source has no README.md; nothing was inherited.\n\n";
  if (!s.problem.empty()) {
    return out + fmt::format("The source's own card is kept unchanged as [README.source.md](README.source.md), but its "
                             "metadata could not be read ({}); nothing was inherited.\n\n",
                             code_span(s.problem));
  }
  out += "The source's own card is kept unchanged as [README.source.md](README.source.md).";
  std::vector<std::string> inherited;
  for (const auto& kv : s.inherited) inherited.push_back(kv.first);
  if (!inherited.empty()) out += " Inherited into this card's metadata: " + joined_spans(inherited) + ".";
  if (!s.dropped.empty()) out += " Not carried over: " + joined_spans(s.dropped) + ".";
  if (!s.not_inherited.empty()) out += " Not inherited (not a string, or control characters): " + joined_spans(s.not_inherited) + ".";
  if (!s.gating.empty()) {
    out += " The source's card has gating keys (" + joined_spans(s.gating) +
           "): gating is a setting of the publishing repository and is not carried over; check the source's license "
           "before publishing.";
  }
  return out + "\n\n";
}

std::string made_section(const CardFacts& f, const std::string& source_text) {
  const Report& r = *f.report;
  std::string options;
  if (f.base_given) options += " --base-model " + f.base_model;
  if (!f.companion_repo.empty()) options += " --companion " + f.companion_repo + (f.companion_rev.empty() ? "" : "@" + f.companion_rev);
  options += fmt::format(" --tp {}", f.tp);
  if (!f.repo_id.empty()) options += " --repo-id " + f.repo_id;
  if (f.gpu_log) options += " --gpu-check gpu-check.log";
  std::string out = "## How it was made\n\n```sh\n";
  if (f.kind == EvidenceKind::Requantize) {
    out += "mx2nv requantize SRC DST";
    if (f.format != TargetFormat::CompressedTensors) out += fmt::format(" --format {}", choice_name(f.format));
    out += " --report requantize-report.json\n";
    out += "mx2nv card SRC DST --requantize-report requantize-report.json" + options + "\n";
  } else {
    const std::string window(window_name(r.window));
    out += "mx2nv convert SRC DST --window " + window;
    if (r.over_span_choice != OverSpanChoice::Fail) out += fmt::format(" --overspan {}", choice_name(r.over_span_choice));
    if (f.format != TargetFormat::CompressedTensors) out += fmt::format(" --format {}", choice_name(f.format));
    out += "\nmx2nv verify SRC DST --window " + window + " --report verify-report.json\n";
    out += "mx2nv card SRC DST --verify-report verify-report.json" + options + "\n";
  }
  return out + fmt::format("```\n\nWith mx2nv {}. SRC: {}; DST: this repository.\n\n", f.version, source_text);
}

std::string not_verified_section(const CardFacts& f) {
  std::string out = "## Not verified\n\n";
  if (f.gpu_log) {
    out += fmt::format("- No GPU has run this checkpoint. A GPU check of this output format ran (`scripts/gpu-check.sh` "
                       "of mx2nv {} on a generated one-layer checkpoint, not this one):\n\n```text\n{}\n```\n\n",
                       f.version, *f.gpu_log);
  } else {
    out += "- No GPU has run this checkpoint.\n";
  }
  out += "- The runtime verdicts are mx2nv gate's rules, read from the pinned releases' source; other versions are not "
         "judged and no runtime was run.";
  bool humming = false;
  for (const Verdict& v : f.gate->verdicts) {
    humming = humming || v.backend->backend == Backend::Humming;
    if (v.kind == Verdict::Unverified) {
      std::string reasons;
      for (const auto& r : texts(v.reasons)) reasons += (reasons.empty() ? "" : "; ") + code_span(r);
      out += fmt::format(" UNVERIFIED: {} {} {}{}.", runtime_of(v), backend_of(v), dtype_of(v),
                         reasons.empty() ? "" : " (" + reasons + ")");
    }
  }
  out += "\n";
  if (humming) out += "- vLLM's Humming path is judged for VLLM_HUMMING_USE_F16_ACCUM=0 (the default) only.\n";
  out += "- No accuracy evaluation was run on this checkpoint; the source card's evaluation results were not carried over.\n";
  if (!f.snapshot_rev.empty()) {
    out += fmt::format("- Whether SRC's files are revision {} of {}: mx2nv proves this checkpoint equals SRC, not that "
                       "SRC equals the Hub's revision.\n",
                       code_span(f.snapshot_rev), code_span(f.snapshot_repo));
  } else {
    out += "- Where the source checkpoint came from.\n";
  }
  if (f.source.present) out += "- The source card (README.source.md) is the source author's text.\n";
  if (f.kind == EvidenceKind::Requantize || !f.report->requantized.empty()) {
    out += "- The error table measures stored weights against the MXFP4 values, not model outputs.\n";
  }
  return out + "\n";
}

std::string license_section(const CardFacts& f) {
  const auto find = [&](const std::string& key) -> const std::string* {
    for (const auto& [k, v] : f.source.inherited) {
      if (k == key) return std::get_if<std::string>(&v);
    }
    return nullptr;
  };
  std::string out = "## License\n\n";
  if (const std::string* lic = find("license")) {
    std::vector<std::string> extra;
    for (const char* k : {"license_name", "license_link"}) {
      if (const std::string* v = find(k)) extra.push_back(*v);
    }
    out += "License: " + code_span(*lic) + (extra.empty() ? "" : " (" + joined_spans(extra) + ")") +
           ", inherited from the source's card.";
  } else {
    out += "The source's card declares no license mx2nv could read.";
  }
  out += " License files kept unchanged: ";
  if (f.license_files.empty()) {
    out += "none found.";
  } else {
    std::string files;
    for (const auto& name : f.license_files) {
      const bool safe = std::all_of(name.begin(), name.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '/' || c == '-';
      });
      files += (files.empty() ? "" : ", ") + (safe ? "[" + name + "](" + name + ")" : code_span(name));
    }
    out += files + ".";
  }
  if (f.source.present) out += " The source's card: [README.source.md](README.source.md).";
  return out + "\n";
}

}  // namespace

std::string render_gate_and_load(const CardFacts& f) { return gate_tables(f) + load_section(f); }

std::string render_trailer(const CardFacts& f) {
  std::string source_text;
  if (!f.snapshot_repo.empty()) {
    source_text = code_span(f.snapshot_repo) + " at revision " + code_span(f.snapshot_rev);
  } else if (!f.base_model.empty()) {
    source_text = code_span(f.base_model) + " (given with --base-model; revision unknown)";
  } else {
    source_text = "a local MXFP4 checkpoint";
  }
  return companion_section(f) + source_section(f) + made_section(f, source_text) + not_verified_section(f) +
         license_section(f);
}

}  // namespace mx2nv

// mx2nv gate: go/no-go, will vLLM / SGLang run this NVFP4A16 checkpoint
// exactly? gate's rule table, and the installed runtimes' own selectors.
#include "cli/standard_output.hpp"
#include "cli/shared_options.hpp"
#include "cli/subcommand.hpp"
#include "common/error.hpp"
#include "common/printable.hpp"
#include "gate/gate.hpp"

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <chrono>

namespace mx2nv::cli {
namespace {

// What a runtime's own selector answered, in words.
std::string said(const RuntimeOpinion& op) {
  switch (op.answer) {
    case RuntimeOpinion::Answer::NotInstalled: return "not installed there";
    case RuntimeOpinion::Answer::CouldNotAsk: return "could not ask: " + op.reason;
    case RuntimeOpinion::Answer::Refused: return "its selector refuses this config: " + op.reason;
    case RuntimeOpinion::Answer::Selected:
      return fmt::format("selects {} ({})", op.selected,
                         op.selects_nvfp4a16 ? "the NVFP4A16 MoE method" : "not the NVFP4A16 MoE method");
  }
  return {};
}

// What the runtimes' own selectors said, one line each (gate --ask-runtimes).
void print_runtime_checks(const GateResult& r) {
  if (!r.not_asked.empty()) {
    out("  runtimes' own selectors: not asked ({})\n", printable(r.not_asked));
    return;
  }
  out("  runtimes' own selectors (asked in {}{}, layer {}):\n", printable(r.asked.python),
      r.asked.python_version.empty() ? "" : fmt::format(", Python {}", printable(r.asked.python_version)),
      printable(r.expert_layer));
  for (const auto& c : r.checks) {
    const RuntimeOpinion& op = c.opinion;
    std::string who = std::string(choice_name(op.runtime)) + (op.version.empty() ? "" : " " + op.version);
    if (op.version_differs()) who += fmt::format(" (gate's rules were read from {})", op.pinned);
    out("    {:<22} {}\n", printable(who), printable(said(op)));
    if (c.agreement != Agreement::NoOpinion) {
      out("    {:<22} {} with gate's scheme rule ({} the NVFP4A16 MoE method)\n", "",
          agreement_name(c.agreement), c.gate_selects ? "which selects" : "which does not select");
    }
  }
}

int gate_and_print(const GateOptions& o, bool json) {
  const GateResult r = run_gate(o);
  if (json) {
    out("{}\n", dump_json(gate_to_json(r)));
    return r.exit_code();
  }
  out("mx2nv gate: {} ({}, hidden {}, intermediate {}, {} experts x {} MoE layers), TP {}{}\n",
      printable(r.checkpoint), r.architecture.empty() ? "no architectures" : printable(r.architecture),
      r.dims.hidden, r.dims.intermediate, r.dims.experts, r.dims.layers, o.tp,
      o.ep > 1 ? fmt::format(", EP {}", o.ep) : "");
  for (const auto& v : r.verdicts) {
    out("  {:<7} {:<8} {:<10} {}  {}\n", fmt::format("{} {}", choice_name(v.backend->runtime), v.backend->version),
        choice_name(v.backend->backend), verdict_name(v.kind), choice_name(v.dtype), v.backend->gpus);
    for (const auto& why : v.reasons) out("      - {}\n", printable(why));
  }
  // What one GPU holds, per runtime (the same for every backend and dtype of it).
  std::optional<Runtime> shown;
  for (const auto& v : r.verdicts) {
    if (v.backend->runtime == shown || v.share.problem) continue;
    shown = v.backend->runtime;
    out("  per GPU on {}: {} of {} experts a layer, inner dimension {}{}, {} of routed-expert weights\n",
        choice_name(v.backend->runtime), v.share.experts, r.dims.experts, v.share.intermediate,
        v.share.padded_intermediate != v.share.intermediate
            ? fmt::format(" (padded to {})", v.share.padded_intermediate) : "",
        human_bytes(static_cast<std::uint64_t>(v.share.bytes)));
  }
  print_runtime_checks(r);
  return r.exit_code();
}

class GateCommand final : public Subcommand {
 public:
  explicit GateCommand(CLI::App& mx2nv)
      : Subcommand(mx2nv, Command::Gate, "go/no-go: will vLLM / SGLang run this NVFP4A16 checkpoint exactly?") {
    app_->add_option("CHECKPOINT", options_.checkpoint, "NVFP4 checkpoint directory (compressed-tensors, or ModelOpt W4A16_NVFP4)")->required();
    add_choice_or_every(app_, "--runtime", options_.runtime, kEveryRuntime, "runtimes to judge");
    app_->add_option("--tp", options_.tp, "tensor-parallel degree, 1-1024")
        ->type_name("N")
        ->check(CLI::Range(1u, 1024u).description(""));
    app_->add_option("--ep", options_.ep,
                     "expert-parallel degree, 1-1024 (1: none); vLLM: its EP size (TP x DP with "
                     "--enable-expert-parallel), SGLang: --ep-size")
        ->type_name("N")
        ->check(CLI::Range(1u, 1024u).description(""));
    add_choice_or_every(app_, "--dtype", dtype_, kEveryDtype, "activation dtype");
    add_threads_option();
    app_->add_flag("--json", json_, "print JSON instead of a summary");
    app_->add_flag("--quick", options_.quick,
                   "read only config, headers and globals, not the block scales: their rules are not checked "
                   "(verdicts UNVERIFIED where they apply)");
    add_choice(app_, "--ask-runtimes", options_.ask.when, "the runtimes' own selectors");
    python_ = app_->add_option("--python", options_.ask.python,
                               "interpreter to ask the runtimes in (not with --ask-runtimes never)")
                   ->type_name("PATH")
                   ->default_str("python3 on PATH");
    timeout_ = app_->add_option("--ask-timeout", ask_timeout_,
                                "seconds the interpreter may take, 1-3600 (not with --ask-runtimes never)")
                   ->type_name("S")
                   ->check(CLI::Range(1u, 3600u).description(""));
  }

  int run(CommandRun&) override {
    // Options for asking the runtimes, given with --ask-runtimes never, could
    // only be ignored: refused instead.
    if (options_.ask.when == AskRuntimes::Never) {
      for (const CLI::Option* o : {python_, timeout_}) {
        if (o->count() > 0) {
          fail(ErrorKind::Usage, "gate {}: does not apply with --ask-runtimes never (nothing is asked)", o->get_name());
        }
      }
    }
    options_.threads = threads_;
    options_.ask.timeout = std::chrono::seconds(ask_timeout_);
    if (dtype_) options_.dtypes = {*dtype_};
    return gate_and_print(options_, json_);
  }

 private:
  GateOptions options_;
  std::optional<ActivationDtype> dtype_;  // nullopt: both
  unsigned ask_timeout_ = 120;
  bool json_ = false;
  CLI::Option* python_ = nullptr;
  CLI::Option* timeout_ = nullptr;
};

}  // namespace

std::unique_ptr<Subcommand> add_gate(CLI::App& mx2nv) { return std::make_unique<GateCommand>(mx2nv); }

}  // namespace mx2nv::cli

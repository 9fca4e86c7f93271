// mx2nv inspect: the dry run. Spans, the predicted outcome under both
// windows, what each --overspan choice would cost, sizes, the TP degrees the
// runtimes would take.
#include "cli/standard_output.hpp"
#include "cli/shared_options.hpp"
#include "cli/subcommand.hpp"
#include "cli/summary.hpp"
#include "common/printable.hpp"
#include "gate/gate.hpp"
#include "inspect/inspect.hpp"

#include <CLI/CLI.hpp>
#include <fmt/core.h>

namespace mx2nv::cli {
namespace {

void print_window_outcomes(const Inspection& in, Window selected) {
  for (const auto& o : in.outcomes) {
    out("  window {:<6} {}{}", window_name(o.window), o.refused ? "REFUSED" : "ok",
        o.window == selected ? "  (selected)" : "");
    out(", {} zero-group scales -> 0x00", o.canonicalised_zero_groups);
    if (o.marlin_zeroed_groups) {
      out(", {} active groups below 2^-6 (Marlin zeroes them)", o.marlin_zeroed_groups);
    }
    if (o.raised_globals) {
      out(", {} globals raised above k_max - 8 (fp16 room for routing weights)", o.raised_globals);
    }
    out("\n");
    print_over_span(o.over_span);
    print_global_conflicts(o.global_conflicts, o.unrepresentable_globals);
  }
}

// The selected window refuses: what each --overspan choice would cost.
void print_overspan_costs(const Inspection::OverSpanCost& c) {
  out("  --overspan fail        refused, nothing written\n");
  out("  --overspan bf16        exact; {} MoE layers as BF16, size {:+} bytes\n", c.bf16_layers.size(),
      c.bf16_size_change);
  for (const auto& l : c.bf16_layers) out("    {}: {} modules\n", printable(l.layer), l.modules.size());
  out("  --overspan requantize  LOSSY, same size; {} modules requantized:\n", c.requantized.size());
  for (const auto& m : c.requantized) {
    out("    {}: relative RMSE {:.6g}, cosine {:.9f}, max abs error {:.6g}\n", printable(m.module),
        m.relative_rmse, m.cosine, m.max_abs_error);
  }
}

// What each --format writes per module: the same bytes under other names.
void print_layouts() {
  for (const Choice<TargetFormat>& f : choices<TargetFormat>()) {
    const FormatNames& n = format_names(f.value);
    out("  {:<8} {}: M{} U8, M{} F8_E4M3, M{} F32 {} ({}){}\n", f.value == TargetFormat::CompressedTensors ? "layout" : "",
        f.name, n.packed, n.scale, n.global, Json(n.global_shape).dump(), n.global_is_divisor ? "divisor" : "multiplier",
        f.value == TargetFormat::ModelOpt ? ", hf_quant_config.json; same tensor bytes (--format modelopt)" : "");
  }
}

// Per TP degree, the runtime backends that would take the converted checkpoint.
void print_tp_table(const MoeDims& dims) {
  out("  TP       after conversion (hidden {}, intermediate {}):", dims.hidden, dims.intermediate);
  for (const Choice<TargetFormat>& f : choices<TargetFormat>()) {
    if (f.value != TargetFormat::CompressedTensors) out("\n           --format {}:", f.name);
    for (const unsigned tp : tp_degrees()) {
      std::string ok;
      for (const RuntimeBackend* b : runtime_backends(f.value)) {
        if (!dims_problem(*b, dims, tp)) {
          ok += fmt::format("{}{}-{}", ok.empty() ? "" : ",", choice_name(b->runtime), choice_name(b->backend));
        }
      }
      out(" {}:{}", tp, ok.empty() ? "none" : ok);
    }
  }
  out("\n");
}

int run_inspect(const fs::path& src, Window window, bool json, unsigned threads,
                const std::optional<ReportFile>& html) {
  const Inspection in = inspect_checkpoint(src, window, threads);
  write_html(html, in.report, &in, threads);
  if (json) {
    out("{}\n", dump_json(inspection_to_json(in)));
    return in.report.exit_code();
  }
  const Report& r = in.report;
  out("mx2nv inspect: {} ({} packed groups probed, {} modules read in full)\n", printable(r.provenance.source),
      in.probes, in.fully_scanned_modules);
  print_counts(r);
  print_layouts();
  out("  span     widest active-exponent span {} (k_max of the shared global - k_min)\n", in.max_span);
  print_window_outcomes(in, window);
  if (in.overspan) print_overspan_costs(*in.overspan);
  if (in.moe_dims) print_tp_table(*in.moe_dims);
  return in.report.exit_code();
}

class InspectCommand final : public Subcommand {
 public:
  explicit InspectCommand(CLI::App& mx2nv)
      : Subcommand(mx2nv, Command::Inspect, "dry run: spans, predicted outcome under both windows, sizes") {
    add_source("source checkpoint directory", true);
    add_window_option();
    add_threads_option();
    app_->add_flag("--json", json_, "print JSON instead of a summary");
    add_html_option();
  }

  int run(CommandRun& state) override {
    begin(state);
    return run_inspect(source_, window_, json_, threads_, state.outputs.html);
  }

 private:
  bool json_ = false;
};

}  // namespace

std::unique_ptr<Subcommand> add_inspect(CLI::App& mx2nv) { return std::make_unique<InspectCommand>(mx2nv); }

}  // namespace mx2nv::cli

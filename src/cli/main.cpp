// The mx2nv command line: argument parsing, human summaries on stdout, errors
// on stderr, JSON reports, exit codes. All work happens in the libraries.
#include "cli/progress_line.hpp"
#include "core/error.hpp"
#include "core/printable.hpp"
#include "core/report.hpp"
#include "core/report_merge.hpp"
#include "fixture/fixture.hpp"
#include "io/cancel.hpp"
#include "io/checkpoint_reader.hpp"
#include "io/convert.hpp"
#include "io/distributed.hpp"
#include "core/overspan.hpp"
#include "io/gate.hpp"
#include "io/inspect.hpp"
#include "io/report_file.hpp"
#include "io/requantize.hpp"
#include "io/verify.hpp"
#include "render/html_report.hpp"

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <csignal>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

namespace fs = std::filesystem;
using namespace mx2nv;

namespace {

void write_report(const std::optional<ReportFile>& file, const Report& report) {
  if (!file) return;
  std::fflush(stdout);  // the summary first, when the report goes to /dev/stdout too
  file->write(dump_json(report_to_json(report)) + "\n");
}

void print_over_span(const std::vector<OverSpan>& over, std::FILE* stream) {
  for (const auto& o : over) {
    fmt::print(stream, "  over span: {}: span {} > {}, {} active groups outside the window\n", printable(o.module), o.span,
               o.limit, o.groups_outside);
  }
}

void print_global_conflicts(const std::vector<GlobalConflict>& conflicts, const std::vector<std::string>& names) {
  for (const auto& c : conflicts) {
    fmt::print("  global range: {}: block scales need a global exponent in [{}, {}], the window allows [{}, {}]\n",
               printable(c.scale_group), c.needed_min, c.needed_max, c.allowed_min, c.allowed_max);
  }
  for (const auto& name : names) {
    const bool explained = std::any_of(conflicts.begin(), conflicts.end(), [&](const auto& c) { return c.scale_group == name; });
    if (!explained) fmt::print("  global scale of {} is not a normal FP32 number\n", printable(name));
  }
}

void print_counts(const Report& r) {
  fmt::print("  source   {}{}\n", printable(r.provenance.source),
             r.provenance.revision ? fmt::format(" (revision {})", printable(*r.provenance.revision)) : "");
  if (!r.provenance.target.empty()) fmt::print("  target   {}\n", printable(r.provenance.target));
  fmt::print("  modules  {} quantized modules, {} global scales (gate/up pairs share one), {} shards\n", r.modules,
             r.scale_groups, r.shards);
  fmt::print("  copied   {} pass-through tensors, {} companion files, byte for byte\n", r.passthrough_tensors,
             r.companion_files);
  if (r.active_groups + r.zero_groups > 0) {
    fmt::print("  groups   {} active, {} all-zero", r.active_groups, r.zero_groups);
    if (r.command == "convert") fmt::print(" ({} zero-group scales canonicalised to 0x00)", r.canonicalised_zero_groups);
    fmt::print("\n");
  }
  fmt::print("  size     {} -> {} tensor bytes ({:+.2f}%)\n", human_bytes(r.source_tensor_bytes),
             human_bytes(r.target_tensor_bytes), r.size_change_percent());
  if (!r.copy_mode.empty()) {
    fmt::print("  output   {} shared with SRC, {} copied, {} written (--copy {})\n", human_bytes(r.shared_bytes),
               human_bytes(r.copied_bytes), human_bytes(r.written_bytes), r.copy_mode);
  }
}

// --html FILE: the same path rules as --report (io/report_file.hpp).
void write_html(const std::optional<ReportFile>& file, const Report& report, const Inspection* inspection,
                unsigned threads) {
  if (file) file->write(render_html_for(report, inspection, threads));
}

int finish(const Report& r, const std::optional<ReportFile>& report_file,
           const std::optional<ReportFile>& html_file = std::nullopt, unsigned threads = 1) {
  write_report(report_file, r);
  write_html(html_file, r, nullptr, threads);
  return r.exit_code();
}

// What --overspan did: every lossy module with its measured error, every BF16 layer with why and its size cost.
void print_overspan(const Report& r) {
  for (const auto& m : r.requantized) {
    fmt::print("  LOSSY    {} requantized: relative RMSE {:.6g}, cosine {:.9f}, max abs error {:.6g}{}\n",
               printable(m.module), m.relative_rmse, m.cosine, m.max_abs_error,
               m.marlin_zeroed_blocks ? fmt::format(", {} block scales below 2^-6 (Marlin zeroes them)",
                                                    m.marlin_zeroed_blocks)
                                      : std::string());
  }
  for (const auto& l : r.bf16_layers) {
    std::string why;
    for (const auto& m : l.refused) why += (why.empty() ? "" : ", ") + printable(m);
    fmt::print("  BF16     {}: {} modules written as BF16 weight (exact), +{} bytes; over the window: {}\n",
               printable(l.layer), l.modules.size(), l.bf16_bytes - l.nvfp4_bytes, why.empty() ? "-" : why);
  }
}

int run_convert(const ConvertOptions& o, const std::optional<ReportFile>& report_path,
                const std::optional<ReportFile>& html = std::nullopt) {
  const Report r = convert_checkpoint(o);
  if (r.already_complete) {
    fmt::print("mx2nv convert: already complete: {} holds this conversion of {} (checked from its records; nothing "
               "was written)\n",
               printable(o.target.string()), printable(o.source.string()));
    print_counts(r);
    return finish(r, report_path, html, o.threads);
  }
  if (r.result == Outcome::Refused) {
    fmt::print("mx2nv convert: refused under window {} (span limit {}); nothing was written to {}\n",
               window_name(o.window), window_limits(o.window).max_span(), printable(o.target.string()));
    print_over_span(r.over_span, stdout);
    print_global_conflicts(r.global_conflicts, r.unrepresentable_globals);
    if (o.window == Window::Marlin) {
      fmt::print("  --window e4m3 allows spans up to 17 (exact on disk, but vLLM's Marlin path zeroes block scales "
                 "below 2^-6); run `mx2nv inspect` for both outcomes.\n");
    }
    fmt::print("  --overspan bf16 writes the affected MoE layers as BF16 (exact, larger); --overspan requantize "
               "requantizes only these modules (lossy, measured); `mx2nv inspect` shows both costs.\n");
    return finish(r, report_path, html, o.threads);
  }
  fmt::print("mx2nv convert: ok, window {}, {:.2f} s\n", window_name(o.window), r.seconds);
  print_counts(r);
  print_overspan(r);
  if (o.resume) fmt::print("  resumed  {} of {} shards reused from the interrupted run\n", r.resumed_shards, r.shards);
  if (r.marlin_zeroed_groups > 0) {
    fmt::print("  warning  {} active groups have block scales below 2^-6: exact on disk, zeroed by vLLM's Marlin path\n",
               r.marlin_zeroed_groups);
  }
  fmt::print("  next     mx2nv verify {} {}\n", printable(o.source.string()), printable(o.target.string()));
  return finish(r, report_path, html, o.threads);
}

int run_verify(const VerifyOptions& o, const std::optional<ReportFile>& report_path,
               const std::optional<ReportFile>& html = std::nullopt) {
  const Report r = verify_checkpoint(o);
  if (r.result == Outcome::Ok) {
    if (r.requantized.empty()) {
      fmt::print("mx2nv verify: ok, every value identical ({} values, max abs error 0), window {}, {:.2f} s\n",
                 r.values_compared, window_name(o.window), r.seconds);
    } else {
      fmt::print("mx2nv verify: ok, LOSSY modules equal the documented requantization bit for bit, every other value "
                 "identical ({} values), window {}, {:.2f} s\n",
                 r.values_compared, window_name(o.window), r.seconds);
    }
    print_counts(r);
    print_overspan(r);
  } else {
    fmt::print("mx2nv verify: MISMATCH: {} value mismatches, {} differences\n", r.mismatches, r.differences.size());
    for (const auto& d : r.differences) fmt::print(stderr, "mx2nv verify: {}\n", printable(d));
  }
  return finish(r, report_path, html, o.threads);
}

int run_plan(const PlanOptions& o, const std::optional<ReportFile>& report_path) {
  fs::path written;
  const Report r = plan_checkpoint(o, written);
  if (r.result == Outcome::Refused) {
    fmt::print("mx2nv plan: refused under window {}; no plan written\n", window_name(o.window));
    print_over_span(r.over_span, stdout);
    return finish(r, report_path);
  }
  if (r.already_complete) {
    fmt::print("mx2nv plan: already complete: {} holds this conversion of {}\n", printable(o.target.string()),
               printable(o.source.string()));
    return finish(r, report_path);
  }
  fmt::print("mx2nv plan: ok, window {}, {} shards, plan in {}\n", window_name(o.window), r.shards,
             printable(written.string()));
  print_overspan(r);
  fmt::print("  next     mx2nv convert --plan {} --shards I/N    (for I in 0..N-1, anywhere, in any order)\n",
             printable(written.string()));
  fmt::print("  then     mx2nv convert --plan {} --finalize\n", printable(written.string()));
  return finish(r, report_path);
}

int run_planned(const PlannedOptions& o, const std::optional<ShardSelection>& selection,
                const std::optional<ReportFile>& report_path, const std::optional<ReportFile>& html) {
  const Report r = selection ? convert_planned_shards(o, *selection) : finalize_planned(o);
  if (r.already_complete) {
    fmt::print("mx2nv convert: already complete: {} holds the finished conversion\n", printable(r.provenance.target));
  } else if (selection) {
    fmt::print("mx2nv convert: ok, {} shards ({} already done), {:.2f} s\n", r.shards, r.resumed_shards, r.seconds);
  } else {
    fmt::print("mx2nv convert: finalized, {:.2f} s\n", r.seconds);
    print_counts(r);
  }
  return finish(r, report_path, html, o.threads);
}

// How a failed command is told on stderr (the one format of every error).
void print_error(const Error& e) { fmt::print(stderr, "mx2nv: {}: {}\n", kind_name(e.kind()), printable(e.what())); }

// verify --merge (core/report_merge.hpp): the parts are input. The report
// may go anywhere but into the SRC and DST the parts name (as recorded, as
// they resolve now, and as they resolved when each part was verified: a
// symlink re-pointed since protects nothing) and never over a part. The
// path is resolved (a FIFO opened) before the parts are read, and checked
// once they are, before anything is printed or written. A failed merge
// writes its error report only where every part's SRC and DST are known, so
// the same check can be made.
int run_merge(const std::vector<std::string>& parts, const std::string& report_path) {
  const std::vector<fs::path> paths(parts.begin(), parts.end());
  std::optional<ReportFile> file;
  if (!report_path.empty()) {
    file.emplace(report_path, "--report");  // a directory, a missing folder: exit 2 now
    file->require_directory();
  }
  const auto check_file = [&](const VerifyReportMerger& merger) {
    std::vector<fs::path> trees;
    for (const auto& t : merger.named_trees()) trees.emplace_back(t);
    std::vector<std::pair<fs::path, std::string>> inputs;
    for (const auto& part : paths) inputs.emplace_back(part, fmt::format("{}, a part this merge reads", part.string()));
    file->check(protect_paths(trees, inputs));
  };
  VerifyReportMerger merger(parts.size());
  Json merged;
  try {
    check_distinct_inputs(paths, "--merge");
    for (const auto& part : parts) {
      std::string text;
      try {
        text = read_text_file(part, kMaxMergePartBytes);
      } catch (const Error& e) {
        rethrow_with_context(e, "--merge");
      }
      merger.add(part, text);
    }
    merged = merger.finish();
  } catch (...) {
    const Error e = current_exception_as_error();
    print_error(e);
    if (file) {
      try {
        if (!merger.all_parts_named() || !merger.window()) {
          fail(ErrorKind::Usage, "the parts do not all name their SRC and DST, which the report must stay out of");
        }
        check_file(merger);
        Report r;
        r.command = "verify";
        r.window = *merger.window();
        r.provenance.source = merger.source();
        r.provenance.target = merger.target();
        r.set_error(e);
        std::fflush(stdout);
        file->write(dump_json(report_to_json(r)) + "\n");
      } catch (...) {
        const Error again = current_exception_as_error();
        fmt::print(stderr, "mx2nv: no report written: {}\n", printable(again.what()));
      }
    }
    return exit_code(e.kind());
  }
  if (file) check_file(merger);

  const std::string result = merged["result"].get<std::string>();
  const bool lossy = merged.contains("requantized");
  fmt::print("mx2nv verify: merged {} parts: {}, {} values compared, {} mismatches, {} differences\n", parts.size(),
             result == "ok"         ? (lossy ? "ok, LOSSY modules equal the documented requantization bit for bit, "
                                               "every other value identical"
                                             : "ok, every value identical")
             : result == "mismatch" ? "MISMATCH"
                                    : "ERROR",
             merged["values_compared"].get<std::uint64_t>(), merged["mismatches"].get<std::uint64_t>(),
             merged["differences"].size());
  if (result == "error") {
    fmt::print(stderr, "mx2nv verify: a part failed: {}: {}\n", printable(merged["error_kind"].get<std::string>()),
               printable(merged["error"].get<std::string>()));
  }
  for (const auto& d : merged["differences"]) fmt::print(stderr, "mx2nv verify: {}\n", printable(d.get<std::string>()));
  if (file) {
    std::fflush(stdout);
    file->write(dump_json(merged) + "\n");
  }
  return merged["exit_code"].get<int>();
}

int run_requantize(const RequantizeOptions& o, const std::optional<ReportFile>& report_path) {
  const Report r = requantize_checkpoint(o);
  fmt::print("mx2nv requantize: ok, LOSSY: {} modules requantized from decoded values ({} values), {:.2f} s\n",
             r.requantized.size(), r.values_compared, r.seconds);
  print_counts(r);
  double worst_rmse = 0, worst_cosine = 1;
  for (const auto& m : r.requantized) {
    worst_rmse = std::max(worst_rmse, m.relative_rmse);
    worst_cosine = std::min(worst_cosine, m.cosine);
  }
  fmt::print("  error    worst relative RMSE {:.6g}, worst cosine {:.9f}, max abs error {:.6g} (per module: --report)\n",
             worst_rmse, worst_cosine, r.max_abs_error);
  return finish(r, report_path);
}

int run_inspect(const fs::path& src, Window window, bool json, unsigned threads,
                const std::optional<ReportFile>& html) {
  const Inspection in = inspect_checkpoint(src, window, threads);
  write_html(html, in.report, &in, threads);
  if (json) {
    fmt::print("{}\n", dump_json(inspection_to_json(in)));
  } else {
    const Report& r = in.report;
    fmt::print("mx2nv inspect: {} ({} packed groups probed, {} modules read in full)\n", printable(r.provenance.source),
               in.probes, in.fully_scanned_modules);
    print_counts(r);
    fmt::print("  span     widest active-exponent span {} (k_max of the shared global - k_min)\n", in.max_span);
    for (const auto& o : in.outcomes) {
      fmt::print("  window {:<6} {}{}", window_name(o.window), o.refused ? "REFUSED" : "ok",
                 o.window == window ? "  (selected)" : "");
      fmt::print(", {} zero-group scales -> 0x00", o.canonicalised_zero_groups);
      if (o.marlin_zeroed_groups) fmt::print(", {} active groups below 2^-6 (Marlin zeroes them)", o.marlin_zeroed_groups);
      if (o.raised_globals) fmt::print(", {} globals raised above k_max - 8 (fp16 room for routing weights)", o.raised_globals);
      fmt::print("\n");
      print_over_span(o.over_span, stdout);
      print_global_conflicts(o.global_conflicts, o.unrepresentable_globals);
    }
    if (in.overspan) {  // the selected window refuses: what each --overspan choice would cost
      const auto& c = *in.overspan;
      fmt::print("  --overspan fail        refused, nothing written\n");
      fmt::print("  --overspan bf16        exact; {} MoE layers as BF16, size {:+} bytes\n", c.bf16_layers.size(),
                 c.bf16_size_change);
      for (const auto& l : c.bf16_layers) fmt::print("    {}: {} modules\n", printable(l.layer), l.modules.size());
      fmt::print("  --overspan requantize  LOSSY, same size; {} modules requantized:\n", c.requantized.size());
      for (const auto& m : c.requantized) {
        fmt::print("    {}: relative RMSE {:.6g}, cosine {:.9f}, max abs error {:.6g}\n", printable(m.module),
                   m.relative_rmse, m.cosine, m.max_abs_error);
      }
    }
    if (in.moe_dims) {
      fmt::print("  TP       after conversion (hidden {}, intermediate {}):", in.moe_dims->hidden, in.moe_dims->intermediate);
      for (const unsigned tp : tp_degrees()) {
        std::string ok;
        for (const auto& b : runtime_backends()) {
          if (!dims_problem(b, *in.moe_dims, tp)) ok += fmt::format("{}{}-{}", ok.empty() ? "" : ",", b.runtime, b.backend);
        }
        fmt::print(" {}:{}", tp, ok.empty() ? "none" : ok);
      }
      fmt::print("\n");
    }
  }
  return in.report.exit_code();
}

// What the runtimes' own selectors said, one line each (gate --ask-runtimes).
void print_runtime_checks(const GateResult& r) {
  if (!r.not_asked.empty()) {
    fmt::print("  runtimes' own selectors: not asked ({})\n", printable(r.not_asked));
    return;
  }
  fmt::print("  runtimes' own selectors (asked in {}{}, layer {}):\n", printable(r.asked.python),
             r.asked.python_version.empty() ? "" : fmt::format(", Python {}", printable(r.asked.python_version)),
             printable(r.expert_layer));
  for (const auto& c : r.checks) {
    const RuntimeOpinion& op = c.opinion;
    std::string who = op.runtime + (op.version.empty() ? "" : " " + op.version);
    if (op.version_differs()) who += fmt::format(" (gate's rules were read from {})", op.pinned);
    std::string said;
    switch (op.outcome) {
      case RuntimeOpinion::Outcome::NotInstalled: said = "not installed there"; break;
      case RuntimeOpinion::Outcome::CouldNotAsk: said = "could not ask: " + op.reason; break;
      case RuntimeOpinion::Outcome::Refused: said = "its selector refuses this config: " + op.reason; break;
      case RuntimeOpinion::Outcome::Selected:
        said = fmt::format("selects {} ({})", op.selected,
                           op.selects_nvfp4a16 ? "the NVFP4A16 MoE method" : "not the NVFP4A16 MoE method");
        break;
    }
    fmt::print("    {:<22} {}\n", printable(who), printable(said));
    if (c.agreement != Agreement::NoOpinion) {
      fmt::print("    {:<22} {} with gate's scheme rule ({} the NVFP4A16 MoE method)\n", "",
                 agreement_name(c.agreement), c.gate_selects ? "which selects" : "which does not select");
    }
  }
}

int run_gate(const GateOptions& o, bool json) {
  const GateResult r = run_gate(o);
  if (json) {
    fmt::print("{}\n", dump_json(gate_to_json(r)));
  } else {
    fmt::print("mx2nv gate: {} (hidden {}, intermediate {}, {} experts x {} MoE layers), TP {}\n",
               printable(r.checkpoint), r.dims.hidden, r.dims.intermediate, r.dims.experts, r.dims.layers, o.tp);
    for (const auto& v : r.verdicts) {
      fmt::print("  {:<7} {:<8} {:<7} {}  {}\n", fmt::format("{} {}", v.backend->runtime, v.backend->version),
                 v.backend->backend, verdict_name(v.kind), activation_dtype_name(v.dtype), v.backend->gpus);
      for (const auto& why : v.reasons) fmt::print("      - {}\n", printable(why));
    }
    print_runtime_checks(r);
  }
  return r.exit_code();
}

int run_demo(const fs::path& dir, unsigned threads) {
  const fs::path marker = dir / ".mx2nv-demo";
  std::error_code ec;
  if (fs::exists(fs::symlink_status(dir)) && !fs::is_directory(dir)) {
    fail(ErrorKind::Usage, "{} exists and is not a directory", printable(dir.string()));
  }
  if (fs::exists(dir) && !fs::is_empty(dir)) {
    if (!fs::exists(marker)) {
      fail(ErrorKind::Usage, "{} exists, is not empty and is not an mx2nv demo directory", printable(dir.string()));
    }
    fs::remove_all(dir / "mxfp4", ec);
    fs::remove_all(dir / "nvfp4", ec);
  }
  fs::create_directories(dir);
  std::ofstream(marker) << "created by mx2nv demo; safe to delete\n";
  FixtureSpec spec;
  spec.layout = FixtureLayout::K3;
  spec.layers = 2;
  spec.experts = 8;
  spec.hidden = 512;
  spec.intermediate = 256;
  spec.shards = 4;
  write_fixture(dir / "mxfp4", spec);
  fmt::print("mx2nv demo: wrote a K3-shaped MXFP4 checkpoint to {}\n\n", printable((dir / "mxfp4").string()));

  const ConvertOptions c{dir / "mxfp4", dir / "nvfp4", Window::Marlin, threads, false};
  const int rc = run_convert(c, ReportFile(dir / "convert-report.json", {c.source, c.target}),
                             ReportFile(dir / "convert-report.html", {c.source, c.target}, "--html"));
  if (rc != kExitOk) return rc;
  fmt::print("\n");
  const int vrc =
      run_verify({c.source, c.target, Window::Marlin, threads, std::nullopt},
                 ReportFile(dir / "verify-report.json", {c.source, c.target}));
  if (vrc == kExitOk) {
    fmt::print("\nmx2nv demo: done. Reports: {}, {}, {}\n", printable((dir / "convert-report.json").string()),
               printable((dir / "convert-report.html").string()), printable((dir / "verify-report.json").string()));
  }
  return vrc;
}

// MODULE=VALUE with an integer VALUE (generate --set-span, --set-k-max).
std::pair<std::string, int> module_value(const std::string& kv, const char* option) {
  const auto eq = kv.rfind('=');
  if (eq == std::string::npos || eq == 0) fail(ErrorKind::Usage, "{}: expected MODULE=VALUE, got {}", option, printable(kv));
  const std::string_view text = std::string_view(kv).substr(eq + 1);
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
    fail(ErrorKind::Usage, "{}: {} is not an integer (in {})", option, printable(text), printable(kv));
  }
  return {kv.substr(0, eq), value};
}

}  // namespace

int main(int argc, char** argv) {
  // SIGINT/SIGTERM unwind through the library's cleanup (temporary files
  // removed, finished shards kept for --resume) instead of dying mid-write.
  struct sigaction stop {};
  stop.sa_handler = [](int signal_number) { request_stop(signal_number); };
  sigemptyset(&stop.sa_mask);
  sigaction(SIGINT, &stop, nullptr);
  sigaction(SIGTERM, &stop, nullptr);
  CLI::App app{"mx2nv: lossless MXFP4 -> NVFP4A16 transcoder for compressed-tensors MoE checkpoints"};
  app.set_version_flag("--version", std::string("mx2nv ") + MX2NV_VERSION);
  app.require_subcommand(1);
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());

  std::string src, dst, report_path, html_path, demo_dir = "mx2nv-demo", progress_text = "auto";
  Window window = windows().front().window;
  unsigned threads = hw;
  bool json = false;
  // --window: names, values and help text all come from the one window table.
  std::map<std::string, Window> window_names;
  std::string window_help = "block-scale window:";
  for (const auto& w : windows()) {
    window_names.emplace(std::string(w.name), w.window);
    window_help += fmt::format(" {}: {};", w.name, w.summary);
  }
  const auto add_window = [&](CLI::App* sub) {
    return sub->add_option("--window", window, window_help)
        ->transform(CLI::CheckedTransformer(window_names, CLI::ignore_case));
  };
  const auto add_html = [&](CLI::App* sub) {
    return sub->add_option("--html", html_path,
                           "write a self-contained HTML report (span heatmap, refusals, size, provenance) to this file "
                           "(the same rules as --report)");
  };
  const auto add_progress = [&](CLI::App* sub) {
    sub->add_option("--progress", progress_text,
                    "auto: a live line on stderr when it is a terminal (default); always; never; json: one JSON "
                    "object per update on stderr")
        ->check(CLI::IsMember({"auto", "always", "never", "json"}));
  };
  const auto add_threads = [&](CLI::App* sub) {
    sub->add_option("--threads", threads, "worker threads (default: all cores)")->check(CLI::Range(1u, 1024u));
  };
  const auto add_report = [&](CLI::App* sub) {
    return sub->add_option("--report", report_path,
                           "write a JSON report to this file (checked before any work against the SRC and DST the "
                           "command uses, with --plan the plan's: never inside them; /dev/stdout and other special "
                           "files are written through)");
  };

  auto* convert = app.add_subcommand("convert", "transcode SRC (MXFP4) into an empty DST (NVFP4A16)");
  convert->add_option("SRC", src, "source checkpoint directory (with --plan: default the plan's)");
  convert->add_option("DST", dst, "target directory (created; must be empty) (with --plan: default the plan's)");
  std::string plan_path, shard_text, shards_text;
  bool finalize = false;
  auto* plan_opt = convert->add_option("--plan", plan_path, "run steps of a plan made by `mx2nv plan` (see --shard, --shards, --finalize)");
  auto* shard_opt = convert->add_option("--shard", shard_text, "with --plan: convert shard I only")->needs(plan_opt);
  auto* shards_opt = convert->add_option("--shards", shards_text, "with --plan: convert shards I, I+N, I+2N, ... (I/N)")
                         ->needs(plan_opt)->excludes(shard_opt);
  convert->add_flag("--finalize", finalize,
                    "with --plan: check every shard is finished, then write companions, config and the index last")
      ->needs(plan_opt)->excludes(shard_opt)->excludes(shards_opt);
  auto* convert_window = add_window(convert);
  add_threads(convert);
  auto* convert_report = add_report(convert);
  bool resume = false;
  std::string copy_text = "auto";
  convert->add_option("--copy", copy_text,
                      "how unchanged bytes reach DST: auto (share with SRC where the file system can, else "
                      "copy_file_range, else read/write), reflink (share or fail with exit 2 before writing), copy "
                      "(read and write every byte, never share)")
      ->check(CLI::IsMember({"auto", "reflink", "copy"}));
  std::string overspan_text = "fail";
  const auto add_overspan = [&](CLI::App* sub) {
    return sub
        ->add_option("--overspan", overspan_text,
                     "scale groups the window refuses: fail (default: refuse, write nothing), bf16 (every expert of "
                     "an affected MoE layer written as an exact BF16 weight and listed in the config's ignore; "
                     "larger) or requantize (LOSSY: only those modules, a gate/up pair together, requantized from "
                     "decoded values as compressed-tensors would; per-module error in the report); with --plan: "
                     "checked against the plan's")
        ->check(CLI::IsMember({"fail", "bf16", "requantize"}));
  };
  auto* convert_overspan = add_overspan(convert);
  convert->add_flag("--resume", resume,
                    "continue an interrupted conversion into DST (finished shards whose records still match are "
                    "reused, everything else is redone); on a DST that already holds this conversion, exit 0 "
                    "without writing. Safe to repeat. A DST holding a plan (continue it with --plan) or another "
                    "conversion (other options, another SRC or mx2nv) is refused");
  auto* convert_html = add_html(convert);
  add_progress(convert);

  auto* verify = app.add_subcommand("verify", "prove every value of DST equals the value in SRC");
  verify->add_option("SRC", src, "source checkpoint directory");
  verify->add_option("DST", dst, "converted checkpoint directory");
  std::string verify_shards;
  std::vector<std::string> merge_parts;
  auto* verify_shards_opt = verify->add_option("--shards", verify_shards,
                                               "verify shards I, I+N, ... only (I/N) and write a partial report");
  verify->add_option("--merge", merge_parts, "join the partial reports of verify --shards I/N into one")
      ->excludes(verify_shards_opt)->expected(1, -1);
  add_window(verify);
  add_threads(verify);
  auto* verify_report = add_report(verify);
  auto* verify_html = add_html(verify);
  add_progress(verify);

  PlanOptions plan_options;
  std::string plan_out;
  auto* plan = app.add_subcommand("plan", "plan a conversion once for many processes or machines: refusals happen here");
  plan->add_option("SRC", src, "source checkpoint directory")->required();
  plan->add_option("DST", dst, "target directory")->required();
  auto* plan_out_opt = plan->add_option("--plan-out", plan_out, "write the plan here instead of DST/.mx2nv/plan.json");
  add_overspan(plan);
  add_window(plan);
  add_threads(plan);
  auto* plan_report = add_report(plan);

  auto* requantize = app.add_subcommand(
      "requantize", "LOSSY companion: requantize every expert of SRC from its decoded values into an empty DST, "
                    "as compressed-tensors' NVFP4 quantization would; per-module error table in the report");
  requantize->add_option("SRC", src, "source checkpoint directory")->required();
  requantize->add_option("DST", dst, "target directory (created; must be empty)")->required();
  add_threads(requantize);
  auto* requantize_report = add_report(requantize);

  auto* inspect = app.add_subcommand("inspect", "dry run: spans, predicted outcome under both windows, sizes");
  inspect->add_option("SRC", src, "source checkpoint directory")->required();
  add_window(inspect);
  add_threads(inspect);
  inspect->add_flag("--json", json, "print JSON instead of a summary");
  auto* inspect_html = add_html(inspect);

  GateOptions gate_options;
  std::string gate_dtype = "both";
  auto* gate = app.add_subcommand("gate", "go/no-go: will vLLM / SGLang run this NVFP4A16 checkpoint exactly?");
  gate->add_option("CHECKPOINT", gate_options.checkpoint, "compressed-tensors NVFP4 checkpoint directory")->required();
  gate->add_option("--runtime", gate_options.runtime, "vllm, sglang or all (default)")
      ->check(CLI::IsMember({"vllm", "sglang", "all"}));
  gate->add_option("--tp", gate_options.tp, "tensor-parallel degree (default 1)")->check(CLI::Range(1u, 1024u));
  gate->add_option("--dtype", gate_dtype, "activation dtype: fp16, bf16 or both (default)")
      ->check(CLI::IsMember({"fp16", "bf16", "both"}));
  add_threads(gate);
  gate->add_flag("--json", json, "print JSON instead of a summary");
  std::string gate_ask = "auto";
  unsigned gate_ask_timeout = 120;
  gate->add_option("--ask-runtimes", gate_ask,
                   "auto (default): also ask the vLLM/SGLang installed in --python which scheme their own code "
                   "selects; never: do not")
      ->check(CLI::IsMember({"auto", "never"}));
  auto* gate_python = gate->add_option("--python", gate_options.ask.python,
                                       "interpreter to ask the runtimes in (default python3 on PATH; not with "
                                       "--ask-runtimes never)");
  auto* gate_timeout = gate->add_option("--ask-timeout", gate_ask_timeout,
                                        "seconds the interpreter may take (default 120; not with --ask-runtimes never)")
                           ->check(CLI::Range(1u, 3600u));

  FixtureSpec gen;
  std::string gen_dir, gen_layout = "k3";
  std::vector<std::string> set_span, set_kmax, all_zero, nan_scale;
  auto* generate = app.add_subcommand("generate", "write a deterministic MXFP4 checkpoint (tests, benchmarks)");
  generate->add_option("DIR", gen_dir, "directory to create (absent or empty)")->required();
  generate->add_option("--layout", gen_layout, "k3 (block_sparse_moe w1/w2/w3, text_config) or flat (mlp gate/up/down_proj)")
      ->check(CLI::IsMember({"k3", "flat"}));
  generate->add_option("--layers", gen.layers, "decoder layers")->check(CLI::Range(1u, 4096u));
  generate->add_option("--experts", gen.experts, "routed experts per layer")->check(CLI::Range(1u, 4096u));
  generate->add_option("--hidden", gen.hidden, "hidden size (K of gate/up), multiple of 32");
  generate->add_option("--intermediate", gen.intermediate, "expert intermediate size (K of down), multiple of 32");
  generate->add_option("--shards", gen.shards, "shard files (1 writes model.safetensors)")->check(CLI::Range(1u, 100000u));
  generate->add_option("--k-max", gen.k_max, "exponent of each module's top active group");
  generate->add_option("--span", gen.span, "k_max - k_min of each module")->check(CLI::Range(0, 200));
  generate->add_option("--zero-percent", gen.zero_group_percent, "share of all-zero groups")->check(CLI::Range(0u, 100u));
  generate->add_option("--seed", gen.seed, "generator seed");
  std::string extreme = "on";
  generate->add_option("--extreme-zero-scales", extreme,
                       "on: a quarter of the all-zero groups carry scales far outside the window (byte 0 or k_max+20)")
      ->check(CLI::IsMember({"on", "off"}));
  generate->add_option("--set-span", set_span, "MODULE=SPAN for one module");
  generate->add_option("--set-k-max", set_kmax, "MODULE=K for one module");
  generate->add_option("--all-zero", all_zero, "MODULE whose codes are all +-0");
  generate->add_option("--nan-scale", nan_scale, "MODULE with one 0xFF scale");

  auto* demo = app.add_subcommand("demo", "write a small K3-shaped MXFP4 checkpoint, convert it, verify it");
  demo->add_option("DIR", demo_dir, "working directory (default: ./mx2nv-demo)");
  add_threads(demo);

  // CLI11's messages quote the arguments (a file name from a glob, say):
  // escaped like every other message.
  app.failure_message([](const CLI::App* a, const CLI::Error& e) {
    std::string out, line;
    std::istringstream lines(CLI::FailureMessage::simple(a, e));
    while (std::getline(lines, line)) out += printable(line) + "\n";
    return out;
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }

  std::optional<ReportFile> report_file, html_file;
  ProgressLine progress(parse_progress_mode(progress_text).value_or(ProgressMode::Auto), stderr);
  std::string verify_subset;  // verify --shards I/N, once parsed: the error report names its part too
  // The SRC and DST the command uses, for its output paths' checks and its
  // error report: the positional ones, or with --plan the plan's.
  fs::path used_src = src, used_dst = dst;
  try {
    // An option given an empty path is a usage error, never "not given".
    for (const auto& [opt, value] : {std::pair<CLI::Option*, const std::string*>{convert_report, &report_path},
                                     {verify_report, &report_path}, {plan_report, &report_path},
                                     {requantize_report, &report_path}, {convert_html, &html_path},
                                     {verify_html, &html_path}, {inspect_html, &html_path}, {plan_opt, &plan_path},
                                     {plan_out_opt, &plan_out}}) {
      if (opt->count() > 0 && value->empty()) fail(ErrorKind::Usage, "{}: empty path", opt->get_name());
    }
    if (*verify && !merge_parts.empty()) {
      // SRC, DST, window and how they were verified come from the parts; an
      // option that could only be ignored is refused.
      if (!src.empty() || !dst.empty()) {
        fail(ErrorKind::Usage, "verify --merge takes SRC and DST from the parts: give SRC DST or --merge, not both");
      }
      for (const char* option : {"--window", "--threads", "--html", "--progress"}) {
        if (verify->get_option(option)->count() > 0) {
          fail(ErrorKind::Usage, "verify --merge: {} does not apply (the parts were verified with their own)", option);
        }
      }
      return run_merge(merge_parts, report_path);
    }
    std::vector<fs::path> protected_trees{src, dst};
    std::vector<std::pair<fs::path, std::string>> inputs;  // files an output must not replace
    std::optional<PlannedOptions> planned_options;
    std::optional<ShardSelection> selection;
    if (*convert && plan_opt->count() > 0) {
      // Options a planned step does not use are refused, never ignored:
      // --resume (implied), --html on a shard step (a finalize writes the
      // conversion's page); --window and --overspan are checked against the
      // plan (io/distributed.hpp).
      if (resume) fail(ErrorKind::Usage, "--resume is implied with --plan");
      if (shard_text.empty() && shards_text.empty() && !finalize) {
        fail(ErrorKind::Usage, "--plan needs --shard I, --shards I/N or --finalize");
      }
      if (!finalize && convert_html->count() > 0) {
        fail(ErrorKind::Usage, "--html is for a whole conversion: give it to --finalize, not to a shard step");
      }
      if (!shards_text.empty()) selection = parse_shard_selection(shards_text);
      if (!shard_text.empty()) selection = parse_shard_index(shard_text);
      PlannedOptions po{plan_path, std::nullopt, std::nullopt, threads,
                        parse_copy_mode(copy_text).value_or(CopyMode::Auto), progress.callback(), std::nullopt,
                        std::nullopt};
      if (!src.empty()) po.source = src;
      if (!dst.empty()) po.target = dst;
      if (convert_window->count() > 0) po.window = window;
      if (convert_overspan->count() > 0) po.overspan = parse_overspan(overspan_text);
      // The plan's SRC and DST (read and checked as the step will), before
      // any output path is checked against them.
      std::vector<fs::path> outputs;
      if (!report_path.empty()) outputs.emplace_back(report_path);
      if (!html_path.empty()) outputs.emplace_back(html_path);
      const PlannedPaths paths = planned_paths(po, outputs);
      used_src = paths.source.value_or(fs::path());
      used_dst = paths.target.value_or(fs::path());
      protected_trees = {used_src, used_dst};
      inputs.emplace_back(plan_path, "the plan this step reads");
      planned_options = std::move(po);
    }
    if (*plan && !plan_out.empty()) inputs.emplace_back(plan_out, "where --plan-out writes the plan");
    // Where the reports go is checked before any work.
    CommandOutputs outputs =
        check_command_outputs(report_path.empty() ? std::nullopt : std::optional<fs::path>(report_path),
                              html_path.empty() ? std::nullopt : std::optional<fs::path>(html_path), protected_trees,
                              inputs);
    report_file = std::move(outputs.report);
    html_file = std::move(outputs.html);
    if (planned_options) return run_planned(*planned_options, selection, report_file, html_file);
    if ((*convert || *verify) && (src.empty() || dst.empty())) {
      fail(ErrorKind::Usage, "SRC and DST are required");
    }
    if (*convert) {
      return run_convert({src, dst, window, threads, resume, parse_copy_mode(copy_text).value_or(CopyMode::Auto),
                          parse_overspan(overspan_text).value_or(OverSpanChoice::Fail), progress.callback()},
                         report_file, html_file);
    }
    if (*verify) {
      if (!verify_shards.empty()) {
        selection = parse_shard_selection(verify_shards);
        verify_subset = fmt::format("{}/{}", selection->index, selection->stride);
      }
      return run_verify({src, dst, window, threads, selection, progress.callback()}, report_file, html_file);
    }
    if (*plan) {
      if (!plan_out.empty()) plan_options.plan_out = plan_out;
      plan_options.source = src;
      plan_options.target = dst;
      plan_options.window = window;
      plan_options.threads = threads;
      plan_options.overspan = parse_overspan(overspan_text).value_or(OverSpanChoice::Fail);
      return run_plan(plan_options, report_file);
    }
    if (*requantize) return run_requantize({src, dst, threads}, report_file);
    if (*inspect) return run_inspect(src, window, json, threads, html_file);
    if (*demo) return run_demo(demo_dir, threads);
    if (*gate) {
      // Options for asking the runtimes, given with --ask-runtimes never,
      // could only be ignored: refused instead.
      if (gate_ask == "never") {
        for (const CLI::Option* o : {gate_python, gate_timeout}) {
          if (o->count() > 0) {
            fail(ErrorKind::Usage, "gate {}: does not apply with --ask-runtimes never (nothing is asked)",
                 o->get_name());
          }
        }
      }
      gate_options.threads = threads;
      gate_options.ask.enabled = gate_ask == "auto";
      gate_options.ask.timeout = std::chrono::seconds(gate_ask_timeout);
      if (gate_dtype != "both") {
        gate_options.dtypes = {gate_dtype == "fp16" ? ActivationDtype::Fp16 : ActivationDtype::Bf16};
      }
      return run_gate(gate_options, json);
    }
    if (*generate) {
      gen.layout = gen_layout == "flat" ? FixtureLayout::Flat : FixtureLayout::K3;
      gen.out_of_window_zero_groups = extreme == "on";
      for (const auto& kv : set_span) {
        const auto [module, value] = module_value(kv, "--set-span");
        if (value < 0 || value > 200) fail(ErrorKind::Usage, "--set-span: {} is outside [0, 200]", value);
        gen.overrides[module].span = value;
      }
      for (const auto& kv : set_kmax) {
        const auto [module, value] = module_value(kv, "--set-k-max");
        gen.overrides[module].k_max = value;
      }
      for (const auto& m : all_zero) gen.overrides[m].all_zero = true;
      for (const auto& m : nan_scale) gen.overrides[m].nan_scale = true;
      const fs::path dir(gen_dir);
      if (fs::exists(fs::symlink_status(dir))) {
        if (!fs::is_directory(fs::symlink_status(dir))) {
          fail(ErrorKind::Usage, "{} exists and is not a directory", printable(gen_dir));
        }
        if (!fs::is_empty(dir)) fail(ErrorKind::Usage, "{} is not empty", printable(gen_dir));
      }
      write_fixture(dir, gen);
      fmt::print("mx2nv generate: wrote {}\n", printable(gen_dir));
      return kExitOk;
    }
  } catch (...) {
    progress.close();
    const Error e = current_exception_as_error();
    print_error(e);
    if ((report_file || html_file) && (*convert || *verify || *plan || *requantize || *inspect)) {
      // The error path's report is the success path's, with result "error".
      try {
        const fs::path target(used_dst);
        const char* command = convert->parsed()      ? "convert"
                              : plan->parsed()       ? "plan"
                              : requantize->parsed() ? "requantize"
                              : inspect->parsed()    ? "inspect"
                                                     : "verify";
        Report r = start_report(command, window, used_src, inspect->parsed() ? nullptr : &target);
        r.shard_subset = verify_subset;  // a failed part of verify --shards I/N is still part I/N for --merge
        if (!verify_subset.empty()) record_resolved_paths(r, used_src, used_dst);
        r.set_error(e);
        write_report(report_file, r);
        write_html(html_file, r, nullptr, threads);
      } catch (...) {
        const Error again = current_exception_as_error();
        fmt::print(stderr, "mx2nv: also failed to write the report: {}\n", printable(again.what()));
      }
    }
    return exit_code(e.kind());
  }
  return kExitUsage;
}

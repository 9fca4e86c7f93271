// render_html_for: what a command's page shows besides its report, gathered
// by reading SRC (inspect) and DST (gate); the rendering is pure
// (html_report.cpp).
#include "html/html_report.hpp"

#include "common/error.hpp"
#include "sys/heap.hpp"

#include <fmt/core.h>

#include <optional>

namespace mx2nv {

std::string render_html_for(const Report& report, const Inspection* inspection, unsigned threads) {
  // Gate first, then inspect: gate's module table is dropped before the
  // inspection's is built, so the two never peak together. The heap the
  // command and then gate freed goes back to the system before each.
  release_free_heap();
  std::optional<GateResult> gate;
  std::string gate_unavailable;
  const bool output_finished = (report.command == Command::Convert || report.command == Command::Verify) &&
                               report.result == Outcome::Ok && !report.provenance.target.empty();
  if (output_finished) {
    try {
      GateOptions options;
      options.checkpoint = report.provenance.target;
      options.threads = threads;
      options.ask.when = AskRuntimes::Never;  // the page shows gate's verdicts; asking a runtime may take a minute
      gate = run_gate(options);
    } catch (const Error& e) {
      gate_unavailable = fmt::format("mx2nv gate could not judge {}: {}.", report.provenance.target, e.what());
    }
  } else if (report.command == Command::Inspect) {
    gate_unavailable = "inspect reads the MXFP4 source; the runtimes' rules judge the NVFP4 output. Convert it and run "
                       "mx2nv gate on DST (or pass --html to convert or verify).";
  } else {
    gate_unavailable = "this command left no finished NVFP4 output to judge.";
  }
  std::optional<Inspection> inspected;
  std::string unavailable;
  release_free_heap();
  if (inspection == nullptr) {
    try {
      inspected = inspect_checkpoint(report.provenance.source, report.window, threads);
      inspection = &*inspected;
    } catch (const Error& e) {
      unavailable = e.what();
    }
  }
  return render_html_report({&report, inspection, unavailable, gate ? &*gate : nullptr, gate_unavailable});
}

}  // namespace mx2nv

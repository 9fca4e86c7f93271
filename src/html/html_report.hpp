// `--html FILE`: one self-contained page (inline CSS and SVG, no script, no
// network) from the data of a run: the report, every module's exponent span
// when SRC could be inspected, and gate's verdicts when there is a finished
// NVFP4 output. Shared by the CLI and the Python package, in two parts:
//   render_html_report  the page from data already gathered: pure, it reads
//                       and writes no files (html_report.cpp);
//   render_html_for     gathers that data for a finished command, reading
//                       SRC and DST (inspect, gate), then renders
//                       (page_inputs.cpp).
// Neither writes the page; the front ends do.
#pragma once

#include "gate/gate.hpp"
#include "inspect/inspect.hpp"
#include "report/report.hpp"

#include <optional>
#include <string>
#include <vector>

namespace mx2nv {

// How a module's span stands against the windows.
enum class SpanClass { AllZero, Fits, Constrained, Refused };
// Constrained: fits the selected window only with spans above the marlin
// window (exact on disk, but vLLM's Marlin path zeroes its smallest scales),
// or would be refused under marlin while e4m3 takes it.
SpanClass classify_span(const ModuleSummary& module, Window window);

struct HtmlReportInput {
  const Report* report = nullptr;           // required
  const Inspection* inspection = nullptr;   // module spans and both windows' outcomes, when available
  std::string spans_unavailable;            // why inspection is null (shown on the page)
  const GateResult* gate = nullptr;         // `mx2nv gate` on the NVFP4 output, when there is one
  std::string gate_unavailable;             // why gate is null (shown on the page)
};

// Pure: text from `input`, no file read or written.
std::string render_html_report(const HtmlReportInput& input);

// The page for a finished command. Without `inspection` (convert, verify),
// SRC is inspected for the module spans: one more pass over its headers and
// scales; if that fails the page says why and shows the rest. When the
// command leaves a finished NVFP4 DST (convert ok, verify ok), the runtime
// verdicts come from `mx2nv gate` on DST (all runtimes, TP 1, fp16 and bf16):
// one more pass over DST's headers and block scales.
std::string render_html_for(const Report& report, const Inspection* inspection, unsigned threads);

}  // namespace mx2nv

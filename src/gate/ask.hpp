// gate asking the installed runtimes themselves: runs the runtime probe
// (python/mx2nv/runtime_probe.py, compiled into this library) in a Python
// interpreter as `PYTHON -c PROBE --request -`, sends the checkpoint's
// quantization_config and one routed-expert layer's names on stdin, and reads
// each runtime's own selection (gate/opinion.hpp). Whatever goes wrong
// (no interpreter, no runtime, a crash, a hang, garbage) becomes a
// "could not ask" opinion; it never changes gate's verdicts.
#pragma once

#include "gate/opinion.hpp"
#include "json/strict_json.hpp"

#include <array>
#include <chrono>
#include <string>
#include <vector>

namespace mx2nv {

// gate --ask-runtimes: also ask the installed runtimes' own selectors?
enum class AskRuntimes { Auto, Never };
template <>
std::span<const Choice<AskRuntimes>> choices<AskRuntimes>();

struct AskOptions {
  AskRuntimes when = AskRuntimes::Auto;
  std::string python = "python3";  // looked up on PATH when it has no '/'
  std::chrono::seconds timeout{120};  // importing vLLM alone takes seconds to tens of seconds
};

struct AskResult {
  bool ran = false;            // the probe was started
  std::string python;          // the interpreter asked
  std::string python_version;  // as it reported itself ("" when it did not answer)
  std::vector<RuntimeOpinion> opinions;
};

// projections: the checkpoint's gate, up and down projection names (w1, w3,
// w2 or gate_proj, up_proj, down_proj); layer: the experts' prefix.
AskResult ask_runtimes(const AskOptions& options, const Json& quantization_config, const std::string& layer,
                       const std::array<std::string, 3>& projections, const std::vector<Runtime>& runtimes);

// The probe's source text, as compiled in (for tests and `--print-probe`-like uses).
std::string_view runtime_probe_source();

}  // namespace mx2nv

// What an installed runtime's own code selects for a checkpoint's routed
// experts (python/mx2nv/runtime_probe.py asks it; gate/ask.cpp runs
// the probe) and whether that agrees with gate's scheme rule
// (gate/rules.cpp). The probe's answer is untrusted text from
// another program: parsed strictly, every string capped.
#pragma once

#include "gate/runtime.hpp"
#include "json/strict_json.hpp"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mx2nv {

struct RuntimeOpinion {
  Runtime runtime = Runtime::Vllm;
  enum class Answer {
    NotInstalled,  // not importable in that interpreter: no opinion
    Selected,      // its selector chose `selected`
    Refused,       // its parser or selector raised on this config (reason)
    CouldNotAsk,   // import failed, probe failed, interpreter missing... (reason)
  } answer = Answer::CouldNotAsk;
  std::string version;      // installed release ("" when unknown)
  std::string pinned;       // the release gate's rules were read from
  std::string selected;     // "Class(arg=value, ...)" when Selected
  bool selects_nvfp4a16 = false;  // the selection is the NVFP4 weight-only MoE method
  std::string reason;

  bool version_differs() const { return !version.empty() && version != pinned; }
};
std::string_view answer_name(RuntimeOpinion::Answer a);

struct ProbeAnswer {
  std::string python_version;  // of the interpreter that answered
  std::vector<RuntimeOpinion> runtimes;
};

// The probe's stdout. Every runtime in `asked` gets an opinion (CouldNotAsk
// when the answer lacks it). Throws Error(InvalidInput) when the text is
// not the probe's protocol: not JSON, wrong types, an unknown runtime or
// outcome, a runtime twice.
ProbeAnswer parse_probe_answer(std::string_view text, const std::vector<Runtime>& asked);

// Every runtime in `asked`, CouldNotAsk with `reason` (interpreter missing,
// probe crashed or timed out).
std::vector<RuntimeOpinion> could_not_ask(const std::vector<Runtime>& asked, const std::string& reason);

// Whether the class a runtime's selector constructed (with its recorded
// keyword arguments) is its NVFP4 weight-only MoE method.
bool selects_nvfp4a16(Runtime runtime, std::string_view cls, const Json& args);

enum class Agreement { NoOpinion, Agrees, Disagrees };
std::string_view agreement_name(Agreement a);
// gate_selects: gate's scheme rule chose the NVFP4A16 method for this runtime.
Agreement agreement(const RuntimeOpinion& o, bool gate_selects);

}  // namespace mx2nv

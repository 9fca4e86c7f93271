#include "gate/ask.hpp"

#include "common/cancel.hpp"
#include "common/error.hpp"
#include "common/printable.hpp"
#include "runtime_probe_text.hpp"  // generated from python/mx2nv/runtime_probe.py (cmake/embed_text.cmake)
#include "sys/subprocess.hpp"

#include <fmt/format.h>

namespace mx2nv {
namespace {

// Linux caps one argument at 128 KiB (MAX_ARG_STRLEN); the probe goes as one.
static_assert(sizeof(kRuntimeProbeSource) < 128 * 1024);

// The last line of the probe's stderr, as a hint when it failed (a Python
// traceback ends with the exception).
std::string last_line(const std::string& err) {
  std::string_view s = err;
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.remove_suffix(1);
  const auto nl = s.rfind('\n');
  if (nl != std::string_view::npos) s.remove_prefix(nl + 1);
  if (s.size() > 300) s = s.substr(s.size() - 300);
  return std::string(s);
}

}  // namespace

namespace {
constexpr Choice<AskRuntimes> kAskRuntimes[] = {
    {AskRuntimes::Auto, "auto", "also ask the vLLM/SGLang installed in --python which scheme their own code selects"},
    {AskRuntimes::Never, "never", "do not"},
};
}  // namespace

template <>
std::span<const Choice<AskRuntimes>> choices<AskRuntimes>() {
  return kAskRuntimes;
}

std::string_view runtime_probe_source() { return {kRuntimeProbeSource, sizeof(kRuntimeProbeSource) - 1}; }

AskResult ask_runtimes(const AskOptions& options, const Json& quantization_config, const std::string& layer,
                       const std::array<std::string, 3>& projections, const std::vector<Runtime>& runtimes) {
  AskResult result;
  result.python = options.python;
  Json names = Json::array();
  for (const Runtime r : runtimes) names.push_back(choice_name(r));
  const Json request = {{"quantization_config", quantization_config},
                        {"layer", layer},
                        {"projections", Json::array({projections[0], projections[1], projections[2]})},
                        {"runtimes", std::move(names)}};
  SubprocessLimits limits;
  limits.timeout = options.timeout;
  const SubprocessResult run = run_subprocess(
      {options.python, "-c", std::string(runtime_probe_source()), "--request", "-"}, dump_json(request, -1), limits);
  result.ran = run.end != SubprocessResult::End::NotStarted;
  if (run.end == SubprocessResult::End::Cancelled) throw_if_stopped();  // Ctrl-C stops gate as any command
  if (run.end != SubprocessResult::End::Exited || run.status != 0) {
    std::string why = fmt::format("{} {}", options.python, describe_end(run, limits));
    if (const std::string hint = last_line(run.err_tail); !hint.empty()) why += fmt::format(" ({})", hint);
    result.opinions = could_not_ask(runtimes, why);
    return result;
  }
  try {
    ProbeAnswer answer = parse_probe_answer(run.out, runtimes);
    result.python_version = answer.python_version;
    result.opinions = std::move(answer.runtimes);
  } catch (const Error& e) {
    result.opinions = could_not_ask(runtimes, fmt::format("{} answered something else than the probe's "
                                                          "protocol: {}", options.python, e.what()));
  }
  return result;
}

}  // namespace mx2nv

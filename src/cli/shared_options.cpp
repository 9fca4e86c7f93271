#include "cli/shared_options.hpp"

#include "common/error.hpp"

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <map>
#include <thread>

namespace mx2nv::cli {

unsigned all_cores() { return std::max(1u, std::thread::hardware_concurrency()); }

CLI::Option* add_window(CLI::App* sub, Window& window) {
  std::map<std::string, Window> names;
  std::string help = "block-scale window:";
  for (const auto& w : windows()) {
    names.emplace(std::string(w.name), w.window);
    help += fmt::format(" {}: {};", w.name, w.summary);
  }
  return sub->add_option("--window", window, help)->transform(CLI::CheckedTransformer(names, CLI::ignore_case));
}

void add_threads(CLI::App* sub, unsigned& threads) {
  sub->add_option("--threads", threads, "worker threads (default: all cores)")->check(CLI::Range(1u, 1024u));
}

CLI::Option* add_report(CLI::App* sub, std::string& path) {
  return sub->add_option("--report", path,
                         "write a JSON report to this file (checked before any work against the SRC and DST the "
                         "command uses, with --plan the plan's: never inside them; /dev/stdout and other special "
                         "files are written through)");
}

CLI::Option* add_html(CLI::App* sub, std::string& path) {
  return sub->add_option("--html", path,
                         "write a self-contained HTML report (span heatmap, refusals, size, provenance) to this file "
                         "(the same rules as --report)");
}

void add_progress(CLI::App* sub, std::string& mode) {
  sub->add_option("--progress", mode,
                  "auto: a live line on stderr when it is a terminal (default); always; never; json: one JSON "
                  "object per update on stderr")
      ->check(CLI::IsMember({"auto", "always", "never", "json"}));
}

CLI::Option* add_overspan(CLI::App* sub, std::string& choice) {
  return sub
      ->add_option("--overspan", choice,
                   "scale groups the window refuses: fail (default: refuse, write nothing), bf16 (every expert of "
                   "an affected MoE layer written as an exact BF16 weight and listed in the config's ignore; "
                   "larger) or requantize (LOSSY: only those modules, a gate/up pair together, requantized from "
                   "decoded values as compressed-tensors would; per-module error in the report); with --plan: "
                   "checked against the plan's")
      ->check(CLI::IsMember({"fail", "bf16", "requantize"}));
}

void refuse_empty_paths(std::initializer_list<std::pair<const CLI::Option*, const std::string*>> paths) {
  for (const auto& [option, value] : paths) {
    if (option->count() > 0 && value->empty()) fail(ErrorKind::Usage, "{}: empty path", option->get_name());
  }
}

std::optional<fs::path> path_if_given(const std::string& path) {
  return path.empty() ? std::nullopt : std::optional<fs::path>(path);
}

}  // namespace mx2nv::cli

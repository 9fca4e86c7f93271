#include "cli/shared_options.hpp"

#include "common/error.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <string_view>
#include <vector>
#include <thread>

namespace mx2nv::cli {

unsigned all_cores() { return std::max(1u, std::thread::hardware_concurrency()); }

namespace {

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

std::vector<std::string> nearest(std::string_view word, const std::vector<std::string>& candidates) {
  // Close enough to be a slip: a third of the word's length, at least 2.
  const std::size_t limit = std::max<std::size_t>(2, word.size() / 3);
  std::size_t best = limit + 1;
  std::vector<std::string> out;
  for (const auto& c : candidates) {
    std::size_t d = edit_distance(word, c);
    // A prefix of a candidate (--win for --window) is a likely slip too.
    if (word.size() >= 3 && c.size() > word.size() && c.compare(0, word.size(), word) == 0) d = std::min(d, limit);
    if (d > limit || d > best) continue;
    if (d < best) out.clear();
    best = d;
    if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  }
  return out;
}

std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  const auto near = nearest(word, candidates);
  if (near.empty()) return {};
  std::string out = " (did you mean " + near.front();
  for (std::size_t i = 1; i < near.size(); ++i) out += (i + 1 == near.size() ? " or " : ", ") + near[i];
  return out + "?)";
}

CLI::Option* add_named_choice(CLI::App* sub, const std::string& name, const std::vector<std::string>& names,
                              const std::string& default_name, const std::string& help,
                              std::function<void(const std::string&)> set) {
  std::string shown = "{";
  for (const auto& n : names) shown += (shown.size() > 1 ? "," : "") + n;
  shown += "}";
  CLI::Validator exact(
      [names, shown](std::string& given) -> std::string {
        if (std::find(names.begin(), names.end(), given) != names.end()) return {};
        return fmt::format("\"{}\" is not one of {}{}", given, shown, did_you_mean(given, names));
      },
      "", "choice");
  return sub->add_option_function<std::string>(name, std::move(set), help)
      ->type_name(shown)
      ->default_str(default_name)
      ->check(exact);
}

CLI::Option* add_window(CLI::App* sub, Window& window) { return add_choice(sub, "--window", window, "block-scale window"); }

void add_threads(CLI::App* sub, unsigned& threads) {
  sub->add_option("--threads", threads, "worker threads, 1-1024")
      ->type_name("N")
      ->default_str("all cores")
      ->check(CLI::Range(1u, 1024u).description(""));
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

void add_progress(CLI::App* sub, ProgressMode& mode) { add_choice(sub, "--progress", mode, "progress on stderr"); }

CLI::Option* add_overspan(CLI::App* sub, OverSpanChoice& choice) {
  return add_choice(sub, "--overspan", choice,
                    "scale groups the window refuses (with --plan: checked against the plan's)");
}

CLI::Option* add_format(CLI::App* sub, TargetFormat& format) {
  return add_choice(sub, "--format", format, "the NVFP4 layout DST is written in (with --plan: checked against the plan's)");
}

CLI::Option* add_copy(CLI::App* sub, CopyMode& mode) {
  return add_choice(sub, "--copy", mode, "how unchanged bytes reach DST");
}

CLI::Option* add_resume(CLI::App* sub, bool& resume, const std::string& run) {
  return sub->add_flag("--resume", resume,
                       "continue an interrupted " + run + " into DST (finished shards whose records still match are "
                       "reused, everything else is redone); on a DST that already holds this " + run + ", exit 0 "
                       "without writing. Safe to repeat. A DST holding a plan (continue it with mx2nv convert --plan) "
                       "or another conversion (other options, another SRC or mx2nv) is refused");
}

std::optional<fs::path> path_if_given(const std::string& path) {
  return path.empty() ? std::nullopt : std::optional<fs::path>(path);
}

}  // namespace mx2nv::cli

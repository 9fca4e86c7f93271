// Options several subcommands share: each is registered with the same name,
// help text and checks wherever it appears.
#pragma once

#include "numerics/window.hpp"
#include "sys/file.hpp"

#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace mx2nv::cli {

// The default of --threads: every core.
unsigned all_cores();

// An option whose value is one of `choices`, spelled exactly as listed: a
// number, a prefix or another case is refused (exit 2), never mapped onto a
// choice. --help shows `{a,b,c} [default]`, the default being `value` as
// given here.
CLI::Option* add_choice(CLI::App* sub, const std::string& name, std::string& value,
                        const std::vector<std::string>& choices, const std::string& help);
// The candidates nearest to `word` by edit distance (none when none is close
// enough to be a likely misspelling), for "did you mean ...".
std::vector<std::string> nearest(std::string_view word, const std::vector<std::string>& candidates);
// " (did you mean X?)", " (did you mean X or Y?)" or "".
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

// --window: names, values and help text all come from the one window table;
// an exact name only (add_choice).
CLI::Option* add_window(CLI::App* sub, Window& window);
void add_threads(CLI::App* sub, unsigned& threads);
CLI::Option* add_report(CLI::App* sub, std::string& path);
CLI::Option* add_html(CLI::App* sub, std::string& path);
void add_progress(CLI::App* sub, std::string& mode);
CLI::Option* add_overspan(CLI::App* sub, std::string& choice);
// --copy auto|reflink|copy (sys/copy_engine.hpp), as convert and requantize take it.
CLI::Option* add_copy(CLI::App* sub, std::string& mode);
// --resume; `run` names what is continued ("conversion", "requantization").
CLI::Option* add_resume(CLI::App* sub, bool& resume, const std::string& run);

// An option given an empty path is a usage error, never "not given"; the
// options are checked in the order listed.
void refuse_empty_paths(std::initializer_list<std::pair<const CLI::Option*, const std::string*>> paths);
// A path option's value; none when it was not given.
std::optional<fs::path> path_if_given(const std::string& path);

}  // namespace mx2nv::cli

// Options several subcommands share: each is registered with the same name,
// help text and checks wherever it appears.
#pragma once

#include "numerics/window.hpp"
#include "sys/file.hpp"

#include <initializer_list>
#include <optional>
#include <string>
#include <utility>

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace mx2nv::cli {

// The default of --threads: every core.
unsigned all_cores();

// --window: names, values and help text all come from the one window table.
CLI::Option* add_window(CLI::App* sub, Window& window);
void add_threads(CLI::App* sub, unsigned& threads);
CLI::Option* add_report(CLI::App* sub, std::string& path);
CLI::Option* add_html(CLI::App* sub, std::string& path);
void add_progress(CLI::App* sub, std::string& mode);
CLI::Option* add_overspan(CLI::App* sub, std::string& choice);

// An option given an empty path is a usage error, never "not given"; the
// options are checked in the order listed.
void refuse_empty_paths(std::initializer_list<std::pair<const CLI::Option*, const std::string*>> paths);
// A path option's value; none when it was not given.
std::optional<fs::path> path_if_given(const std::string& path);

}  // namespace mx2nv::cli

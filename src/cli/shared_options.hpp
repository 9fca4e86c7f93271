// Options several subcommands share: each is registered with the same name,
// help text and checks wherever it appears.
#pragma once

#include "common/choice.hpp"
#include "cli/progress_line.hpp"
#include "plan/plan.hpp"
#include "convert/convert.hpp"

#include <functional>
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

// An option whose value is one of `names`, spelled exactly as listed: a
// number, a prefix or another case is refused (exit 2), never mapped onto a
// choice. --help shows `{a,b,c} [default]`. `set` receives the name given.
CLI::Option* add_named_choice(CLI::App* sub, const std::string& name, const std::vector<std::string>& names,
                              const std::string& default_name, const std::string& help,
                              std::function<void(const std::string&)> set);

// The same for an enum with a choice table (common/choice.hpp): names, help
// and default all come from the table and `value`; the option writes `value`.
// --help reads "<intro>: name: help; name: help".
template <class E>
CLI::Option* add_choice(CLI::App* sub, const std::string& name, E& value, std::string_view intro) {
  std::string help(intro);
  help += ':';
  for (const Choice<E>& c : choices<E>()) {
    help.append(" ").append(c.name).append(": ").append(c.help).append(";");
  }
  help.pop_back();
  return add_named_choice(sub, name, choice_names<E>(), std::string(choice_name(value)), help,
                          [&value](const std::string& given) { value = *parse_choice<E>(given); });
}
// The same, with one more name first (`every`, the default) that selects
// every value: `value` stays nullopt for it.
template <class E>
CLI::Option* add_choice_or_every(CLI::App* sub, const std::string& name, std::optional<E>& value,
                                 std::string_view every, std::string_view intro) {
  std::vector<std::string> names{std::string(every)};
  std::string help(intro);
  help.append(": ").append(every).append(": every one;");
  for (const Choice<E>& c : choices<E>()) {
    names.emplace_back(c.name);
    help.append(" ").append(c.name).append(": ").append(c.help).append(";");
  }
  help.pop_back();
  return add_named_choice(sub, name, names, std::string(every), help, [&value](const std::string& given) {
    value = parse_choice<E>(given);  // nullopt for `every`
  });
}

// The candidates nearest to `word` by edit distance (none when none is close
// enough to be a likely misspelling), for "did you mean ...".
std::vector<std::string> nearest(std::string_view word, const std::vector<std::string>& candidates);
// " (did you mean X?)", " (did you mean X or Y?)" or "".
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

CLI::Option* add_window(CLI::App* sub, Window& window);
void add_threads(CLI::App* sub, unsigned& threads);
CLI::Option* add_report(CLI::App* sub, std::string& path);
CLI::Option* add_html(CLI::App* sub, std::string& path);
void add_progress(CLI::App* sub, ProgressMode& mode);
CLI::Option* add_overspan(CLI::App* sub, OverSpanChoice& choice);
CLI::Option* add_copy(CLI::App* sub, CopyMode& mode);
CLI::Option* add_format(CLI::App* sub, TargetFormat& format);
// --resume; `run` names what is continued ("conversion", "requantization").
CLI::Option* add_resume(CLI::App* sub, bool& resume, const std::string& run);

// A path option's value; none when it was not given.
std::optional<fs::path> path_if_given(const std::string& path);

}  // namespace mx2nv::cli

// mx2nv._core: the library behind the Python package (python/mx2nv). Each
// command runs on a worker thread with the GIL released; the calling thread
// wakes every few milliseconds to hand progress to Python and to let Python
// see Ctrl-C. An interrupt (or an exception from the progress callback)
// stops the library exactly like SIGINT stops the CLI: temporary files are
// removed, finished shards are kept for resume, and the Python exception is
// raised once the library has unwound. Results cross as JSON text, the
// report contract, so the Python classes mirror the JSON report field for
// field. Where the report and the HTML page go is checked before any work,
// against the SRC and DST the command uses (with a plan, the plan's), and
// they are written here as the CLI writes them (output/report_file.hpp).
#include "common/cancel.hpp"
#include "common/error.hpp"
#include "common/printable.hpp"
#include "common/progress.hpp"
#include "compare/compare.hpp"
#include "destination/destination.hpp"
#include "convert/convert.hpp"
#include "gate/gate.hpp"
#include "html/html.hpp"
#include "inspect/inspect.hpp"
#include "plan/plan.hpp"
#include "report/report.hpp"
#include "output/output.hpp"
#include "card/card.hpp"
#include "verify/verify.hpp"

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <chrono>
#include <csignal>
#include <deque>
#include <future>
#include <mutex>

namespace nb = nanobind;
using namespace mx2nv;

namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(20);

// What each function returns to Python: (exit code, JSON text, the HTML page
// or the plan file written or None); python/mx2nv/_api.py unpacks it.
using CommandReturn = std::tuple<int, std::string, std::optional<std::string>>;

// Progress updates from worker threads, waiting for the Python thread.
// Phase changes are queued; updates within a phase replace each other.
class ProgressMailbox {
 public:
  void post(const Progress& p) {
    std::lock_guard lock(mutex_);
    if (!queue_.empty() && queue_.back().phase == p.phase) {
      queue_.back() = p;
    } else {
      queue_.push_back(p);
    }
  }
  std::deque<Progress> take() {
    std::lock_guard lock(mutex_);
    return std::exchange(queue_, {});
  }

 private:
  std::mutex mutex_;
  std::deque<Progress> queue_;
};

nb::dict progress_dict(const Progress& p) {
  nb::dict d;
  d["command"] = std::string(command_name(p.command));
  d["phase"] = phase_name(p.phase);
  d["bytes_done"] = p.bytes_done;
  d["bytes_total"] = p.bytes_total;
  d["units_done"] = p.units_done;
  d["units_total"] = p.units_total;
  d["unit"] = p.unit;
  d["seconds"] = p.seconds;
  return d;
}

// Runs `work` (which returns a CommandReturn) off the Python thread; see the
// file comment.
template <typename Work>
CommandReturn run_released(Work work, const nb::object& callback, ProgressMailbox& mailbox) {
  auto future = std::async(std::launch::async, std::move(work));
  const auto deliver = [&] {
    if (callback.is_none()) return;
    for (const Progress& p : mailbox.take()) callback(progress_dict(p));
  };
  try {
    for (;;) {
      bool ready = false;
      {
        nb::gil_scoped_release release;
        ready = future.wait_for(kPollInterval) == std::future_status::ready;
      }
      deliver();
      if (ready) break;
      if (PyErr_CheckSignals() != 0) throw nb::python_error();
    }
  } catch (...) {
    // Ctrl-C, or the callback raised: stop the library and wait for it to
    // clean up before Python sees the exception.
    request_stop(SIGINT);
    {
      nb::gil_scoped_release release;
      future.wait();
    }
    clear_stop();
    throw;
  }
  return future.get();
}

// A name from E's choice table (common/choice.hpp); anything else is a UsageError.
template <class E>
E choice_arg(std::string_view what, const std::string& name) {
  const auto value = parse_choice<E>(name);
  if (!value) fail(ErrorKind::Usage, "{} must be {}, not \"{}\"", what, choice_list<E>(), name);
  return *value;
}

// The same, or `every` (nullopt: every value).
template <class E>
std::optional<E> choice_or_every_arg(std::string_view what, const std::string& name, std::string_view every) {
  if (name == every) return std::nullopt;
  const auto value = parse_choice<E>(name);
  if (!value) fail(ErrorKind::Usage, "{} must be {}, {}, not \"{}\"", what, every, choice_list<E>(), name);
  return value;
}

// Every choice table by the keyword argument it validates: the Python
// package's WINDOWS, COPY_MODES, ... are read from here, not spelled again.
nb::dict choice_tables() {
  nb::dict d;
  const auto put = [&d](const char* key, std::vector<std::string> names) {
    nb::list l;
    for (auto& n : names) l.append(nb::str(n.c_str()));
    d[key] = nb::tuple(l);
  };
  put("window", choice_names<Window>());
  put("overspan", choice_names<OverSpanChoice>());
  put("copy", choice_names<CopyMode>());
  put("format", choice_names<TargetFormat>());
  std::vector<std::string> runtimes{std::string(kEveryRuntime)}, dtypes{std::string(kEveryDtype)};
  for (auto& n : choice_names<Runtime>()) runtimes.push_back(n);
  for (auto& n : choice_names<ActivationDtype>()) dtypes.push_back(n);
  put("runtime", runtimes);
  put("dtype", dtypes);
  return d;
}

std::optional<fs::path> path_of(const std::optional<std::string>& p) {
  return p ? std::optional<fs::path>(*p) : std::nullopt;
}

// Writes what a command produced to the output files it was given (checked
// before the work), the report's JSON as the CLI writes it.
CommandReturn written(const CommandOutputs& outputs, CommandReturn returned) {
  const auto& [code, text, page] = returned;
  if (outputs.report) outputs.report->write(text + "\n");
  if (outputs.html && page) outputs.html->write(*page);
  return returned;
}

// A finished command's report as the CLI answers it: its JSON, the page when
// --html was given, both written to the outputs checked before the work.
CommandReturn report_return(const CommandOutputs& outputs, const Report& r, bool page_wanted, unsigned threads) {
  std::optional<std::string> page;
  if (page_wanted) page = render_html_for(r, nullptr, threads);
  return written(outputs, {r.exit_code(), report_json_text(r), page});
}

// The report the CLI writes for a failed command (report/report.hpp
// failed_report), with the error's exit code, written to the output files if
// they were checked already. Called inside a catch.
CommandReturn error_return(Command command, Window window, const fs::path& src, const fs::path& dst,
                           const CommandOutputs& outputs, unsigned threads) {
  const Report r = failed_report(command, window, src, dst, current_exception_as_error(), UnresolvedPaths::AsGiven);
  std::optional<std::string> page;
  if (outputs.html) page = render_html_for(r, nullptr, threads);
  CommandReturn returned{r.exit_code(), report_json_text(r), page};
  try {
    return written(outputs, returned);  // a copy: `returned` is what the catch below returns
  } catch (...) {  // the error is the command's; a report that cannot be written is not a second one
    return returned;
  }
}

// The answer of a failed command that has no report (gate, card):
// {"result": "error", "error": message}. Called inside a catch.
CommandReturn error_object() {
  const Error e = current_exception_as_error();
  return {exit_code(e.kind()), dump_json(nlohmann::json{{"result", "error"}, {"error", json_text(e.what())}}),
          std::nullopt};
}

// Every function below is one call of this: `work(progress)` runs off the
// Python thread (run_released), posting progress for `callback` (None: no
// progress), and answers; any failure is answered by `failed()`, called
// inside the catch.
template <class Work, class Failed>
CommandReturn call(const nb::object& callback, Work work, Failed failed) {
  ProgressMailbox mailbox;
  ProgressCallback progress;
  if (!callback.is_none()) progress = [&mailbox](const Progress& p) { mailbox.post(p); };
  return run_released(
      [&]() -> CommandReturn {
        try {
          return work(progress);
        } catch (...) {
          return failed();
        }
      },
      callback, mailbox);
}

CommandReturn convert(const std::string& src, const std::string& dst, const std::string& window, unsigned threads,
                      bool resume, const std::string& copy, const std::string& overspan, const std::string& format,
                      const nb::object& callback, const std::optional<std::string>& report,
                      const std::optional<std::string>& html) {
  ConvertOptions o{src, dst, Window::Marlin, threads, resume};
  CommandOutputs outputs;
  return call(
      callback,
      [&](const ProgressCallback& progress) {
        o.progress = progress;
        outputs = check_command_outputs(path_of(report), path_of(html), {o.source, o.target});
        o.window = choice_arg<Window>("window", window);
        o.copy = choice_arg<CopyMode>("copy", copy);
        o.over_span_choice = choice_arg<OverSpanChoice>("overspan", overspan);
        o.format = choice_arg<TargetFormat>("format", format);
        return report_return(outputs, convert_checkpoint(o), html.has_value(), threads);
      },
      [&] { return error_return(Command::Convert, o.window, o.source, o.target, outputs, threads); });
}

CommandReturn verify(const std::string& src, const std::string& dst, const std::string& window, unsigned threads,
                     const nb::object& callback, const std::optional<std::string>& report,
                     const std::optional<std::string>& html) {
  VerifyOptions o{src, dst, Window::Marlin, threads, std::nullopt};
  CommandOutputs outputs;
  return call(
      callback,
      [&](const ProgressCallback& progress) {
        o.progress = progress;
        outputs = check_command_outputs(path_of(report), path_of(html), {o.source, o.target});
        // No window given: the one DST records (as the CLI's verify), else marlin.
        o.window = window.empty() ? Destination::recorded_window(o.target).value_or(Window::Marlin)
                                  : choice_arg<Window>("window", window);
        return report_return(outputs, verify_checkpoint(o), html.has_value(), threads);
      },
      [&] { return error_return(Command::Verify, o.window, o.source, o.target, outputs, threads); });
}

// compare SRC OTHER: its JSON document; exit 0 or 1 is a result, not an
// error (python/mx2nv/_compare.py).
CommandReturn compare(const std::string& src, const std::string& other, unsigned threads, const std::string& modules,
                      const nb::object& callback, const std::optional<std::string>& report,
                      const std::optional<std::string>& html) {
  CompareOptions o{src, other, threads, modules};
  CommandOutputs outputs;
  return call(
      callback,
      [&](const ProgressCallback& progress) -> CommandReturn {
        o.progress = progress;
        outputs = check_command_outputs(path_of(report), path_of(html), {o.source, o.other});
        const CompareResult r = compare_checkpoints(o);
        const std::string text = compare_json_text(r);
        std::optional<std::string> page;
        if (html) page = render_compare_html(r);
        if (outputs.report) outputs.report->write(text);
        if (outputs.html) outputs.html->write(*page);
        return {r.exit_code(), text, page};
      },
      [&] { return error_return(Command::Compare, Window::Marlin, o.source, o.other, outputs, threads); });
}

CommandReturn inspect(const std::string& src, const std::string& window, unsigned threads,
                      const std::optional<std::string>& html) {
  Window w = Window::Marlin;
  CommandOutputs outputs;
  return call(
      nb::none(),
      [&](const ProgressCallback&) -> CommandReturn {
        outputs = check_command_outputs(std::nullopt, path_of(html), {fs::path(src)});
        w = choice_arg<Window>("window", window);
        const Inspection in = inspect_checkpoint(src, w, threads);
        std::optional<std::string> page;
        if (html) page = render_html_for(in.report, &in, threads);
        CommandReturn returned{in.report.exit_code(), dump_json(inspection_to_json(in)), page};
        if (outputs.html) outputs.html->write(*page);
        return returned;
      },
      [&] { return error_return(Command::Inspect, w, src, {}, outputs, threads); });
}

// mx2nv plan: (exit code, report JSON, the plan file written or None).
CommandReturn plan(const std::string& src, const std::string& dst, const std::string& window, unsigned threads,
                   const std::optional<std::string>& plan_out, const std::string& overspan,
                   const std::string& format) {
  PlanOptions o{src, dst, Window::Marlin, threads, std::nullopt};
  if (plan_out) o.plan_out = *plan_out;
  return call(
      nb::none(),
      [&](const ProgressCallback&) -> CommandReturn {
        o.window = choice_arg<Window>("window", window);
        o.over_span_choice = choice_arg<OverSpanChoice>("overspan", overspan);
        o.format = choice_arg<TargetFormat>("format", format);
        fs::path written_to;
        const Report r = plan_checkpoint(o, written_to);
        std::optional<std::string> plan_path;
        if (!written_to.empty()) plan_path = written_to.string();
        return {r.exit_code(), report_json_text(r), plan_path};
      },
      [&] { return error_return(Command::Plan, o.window, o.source, o.target, {}, threads); });
}

PlannedOptions planned_options(const std::string& plan_path, const std::optional<std::string>& src,
                               const std::optional<std::string>& dst, unsigned threads) {
  PlannedOptions o{plan_path, std::nullopt, std::nullopt, threads, CopyMode::Auto, {}, std::nullopt, std::nullopt,
                   std::nullopt};
  if (src) o.source = *src;
  if (dst) o.target = *dst;
  return o;
}

// A plan step's outputs, checked against the SRC and DST it uses (the
// plan's unless given) and the plan itself; `paths` gets them for the error
// report. A plan that cannot be read leaves them unknown: no output is
// written then (it could not be checked).
CommandOutputs planned_outputs(const PlannedOptions& o, const std::optional<std::string>& report,
                               const std::optional<std::string>& html, PlannedPaths& paths) {
  std::vector<fs::path> outputs;
  if (report) outputs.emplace_back(*report);
  if (html) outputs.emplace_back(*html);
  paths = planned_paths(o, outputs);
  return check_command_outputs(path_of(report), path_of(html),
                               {paths.source.value_or(fs::path()), paths.target.value_or(fs::path())},
                               {{o.plan, "the plan this step reads"}});
}

// The error report of a plan step: the paths it uses when known, else the plan's path.
CommandReturn planned_error(const PlannedOptions& o, const PlannedPaths& paths, const CommandOutputs& outputs) {
  return error_return(Command::Convert, Window::Marlin, paths.source.value_or(o.plan),
                      paths.target.value_or(fs::path()), outputs, o.threads);
}

// convert --plan P --shard I | --shards I/N: (exit code, report JSON, None).
CommandReturn convert_shards(const std::string& plan_path, const std::string& selection,
                             const std::optional<std::string>& src, const std::optional<std::string>& dst,
                             unsigned threads, const std::string& copy, const nb::object& callback,
                             const std::optional<std::string>& report) {
  PlannedOptions o = planned_options(plan_path, src, dst, threads);
  PlannedPaths paths{o.plan, o.source, o.target};
  CommandOutputs outputs;
  return call(
      callback,
      [&](const ProgressCallback& progress) {
        o.progress = progress;
        o.copy = choice_arg<CopyMode>("copy", copy);
        const ShardSelection which = selection.find('/') == std::string::npos ? parse_shard_index(selection)
                                                                               : parse_shard_selection(selection);
        outputs = planned_outputs(o, report, std::nullopt, paths);
        return report_return(outputs, convert_planned_shards(o, which, &paths), false, threads);
      },
      [&] { return planned_error(o, paths, outputs); });
}

// convert --plan P --finalize: (exit code, report JSON, HTML page or None).
CommandReturn finalize(const std::string& plan_path, const std::optional<std::string>& src,
                       const std::optional<std::string>& dst, unsigned threads, const std::string& copy,
                       const std::optional<std::string>& report, const std::optional<std::string>& html) {
  PlannedOptions o = planned_options(plan_path, src, dst, threads);
  PlannedPaths paths{o.plan, o.source, o.target};
  CommandOutputs outputs;
  return call(
      nb::none(),
      [&](const ProgressCallback&) {
        o.copy = choice_arg<CopyMode>("copy", copy);
        outputs = planned_outputs(o, report, html, paths);
        return report_return(outputs, finalize_planned(o, &paths), html.has_value(), threads);
      },
      [&] { return planned_error(o, paths, outputs); });
}

// mx2nv gate: (exit code, gate JSON, None); a failure: error_object().
// python: the interpreter to ask the runtimes in, None not to ask.
CommandReturn gate(const std::string& checkpoint, const std::string& runtime, unsigned tp, unsigned ep,
                   const std::string& dtype, unsigned threads, const std::optional<std::string>& python,
                   unsigned ask_timeout, bool quick) {
  return call(
      nb::none(),
      [&](const ProgressCallback&) -> CommandReturn {
        const auto runtime_choice = choice_or_every_arg<Runtime>("runtime", runtime, kEveryRuntime);
        const auto dtype_choice = choice_or_every_arg<ActivationDtype>("dtype", dtype, kEveryDtype);
        if (tp < 1 || tp > 1024) fail(ErrorKind::Usage, "tp must be in [1, 1024], got {}", tp);
        if (ep < 1 || ep > 1024) fail(ErrorKind::Usage, "ep must be in [1, 1024], got {}", ep);
        if (ask_timeout < 1 || ask_timeout > 3600) fail(ErrorKind::Usage, "ask_timeout must be in [1, 3600] s");
        GateOptions o;
        o.checkpoint = checkpoint;
        o.runtime = runtime_choice;
        o.tp = tp;
        o.ep = ep;
        o.threads = threads;
        o.quick = quick;
        if (dtype_choice) o.dtypes = {*dtype_choice};
        o.ask.when = python ? AskRuntimes::Auto : AskRuntimes::Never;
        if (python) o.ask.python = *python;
        o.ask.timeout = std::chrono::seconds(ask_timeout);
        const GateResult r = run_gate(o);
        return {r.exit_code(), dump_json(gate_to_json(r)), std::nullopt};
      },
      error_object);
}

// card's result as the Python package reads it (python/mx2nv/_card.py).
nlohmann::json card_to_json(const CardResult& r) {
  nlohmann::json fm = nlohmann::json::array();
  for (const auto& [k, v] : r.front_matter) {
    const bool list = std::find(r.list_keys.begin(), r.list_keys.end(), k) != r.list_keys.end();
    fm.push_back({k, list ? nlohmann::json(v) : nlohmann::json(v.front())});
  }
  return {{"result", "ok"},
          {"path", json_text(r.path.string())},
          {"source_card", r.source_card ? nlohmann::json("README.source.md") : nlohmann::json()},
          {"sha256", r.sha256},
          {"text", r.text},
          {"front_matter", fm},
          {"inherited", r.inherited},
          {"dropped", r.dropped},
          {"not_inherited", r.not_inherited},
          {"source_card_problem",
           r.source_card_problem.empty() ? nlohmann::json() : nlohmann::json(r.source_card_problem)},
          {"warnings", r.warnings}};
}

// mx2nv card: (exit code, card_to_json or error_object(), None).
// `report_text` set: the report given as JSON (a Report object), `report`
// only naming its kind.
CommandReturn card(const std::string& src, const std::string& dst, const std::string& kind, const std::string& report,
                   const std::optional<std::string>& report_text, const std::optional<std::string>& base_model,
                   const std::optional<std::string>& companion, unsigned tp, const std::optional<std::string>& repo_id,
                   const std::optional<std::string>& gpu_check, unsigned threads) {
  return call(
      nb::none(),
      [&](const ProgressCallback&) -> CommandReturn {
        CardOptions o;
        o.source = src;
        o.target = dst;
        if (kind == "verify") {
          o.verify_report = report;
        } else {
          o.requantize_report = report;
        }
        o.report_text = report_text;
        o.base_model = base_model;
        o.companion = companion;
        o.tp = tp;
        o.repo_id = repo_id;
        if (gpu_check) o.gpu_check = *gpu_check;
        o.threads = threads;
        return {0, dump_json(card_to_json(run_card(o))), std::nullopt};
      },
      error_object);
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "mx2nv's C++ library; use the mx2nv package, not this module.";
  m.def("version", [] { return std::string(MX2NV_VERSION); });
  m.attr("CHOICES") = choice_tables();
  m.def("convert", &convert, nb::arg("src"), nb::arg("dst"), nb::arg("window"), nb::arg("threads"),
        nb::arg("resume"), nb::arg("copy"), nb::arg("overspan"), nb::arg("format"), nb::arg("progress").none(),
        nb::arg("report").none(),
        nb::arg("html").none(),
        "Convert, writing the report / HTML page to the paths given (checked first); returns (exit code, report "
        "JSON, HTML page or None).");
  m.def("verify", &verify, nb::arg("src"), nb::arg("dst"), nb::arg("window"), nb::arg("threads"),
        nb::arg("progress").none(), nb::arg("report").none(), nb::arg("html").none(),
        "Verify, as convert; returns (exit code, report JSON, HTML page or None).");
  m.def("compare", &compare, nb::arg("src"), nb::arg("other"), nb::arg("threads"), nb::arg("modules"),
        nb::arg("progress").none(), nb::arg("report").none(), nb::arg("html").none(),
        "Compare, writing the JSON document and the HTML page to the paths given (checked first); returns (exit "
        "code, JSON, HTML page or None).");
  m.def("inspect", &inspect, nb::arg("src"), nb::arg("window"), nb::arg("threads"), nb::arg("html").none(),
        "Inspect, writing the HTML page to the path given; returns (exit code, inspection JSON, HTML page or None).");
  m.def("plan", &plan, nb::arg("src"), nb::arg("dst"), nb::arg("window"), nb::arg("threads"),
        nb::arg("plan_out").none(), nb::arg("overspan"), nb::arg("format"), "Plan; returns (exit code, report JSON, plan file written or None).");
  m.def("convert_shards", &convert_shards, nb::arg("plan"), nb::arg("selection"), nb::arg("src").none(),
        nb::arg("dst").none(), nb::arg("threads"), nb::arg("copy"), nb::arg("progress").none(),
        nb::arg("report").none(),
        "Convert shards of a plan (selection \"I\" or \"I/N\"), writing the report to the path given (checked "
        "first against the plan's SRC and DST); returns (exit code, report JSON, None).");
  m.def("finalize", &finalize, nb::arg("plan"), nb::arg("src").none(), nb::arg("dst").none(), nb::arg("threads"),
        nb::arg("copy"), nb::arg("report").none(), nb::arg("html").none(),
        "Finalize a plan, as convert_shards; returns (exit code, report JSON, HTML page or None).");
  m.def("gate", &gate, nb::arg("checkpoint"), nb::arg("runtime"), nb::arg("tp"), nb::arg("ep"), nb::arg("dtype"),
        nb::arg("threads"),
        nb::arg("python").none(), nb::arg("ask_timeout"), nb::arg("quick"),
        "Gate; returns (exit code, gate JSON or {result: error, error}, None).");
  m.def("card", &card, nb::arg("src"), nb::arg("dst"), nb::arg("kind"), nb::arg("report"),
        nb::arg("report_text").none(), nb::arg("base_model").none(), nb::arg("companion").none(), nb::arg("tp"),
        nb::arg("repo_id").none(),
        nb::arg("gpu_check").none(), nb::arg("threads"),
        "Card (kind \"verify\" or \"requantize\"); returns (exit code, card JSON or {result: error, error}, None).");
}

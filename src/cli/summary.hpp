// What the subcommands share in telling a run: the human summary lines on
// stdout, the one format of an error on stderr, and the report files.
#pragma once

#include "common/error.hpp"
#include "inspect/inspect.hpp"
#include "report/report.hpp"
#include "output/output.hpp"

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace mx2nv::cli {

// How a failed command is told on stderr (the one format of every error).
void print_error(const Error& e);

void print_over_span(const std::vector<OverSpan>& over);
void print_global_conflicts(const std::vector<GlobalConflict>& conflicts, const std::vector<std::string>& names);
// source, target, modules, copied, groups, size, output: the lines every summary of a conversion starts with.
void print_counts(const Report& r);
// What --overspan did: every lossy module with its measured error, every BF16 layer with why and its size cost.
void print_overspan(const Report& r);

// --report FILE: the JSON, after the summary (which may go to /dev/stdout too).
void write_report(const std::optional<ReportFile>& file, const Report& report);
// --html FILE: the same path rules as --report (output/report_file.hpp).
void write_html(const std::optional<ReportFile>& file, const Report& report, const Inspection* inspection,
                unsigned threads);
// Writes the report files of a finished run; its exit code.
int finish(const Report& r, const std::optional<ReportFile>& report_file,
           const std::optional<ReportFile>& html_file = std::nullopt, unsigned threads = 1);

}  // namespace mx2nv::cli

// How the CLI shows common/progress.hpp updates on stderr: one live line on a
// terminal, JSON lines for orchestrators, or nothing. The library never
// prints; this is the only place that draws progress.
#pragma once

#include "common/choice.hpp"
#include "common/progress.hpp"

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>

namespace mx2nv {

enum class ProgressMode { Auto, Always, Never, JsonLines };
template <>
std::span<const Choice<ProgressMode>> choices<ProgressMode>();  // --progress

class ProgressLine {
 public:
  // Auto draws only when `stream` is a terminal.
  ProgressLine(ProgressMode mode, std::FILE* stream);
  ~ProgressLine();  // erases a live line, so what follows starts clean
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  // The callback to put in ConvertOptions/VerifyOptions; empty when nothing
  // is drawn, so the library skips the bookkeeping.
  ProgressCallback callback();
  // Erases a live line now (before an error message is printed).
  void close() { erase(); }

 private:
  void update(const Progress& p);
  void erase();

  bool live_ = false, json_ = false;
  std::FILE* stream_;
  bool line_open_ = false;
  ProgressPhase last_phase_ = ProgressPhase::Done;
  std::uint64_t last_units_ = 0;
  double phase_started_ = 0, last_drawn_ = -1;
};

// "1.23 GB  27%  1.85 GB/s  ETA 0:02" and friends: one line, no newline.
std::string format_progress_line(const Progress& p, double phase_seconds);
// One JSON object (no newline).
std::string format_progress_json(const Progress& p, double phase_seconds);

}  // namespace mx2nv

#include "cli/progress_line.hpp"

#include "common/printable.hpp"
#include "json/json.hpp"

#include <fmt/core.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cmath>

namespace mx2nv {
namespace {

// Progress is a courtesy: a stream that cannot be written (a closed or full
// stderr) loses it, and the command goes on (its result is on stdout and in
// its exit code).
void draw(std::FILE* stream, const std::string& text) {
  if (std::fwrite(text.data(), 1, text.size(), stream) != text.size()) std::clearerr(stream);
  std::fflush(stream);
}

constexpr double kRedrawSeconds = 0.1;  // a terminal line needs no more than 10 frames a second

// "12.34/56.78 GB", or MB for small totals, so a small run still moves.
std::string amount(std::uint64_t done, std::uint64_t total) {
  const double unit = total >= 1'000'000'000 ? 1e9 : 1e6;
  return fmt::format("{:.2f}/{:.2f} {}", static_cast<double>(done) / unit, static_cast<double>(total) / unit,
                     unit == 1e9 ? "GB" : "MB");
}

std::string clock_text(double seconds) {
  const auto s = static_cast<std::uint64_t>(std::llround(seconds));
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
  return fmt::format("{}:{:02}", s / 60, s % 60);
}

double rate(const Progress& p, double phase_seconds) {
  return phase_seconds > 0 ? static_cast<double>(p.bytes_done) / phase_seconds : 0;
}

std::optional<double> eta(const Progress& p, double phase_seconds) {
  const double r = rate(p, phase_seconds);
  if (p.bytes_total == 0 || r <= 0 || p.phase != ProgressPhase::Shards) return std::nullopt;
  return static_cast<double>(p.bytes_total - p.bytes_done) / r;
}

}  // namespace

namespace {
constexpr Choice<ProgressMode> kProgressModes[] = {
    {ProgressMode::Auto, "auto", "a live line when stderr is a terminal"},
    {ProgressMode::Always, "always", "a live line"},
    {ProgressMode::Never, "never", "nothing"},
    {ProgressMode::JsonLines, "json", "one JSON object per update"},
};
}  // namespace

template <>
std::span<const Choice<ProgressMode>> choices<ProgressMode>() {
  return kProgressModes;
}

std::string format_progress_line(const Progress& p, double phase_seconds) {
  std::string line = fmt::format("{} {:<8}", command_name(p.command), phase_name(p.phase));
  if (p.bytes_total > 0) {
    const double percent = 100.0 * static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total);
    line += fmt::format(" {} {:3.0f}%  {:.2f} GB/s", amount(p.bytes_done, p.bytes_total), percent,
                        rate(p, phase_seconds) / 1e9);
    if (const auto e = eta(p, phase_seconds)) line += fmt::format("  ETA {}", clock_text(*e));
  }
  if (p.units_total > 0) line += fmt::format("  {}/{} {}", p.units_done, p.units_total, p.unit);
  line += fmt::format("  {}", clock_text(p.seconds));
  return line;
}

std::string format_progress_json(const Progress& p, double phase_seconds) {
  const auto e = eta(p, phase_seconds);
  Json j = {{"command", command_name(p.command)},
            {"phase", phase_name(p.phase)},
            {"bytes_done", p.bytes_done},
            {"bytes_total", p.bytes_total},
            {"units_done", p.units_done},
            {"units_total", p.units_total},
            {"unit", p.unit},
            {"seconds", std::round(p.seconds * 1000) / 1000},
            {"bytes_per_second", std::round(rate(p, phase_seconds))},
            {"eta_seconds", e ? Json(std::round(*e * 10) / 10) : Json(nullptr)}};
  return dump_json(j, -1);
}

ProgressLine::ProgressLine(ProgressMode mode, std::FILE* stream) : stream_(stream) {
  json_ = mode == ProgressMode::JsonLines;
  live_ = mode == ProgressMode::Always || (mode == ProgressMode::Auto && isatty(fileno(stream)) == 1);
}

ProgressLine::~ProgressLine() { erase(); }

ProgressCallback ProgressLine::callback() {
  if (!live_ && !json_) return {};
  return [this](const Progress& p) { update(p); };
}

void ProgressLine::update(const Progress& p) {
  const bool changed = p.phase != last_phase_ || (p.units_total > 0 && p.units_done == p.units_total &&
                                                  p.units_done != last_units_);
  if (p.phase != last_phase_) phase_started_ = p.seconds;
  last_phase_ = p.phase;
  last_units_ = p.units_done;
  const double phase_seconds = p.seconds - phase_started_;
  if (json_) {
    draw(stream_, format_progress_json(p, phase_seconds) + "\n");
    std::fflush(stream_);
    return;
  }
  if (p.phase == ProgressPhase::Done) return erase();
  if (!changed && p.seconds - last_drawn_ < kRedrawSeconds) return;
  last_drawn_ = p.seconds;
  std::string line = format_progress_line(p, phase_seconds);
  winsize ws{};
  if (ioctl(fileno(stream_), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 && line.size() >= ws.ws_col) {
    line.resize(ws.ws_col - 1u);  // a wrapped line could not be redrawn in place
  }
  // \r: back to column 0; ESC[K: clear what a longer previous line left.
  draw(stream_, "\r" + line + "\x1b[K");
  std::fflush(stream_);
  line_open_ = true;
}

void ProgressLine::erase() {
  if (!line_open_) return;
  draw(stream_, "\r\x1b[K");
  std::fflush(stream_);
  line_open_ = false;
}

}  // namespace mx2nv

// Windows: which NVFP4 encodings a target runtime reproduces exactly. One
// table (window.cpp) holds every window's name, limits, help text and the
// runtime facts behind them; the CLI, plan, verify, inspect and gate read it.
//
// A window constrains, for each scale group with global exponent m (divisor
// 2^-m, multiplier 2^m):
//   * the block scale 2^(k-m) of every active group: k - m in [min_exp, max_exp];
//   * the global exponent itself: m in [global_min, global_max], because
//     runtimes fold the global into narrower types (vLLM's and SGLang's FP4
//     Marlin path: 2^m x 2^7 as an fp16, which must be a normal number),
//     preferably m >= global_preferred_min (headroom for the routing weight
//     the kernel multiplies it with).
#pragma once

#include "common/choice.hpp"

#include <optional>
#include <span>
#include <string_view>

namespace mx2nv {

enum class Window {
  Marlin,  // every runtime's Marlin path, fp16 and bf16 (vLLM 0.33 and SGLang 0.5.23): the default
  E4M3,    // the file format alone: exact on disk, not through Marlin
};

struct WindowLimits {
  int min_exp;     // lowest block-scale exponent k - m allowed for an active group
  int max_exp;     // highest (8: the largest power of two in E4M3)
  int global_min;  // lowest global exponent m (the multiplier 2^m) the runtime reproduces exactly
  int global_max;  // highest
  // The plan raises a global up to here when the block scales allow it: under
  // Marlin the fp16 multiplier 2^(m+7) is multiplied by the top-k routing
  // weight, and a product below 2^-14 is subnormal; m >= -13 keeps routing
  // weights down to 2^-8 at full fp16 precision.
  int global_preferred_min;
  int max_span() const { return max_exp - min_exp; }
};

struct WindowInfo {
  Window window;
  std::string_view name;
  WindowLimits limits;
  std::string_view summary;      // one line for --help
  std::string_view runtimes;   // who reads this window exactly, and why (README's windows table)
};

// Every window, default first.
std::span<const WindowInfo> windows();
const WindowInfo& window_spec(Window w);
WindowLimits window_limits(Window w);
std::string_view window_name(Window w);
std::optional<Window> parse_window(std::string_view name);
// The window table as a choice table (names and summaries), for the CLI's --window.
template <>
std::span<const Choice<Window>> choices<Window>();

// Whether a global multiplier (1 / weight_global_scale, any positive float,
// not only powers of two) lies in the window's global range: 2^global_min <=
// g < 2^(global_max + 1).
bool global_multiplier_fits(Window w, double multiplier);

}  // namespace mx2nv

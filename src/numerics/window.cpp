#include "numerics/window.hpp"

#include "numerics/formats.hpp"

#include <array>
#include <cmath>

namespace mx2nv {
namespace {

// Global range for the Marlin path, from vLLM 0.34.0 and SGLang 0.5.23 (README
// "Windows and what the runtimes do with them"): the multiplier 2^m is scaled by
// 2^7 in fp16 (vllm/.../utils/marlin_utils_fp4.py:133-145; sglang/srt/layers/
// quantization/marlin_utils_fp4.py:47-60, after a cast to the activation dtype at
// :519-520) and, for w2, folded into the fp16 top-k routing weight by the kernel.
// 2^(m+7) must be a normal fp16 (>= 2^-14) and at most 65504 (< 2^16): m in [-21, 8].
// bf16 is looser: 2^(m+119)/sf with sf >= 1 stays finite for m <= 8.
constexpr int kFp16MinNormalPow2 = -14;
constexpr int kFp16MaxPow2 = 15;
constexpr int kMarlinGlobalBias = 7;  // nvfp4_marlin_process_global_scale: x 2^(14 - 7) for fp16
// Routing weights down to 2^-8 times the multiplier stay normal fp16 numbers.
constexpr int kRoutingWeightHeadroom = 8;

// The file format alone: the divisor 2^-m must be a normal float.
constexpr int kFloatMinNormalPow2 = -126;
constexpr int kFloatMaxPow2 = 127;

constexpr std::array<WindowInfo, 2> kWindows{{
    {Window::Marlin, "marlin",
     {kE4M3MinNormalPow2, kE4M3MaxPow2, kFp16MinNormalPow2 - kMarlinGlobalBias, kFp16MaxPow2 - kMarlinGlobalBias,
      kFp16MinNormalPow2 - kMarlinGlobalBias + kRoutingWeightHeadroom},
     "block scales in [2^-6, 2^8] and global multiplier in [2^-21, 2^8]: exact through vLLM's and SGLang's FP4 "
     "Marlin path in fp16 and bf16 (span <= 14, default)",
     "vLLM 0.34.0 Marlin and SGLang 0.5.23 Marlin, fp16 and bf16"},
    {Window::E4M3, "e4m3",
     {kE4M3MinPow2, kE4M3MaxPow2, -kFloatMaxPow2, -kFloatMinNormalPow2, -kFloatMaxPow2},
     "block scales in [2^-9, 2^8], any normal FP32 global: exact on disk only (span <= 17)",
     "readers that decode E4M3 and the FP32 global faithfully (compressed-tensors); not Marlin"},
}};

// The same rows, as the choice table the CLI binds.
constexpr auto kWindowChoices = [] {
  std::array<Choice<Window>, kWindows.size()> out{};
  for (std::size_t i = 0; i < kWindows.size(); ++i) out[i] = {kWindows[i].window, kWindows[i].name, kWindows[i].summary};
  return out;
}();

}  // namespace

template <>
std::span<const Choice<Window>> choices<Window>() {
  return kWindowChoices;
}

std::span<const WindowInfo> windows() { return kWindows; }

const WindowInfo& window_spec(Window w) {
  for (const auto& s : kWindows) {
    if (s.window == w) return s;
  }
  return kWindows[0];
}

WindowLimits window_limits(Window w) { return window_spec(w).limits; }

std::string_view window_name(Window w) { return window_spec(w).name; }

std::optional<Window> parse_window(std::string_view name) {
  for (const auto& s : kWindows) {
    if (s.name == name) return s.window;
  }
  return std::nullopt;
}

bool global_multiplier_fits(Window w, double multiplier) {
  const WindowLimits l = window_limits(w);
  return std::isfinite(multiplier) && multiplier >= std::ldexp(1.0, l.global_min) &&
         multiplier < std::ldexp(1.0, l.global_max + 1);
}

}  // namespace mx2nv

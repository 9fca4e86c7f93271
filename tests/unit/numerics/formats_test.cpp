// Exhaustive numerics: every E8M0 byte, every E2M1 code, every E4M3 byte,
// and every scale byte through the transcode under both windows.
#include "convert/scale_map.hpp"
#include "numerics/formats.hpp"
#include "plan/plan.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace mx2nv {
namespace {

TEST(E8M0, EveryByteIsAPowerOfTwoExceptNaN) {
  for (int b = 0; b < 256; ++b) {
    const double v = e8m0_value(static_cast<std::uint8_t>(b));
    if (b == 0xFF) {
      EXPECT_TRUE(std::isnan(v));
      continue;
    }
    EXPECT_EQ(v, std::ldexp(1.0, b - 127)) << b;
  }
}

TEST(E2M1, AllSixteenCodes) {
  const double magnitudes[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (std::uint8_t c = 0; c < 16; ++c) {
    const double v = e2m1_value(c);
    EXPECT_EQ(std::fabs(v), magnitudes[c & 7]) << int(c);
    EXPECT_EQ(std::signbit(v), c >= 8) << int(c);  // 0x8 is -0
    EXPECT_EQ(e2m1_is_zero(c), (c & 7) == 0);
  }
}

TEST(E4M3, KnownBytes) {
  EXPECT_EQ(e4m3_value(0x7E), 448.0);
  EXPECT_EQ(e4m3_value(0x08), std::ldexp(1.0, -6));
  EXPECT_EQ(e4m3_value(0x01), std::ldexp(1.0, -9));
  EXPECT_EQ(e4m3_value(0x38), 1.0);
  EXPECT_EQ(e4m3_value(0x78), 256.0);
  EXPECT_TRUE(std::isnan(e4m3_value(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_value(0xFF)));
  EXPECT_TRUE(std::signbit(e4m3_value(0x80)));
  EXPECT_EQ(e4m3_value(0x00), 0.0);
}

TEST(E4M3, DecodeIsMonotoneOverPositiveBytes) {
  for (int b = 1; b < 0x7F; ++b) {
    EXPECT_LT(e4m3_value(static_cast<std::uint8_t>(b - 1)), e4m3_value(static_cast<std::uint8_t>(b))) << b;
    EXPECT_EQ(e4m3_value(static_cast<std::uint8_t>(b | 0x80)), -e4m3_value(static_cast<std::uint8_t>(b)));
  }
}

TEST(E4M3, PowerOfTwoEncodeRoundTripsAndIsUnique) {
  for (int e = -40; e <= 40; ++e) {
    const auto enc = e4m3_encode_pow2(e);
    if (e < -9 || e > 8) {
      EXPECT_FALSE(enc.has_value()) << e;
      continue;
    }
    ASSERT_TRUE(enc.has_value()) << e;
    EXPECT_EQ(e4m3_value(*enc), std::ldexp(1.0, e)) << e;
  }
  // Every byte that decodes to a positive power of two is the encoder's byte.
  for (int b = 0; b < 256; ++b) {
    const double v = e4m3_value(static_cast<std::uint8_t>(b));
    if (!(v > 0) || std::isnan(v)) continue;
    int exp = 0;
    if (std::frexp(v, &exp) != 0.5) continue;
    EXPECT_EQ(e4m3_encode_pow2(exp - 1), static_cast<std::uint8_t>(b)) << b;
  }
}

TEST(GlobalDivisor, NormalFloatsOnly) {
  EXPECT_EQ(global_divisor_for(0), 1.0f);
  EXPECT_EQ(global_divisor_for(-14), 16384.0f);
  EXPECT_EQ(global_divisor_for(126), std::ldexp(1.0f, -126));
  EXPECT_FALSE(global_divisor_for(127).has_value());   // 2^-127 is subnormal
  EXPECT_EQ(global_divisor_for(-127), std::ldexp(1.0f, 127));
  EXPECT_FALSE(global_divisor_for(-128).has_value());  // 2^128 overflows
}

// Every source scale byte, as the lowest active group of a module whose top
// active group is fixed, under both windows: refused exactly when the span
// exceeds the window, and when accepted the written E4M3 scale divided by the
// global reproduces 2^k exactly.
class EveryScaleByte : public ::testing::TestWithParam<Window> {};

TEST_P(EveryScaleByte, AcceptedExactlyWithinTheWindow) {
  const Window window = GetParam();
  const int span_limit = window_limits(window).max_span();
  for (const int top_byte : {254, 200, 145, 144, 135, 127, 120, 113, 112, 106, 100, 90, 20, 10}) {
    for (int b = 0; b <= top_byte; ++b) {
      ModuleSet set;
      QuantModule m;
      m.name = "x.w2";
      m.rows = 1;
      m.groups = 2;
      set.modules.push_back(m);
      set.scale_groups = {{0}};
      ModuleFacts f;
      f.k_max = top_byte - 127;
      f.k_min = b - 127;
      ByteHistogram h{};
      ++h[static_cast<std::size_t>(top_byte)];
      ++h[static_cast<std::size_t>(b)];
      f.histogram = to_sparse(h);
      // Both groups are active; the counter answers from that.
      const auto counter = [&](std::size_t, int lo, int hi) -> std::uint64_t {
        std::uint64_t n = 0;
        for (const int k : {top_byte - 127, b - 127}) n += (k >= lo && k <= hi) ? 1 : 0;
        if (top_byte == b) n = (b - 127 >= lo && b - 127 <= hi) ? 2 : 0;
        return n;
      };
      const Plan plan = make_plan(set, {f}, window, counter);
      // Brute force over every global exponent that keeps both block scales in
      // the window, lies in the window's global range and gives a normal FP32
      // divisor: the plan takes the smallest at or above the preferred
      // minimum, else the largest.
      const WindowLimits l = window_limits(window);
      std::optional<int> smallest, largest;
      for (int g = -300; g <= 300; ++g) {
        const bool scales_ok = top_byte - 127 - g <= l.max_exp && b - 127 - g >= l.min_exp;
        if (!scales_ok || g < l.global_min || g > l.global_max || !global_divisor_for(g)) continue;
        largest = g;
        if (!smallest && g >= l.global_preferred_min) smallest = g;
      }
      if (!smallest) smallest = largest;
      const bool expect_refused = !smallest.has_value();
      ASSERT_EQ(plan.refused(), expect_refused) << "top " << top_byte << " byte " << b;
      if (expect_refused) {
        if ((top_byte - b) > span_limit) {
          ASSERT_EQ(plan.refused_spans.size(), 1u);
          EXPECT_EQ(plan.refused_spans[0].span, top_byte - b);
          EXPECT_EQ(plan.refused_spans[0].groups_outside, 1u);
        } else {
          EXPECT_EQ(plan.global_conflicts.size(), 1u) << "top " << top_byte << " byte " << b;
        }
        continue;
      }
      EXPECT_EQ(plan.modules[0].m, *smallest) << "top " << top_byte << " byte " << b;
      if (window == Window::Marlin) {
        // vLLM's Marlin path multiplies the global 2^m by 2^7 in fp16: a normal
        // fp16 (>= 2^-14) no larger than 65504.
        const double folded = std::ldexp(1.0, plan.modules[0].m + 7);
        EXPECT_GE(folded, std::ldexp(1.0, -14));
        EXPECT_LE(folded, 65504.0);
      }
      const ModulePlan& p = plan.modules[0];
      const ScaleLut lut = make_scale_lut(p.m, p.zero_scales);
      for (const int byte : {top_byte, b}) {
        const double written = e4m3_value(lut[static_cast<std::size_t>(byte)]) / static_cast<double>(p.divisor);
        EXPECT_EQ(written, std::ldexp(1.0, byte - 127)) << "top " << top_byte << " byte " << byte;
        if (window == Window::Marlin) {
          EXPECT_GE(e4m3_value(lut[static_cast<std::size_t>(byte)]), std::ldexp(1.0, -6));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(BothWindows, EveryScaleByte, ::testing::Values(Window::Marlin, Window::E4M3),
                         [](const auto& p) { return std::string(window_name(p.param)); });

TEST(ScaleLut, EveryByteMapsToExactPowerOrZero) {
  for (const int m : {-20, -14, -1, 0, 5, 100}) {
    const ScaleLut lut = make_scale_lut(m, false);
    for (int b = 0; b < 255; ++b) {
      const int e = b - 127 - m;
      if (e >= -9 && e <= 8) {
        EXPECT_EQ(e4m3_value(lut[static_cast<std::size_t>(b)]), std::ldexp(1.0, e));
      } else {
        EXPECT_EQ(lut[static_cast<std::size_t>(b)], 0) << "m " << m << " byte " << b;
      }
    }
  }
  const ScaleLut zeros = make_scale_lut(0, true);
  for (const auto v : zeros) EXPECT_EQ(v, 0);
}

TEST(ScaleLut, MapWritesEachScaleTwice) {
  const ScaleLut lut = make_scale_lut(0, false);
  const std::byte in[3] = {std::byte{127}, std::byte{120}, std::byte{135}};
  std::byte out[6];
  map_scales(lut, in, out);
  EXPECT_EQ(std::to_integer<int>(out[0]), 0x38);  // 2^0
  EXPECT_EQ(std::to_integer<int>(out[2]), 0x04);  // 2^-7, subnormal
  EXPECT_EQ(std::to_integer<int>(out[4]), 0x78);  // 2^8
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out[2 * i], out[2 * i + 1]);
}

}  // namespace
}  // namespace mx2nv

// The two NVFP4 layouts (model/target_format.hpp): their names, the
// second-level scale stored as a divisor or as its exact reciprocal, and the
// layout a converted checkpoint's config says it is in.
#include "model/target_format.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace mx2nv {
namespace {

TEST(TargetFormat, NamesAndShapes) {
  const FormatNames& ct = format_names(TargetFormat::CompressedTensors);
  EXPECT_EQ(ct.packed, ".weight_packed");
  EXPECT_EQ(ct.global, ".weight_global_scale");
  EXPECT_EQ(ct.global_shape, std::vector<std::uint64_t>{1});
  EXPECT_TRUE(ct.global_is_divisor);
  const FormatNames& mo = format_names(TargetFormat::ModelOpt);
  EXPECT_EQ(mo.packed, ".weight");
  EXPECT_EQ(mo.scale, ".weight_scale");
  EXPECT_EQ(mo.global, ".weight_scale_2");
  EXPECT_TRUE(mo.global_shape.empty());
  EXPECT_FALSE(mo.global_is_divisor);
}

TEST(TargetFormat, EveryPowerOfTwoDivisorRoundTripsExactly) {
  for (int e = -126; e <= 126; ++e) {
    const float divisor = std::ldexp(1.0f, e);
    const float stored = stored_global(TargetFormat::ModelOpt, divisor);
    EXPECT_EQ(static_cast<double>(stored) * static_cast<double>(divisor), 1.0) << e;
    EXPECT_EQ(divisor_of_stored(TargetFormat::ModelOpt, stored), divisor) << e;
    EXPECT_EQ(stored_global(TargetFormat::CompressedTensors, divisor), divisor);
  }
}

TEST(TargetFormat, NoDivisorFromWhatIsNotAPositiveFiniteScale) {
  for (const TargetFormat f : {TargetFormat::CompressedTensors, TargetFormat::ModelOpt}) {
    for (const float bad : {0.0f, -0.0f, -1.0f, std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()}) {
      EXPECT_FALSE(divisor_of_stored(f, bad).has_value()) << bad;
    }
  }
  // The reciprocal of the smallest subnormal overflows: no divisor.
  EXPECT_FALSE(divisor_of_stored(TargetFormat::ModelOpt, std::numeric_limits<float>::denorm_min()).has_value());
}

TEST(TargetFormat, TheConfigSaysWhichLayout) {
  EXPECT_EQ(target_format_of(R"({"quantization_config": {"quant_method": "compressed-tensors"}})", false),
            TargetFormat::CompressedTensors);
  EXPECT_EQ(target_format_of(R"({"quantization_config": {"quant_method": "modelopt"}})", false),
            TargetFormat::ModelOpt);
  EXPECT_EQ(target_format_of(R"({"text_config": {"quantization_config": {"quant_method": "modelopt_fp4"}}})", false),
            TargetFormat::ModelOpt);
  // One damaged copy of two: still ModelOpt's, so its checks name the damage.
  EXPECT_EQ(target_format_of(R"({"quantization_config": {"quant_method": "x"}, "text_config":)"
                             R"( {"quantization_config": {"quant_method": "modelopt"}}})", false),
            TargetFormat::ModelOpt);
  EXPECT_EQ(target_format_of("{}", true), TargetFormat::ModelOpt);
  EXPECT_EQ(target_format_of("not json", false), TargetFormat::CompressedTensors);
  EXPECT_EQ(target_format_of("[1]", false), TargetFormat::CompressedTensors);
}

}  // namespace
}  // namespace mx2nv

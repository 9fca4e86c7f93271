// Exact BF16 encoding of decoded MXFP4 values, for writing a module
// dequantized (convert --overspan bf16). BF16 is float32's upper half: an
// E2M1 x 2^k value is exact in BF16 unless it is beyond BF16's largest finite
// value (~3.39e38): E2M1 has two significant bits, BF16 eight, and BF16's
// subnormals reach 2^-133, below the smallest MXFP4 value 2^-128.
#pragma once

#include <cstdint>
#include <optional>

namespace mx2nv {

// The BF16 bits of `value` when BF16 holds it exactly; nullopt otherwise
// (never rounds).
std::optional<std::uint16_t> bf16_exact(double value);

// The value of BF16 bits (NaN for NaN encodings).
double bf16_value(std::uint16_t bits);

}  // namespace mx2nv

// safetensors dtype names and their sizes in bits (huggingface/safetensors
// `Dtype`). Sizes are in bits because F4 and F6 pack below a byte.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace mx2nv {

enum class Dtype : std::uint8_t {
  BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ,
  I16, U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64,
};

std::optional<Dtype> parse_dtype(std::string_view name);
std::string_view dtype_name(Dtype d);
unsigned dtype_bits(Dtype d);

}  // namespace mx2nv

// Fuzz target: a whole safetensors file's first bytes. Property: parsing
// never crashes or leaks; what parses re-serialises to a header that parses
// back to the same tensors.
#include "common/error.hpp"
#include "safetensors/header.hpp"

#include <cstdint>
#include <cstdlib>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace mx2nv;
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  try {
    const std::uint64_t n = ShardHeader::parse_header_length({bytes, size < 8 ? size : 8}, size, "fuzz");
    const std::string_view json(reinterpret_cast<const char*>(data) + 8, static_cast<std::size_t>(n));
    const ShardHeader h = ShardHeader::parse(json, size, "fuzz");
    const std::string again = serialize_header(h.metadata(), h.tensors());
    const std::uint64_t n2 = again.size() - 8;
    const ShardHeader h2 = ShardHeader::parse(std::string_view(again).substr(8), n2 + 8 + h.data_size(), "again");
    if (h2.tensors().size() != h.tensors().size()) std::abort();
    for (std::size_t i = 0; i < h.tensors().size(); ++i) {
      const auto& a = h.tensors()[i];
      const auto& b = h2.tensors()[i];
      if (a.name != b.name || a.dtype != b.dtype || a.shape != b.shape || a.begin != b.begin || a.end != b.end) {
        std::abort();
      }
    }
  } catch (const Error&) {
  }
  return 0;
}

// SHA-256 (FIPS 180-4), for DST/.mx2nv/card.json: the digests a publisher
// can recompute with `sha256sum` (XXH3 is not a tool everyone has).
#pragma once

#include <string>
#include <string_view>

namespace mx2nv {

std::string sha256_hex(std::string_view bytes);  // 64 lowercase hex digits

}  // namespace mx2nv

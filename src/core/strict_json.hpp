// JSON parsing for untrusted documents (safetensors headers, index files,
// config.json). nlohmann's DOM parser silently keeps the last of duplicate
// keys; a checkpoint whose two readers could disagree about a tensor is
// exactly what we must refuse, so we parse through SAX and reject duplicates,
// excessive nesting, invalid UTF-8 (the lexer enforces UTF-8), a leading
// byte order mark and NUL bytes (see json_stream.hpp). This DOM parser is for
// small documents (config.json, records); large ones stream (json_stream.hpp).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace mx2nv {

using Json = nlohmann::json;

inline constexpr std::size_t kMaxJsonDepth = 64;

struct StrictJson {
  Json value;
  // Keys of the top-level object in document order (nlohmann::json sorts keys;
  // safetensors tensor order and config layout are observable, so we keep it).
  std::vector<std::string> top_level_keys;
};

// Throws Error(InvalidInput) naming `what` (a file name) and the byte offset.
StrictJson parse_strict_json(std::string_view text, std::string_view what);

}  // namespace mx2nv

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

// A JSON value built from SAX events into `root`: values go into the open
// container (under the last key given, in an object) or, with none open,
// into the root itself. Handlers check keys and depth; this only places.
class JsonTree {
 public:
  explicit JsonTree(Json& root) : root_(&root) {}
  // Places a scalar or an empty container; returns where it went.
  Json* place(Json&& v);
  void open(Json&& container) { stack_.push_back(place(std::move(container))); }
  void close() { stack_.pop_back(); }
  // The key for the next value in the open object (moved from `k`); false,
  // and `k` untouched, if the object already has it.
  bool key(std::string& k);
  bool at_root() const { return stack_.empty(); }
  std::size_t depth() const { return stack_.size(); }

 private:
  Json* root_;
  std::vector<Json*> stack_;
  std::string pending_key_;
};

struct StrictJson {
  Json value;
  // Keys of the top-level object in document order (nlohmann::json sorts keys;
  // safetensors tensor order and config layout are observable, so we keep it).
  std::vector<std::string> top_level_keys;
};

// Throws Error(InvalidInput) naming `what` (a file name) and the byte offset.
// `max_values` bounds the DOM (every scalar, object and array counts one):
// a document of many tiny values costs tens of times its size in memory, so
// callers that parse text of any origin below a size cap can also cap this.
StrictJson parse_strict_json(std::string_view text, std::string_view what,
                             std::size_t max_values = static_cast<std::size_t>(-1));

// The member `key` of `v` when v is an object holding it, else null: how
// checkers read documents of any shape without throwing.
const Json& member_or_null(const Json& v, std::string_view key);

}  // namespace mx2nv

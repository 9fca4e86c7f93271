// File names with a meaning, defined once: the checkpoint's structural files
// (config, index, single-file model) and the names mx2nv reserves inside a
// destination (its state directory and temporary files). A source that holds
// a reserved name is refused: converting it would either overwrite mx2nv's
// own state or have a later run delete the user's file as a leftover.
#pragma once

#include <string_view>

namespace mx2nv {

inline constexpr std::string_view kConfigFileName = "config.json";
inline constexpr std::string_view kIndexFileName = "model.safetensors.index.json";
inline constexpr std::string_view kSingleShardName = "model.safetensors";
// ModelOpt's quantization settings, beside config.json in its checkpoints (and
// in an mx2nv DST written with --format modelopt).
inline constexpr std::string_view kModelOptConfigFileName = "hf_quant_config.json";

// DST/.mx2nv/: the lock, which conversion an unfinished DST is receiving, the
// per-shard records of an unfinished run, and the record of a finished one.
inline constexpr std::string_view kStateDirName = ".mx2nv";
inline constexpr std::string_view kLockFileName = "lock";
inline constexpr std::string_view kConversionFileName = "conversion.json";
inline constexpr std::string_view kRecordsDirName = "state";
inline constexpr std::string_view kFinishedFileName = "finished.json";
// `mx2nv card`'s record of the card it wrote (card/card.hpp): kept beside
// finished.json when a finished DST is tidied.
inline constexpr std::string_view kCardRecordFileName = "card.json";
// The card itself and SRC's README.md kept beside it, in DST's root.
inline constexpr std::string_view kCardFileName = "README.md";
inline constexpr std::string_view kSourceCardFileName = "README.source.md";
// Files being written are named ".mx2nv-tmp.<n>.<final name>" in their final directory.
inline constexpr std::string_view kTempPrefix = ".mx2nv-tmp.";

// True when some component of `relative_path` ('/'-separated) starts with
// ".mx2nv" (the state directory, temporary files, and anything that could be
// mistaken for them).
constexpr bool is_reserved_name(std::string_view relative_path) {
  constexpr std::string_view kReserved = ".mx2nv";
  std::size_t begin = 0;
  while (begin <= relative_path.size()) {
    const std::size_t end = relative_path.find('/', begin);
    const std::string_view component =
        relative_path.substr(begin, end == std::string_view::npos ? std::string_view::npos : end - begin);
    if (component.starts_with(kReserved)) return true;
    if (end == std::string_view::npos) break;
    begin = end + 1;
  }
  return false;
}

}  // namespace mx2nv

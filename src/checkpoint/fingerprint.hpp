// A digest of a checkpoint's files, recorded in verify's and requantize's
// reports (`fingerprint`) so that `mx2nv card` can tell whether the files a
// report speaks of are still the files on disk (docs/reference/model-card.md
// §7).
//
// One line per file, in byte order of the relative name:
//   json_text(name) \t size \t mtime_ns \t ctime_ns \t inode \t xxh3-64(content)
// where content is a shard's header (8-byte length + JSON header) and every
// other file whole; the digest is XXH3-128 of the lines. Size, mtime and
// header catch a re-conversion or a replaced shard; the content hash catches
// an edit of config, index or companions; ctime and inode catch an in-place
// edit of tensor data even when size and mtime are restored (every write,
// truncate or clone sets ctime to now, and no system call sets it to a chosen
// value: the argument destination/records.hpp relies on). Reading every
// tensor byte again would be a second verify.
#pragma once

#include "checkpoint/reader.hpp"
#include "safetensors/file_names.hpp"

#include <cstdint>
#include <string>

namespace mx2nv {

inline constexpr std::string_view kFingerprintScheme = "mx2nv-fingerprint/1";

struct FileSetDigest {
  std::string digest;  // "xxh3-128:<32 lowercase hex>"
  std::uint64_t files = 0;
};

// `ck` as open_checkpoint opened it (`role` as given there): its shards,
// config, index and companions; for a Target the card's files
// (kCardFileName, kSourceCardFileName) are left out: `card` can run again
// after a fresh verify, and its own writes are not changes to DST.
FileSetDigest checkpoint_fingerprint(const Checkpoint& ck, CheckpointRole role);

}  // namespace mx2nv

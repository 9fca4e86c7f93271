#include "checkpoint/fingerprint.hpp"

#include "common/error.hpp"
#include "common/printable.hpp"
#include "common/stream_hash.hpp"
#include "safetensors/file_names.hpp"
#include "sys/file.hpp"

#include <fmt/core.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <limits>
#include <vector>

namespace mx2nv {
namespace {

constexpr std::size_t kHashChunk = 1 << 20;

// XXH3-64 of `length` bytes of `f` from `offset`, read in bounded chunks.
std::uint64_t hash_range(const File& f, std::uint64_t offset, std::uint64_t length) {
  StreamHash h;
  std::vector<std::byte> buffer(static_cast<std::size_t>(std::min<std::uint64_t>(length, kHashChunk)));
  for (std::uint64_t done = 0; done < length;) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), length - done));
    f.read_at(offset + done, {buffer.data(), n});
    h.update({buffer.data(), n});
    done += n;
  }
  return h.digest();
}

// Nanoseconds, saturated: a timestamp set far outside the epoch's range
// (utimensat takes any value) still gives a defined, distinct-enough line.
std::int64_t ns(const struct timespec& t) {
  constexpr std::int64_t kLimit = std::numeric_limits<std::int64_t>::max() / 1'000'000'000 - 1;
  const auto s = static_cast<std::int64_t>(t.tv_sec);
  if (s > kLimit || s < -kLimit) return s;
  return s * 1'000'000'000 + static_cast<std::int64_t>(t.tv_nsec);
}

// The line of one file; `header_bytes` > 0: hash only that prefix (a shard).
std::string file_line(const fs::path& root, const std::string& name, std::uint64_t header_bytes) {
  const File f = File::open_read(root / name);
  struct stat st {};
  if (::fstat(f.fd(), &st) != 0) fail(ErrorKind::Io, "cannot stat {}", printable((root / name).string()));
  const std::uint64_t size = f.size();
  const std::uint64_t hashed = header_bytes > 0 ? std::min(header_bytes, size) : size;
  return fmt::format("{}\t{}\t{}\t{}\t{}\t{:016x}\n", json_text(name), size, ns(st.st_mtim), ns(st.st_ctim),
                     static_cast<std::uint64_t>(st.st_ino), hash_range(f, 0, hashed));
}

}  // namespace

FileSetDigest checkpoint_fingerprint(const Checkpoint& ck, CheckpointRole role) {
  // (name, header bytes or 0 for the whole file)
  std::vector<std::pair<std::string, std::uint64_t>> files;
  for (const auto& s : ck.shards) files.emplace_back(s.file, s.data_start);
  files.emplace_back(std::string(kConfigFileName), 0);
  if (ck.index) files.emplace_back(std::string(kIndexFileName), 0);
  for (const auto& c : ck.companions) {
    if (role == CheckpointRole::Target && (c == kCardFileName || c == kSourceCardFileName)) continue;
    files.emplace_back(c, 0);
  }
  std::sort(files.begin(), files.end());
  XXH3_state_t* state = XXH3_createState();
  if (state == nullptr) throw std::bad_alloc();
  XXH3_128bits_reset(state);
  try {
    for (const auto& [name, header] : files) {
      const std::string line = file_line(ck.root, name, header);
      XXH3_128bits_update(state, line.data(), line.size());
    }
  } catch (...) {
    XXH3_freeState(state);
    throw;
  }
  const XXH128_hash_t d = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  return {fmt::format("xxh3-128:{:016x}{:016x}", d.high64, d.low64), files.size()};
}

}  // namespace mx2nv

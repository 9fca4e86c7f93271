// verify: the files around the tensors.
#include "common/cancel.hpp"
#include "json/strict_json.hpp"
#include "safetensors/file_names.hpp"
#include "verify/checks.hpp"

#include <algorithm>
#include <cstring>
#include <set>

namespace mx2nv {
namespace {

constexpr std::size_t kCompareBytes = 4 << 20;

}  // namespace

std::vector<std::string> Differences::take() {
  if (count_ > list_.size()) list_.push_back(fmt::format("... and {} more", count_ - list_.size()));
  return std::move(list_);
}

void compare_bytes(const File& a, std::uint64_t a_off, const File& b, std::uint64_t b_off, std::uint64_t n,
                   const std::string& what, Differences& diff) {
  std::vector<std::byte> x(static_cast<std::size_t>(std::min<std::uint64_t>(n, kCompareBytes)));
  std::vector<std::byte> y(x.size());
  for (std::uint64_t done = 0; done < n; done += x.size()) {
    const auto len = static_cast<std::size_t>(std::min<std::uint64_t>(x.size(), n - done));
    a.read_at(a_off + done, {x.data(), len});
    b.read_at(b_off + done, {y.data(), len});
    if (std::memcmp(x.data(), y.data(), len) != 0) {
      const auto at = std::mismatch(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(len), y.begin()).first;
      diff.add("{}: byte {} differs", what, done + static_cast<std::uint64_t>(at - x.begin()));
      return;
    }
    throw_if_stopped();
  }
}

// A DST carded by `mx2nv card` (its .mx2nv/card.json parses): SRC's
// README.md is kept as README.source.md, and README.md is the card, which is
// documentation the publisher may edit and is not compared
// (docs/reference/model-card.md §7).
bool carded(const fs::path& dst) {
  std::error_code ec;
  const fs::path record = dst / kStateDirName / kCardRecordFileName;
  if (!fs::is_regular_file(fs::symlink_status(record, ec)) || ec) return false;
  try {
    const Json j = parse_strict_json(read_text_file(record, 1 << 20), "card.json").value;
    return j.is_object() && j.value("format", Json()) == "mx2nv-card/1";
  } catch (const Error&) {
    return false;
  }
}

void check_files(const VerifyContext& ctx) {
  const Checkpoint& src = ctx.source.checkpoint;
  const Checkpoint& dst = ctx.target;
  Differences& diff = ctx.diff;
  const bool card = carded(dst.root);
  // SRC's companion -> its name in DST.
  const auto in_dst = [&](const std::string& rel) {
    return card && rel == kCardFileName ? std::string(kSourceCardFileName) : rel;
  };
  std::set<std::string> a, b(dst.companions.begin(), dst.companions.end());
  for (const auto& f : src.companions) a.insert(in_dst(f));
  if (card) b.erase(std::string(kCardFileName));
  // ModelOpt's settings file is DST's own (checked with config.json).
  if (ctx.format == TargetFormat::ModelOpt) b.erase(std::string(kModelOptConfigFileName));
  if (a != b) {
    for (const auto& f : a) if (!b.count(f)) diff.add("{}: companion file missing from DST", f);
    for (const auto& f : b) if (!a.count(f)) diff.add("{}: unexpected file in DST", f);
  }
  for (const auto& rel : src.companions) {
    const std::string there = in_dst(rel);
    if (!b.count(there)) continue;
    const File fa = File::open_read(src.root / rel);
    const File fb = File::open_read(dst.root / there);
    if (fa.size() != fb.size()) {
      diff.add("{}: {} bytes in SRC, {} in DST{}", rel, fa.size(), fb.size(), there == rel ? "" : " (" + there + ")");
    } else {
      compare_bytes(fa, 0, fb, 0, fa.size(), there, diff);
    }
  }
  if (src.index.has_value() != dst.index.has_value()) {
    diff.add("DST {} an index where SRC {}", dst.index ? "has" : "lacks", src.index ? "has one" : "does not");
  }
  if (dst.index) {
    const Json meta = dst.index->other.value("metadata", Json::object());
    if (meta.value("total_size", Json()) != Json(dst.tensor_bytes())) {
      diff.add("{}: metadata.total_size is {}, tensors hold {} bytes", kIndexFileName,
               meta.value("total_size", Json()).dump(), dst.tensor_bytes());
    }
  }
  std::vector<std::string> src_files, dst_files;
  for (const auto& s : src.shards) src_files.push_back(s.file);
  for (const auto& s : dst.shards) dst_files.push_back(s.file);
  if (src_files != dst_files) diff.add("DST shard files differ from SRC's");
}

}  // namespace mx2nv

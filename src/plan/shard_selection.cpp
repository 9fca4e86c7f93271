#include "plan/shard_selection.hpp"

#include "common/error.hpp"
#include "common/printable.hpp"

#include <charconv>
#include <optional>

namespace mx2nv {
namespace {

std::optional<std::size_t> parse_count(std::string_view text) {
  std::size_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return v;
}

}  // namespace

ShardSelection parse_shard_selection(std::string_view text) {
  const auto slash = text.find('/');
  if (slash == std::string_view::npos) fail(ErrorKind::Usage, "--shards {}: expected I/N", printable(text));
  const auto i = parse_count(text.substr(0, slash));
  const auto n = parse_count(text.substr(slash + 1));
  if (!i || !n || *n == 0 || *i >= *n) {
    fail(ErrorKind::Usage, "--shards {}: expected I/N with 0 <= I < N < 2^64", printable(text));
  }
  return {*i, *n};
}

ShardSelection parse_shard_index(std::string_view text) {
  const auto i = parse_count(text);
  if (!i) fail(ErrorKind::Usage, "--shard {}: expected a shard number below 2^64", printable(text));
  return {*i, 0};
}

std::vector<std::size_t> selected_shards(const ShardSelection& selection, std::size_t total) {
  if (selection.stride == 0) {
    if (selection.index >= total) {
      if (total == 0) fail(ErrorKind::Usage, "--shard {}: there are no shards", selection.index);
      fail(ErrorKind::Usage, "--shard {}: the plan has {} shards (0 to {})", selection.index, total, total - 1);
    }
    return {selection.index};
  }
  std::vector<std::size_t> out;
  // s < total, so total - s does not wrap; the next index is s + stride only
  // while that stays below total (s + stride itself could wrap past 2^64).
  for (std::size_t s = selection.index; s < total; s += selection.stride) {
    out.push_back(s);
    if (selection.stride >= total - s) break;
  }
  return out;
}

}  // namespace mx2nv

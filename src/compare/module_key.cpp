#include "compare/module_key.hpp"

#include "common/error.hpp"
#include "model/module_names.hpp"

#include <array>
#include <fmt/core.h>

namespace mx2nv {
namespace {

// Longest first where one prefix starts another ("model." vs
// "model.language_model."): the routed-expert test tries every prefix, the
// generic key removes the first that matches, in this order (the oracle's).
constexpr std::array<std::string_view, 4> kPrefixes = {"language_model.model.", "model.language_model.",
                                                       "language_model.", "model."};

// The key of each model/module_names projection (gate/up/down, in
// Projection's order), whatever the checkpoint's spelling.
constexpr std::array<std::string_view, 3> kProjectionKeys = {"gate", "up", "down"};

bool consume(std::string_view& s, std::string_view word) {
  if (!s.starts_with(word)) return false;
  s.remove_prefix(word.size());
  return true;
}

// One or more decimal digits, then a dot; the number must fit 64 bits.
std::optional<std::uint64_t> number_then_dot(std::string_view& s, std::string_view whole) {
  std::size_t n = 0;
  while (n < s.size() && s[n] >= '0' && s[n] <= '9') ++n;
  if (n == 0 || n >= s.size() || s[n] != '.') return std::nullopt;
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto digit = static_cast<std::uint64_t>(s[i] - '0');
    if (v > (~std::uint64_t{0} - digit) / 10) fail_input("{}: layer or expert number too large", whole);
    v = v * 10 + digit;
  }
  s.remove_prefix(n + 1);
  return v;
}

std::optional<RoutedExpert> expert_without_prefix(std::string_view s, std::string_view whole) {
  if (!consume(s, "layers.")) return std::nullopt;
  const auto layer = number_then_dot(s, whole);
  if (!layer) return std::nullopt;
  if (!consume(s, "block_sparse_moe.") && !consume(s, "mlp.") && !consume(s, "ffn.")) return std::nullopt;
  if (!consume(s, "experts.")) return std::nullopt;
  const auto expert = number_then_dot(s, whole);
  if (!expert) return std::nullopt;
  // What is left must be the whole last component, one of the projection
  // spellings model/module_names reads.
  const auto projection = parse_projection(whole);
  if (!projection || projection->suffix != s) return std::nullopt;
  return RoutedExpert{*layer, *expert, kProjectionKeys[static_cast<std::size_t>(projection->projection)]};
}

std::string expert_key(std::uint64_t layer, std::uint64_t expert, std::string_view projection) {
  return fmt::format("E{}.{}.{}", layer, expert, projection);
}

}  // namespace

std::optional<RoutedExpert> routed_expert(std::string_view name) {
  if (auto e = expert_without_prefix(name, name)) return e;
  for (const auto prefix : kPrefixes) {
    if (name.starts_with(prefix)) {
      if (auto e = expert_without_prefix(name.substr(prefix.size()), name)) return e;
    }
  }
  return std::nullopt;
}

std::string module_key(std::string_view name) {
  if (const auto e = routed_expert(name)) return expert_key(e->layer, e->expert, e->projection);
  for (const auto prefix : kPrefixes) {
    if (name.starts_with(prefix)) return "M" + std::string(name.substr(prefix.size()));
  }
  return "M" + std::string(name);
}

}  // namespace mx2nv

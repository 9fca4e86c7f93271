// A closed set of names a user chooses from (--window, --overspan, --copy,
// --progress, gate's --runtime/--dtype, generate's --layout, ...): one table
// per enum, beside the enum, holds each value's name and one line of help.
// The CLI binds the table directly (cli/shared_options.hpp add_choice), the
// Python validators and the reports read it, so each name is spelled once and
// a name is turned into a value in one direction only (parse_choice).
//
// An enum E takes part by specialising `choices<E>()` next to its definition:
//   template <> std::span<const Choice<MyEnum>> choices<MyEnum>();
// The table lists the default first and holds every enumerator exactly once
// (tests/unit/common/choice_test.cpp checks each table).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mx2nv {

template <class E>
struct Choice {
  E value;
  std::string_view name;  // what the user types and the reports write
  std::string_view help;  // one line for --help and docs
};

// E's table, default first. Declared here, specialised beside each enum.
template <class E>
std::span<const Choice<E>> choices();

template <class E>
std::optional<E> parse_choice(std::string_view name) {
  for (const Choice<E>& c : choices<E>()) {
    if (c.name == name) return c.value;
  }
  return std::nullopt;
}

template <class E>
const Choice<E>& choice_of(E value) {
  const auto table = choices<E>();
  for (const Choice<E>& c : table) {
    if (c.value == value) return c;
  }
  return table.front();  // unreachable for a complete table (checked by the tests)
}

template <class E>
std::string_view choice_name(E value) {
  return choice_of(value).name;
}

// Every name, in table order.
template <class E>
std::vector<std::string> choice_names() {
  std::vector<std::string> out;
  for (const Choice<E>& c : choices<E>()) out.emplace_back(c.name);
  return out;
}

// "a, b or c": how messages list the names.
template <class E>
std::string choice_list() {
  const auto names = choice_names<E>();
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " or " : ", ";
    out += names[i];
  }
  return out;
}

}  // namespace mx2nv

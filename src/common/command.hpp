// mx2nv's commands, named in one place: the CLI's subcommands and the
// "command" of a report (convert, verify, plan, requantize and inspect write
// reports; gate, generate and demo do not).
#pragma once

#include <string_view>

namespace mx2nv {

enum class Command { Convert, Verify, Plan, Requantize, Inspect, Gate, Generate, Demo, Card, Compare };
std::string_view command_name(Command command) noexcept;

}  // namespace mx2nv

#include "common/command.hpp"

namespace mx2nv {

std::string_view command_name(Command command) noexcept {
  switch (command) {
    case Command::Convert: return "convert";
    case Command::Verify: return "verify";
    case Command::Plan: return "plan";
    case Command::Requantize: return "requantize";
    case Command::Inspect: return "inspect";
    case Command::Gate: return "gate";
    case Command::Generate: return "generate";
    case Command::Demo: return "demo";
    case Command::Card: return "card";
    case Command::Compare: return "compare";
  }
  return "convert";
}

}  // namespace mx2nv

#include "cli/subcommand.hpp"

#include <CLI/CLI.hpp>

namespace mx2nv::cli {

Subcommand::Subcommand(CLI::App& mx2nv, Command command, const std::string& description)
    : command_(command), app_(mx2nv.add_subcommand(std::string(command_name(command)), description)) {}

bool Subcommand::chosen() const { return app_->parsed(); }

}  // namespace mx2nv::cli

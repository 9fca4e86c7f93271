// Text from a hostile checkpoint (tensor names, JSON fragments in parser
// errors) ends up in messages. Before it reaches a terminal, control bytes
// and invalid UTF-8 are escaped as \xNN so a file cannot drive the terminal.
#pragma once

#include <string>
#include <string_view>

namespace mx2nv {

std::string printable(std::string_view text);

}  // namespace mx2nv

// What every mx2nv HTML page shares (the command reports, compare's page):
// the head with its inline style and content security policy, and the
// escaping of untrusted text.
#pragma once

#include <string>
#include <string_view>

namespace mx2nv {

// Names come from a hostile checkpoint: control bytes escaped (printable),
// then HTML's special characters.
std::string html_escape(std::string_view raw);

// <!DOCTYPE html> through <body>: meta tags, the escaped title, the style.
std::string page_preamble(std::string_view title);

}  // namespace mx2nv

// Text we emit. Text from a hostile checkpoint or file system (tensor names,
// JSON fragments in parser errors, file and directory names, which on Linux
// are bytes, not text, a runtime probe's answers, partial reports) ends up in
// messages and JSON reports.
// - printable(): for terminals (every human-readable message, the HTML
//   report). Printable ASCII and valid UTF-8 pass through, except:
//     * a byte that is not part of valid UTF-8, a C0 control (U+0000-U+001F)
//       and DEL (U+007F) become \xNN (one byte, lower-case hex);
//     * the code points a terminal or a text renderer acts on become \uXXXX
//       (the whole code point, four lower-case hex digits): the C1 controls
//       U+0080-U+009F (U+009B is CSI on many terminals), the bidirectional
//       controls U+061C, U+200E, U+200F, U+202A-U+202E, U+2066-U+2069 (they
//       reorder what is shown: "Trojan Source"), and the line and paragraph
//       separators U+2028, U+2029.
//   So \xNN is always one raw byte and \uXXXX always one valid character:
//   the byte 0x9B (not UTF-8) shows as \x9b, the character U+009B as
//   \u009b. A backslash is not escaped, so printable() is idempotent (a
//   message that embeds an already printable() name is printed through
//   printable() again unchanged); the price is that a name that itself
//   contains the text "\x1b" prints like one that contains ESC.
// - json_text(): for JSON strings. Valid UTF-8 is kept as is; each byte that
//   is not part of valid UTF-8 becomes the four characters \xNN, so every
//   report is valid JSON for any path, and two paths that differ in bytes
//   give different strings. (Documented in README "Report".)
// - dump_json(): the one way we serialise JSON; it never throws on text, and
//   writes DEL and the characters printable() writes as \uXXXX as JSON
//   \uXXXX escapes (the same string to a JSON reader), so `cat report.json`
//   or `gate --json` on a terminal cannot drive it either (JSON itself
//   escapes C0 controls).
// - human_bytes(): a byte count for people (B, KiB, MiB, GiB, TiB).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace mx2nv {

std::string printable(std::string_view text);
std::string json_text(std::string_view text);
std::string dump_json(const nlohmann::json& value, int indent = 2);
std::string human_bytes(std::uint64_t n);
// At most `max_bytes` of `text` (cut before a UTF-8 sequence it would split),
// then "... (N bytes)" when it was cut, through printable(): hostile text of
// megabytes (a path in a forged plan, a JSON token in a parser's message)
// is never echoed whole.
std::string excerpt(std::string_view text, std::size_t max_bytes = 256);

// The code points printable() writes as \uXXXX (see above).
bool terminal_unsafe_code_point(char32_t c);

}  // namespace mx2nv

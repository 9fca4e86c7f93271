// Text we emit. Text from a hostile checkpoint or file system (tensor names,
// JSON fragments in parser errors, file and directory names, which on Linux
// are bytes, not text) ends up in messages and JSON reports.
// - printable(): for terminals. Control bytes and invalid UTF-8 become \xNN
//   so a file cannot drive the terminal.
// - json_text(): for JSON strings. Valid UTF-8 is kept as is (JSON escapes
//   control characters itself); each byte that is not part of valid UTF-8
//   becomes the four characters \xNN, so every report is valid JSON for any
//   path. (Documented in README "Report".)
// - dump_json(): the one way we serialise JSON; it never throws on text.
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

}  // namespace mx2nv

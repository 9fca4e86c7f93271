// Command lines mx2nv suggests (convert's `next`, the continuation after an
// interruption, refusal hints) are printed so they run as printed: each word
// shell-quoted for bash, a path that starts with '-' written as ./-... so it
// is never taken for an option.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace mx2nv::cli {

// One word for bash: unchanged when it holds only characters no shell treats
// specially; else in single quotes; a word that printable() would change (a
// control character, invalid UTF-8) as $'...' with \xHH escapes, so the line
// is both safe on a terminal and runnable.
std::string shell_word(std::string_view word);
// A path argument: shell_word, with "./" before a relative path that starts with '-'.
std::string shell_path(std::string_view path);
// "mx2nv" and the words, each quoted (already quoted words are not: give the raw ones).
std::string shell_line(const std::vector<std::string>& words);

}  // namespace mx2nv::cli

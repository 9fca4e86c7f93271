// The byte-level rules of the model card (docs/reference/model-card.md §4,
// §5.0): double-quoted ASCII YAML scalars, Markdown code spans that no input
// can break out of, and numbers written exactly as Python's repr writes them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mx2nv {

// UTF-8 to code points; nullopt when `text` is not valid UTF-8 (overlong
// forms, surrogates and values above U+10FFFF are invalid).
std::optional<std::vector<char32_t>> decode_utf8(std::string_view text);
void append_utf8(std::string& out, char32_t c);
// The offset of the first byte that is not part of valid UTF-8, or npos.
std::size_t first_invalid_utf8(std::string_view text);

// A YAML double-quoted scalar, pure ASCII: `"` and `\` escaped, U+0020-U+007E
// as is, everything else \xHH, \uHHHH or \UHHHHHHHH (uppercase hex). `text`
// is valid UTF-8 (inherited values were decoded from it; computed ones are
// ASCII).
std::string yaml_quoted(std::string_view text);

// Text from an input in a Markdown code span: controls, DEL, C1, U+2028,
// U+2029 and U+FEFF as \xHH / \uHHHH (invalid UTF-8 bytes as \xHH), a fence
// one backtick longer than the longest run inside, padded when the text
// starts or ends with a backtick or space; `in_table`: `|` as `\|`.
std::string code_span(std::string_view text, bool in_table = false);
// The same escaping without the span: for a fenced block's lines.
std::string escaped_text(std::string_view text);

// Python's repr(float): the shortest digits that round-trip, fixed notation
// for decimal exponents in [-4, 16), else "1e-05" / "1e+16"; "inf", "nan".
std::string python_float(double value);

}  // namespace mx2nv

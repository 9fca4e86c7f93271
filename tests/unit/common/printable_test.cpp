// What reaches a terminal (printable) and a JSON document (json_text,
// dump_json) from text mx2nv did not write: every C0 and C1 control, DEL,
// every bidirectional control and line separator, and every byte that is not
// UTF-8 is escaped, each form saying what it stands for (\xNN one byte,
// \uXXXX one character), and valid text passes unchanged.
#include "common/printable.hpp"
#include "json/strict_json.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <random>

namespace mx2nv {
namespace {

std::string utf8(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

// Nothing a terminal acts on: no C0, DEL or C1 control, no bidi control, no
// line separator, valid UTF-8 throughout.
bool terminal_safe(const std::string& s) {
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x20 || b == 0x7F) return false;
  }
  try {
    const std::u32string decoded = [&] {
      std::u32string out;
      for (std::size_t i = 0; i < s.size();) {
        const auto b = static_cast<unsigned char>(s[i]);
        std::size_t n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
        if (b >= 0x80 && b < 0xC2) throw 0;
        char32_t c = n == 1 ? char32_t{b} : static_cast<char32_t>(b & (0xFFu >> (n + 1)));
        for (std::size_t k = 1; k < n; ++k) {
          if (i + k >= s.size() || (static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) throw 0;
          c = (c << 6) | static_cast<char32_t>(static_cast<unsigned char>(s[i + k]) & 0x3Fu);
        }
        out += c;
        i += n;
      }
      return out;
    }();
    for (const char32_t c : decoded) {
      if (terminal_unsafe_code_point(c)) return false;
    }
  } catch (int) {
    return false;
  }
  return true;
}

TEST(Printable, EscapesC0DelAndInvalidUtf8AsBytes) {
  EXPECT_EQ(printable("layers.0.w1"), "layers.0.w1");
  EXPECT_EQ(printable("a\x1b[2Jb"), "a\\x1b[2Jb");
  EXPECT_EQ(printable("\x7f"), "\\x7f");
  EXPECT_EQ(printable("\r\n\t"), "\\x0d\\x0a\\x09");
  EXPECT_EQ(printable("x\xff\xc3"), "x\\xff\\xc3");
  EXPECT_EQ(printable("\xc0\xaf"), "\\xc0\\xaf");  // overlong
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a UTF-16 surrogate is not UTF-8
  EXPECT_EQ(printable("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // beyond U+10FFFF
}

TEST(Printable, EscapesEveryC1ControlAsACodePoint) {
  for (char32_t c = 0x80; c <= 0x9F; ++c) {
    EXPECT_EQ(printable("a" + utf8(c) + "b"), fmt::format("a\\u{:04x}b", static_cast<unsigned>(c)));
  }
  // The character U+009B (CSI) and the byte 0x9B (not UTF-8) read differently.
  EXPECT_EQ(printable("\xc2\x9b" "2J"), "\\u009b2J");
  EXPECT_EQ(printable("\x9b" "2J"), "\\x9b2J");
  EXPECT_EQ(printable("\xc2\xa0"), "\xc2\xa0");  // U+00A0, the first character after C1, is text
}

TEST(Printable, EscapesBidiControlsAndLineSeparators) {
  for (const char32_t c : {0x061Cu, 0x200Eu, 0x200Fu, 0x202Au, 0x202Bu, 0x202Cu, 0x202Du, 0x202Eu, 0x2066u, 0x2067u,
                           0x2068u, 0x2069u, 0x2028u, 0x2029u}) {
    EXPECT_EQ(printable(utf8(c)), fmt::format("\\u{:04x}", static_cast<unsigned>(c)));
  }
  // "Trojan Source": an override that would show a name reversed.
  EXPECT_EQ(printable("model.\xe2\x80\xae" "1w.stre\xe2\x80\xac"), "model.\\u202e1w.stre\\u202c");
  // Their neighbours are text.
  for (const char32_t c : {0x061Bu, 0x200Du, 0x2027u, 0x202Fu, 0x2065u, 0x206Au, 0x00E9u, 0x5C02u, 0x1F600u}) {
    EXPECT_EQ(printable(utf8(c)), utf8(c));
  }
}

TEST(Printable, IsIdempotentAndAlwaysTerminalSafe) {
  std::mt19937 rng(2026);
  for (int round = 0; round < 20000; ++round) {
    std::string s;
    for (int k = static_cast<int>(rng() % 12); k > 0; --k) {
      switch (rng() % 4) {
        case 0: s += static_cast<char>(rng() % 256); break;                 // any byte
        case 1: s += utf8(static_cast<char32_t>(0x80 + rng() % 0x20)); break;  // C1
        case 2: s += utf8(static_cast<char32_t>(0x2000 + rng() % 0x80)); break;
        default: s += "w1.\\x1b"; break;
      }
    }
    const std::string p = printable(s);
    ASSERT_TRUE(terminal_safe(p)) << p;
    ASSERT_EQ(printable(p), p);
  }
}

TEST(JsonText, BytesThatAreNotUtf8BecomeXnnAndDifferentBytesStayDifferent) {
  EXPECT_EQ(json_text("/models/bad\xff\xfe"), "/models/bad\\xff\\xfe");
  EXPECT_NE(json_text("/a\xff"), json_text("/a\xfe"));
  EXPECT_EQ(json_text("caf\xc3\xa9"), "caf\xc3\xa9");
  EXPECT_EQ(json_text("\x1b"), "\x1b");  // JSON escapes controls itself
}

TEST(DumpJson, WritesTerminalUnsafeCharactersAsJsonEscapes) {
  const Json j = {{"reason", "a" + utf8(0x9B) + "2J" + utf8(0x202E) + "x\x1b"}, {"name", "caf\xc3\xa9"}};
  const std::string text = dump_json(j, -1);
  EXPECT_TRUE(terminal_safe(text)) << text;
  EXPECT_NE(text.find("a\\u009b2J\\u202ex\\u001b"), std::string::npos) << text;
  EXPECT_NE(text.find("caf\xc3\xa9"), std::string::npos) << text;  // other text stays as it is
  EXPECT_EQ(Json::parse(text), j);                                  // the same strings to a reader
  // Every code point from 0 to U+3000, in one string.
  std::string all;
  for (char32_t c = 1; c < 0x3000; ++c) {
    if (c < 0xD800 || c > 0xDFFF) all += utf8(c);
  }
  const std::string dumped = dump_json(Json(all));
  EXPECT_TRUE(terminal_safe(dumped));
  EXPECT_EQ(Json::parse(dumped), Json(all));
  // Invalid UTF-8 that slipped past json_text() still cannot break the document.
  EXPECT_NO_THROW(Json::parse(dump_json(Json("\xff"))));
}

}  // namespace
}  // namespace mx2nv

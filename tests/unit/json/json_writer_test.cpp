// json_text writes what Json::dump() writes, byte for byte: the index and
// headers it builds must not change when the fast path is taken or not.
#include "json/json_writer.hpp"
#include "json/strict_json.hpp"

#include <gtest/gtest.h>

#include <random>

namespace mx2nv {
namespace {

std::string dumped(const std::string& s) { return Json(s).dump(); }

std::string ours(std::string_view head, std::string_view tail = {}) {
  std::string out = "x";  // appends, never replaces
  append_json_string(out, head, tail);
  return out.substr(1);
}

TEST(JsonText, EverySingleByteAsNlohmannWritesIt) {
  for (int b = 0; b < 0x80; ++b) {
    const std::string s(1, static_cast<char>(b));
    EXPECT_EQ(ours(s), dumped(s)) << b;
    EXPECT_EQ(ours("a", s), dumped("a" + s)) << b;
    EXPECT_EQ(ours(s, "z"), dumped(s + "z")) << b;
  }
}

TEST(JsonText, EveryByteAtEveryPositionOfALongName) {
  // Long names are checked eight bytes at a time: every ASCII byte, and a
  // two-byte UTF-8 character, at each position of the words and the tail.
  for (std::size_t at = 0; at < 19; ++at) {
    for (int b = 0; b < 0x80; ++b) {
      std::string s(19, 'n');
      s[at] = static_cast<char>(b);
      ASSERT_EQ(ours(s), dumped(s)) << at << " " << b;
    }
    std::string u(19, 'n');
    u.replace(at, 1, "é");
    ASSERT_EQ(ours(u), dumped(u)) << at;
  }
}

TEST(JsonText, RandomNamesAsNlohmannWritesThem) {
  // Tensor-name alphabet plus escapes, controls and multi-byte UTF-8.
  const std::vector<std::string> pieces = {"model.", "layers.", "7", "experts", "_", "w1", "\"", "\\", "\n", "\x01",
                                           "\x7f", "é", "専門家", "😀", "/", " ", "\t"};
  std::mt19937 rng(2026);
  for (int i = 0; i < 5000; ++i) {
    std::string head, tail;
    for (int k = static_cast<int>(rng() % 6); k > 0; --k) head += pieces[rng() % pieces.size()];
    for (int k = static_cast<int>(rng() % 3); k > 0; --k) tail += pieces[rng() % pieces.size()];
    ASSERT_EQ(ours(head, tail), dumped(head + tail)) << head << tail;
  }
}

TEST(JsonText, InvalidUtf8IsRefusedNotWritten) {
  EXPECT_THROW(ours("a\xff"), nlohmann::json::type_error);
  EXPECT_THROW(ours("a", "\xc3"), nlohmann::json::type_error);
}

TEST(JsonText, UintArraysAsNlohmannWritesThem) {
  const std::vector<std::vector<std::uint64_t>> cases = {
      {}, {0}, {7168, 256}, {UINT64_MAX, 0, 1, 10, 99, 100, 1ull << 63}};
  for (const auto& v : cases) {
    std::string out;
    append_json_uint_array(out, v);
    EXPECT_EQ(out, Json(v).dump());
  }
}

}  // namespace
}  // namespace mx2nv

// The simdjson fast path (core/json_fast) may only accept a document when
// the streaming nlohmann parser would produce the very same SAX events; every
// refusal must come from the streaming parser. Compared event by event on
// edge cases and on thousands of mutations of a real header.
#include "common/error.hpp"
#include "json/json_fast.hpp"
#include "json/json_stream.hpp"
#include "safetensors/header.hpp"
#include "safetensors/index.hpp"

#include <gtest/gtest.h>

#include <random>

namespace mx2nv {
namespace {

// Logs every event; a handler exception is logged as the last event.
class Recorder final : public StrictSax {
 public:
  Recorder() : StrictSax("t.json") {}
  std::string log;
  bool null() override { return add("null"); }
  bool boolean(bool v) override { return add(v ? "true" : "false"); }
  bool number_integer(number_integer_t v) override { return add("i" + std::to_string(v)); }
  bool number_unsigned(number_unsigned_t v) override { return add("u" + std::to_string(v)); }
  bool number_float(number_float_t v, const string_t&) override { return add("f" + std::to_string(v)); }
  bool string(string_t& v) override { return add("s" + v); }
  bool key(string_t& k) override { return add("k" + k); }
  bool start_object(std::size_t) override {
    enter();
    return add("{");
  }
  bool end_object() override {
    leave();
    return add("}");
  }
  bool start_array(std::size_t) override {
    enter();
    return add("[");
  }
  bool end_array() override {
    leave();
    return add("]");
  }

 private:
  bool add(const std::string& event) {
    log += event;
    log += '\x1f';
    return true;
  }
};

enum class Path { Streaming, Fast, Large };

std::string events(Path path, std::string_view text, bool* accepted = nullptr) {
  const MemorySource source(text);
  Recorder r;
  try {
    if (path == Path::Large) {
      const bool took = parse_large_object_fast(source, text.size(), r, "t.json");
      if (accepted != nullptr) *accepted = took;
      // A decline may come after events: the caller discards them.
      if (!took) return "declined";
    } else if (path == Path::Fast) {
      const bool took = parse_json_fast(source, 0, text.size(), r);
      if (accepted != nullptr) *accepted = took;
      if (!took) return "declined";
    } else {
      parse_json_streaming(source, 0, text.size(), r, "t.json");
    }
  } catch (const Error& e) {
    // parse_json_fast throws only from the handler, i.e. once it has taken
    // the document (the large path declines instead of throwing).
    if (path == Path::Fast && accepted != nullptr) *accepted = true;
    r.log += std::string("throw:") + e.what();
  }
  return r.log;
}

std::string events(bool fast, std::string_view text, bool* accepted = nullptr) {
  return events(fast ? Path::Fast : Path::Streaming, text, accepted);
}

// 3,000 documents with one to three random edits drawn from `alphabet`:
// wherever the fast path takes one, the events equal the streaming parser's.
void expect_mutations_agree(Path path, const std::string& original, std::string_view alphabet, unsigned seed) {
  std::mt19937 rng(seed);
  int accepted_count = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string text = original;
    for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) {
      const std::size_t at = rng() % text.size();
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0: text[at] = c; break;
        case 1: text.insert(text.begin() + static_cast<std::ptrdiff_t>(at), c); break;
        default: text.erase(at, 1 + rng() % 4); break;
      }
    }
    bool accepted = false;
    const std::string fast = events(path, text, &accepted);
    if (!accepted) continue;
    ++accepted_count;
    ASSERT_EQ(fast, events(Path::Streaming, text)) << text;
  }
  // Most mutations land in names or digits and stay valid: the comparison ran.
  EXPECT_GT(accepted_count, 500);
}

// Fast accepted => identical events (and the same exception, if any).
void expect_agreement(std::string_view text) {
  bool accepted = false;
  const std::string fast = events(true, text, &accepted);
  if (!accepted) {
    EXPECT_TRUE(fast == "declined" || fast.empty()) << text;
    return;
  }
  EXPECT_EQ(fast, events(false, text)) << text;
}

std::string k3_like_header() {
  std::vector<TensorInfo> tensors;
  std::uint64_t at = 0;
  for (int e = 0; e < 40; ++e) {
    for (const char* w : {"w1", "w2", "w3"}) {
      const std::string base = "model.layers.3.mlp.experts." + std::to_string(e) + "." + w;
      tensors.push_back({base + ".weight_packed", Dtype::U8, {64, 32}, at, at + 2048});
      at += 2048;
      tensors.push_back({base + ".weight_scale", Dtype::U8, {64, 2}, at, at + 128});
      at += 128;
    }
  }
  const std::string out = serialize_header(std::map<std::string, std::string>{{"format", "pt"}}, tensors);
  return out.substr(kHeaderLengthBytes);
}

TEST(JsonFast, TakesARealHeaderAndAgrees) {
  const std::string header = k3_like_header();
  bool accepted = false;
  const std::string fast = events(true, header, &accepted);
  EXPECT_TRUE(accepted);
  EXPECT_EQ(fast, events(false, header));
  EXPECT_NE(fast.find("kmodel.layers.3.mlp.experts.39.w3.weight_scale"), std::string::npos);
}

TEST(JsonFast, DeclinesWhatItCannotMatch) {
  const std::vector<std::string> declined = {R"({"a\"b":1})", "{\"a\":\n1}", "\xEF\xBB\xBF{}", R"({"a":-0})",
                                            R"([-0.5])", std::string("{\"a\":\0}", 7), R"({"a":)", R"({"a":1}x)", ""};
  for (const auto& text : declined) {
    bool accepted = true;
    events(true, text, &accepted);
    EXPECT_FALSE(accepted) << text;
  }
  const std::string big(kFastJsonMaxBytes + 1, ' ');
  bool accepted = true;
  events(true, "{}" + big, &accepted);
  EXPECT_FALSE(accepted);
}

// The byte rules are checked 16 bytes a step: every control character and a
// backslash decline wherever they fall, in every lane and in the tail.
TEST(JsonFast, EveryControlByteAndBackslashDeclinesAtEveryPosition) {
  const std::string base = R"({"abcdefghijklmnopqrstuvwxyz0123456789ABCDEF":1})";
  for (int b = 0; b < 256; ++b) {
    for (std::size_t at = 2; at < base.size() - 4; ++at) {
      std::string text = base;
      text[at] = static_cast<char>(b);
      bool accepted = false;
      const std::string fast = events(true, text, &accepted);
      if (b < 0x20 || b == '\\') {
        EXPECT_FALSE(accepted) << "byte " << b << " at " << at;
      } else if (accepted) {
        EXPECT_EQ(fast, events(false, text)) << "byte " << b << " at " << at;
      }
    }
  }
}

TEST(JsonFast, EdgeCasesAgree) {
  const std::vector<std::string> cases = {
      "{}", "[]", "0", "7", "1.5", "1e5", "1E-2", "-1", "-9223372036854775808", "-9223372036854775809",
      "9223372036854775807", "9223372036854775808", "18446744073709551615", "18446744073709551616",
      "123456789012345678901234567890", "true", "false", "null", R"("x")", R"({"a":1,"a":2})",
      R"({"a":[1,{"b":null}],"c":"é専😀"})", "  {}  ", "[1,2,]", "[01]", "[.5]", "[1.]", R"({"a" 1})",
      "\"\xff\"", "\"\xed\xa0\x80\"", "\"\xc0\xaf\"", "\"\xf4\x90\x80\x80\"", "[\"\x7f\"]", "{\"a\":1}{}", "[1e99999]", "[-1e99999]"};
  for (const auto& text : cases) expect_agreement(text);
  for (const std::size_t depth : {63u, 64u, 65u, 1023u, 1025u, 5000u}) {
    expect_agreement(std::string(depth, '[') + std::string(depth, ']'));
  }
}

TEST(JsonFast, MutatedHeadersAgree) {
  expect_mutations_agree(Path::Fast, k3_like_header(), "-0123456789eE.+\"\\{}[],: tnfrul\x01\x7f\xc3\xa9\xff\xed", 8);
}

TEST(JsonFast, ShardHeaderIsTheSameEitherWay) {
  const std::string header = k3_like_header();
  const std::uint64_t file_size = kHeaderLengthBytes + header.size() + 40 * 3 * (2048 + 128);
  const ShardHeader h = ShardHeader::parse(header, file_size, "t");
  ASSERT_EQ(h.tensors().size(), 240u);
  EXPECT_EQ(h.tensors()[5].name, "model.layers.3.mlp.experts.0.w3.weight_scale");
  EXPECT_EQ(h.tensors()[5].shape, (std::vector<std::uint64_t>{64, 2}));
  EXPECT_EQ(h.metadata()->at("format"), "pt");
}

// An index like K3's: pretty-printed, metadata with numbers and an array,
// weight_map of strings.
std::string k3_like_index(int experts) {
  std::string text =
      "{\n  \"metadata\": {\n    \"total_size\": 1234567890123,\n    \"note\": [1, 2.5, null, true]\n  },\n"
      "  \"weight_map\": {\n";
  for (int e = 0; e < experts; ++e) {
    for (const char* w : {"w1", "w2", "w3"}) {
      for (const char* t : {"weight_packed", "weight_scale"}) {
        text += "    \"model.layers.3.mlp.experts." + std::to_string(e) + "." + w + "." + t + "\": \"model-0000" +
                std::to_string(1 + e % 3) + "-of-00003.safetensors\",\n";
      }
    }
  }
  text += "    \"lm_head.weight\": \"model-00003-of-00003.safetensors\"\n  }\n}\n";
  return text;
}

TEST(JsonLarge, TakesAnIndexAndAgrees) {
  const std::string index = k3_like_index(200);
  bool accepted = false;
  const std::string fast = events(Path::Large, index, &accepted);
  EXPECT_TRUE(accepted);
  EXPECT_EQ(fast, events(Path::Streaming, index));
  EXPECT_NE(fast.find("u1234567890123"), std::string::npos);  // the number came through nlohmann
  EXPECT_NE(fast.find("kmodel.layers.3.mlp.experts.199.w3.weight_scale"), std::string::npos);
}

TEST(JsonLarge, DeclinesWhatItCannotMatch) {
  const std::vector<std::string> declined = {R"({"a\"b":"c"})",
                                            "{\"a\":\"x\ny\"}",
                                            "\xEF\xBB\xBF{}",
                                            std::string("{\"a\":\"\0\"}", 8),
                                            R"({"a":)",
                                            R"({"a":"b"}x)",
                                            R"({"a":"b"}{})",
                                            "[1]",
                                            "\"s\"",
                                            "",
                                            R"({"a":[1,]})",
                                            "{\"a\":\"\xff\"}"};
  for (const auto& text : declined) {
    bool accepted = true;
    events(Path::Large, text, &accepted);
    EXPECT_FALSE(accepted) << text;
  }
  // Too many structural characters for the memory bound.
  bool accepted = true;
  events(Path::Large, "{\"a\":[" + std::string(kLargeJsonMaxStructurals, ',') + "]}", &accepted);
  EXPECT_FALSE(accepted);
}

// A string (key or value) the streaming parser refuses as too long (over
// kMaxJsonTokenBytes with its quotes) is declined, not taken: an index of a
// few MiB would otherwise be accepted or refused depending on its padding.
TEST(JsonLarge, StringsOverTheTokenCapDecline) {
  for (const bool as_key : {false, true}) {
    for (const std::size_t length : {kMaxJsonTokenBytes - 2, kMaxJsonTokenBytes - 1}) {
      const std::string s(length, 'a');
      const std::string text = as_key ? R"({"weight_map":{")" + s + R"(":"x"}})"
                                      : R"({"weight_map":{"t":"x"},"metadata":{"note":")" + s + R"("},"z":")" + s + R"("})";
      bool accepted = false;
      const std::string fast = events(Path::Large, text, &accepted);
      const std::string streaming = events(Path::Streaming, text);
      if (length + 2 > kMaxJsonTokenBytes) {
        EXPECT_FALSE(accepted) << length;
        EXPECT_NE(streaming.find("longer than"), std::string::npos);
      } else {
        EXPECT_TRUE(accepted) << length;
        EXPECT_EQ(fast, streaming);
      }
    }
  }
}

// The bound on simdjson's structural index is counted 16 bytes a step in
// byte lanes summed every 255 steps: exactly, so a valid document at the cap
// is taken and one more element declines. Here {"a":[k empty strings, 1, 1]}
// counts 7 + 3k + 2 * 2 (operators, quotes, and a scalar start for each 1).
TEST(JsonLarge, StructuralCapIsExact) {
  const auto document = [](std::size_t k) {
    std::string text = R"({"a":[)";
    text.reserve(text.size() + 3 * k + 8);
    for (std::size_t i = 0; i < k; ++i) text += R"("",)";
    return text + "1,1]}";
  };
  static_assert((kLargeJsonMaxStructurals - 11) % 3 == 0);
  const std::size_t at_cap = (kLargeJsonMaxStructurals - 11) / 3;
  bool accepted = false;
  events(Path::Large, document(at_cap), &accepted);
  EXPECT_TRUE(accepted);
  events(Path::Large, document(at_cap + 1), &accepted);
  EXPECT_FALSE(accepted);
}

// Stage 1 indexes every scalar start: a document of numbers must not pass
// on its operators alone (as "1 1 1 ...", valid or not, 31M index entries,
// ~120 MB, for a 62 MB index). Here half the cap in commas, as many numbers.
TEST(JsonLarge, ScalarsCountTowardTheStructuralBound) {
  std::string text = R"({"weight_map":{"t":"x"},"x":[0)";
  for (std::size_t i = 0; i < kLargeJsonMaxStructurals / 2; ++i) text += ",1";
  text += "]}";
  bool accepted = true;
  events(Path::Large, text, &accepted);
  EXPECT_FALSE(accepted);
}

TEST(JsonLarge, EdgeCasesAgree) {
  const std::vector<std::string> cases = {"{}",
                                          " {} \n",
                                          R"({"a":"b"})",
                                          R"({"a":{}})",
                                          R"({"a":[]})",
                                          R"({"a":{"b":{"c":[1,{"d":-0}]}}})",
                                          R"({"a":-0})",
                                          R"({"a":0.0})",
                                          R"({"a":1e99999})",
                                          R"({"a":18446744073709551616})",
                                          R"({"a":{"x":true,"y":"z"}})",
                                          "{\"a\":\t\"b\"\r\n}",
                                          R"({"é専😀":"😀"})"};
  int accepted_count = 0;
  for (const auto& text : cases) {
    bool accepted = false;
    const std::string fast = events(Path::Large, text, &accepted);
    if (!accepted) continue;
    ++accepted_count;
    EXPECT_EQ(fast, events(Path::Streaming, text)) << text;
  }
  EXPECT_GE(accepted_count, 10);
  for (const std::size_t depth : {60u, 70u, 2000u}) {
    const std::string text = "{\"a\":" + std::string(depth, '[') + std::string(depth, ']') + "}";
    bool accepted = false;
    const std::string fast = events(Path::Large, text, &accepted);
    if (accepted) {
      EXPECT_EQ(fast, events(Path::Streaming, text)) << depth;
    }
  }
}

TEST(JsonLarge, MutatedIndexesAgree) {
  expect_mutations_agree(Path::Large, k3_like_index(30), "-0123456789eE.+\"\\{}[],: tnfrul\x01\n\x7f\xc3\xa9\xff\xed", 9);
}

TEST(JsonLarge, ShardIndexIsTheSameEitherWay) {
  // read_shard_index takes the fast path for this index and the streaming
  // one when an escape rules it out; the results agree.
  const std::string index = k3_like_index(50);
  std::string escaped = index;
  escaped.replace(escaped.find("lm_head"), 7, "lm_h\\u0065ad");
  const ShardIndex a = parse_shard_index(index, "a");
  const ShardIndex b = parse_shard_index(escaped, "b");
  ASSERT_EQ(a.tensors.size(), 301u);
  ASSERT_EQ(b.tensors.size(), 301u);
  EXPECT_EQ(a.shard_files, b.shard_files);
  for (NameTable::Id id = 0; id < a.tensors.size(); ++id) {
    EXPECT_EQ(a.tensors.name(id), b.tensors.name(id));
    EXPECT_EQ(a.shard_of[id], b.shard_of[id]);
  }
  EXPECT_EQ(a.other.dump(), b.other.dump());
  // A duplicate key is refused with the streaming parser's message.
  std::string dup = index;
  dup.insert(dup.find("    \"lm_head"), "    \"lm_head.weight\": \"model-00001-of-00003.safetensors\",\n");
  try {
    parse_shard_index(dup, "d");
    FAIL() << "duplicate accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("duplicate JSON key \"lm_head.weight\""), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mx2nv

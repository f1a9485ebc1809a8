// The Hugging Face tokenizer.json reader (data/bpe_tokenizer.cpp) on a small
// hand-written fixture: the 256 byte characters of GPT-2's byte-to-unicode map
// as ids 0..255, fourteen merges, two special tokens and LLaMA-3's pre-tokenizer
// regex. Every expected id below was worked out by hand from those merges (the
// comments show how), covering merges by rank, the regex's splits on digits,
// spaces, punctuation and non-ASCII letters, bytes no merge covers (invalid
// UTF-8 included) and special tokens; and long random words against BPE's
// definition written out in the test.

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "test_util.h"

namespace hdp {
namespace {

#define EXPECT_CONTAINS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

// GPT-2's bytes_to_unicode as its Python source defines it (written out again
// here, independently of the reader): bytes '!'..'~', 0xa1..0xac and 0xae..0xff
// are themselves, the others get 256, 257, ... in byte order.
std::string byte_char(int b) {
  uint32_t cp = static_cast<uint32_t>(b);
  if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) {
    uint32_t n = 0;
    for (int x = 0; x < b; ++x)
      if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) ++n;
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) s += static_cast<char>(cp);
  else {
    s += static_cast<char>(0xc0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  }
  return s;
}

std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += static_cast<char>(c);
    else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else out += static_cast<char>(c);
  }
  return out + "\"";
}

// Merges by rank (rank = id - 256). "Ġ" is the space's character, "Ã" and "©"
// the bytes 0xC3 0xA9 of "é".
const char* const kMerges[][2] = {
    {"h", "e"},        // 256 he
    {"l", "l"},        // 257 ll
    {"he", "ll"},      // 258 hell
    {"hell", "o"},     // 259 hello
    {"Ġ", "w"},        // 260 Ġw
    {"o", "r"},        // 261 or
    {"Ġw", "or"},      // 262 Ġwor
    {"1", "2"},        // 263 12
    {"12", "3"},       // 264 123
    {"Ã", "©"},        // 265 é
    {"!", "!"},        // 266 !!
    {"c", "a"},        // 267 ca
    {"ca", "f"},       // 268 caf
    {"caf", "Ã©"},     // 269 café
};

// LLaMA-3's pre-tokenizer regex (as its tokenizer.json writes it).
const char* const kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string fixture(const std::string& dir) {
  std::string vocab;
  for (int b = 0; b < 256; ++b) vocab += (b ? ", " : "") + json_quote(byte_char(b)) + ": " + std::to_string(b);
  std::string merges;
  int id = 256;
  for (const auto& m : kMerges) {
    vocab += ", " + json_quote(std::string(m[0]) + m[1]) + ": " + std::to_string(id++);
    merges += std::string(merges.empty() ? "" : ", ") + "[" + json_quote(m[0]) + ", " + json_quote(m[1]) + "]";
  }
  const std::string json = R"({
  "version": "1.0",
  "added_tokens": [
    {"id": 270, "content": "<|endoftext|>", "special": true},
    {"id": 271, "content": "<|begin|>", "special": true}
  ],
  "normalizer": null,
  "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": )" + json_quote(kLlama3Regex) + R"(}, "behavior": "Isolated", "invert": false},
    {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]},
  "post_processor": null,
  "decoder": {"type": "ByteLevel"},
  "model": {"type": "BPE", "dropout": null, "unk_token": null, "byte_fallback": false,
            "vocab": {)" + vocab + R"(},
            "merges": [)" + merges + R"(]}
})";
  std::ofstream(dir + "/tokenizer.json") << json;
  std::ofstream(dir + "/tokenizer_config.json") << R"({"bos_token": "<|begin|>", "eos_token": "<|endoftext|>"})";
  return dir + "/tokenizer.json";
}

std::vector<uint32_t> encode(const Tokenizer& t, const std::string& text) {
  std::vector<uint32_t> ids;
  t.encode_append(text, ids);
  return ids;
}

using Ids = std::vector<uint32_t>;

class BpeFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    // One directory per test: ctest may run the fixture's tests at once.
    dir_ = testing::scratch_dir(std::string("bpe-fixture-") + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    tokenizer_ = load_tokenizer(fixture(dir_));
  }
  std::string dir_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(BpeFixture, VocabularyAndSpecialIds) {
  EXPECT_EQ(tokenizer_->vocab_size(), 272u);
  EXPECT_EQ(tokenizer_->bos_id(), 271u);
  EXPECT_EQ(tokenizer_->eos_id(), 270u);
  EXPECT_TRUE(tokenizer_->adds_bos());
  EXPECT_CONTAINS(tokenizer_->name(), "bpe tokenizer.json fnv1a64:");
}

TEST_F(BpeFixture, MergesByRank) {
  // "hello": h e l l o -> he (rank 0) -> ll (1) -> hell (2) -> hello (3).
  // " world": Ġw (4) before or (5), then Ġwor (6); "l" "d" stay bytes 108, 100.
  EXPECT_EQ(encode(*tokenizer_, "hello world"), (Ids{259, 262, 108, 100}));
  // "world" without its space: no "w or" merge, so w, or, l, d.
  EXPECT_EQ(encode(*tokenizer_, "world"), (Ids{119, 261, 108, 100}));
  // "café": bytes c a f C3 A9; é (rank 9) first, then ca (11), caf (12), café (13).
  EXPECT_EQ(encode(*tokenizer_, "café"), (Ids{269}));
}

TEST_F(BpeFixture, PreTokenizerSplits) {
  // Digits in groups of at most three: "123" (merged: 12, then 123) and "45".
  EXPECT_EQ(encode(*tokenizer_, "12345"), (Ids{264, 52, 53}));
  // Letters and digits are separate words: "abc" (no merges), "12".
  EXPECT_EQ(encode(*tokenizer_, "abc12"), (Ids{97, 98, 99, 263}));
  // Punctuation is its own word ("!!" merges), a space joins the following letters (" ok").
  EXPECT_EQ(encode(*tokenizer_, "hi!! ok"), (Ids{104, 105, 266, 32, 111, 107}));
  // Two spaces before a letter: the first is a word of its own (\s+(?!\S)), the second joins "b".
  EXPECT_EQ(encode(*tokenizer_, "a  b"), (Ids{97, 32, 32, 98}));
  // A non-ASCII letter joins its word: " é" is Ġ then the merged é.
  EXPECT_EQ(encode(*tokenizer_, "x é"), (Ids{120, 32, 265}));
}

TEST_F(BpeFixture, BytesNoMergeCovers) {
  // "ü" is C3 BC: no merge, so its two byte characters Ã (195) and ¼ (188);
  // the control byte 0x01 is byte id 1.
  EXPECT_EQ(encode(*tokenizer_, "ü\x01"), (Ids{195, 188, 1}));
  // A byte that is not UTF-8 at all (0xFF) matches no regex branch and is a word of its own.
  EXPECT_EQ(encode(*tokenizer_, "a\xff" "b"), (Ids{97, 255, 98}));
  // A truncated "€" (E2 82) is one word of two bytes; the whole "€" after it is valid
  // UTF-8 (a word of punctuation, no merges), and " b" a word of its own.
  EXPECT_EQ(encode(*tokenizer_, "a\xe2\x82\xe2\x82\xac b"), (Ids{97, 226, 130, 226, 130, 172, 32, 98}));
}

// BPE by its definition, written again here: merge the lowest-ranked adjacent pair,
// the leftmost of equal ranks, until no pair is a merge; ids of the fixture's vocabulary.
Ids reference_bpe(const std::string& word) {
  std::vector<std::string> symbols;
  for (unsigned char c : word) symbols.push_back(byte_char(c));
  for (;;) {
    size_t best_rank = std::size(kMerges), where = 0;
    for (size_t k = 0; k + 1 < symbols.size(); ++k)
      for (size_t r = 0; r < best_rank; ++r)
        if (symbols[k] == kMerges[r][0] && symbols[k + 1] == kMerges[r][1]) best_rank = r, where = k;
    if (best_rank == std::size(kMerges)) break;
    symbols[where] += symbols[where + 1];
    symbols.erase(symbols.begin() + static_cast<long>(where) + 1);
  }
  Ids ids;
  for (const std::string& s : symbols) {
    uint32_t id = UINT32_MAX;
    for (int b = 0; b < 256; ++b)
      if (byte_char(b) == s) id = static_cast<uint32_t>(b);
    for (size_t r = 0; r < std::size(kMerges); ++r)
      if (std::string(kMerges[r][0]) + kMerges[r][1] == s) id = static_cast<uint32_t>(256 + r);
    ids.push_back(id);
  }
  return ids;
}

TEST_F(BpeFixture, LongWordsMergeAsTheDefinitionSays) {
  // Equal ranks go leftmost first: 2001 l's are 1000 "ll" and one "l".
  Ids ls(1000, 257);
  ls.push_back(108);
  EXPECT_EQ(encode(*tokenizer_, std::string(2001, 'l')), ls);
  EXPECT_EQ(encode(*tokenizer_, [] { std::string s; for (int i = 0; i < 3000; ++i) s += "hello"; return s; }()),
            Ids(3000, 259));
  // Random words over the merges' letters (one word each: letters only), against the definition.
  std::mt19937 rng(5);
  const std::string letters = "helowrcaf";
  for (int n : {1, 2, 3, 5, 8, 13, 40, 200, 1000}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::string word;
      for (int i = 0; i < n; ++i) word += letters[rng() % letters.size()];
      ASSERT_EQ(encode(*tokenizer_, word), reference_bpe(word)) << word;
    }
  }
}

TEST_F(BpeFixture, SpecialTokens) {
  // Added tokens are split out before the regex and never merged into words.
  EXPECT_EQ(encode(*tokenizer_, "hello<|endoftext|>world"), (Ids{259, 270, 119, 261, 108, 100}));
  EXPECT_EQ(encode(*tokenizer_, "<|begin|>12<|endoftext|>"), (Ids{271, 263, 270}));
  // Decoding drops them and turns the byte characters back into bytes.
  EXPECT_EQ(tokenizer_->decode(Ids{271, 259, 262, 108, 100, 270}), "hello world");
  const std::string text = "hello world, café!! 12345 a  b ü\x01";
  EXPECT_EQ(tokenizer_->decode(encode(*tokenizer_, text)), text);
}

TEST(BpeFiles, UnsupportedShapesAreNamed) {
  const std::string dir = testing::scratch_dir("bpe-bad");
  auto error_of = [&](const std::string& json) {
    std::ofstream(dir + "/tokenizer.json") << json;
    std::ofstream(dir + "/tokenizer_config.json") << R"({"eos_token": "a"})";
    try {
      load_tokenizer(dir + "/tokenizer.json");
    } catch (const TokenizerError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string path = dir + "/tokenizer.json";
  EXPECT_CONTAINS(error_of(R"({"model": {"type": "WordPiece", "vocab": {}}})"),
                  path + ": model.type: 'WordPiece' is not supported");
  EXPECT_CONTAINS(error_of(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]},
                              "pre_tokenizer": {"type": "ByteLevel"}})"),
                  path + ": model.merges[0]: merges 'a' and 'b' into 'ab', which is not in model.vocab");
  EXPECT_CONTAINS(error_of(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                              "normalizer": {"type": "NFC"}, "pre_tokenizer": {"type": "ByteLevel"}})"),
                  path + ": normalizer: {\"type\":\"NFC\"} is not supported");
  EXPECT_CONTAINS(error_of(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                              "pre_tokenizer": {"type": "Whitespace"}})"),
                  path + ": pre_tokenizer: {\"type\":\"Whitespace\"} is not supported");
  EXPECT_CONTAINS(error_of("{not json"), path + ": not valid JSON");
}

// Token ids become dataset ids (uint32 below a vocabulary of at most 2^31 - 1): an
// id of 2^33 is refused, not cut to 32 bits (an EOS of 2^33 became id 0); so are
// one id for two tokens and an EOS that is a byte's token, which text encodes to.
// Each message names the file and the field.
TEST(BpeFiles, IdsBeyond31BitsDuplicateIdsAndAByteEosAreRefused) {
  const std::string dir = testing::scratch_dir("bpe-ids");
  const std::string path = fixture(dir), config = dir + "/tokenizer_config.json";
  std::string json;
  {
    std::ifstream in(path);
    json.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const std::string good_config = R"({"bos_token": "<|begin|>", "eos_token": "<|endoftext|>"})";
  auto error_with = [&](const std::string& from, const std::string& to, const std::string& config_text) {
    std::string text = json;
    if (!from.empty()) {
      const size_t at = text.find(from);
      if (at == std::string::npos) return "fixture lacks " + from;
      text.replace(at, from.size(), to);
    }
    std::ofstream(path) << text;
    std::ofstream(config) << config_text;
    try {
      load_tokenizer(path);
    } catch (const TokenizerError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_CONTAINS(error_with(R"({"id": 270, "content": "<|endoftext|>")", R"({"id": 8589934592, "content": "<|endoftext|>")",
                             good_config),
                  path + ": added_tokens[0]: token id 8589934592 is above 2147483646");
  EXPECT_CONTAINS(error_with("\"ca\": 267", "\"ca\": 266", good_config),
                  path + ": model.vocab.ca: token id 266 is also the id of '!!'");
  EXPECT_CONTAINS(error_with(R"({"id": 271, "content": "<|begin|>")", R"({"id": 100, "content": "<|begin|>")", good_config),
                  path + ": added_tokens[1]: token id 100 is also the id of 'd'");
  EXPECT_CONTAINS(error_with("", "", R"({"bos_token": "<|begin|>", "eos_token": "a"})"),
                  config + ": eos_token: 'a' (id 97 of " + path + ") is the token of a single byte");
  EXPECT_EQ(error_with("", "", good_config), "no error");
}

TEST(BpeFiles, ByteFallbackAndUnknownSymbols) {
  // A vocabulary without some byte characters: with byte_fallback such a byte is
  // its <0xXX> token when the vocabulary has one, else the unk_token.
  const std::string dir = testing::scratch_dir("bpe-byte-fallback");
  std::ofstream(dir + "/tokenizer.json") << R"({
    "model": {"type": "BPE", "byte_fallback": true, "unk_token": "<unk>",
              "vocab": {"h": 0, "i": 1, "<0xC3>": 2, "<0xA9>": 3, "<unk>": 4, "</s>": 5}, "merges": []},
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}})";
  std::ofstream(dir + "/tokenizer_config.json") << R"({"eos_token": "</s>"})";
  const std::unique_ptr<Tokenizer> t = load_tokenizer(dir + "/tokenizer.json");
  EXPECT_EQ(t->eos_id(), 5u);
  EXPECT_FALSE(t->adds_bos());  // no bos_token
  EXPECT_EQ(encode(*t, "hié"), (Ids{0, 1, 2, 3}));  // é = C3 A9, neither byte's character is in the vocabulary
  EXPECT_EQ(encode(*t, "hx"), (Ids{0, 4}));          // no <0x78> either: unk
}

TEST(BpeFiles, IgnoreMergesTakesWholeWordTokens) {
  // "hx" is a token but no merge makes it: with ignore_merges (LLaMA-3) the word
  // is that token, without it the word stays two bytes.
  const std::string dir = testing::scratch_dir("bpe-ignore-merges");
  for (const bool ignore : {true, false}) {
    std::ofstream(dir + "/tokenizer.json")
        << R"({"model": {"type": "BPE", "ignore_merges": )" << (ignore ? "true" : "false")
        << R"(, "vocab": {"h": 0, "x": 1, "hx": 2, "</s>": 3}, "merges": []},
              "pre_tokenizer": {"type": "ByteLevel", "use_regex": true}})";
    std::ofstream(dir + "/tokenizer_config.json") << R"({"eos_token": "</s>"})";
    const std::unique_ptr<Tokenizer> t = load_tokenizer(dir + "/tokenizer.json");
    EXPECT_EQ(encode(*t, "hx"), ignore ? Ids{2} : (Ids{0, 1})) << ignore;
  }
}

}  // namespace
}  // namespace hdp

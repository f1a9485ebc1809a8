// Hugging Face tokenizer.json with a byte-level BPE model (GPT-2, LLaMA-3 style),
// written here: added tokens split out first, then the pre-tokenizer's regex
// (PCRE2) cuts the text into words, each word's bytes become characters through
// GPT-2's byte-to-unicode map, and BPE merges the lowest-ranked adjacent pair
// until none of the word's pairs is in the merge list. Only the shapes of
// tokenizer.json that mean exactly this are accepted; anything else (another
// model type, a normalizer, another pre-tokenizer) is refused by key.

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <mutex>
#include <queue>
#include <shared_mutex>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <utility>

#include "data/tokenizer.h"

namespace hdp {
namespace {

using Json = nlohmann::json;

// GPT-2's regex, which a ByteLevel pre-tokenizer with use_regex applies.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

// The length of the valid UTF-8 character `text` starts with (RFC 3629: no
// overlong forms, surrogates or code points above U+10FFFF, as PCRE2 checks), or 0.
size_t utf8_char_length(std::string_view text) {
  auto byte = [&](size_t k) { return k < text.size() ? static_cast<unsigned char>(text[k]) : 0u; };
  auto continuation = [&](size_t k) { return (byte(k) & 0xc0) == 0x80; };
  const unsigned b = byte(0);
  if (text.empty()) return 0;
  if (b < 0x80) return 1;
  if (b >= 0xc2 && b <= 0xdf) return continuation(1) ? 2 : 0;
  if (b >= 0xe0 && b <= 0xef) {
    const unsigned lo = b == 0xe0 ? 0xa0 : 0x80, hi = b == 0xed ? 0x9f : 0xbf;
    return byte(1) >= lo && byte(1) <= hi && continuation(2) ? 3 : 0;
  }
  if (b >= 0xf0 && b <= 0xf4) {
    const unsigned lo = b == 0xf0 ? 0x90 : 0x80, hi = b == 0xf4 ? 0x8f : 0xbf;
    return byte(1) >= lo && byte(1) <= hi && continuation(2) && continuation(3) ? 4 : 0;
  }
  return 0;
}

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the other 68
// take the code points from 256 on, in byte order. Every byte is one character,
// so a byte-level vocabulary covers any input.
struct ByteMap {
  std::string to_char[256];                      // byte -> its character, UTF-8
  std::unordered_map<std::string, uint8_t> to_byte;
  ByteMap() {
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
      append_utf8(to_char[b], printable ? static_cast<uint32_t>(b) : next++);
      to_byte[to_char[b]] = static_cast<uint8_t>(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

class BpeTokenizer : public Tokenizer {
 public:
  explicit BpeTokenizer(const std::string& path) : path_(path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw TokenizerError(path + ": cannot open");
    Json root;
    try {
      root = Json::parse(in);
    } catch (const Json::exception& e) {
      fail("", std::string("not valid JSON (") + e.what() + ")");
    }
    if (!root.is_object()) fail("", "expected a JSON object");
    read_model(root);
    read_normalizer(root);
    read_pre_tokenizer(root);
    read_added_tokens(root);
    read_special_ids();
    name_ = "bpe " + std::filesystem::path(path).filename().string() + " fnv1a64:" + file_fingerprint(path);
  }
  void encode_append(std::string_view text, std::vector<uint32_t>& out) const override {
    // Added tokens first: the longest one starting at each position wins.
    size_t start = 0, i = 0;
    while (i < text.size()) {
      const AddedToken* hit = nullptr;
      for (const size_t k : added_by_first_byte_[static_cast<unsigned char>(text[i])]) {
        const AddedToken& t = added_[k];
        if (text.compare(i, t.content.size(), t.content) == 0 && (!hit || t.content.size() > hit->content.size()))
          hit = &t;
      }
      if (!hit) {
        ++i;
        continue;
      }
      encode_plain(text.substr(start, i - start), out);
      out.push_back(hit->id);
      i += hit->content.size();
      start = i;
    }
    encode_plain(text.substr(start), out);
  }

  std::string piece(uint32_t id) const override {
    const auto it = id_to_token_.find(id);
    return it == id_to_token_.end() ? std::string() : it->second;
  }
  std::string decode(std::span<const uint32_t> ids) const override {
    std::string out;
    for (uint32_t id : ids) {
      auto it = id_to_token_.find(id);
      if (it == id_to_token_.end()) throw TokenizerError(path_ + ": token id " + std::to_string(id) + " is not in the vocabulary");
      if (special_.count(id)) continue;
      if (added_ids_.count(id)) {
        out += it->second;
        continue;
      }
      // Back through the byte map, character by character.
      const std::string& s = it->second;
      for (size_t k = 0; k < s.size();) {
        const size_t len = (s[k] & 0x80) == 0 ? 1 : (s[k] & 0xe0) == 0xc0 ? 2 : (s[k] & 0xf0) == 0xe0 ? 3 : 4;
        auto b = byte_map().to_byte.find(s.substr(k, len));
        if (b != byte_map().to_byte.end()) out += static_cast<char>(b->second);
        else out += s.substr(k, len);  // e.g. a byte_fallback "<0x41>" piece stays as written
        k += len;
      }
    }
    return out;
  }

 private:
  struct AddedToken {
    std::string content;
    uint32_t id;
  };

  [[noreturn]] void fail(const std::string& key, const std::string& problem) const {
    throw TokenizerError(path_ + ": " + (key.empty() ? "" : key + ": ") + problem);
  }

  // One token and its id, at `key` for messages. Ids become dataset token ids
  // (uint32 below vocab_size <= 2^31 - 1, data/dataset.h), so a larger one is
  // refused rather than cut to 32 bits; one id for two tokens (or one token with
  // two ids) would decode or encode one of them as the other.
  void add_token(const std::string& key, const std::string& token, uint64_t id) {
    constexpr uint64_t kMaxId = static_cast<uint64_t>(INT32_MAX) - 1;
    if (id > kMaxId)
      fail(key, "token id " + std::to_string(id) + " is above " + std::to_string(kMaxId) +
                    " (datasets hold ids below a vocabulary of at most 2^31 - 1)");
    const uint32_t v = static_cast<uint32_t>(id);
    if (const auto other = id_to_token_.find(v); other != id_to_token_.end() && other->second != token)
      fail(key, "token id " + std::to_string(v) + " is also the id of '" + other->second + "'");
    if (const auto other = vocab_.find(token); other != vocab_.end() && other->second != v)
      fail(key, "'" + token + "' has id " + std::to_string(v) + " here and " + std::to_string(other->second) +
                    " elsewhere in the file");
    vocab_[token] = v;
    id_to_token_[v] = token;
  }

  void read_model(const Json& root) {
    if (!root.contains("model") || !root["model"].is_object()) fail("model", "missing or not an object");
    const Json& m = root["model"];
    const std::string type = m.value("type", "");
    if (type != "BPE") fail("model.type", "'" + type + "' is not supported; this build reads byte-level BPE");
    if (!m.contains("vocab") || !m["vocab"].is_object()) fail("model.vocab", "missing or not an object");
    for (const auto& [token, id] : m["vocab"].items()) {
      if (!id.is_number_unsigned()) fail("model.vocab." + token, "expected a token id, got " + id.dump());
      add_token("model.vocab." + token, token, id.get<uint64_t>());
    }
    if (!m.contains("merges") || !m["merges"].is_array()) fail("model.merges", "missing or not a list");
    for (int b = 0; b < 256; ++b) byte_symbol_[b] = *symbol_id(byte_map().to_char[b]);
    int rank = 0;
    for (const Json& merge : m["merges"]) {
      std::string a, b;
      if (merge.is_string()) {  // "a b" (older files)
        const std::string s = merge.get<std::string>();
        const size_t space = s.find(' ');
        if (space == std::string::npos || space == 0 || space + 1 == s.size())
          fail("model.merges[" + std::to_string(rank) + "]", "'" + s + "' is not two tokens separated by a space");
        a = s.substr(0, space);
        b = s.substr(space + 1);
      } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
        a = merge[0].get<std::string>();
        b = merge[1].get<std::string>();
      } else {
        fail("model.merges[" + std::to_string(rank) + "]", "expected \"a b\" or [\"a\", \"b\"], got " + merge.dump());
      }
      if (!vocab_.count(a + b))
        fail("model.merges[" + std::to_string(rank) + "]", "merges '" + a + "' and '" + b + "' into '" + a + b +
                                                                "', which is not in model.vocab");
      const std::optional<uint32_t> left = symbol_id(a), right = symbol_id(b);
      // A part that is neither a token nor a byte's character never occurs in a word.
      if (left && right) merges_.emplace(pair_key(*left, *right), Merge{rank, vocab_.at(a + b)});
      ++rank;
    }
    byte_fallback_ = m.value("byte_fallback", false);
    // LLaMA-3 sets it: a word that is a token as a whole is that token, whatever the merges would make.
    ignore_merges_ = m.value("ignore_merges", false);
    if (m.contains("unk_token") && m["unk_token"].is_string()) {
      auto it = vocab_.find(m["unk_token"].get<std::string>());
      if (it != vocab_.end()) unk_ = it->second;
    }
  }

  void read_normalizer(const Json& root) {
    if (root.contains("normalizer") && !root["normalizer"].is_null())
      fail("normalizer", root["normalizer"].dump() + " is not supported; byte-level BPE needs none (null)");
  }

  // ByteLevel (GPT-2: its regex), or Sequence [Split(regex, Isolated), ByteLevel(use_regex false)] (LLaMA-3).
  void read_pre_tokenizer(const Json& root) {
    if (!root.contains("pre_tokenizer") || !root["pre_tokenizer"].is_object())
      fail("pre_tokenizer", "missing; byte-level BPE needs a ByteLevel pre-tokenizer");
    const Json& p = root["pre_tokenizer"];
    std::string pattern;
    auto byte_level = [&](const Json& b, const std::string& key) {
      if (b.value("type", "") != "ByteLevel") fail(key, b.dump() + " is not supported; expected a ByteLevel pre-tokenizer");
      add_prefix_space_ = b.value("add_prefix_space", false);
      return b.value("use_regex", true);
    };
    if (p.value("type", "") == "ByteLevel") {
      if (byte_level(p, "pre_tokenizer")) pattern = kGpt2Pattern;
    } else if (p.value("type", "") == "Sequence" && p.contains("pretokenizers") && p["pretokenizers"].is_array() &&
               p["pretokenizers"].size() == 2) {
      const Json& split = p["pretokenizers"][0];
      if (split.value("type", "") != "Split" || !split.contains("pattern") || !split["pattern"].is_object() ||
          !split["pattern"].contains("Regex") || split.value("behavior", "") != "Isolated" || split.value("invert", false))
        fail("pre_tokenizer.pretokenizers[0]", split.dump() + " is not supported; expected a Split with a Regex "
             "pattern, behavior Isolated, invert false");
      pattern = split["pattern"]["Regex"].get<std::string>();
      if (byte_level(p["pretokenizers"][1], "pre_tokenizer.pretokenizers[1]"))
        fail("pre_tokenizer.pretokenizers[1]", "use_regex true after a Split is not supported");
    } else {
      fail("pre_tokenizer", p.dump() + " is not supported; expected ByteLevel, or a Sequence of a Split and ByteLevel");
    }
    if (pattern.empty()) return;
    int error = 0;
    PCRE2_SIZE offset = 0;
    // UTF and Unicode properties as the Rust regex the file was written for
    // (encode_plain gives it valid UTF-8 only).
    regex_.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                               &error, &offset, nullptr));
    if (!regex_) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      fail("pre_tokenizer", "the regex does not compile at offset " + std::to_string(offset) + ": " +
                                reinterpret_cast<const char*>(message));
    }
    // Compiled to machine code where PCRE2 can (several times faster); else interpreted.
    pcre2_jit_compile(regex_.get(), PCRE2_JIT_COMPLETE);
  }

  void read_added_tokens(const Json& root) {
    if (!root.contains("added_tokens") || root["added_tokens"].is_null()) return;
    if (!root["added_tokens"].is_array()) fail("added_tokens", "expected a list");
    for (const Json& t : root["added_tokens"]) {
      if (!t.is_object() || !t.contains("id") || !t.contains("content") || !t["id"].is_number_unsigned() ||
          !t["content"].is_string() || t["content"].get<std::string>().empty())
        fail("added_tokens", "expected {\"id\": N, \"content\": \"...\"}, got " + t.dump());
      const std::string content = t["content"].get<std::string>();
      // An added token usually repeats its model.vocab entry (same text, same id).
      const auto known = vocab_.find(content);
      if (known == vocab_.end() || known->second != t["id"].get<uint64_t>())
        add_token("added_tokens[" + std::to_string(added_.size()) + "]", content, t["id"].get<uint64_t>());
      const AddedToken a{content, vocab_.at(content)};
      added_by_first_byte_[static_cast<unsigned char>(content[0])].push_back(added_.size());
      added_.push_back(a);
      added_ids_.insert({a.id, true});
      if (t.value("special", false)) special_.insert({a.id, true});
    }
  }

  // BOS and EOS from tokenizer_config.json beside the file (bos_token, eos_token),
  // as transformers reads them; tokenizer.json itself does not say.
  void read_special_ids() {
    uint32_t max_id = 0;
    for (const auto& [id, token] : id_to_token_) max_id = std::max(max_id, id);
    vocab_size_ = static_cast<uint64_t>(max_id) + 1;
    const std::string config = (std::filesystem::path(path_).parent_path() / "tokenizer_config.json").string();
    std::ifstream in(config);
    if (!in) fail("", "tokenizer_config.json is missing beside it; it names the EOS token (eos_token)");
    Json c;
    try {
      c = Json::parse(in);
    } catch (const Json::exception& e) {
      throw TokenizerError(config + ": not valid JSON (" + e.what() + ")");
    }
    auto token_id = [&](const char* key) -> std::optional<uint32_t> {
      if (!c.contains(key) || c[key].is_null()) return std::nullopt;
      const Json& v = c[key].is_object() ? c[key]["content"] : c[key];
      if (!v.is_string()) throw TokenizerError(config + ": " + key + ": expected a token, got " + c[key].dump());
      auto it = vocab_.find(v.get<std::string>());
      if (it == vocab_.end())
        throw TokenizerError(config + ": " + key + ": '" + v.get<std::string>() + "' is not a token of " + path_);
      return it->second;
    };
    const auto eos = token_id("eos_token");
    if (!eos) throw TokenizerError(config + ": eos_token is missing; datasets end every document with EOS");
    const auto bos = token_id("bos_token");
    // A byte's token is what text encodes that byte to: as EOS (or BOS) it would
    // mark document boundaries inside documents.
    for (const auto& [key, id] : {std::pair{"eos_token", eos}, std::pair{"bos_token", bos}}) {
      if (!id) continue;
      const std::string& token = id_to_token_.at(*id);
      unsigned byte = 0;
      const bool byte_token = byte_map().to_byte.count(token) ||
                              (token.size() == 6 && std::sscanf(token.c_str(), "<0x%2X>", &byte) == 1);
      if (byte_token)
        throw TokenizerError(config + ": " + key + ": '" + token + "' (id " + std::to_string(*id) + " of " + path_ +
                             ") is the token of a single byte, which text encodes to; name a special token");
    }
    eos_id_ = *eos;
    // GPT-2 names one token for both and adds none at the start; LLaMA-3 has its own BOS.
    adds_bos_ = bos && *bos != *eos;
    bos_id_ = bos ? *bos : *eos;
  }

  // Text without added tokens: words by the regex (and the gaps between its
  // matches), then BPE on each. The regex runs over each run of valid UTF-8 on
  // its own, with PCRE2's UTF check off: a check on every call would scan the rest
  // of the text each time (quadratic in a document's length). Bytes that are not
  // valid UTF-8 match nothing and become words of their own, as a regex compiled
  // with PCRE2_MATCH_INVALID_UTF treats them.
  void encode_plain(std::string_view text, std::vector<uint32_t>& out) const {
    if (text.empty()) return;
    std::string prefixed;
    if (add_prefix_space_ && text.front() != ' ') {
      prefixed = " " + std::string(text);
      text = prefixed;
    }
    if (!regex_) {
      encode_word(text, out);
      return;
    }
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
        pcre2_match_data_create_from_pattern(regex_.get(), nullptr), &pcre2_match_data_free);
    size_t at = 0;
    while (at < text.size()) {
      size_t end = at;
      while (end < text.size()) {
        const size_t length = utf8_char_length(text.substr(end));
        if (length == 0) break;
        end += length;
      }
      if (end == at) {  // invalid bytes, up to the next valid character
        while (end < text.size() && utf8_char_length(text.substr(end)) == 0) ++end;
        encode_word(text.substr(at, end - at), out);
      } else {
        encode_valid(text.substr(at, end - at), match.get(), out);
      }
      at = end;
    }
  }

  // The regex's words of valid UTF-8 text, and the text between them (none for the
  // patterns accepted here, which match any character; kept a word if one did not).
  void encode_valid(std::string_view text, pcre2_match_data* match, std::vector<uint32_t>& out) const {
    const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t at = 0;
    while (at < text.size()) {
      int rc = pcre2_match(regex_.get(), subject, text.size(), at, PCRE2_NO_UTF_CHECK, match, nullptr);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // a long run for the JIT's stack: the interpreter has the heap
        rc = pcre2_match(regex_.get(), subject, text.size(), at, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, match, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(rc, message, sizeof(message));
        throw TokenizerError(path_ + ": the pre-tokenizer's regex failed on the text: " +
                             reinterpret_cast<const char*>(message));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match);
      if (ov[0] > at) encode_word(text.substr(at, ov[0] - at), out);
      if (ov[1] == ov[0]) {  // an empty match: step one character so the loop ends
        at = ov[0];
        if (at < text.size()) {
          const size_t length = utf8_char_length(text.substr(at));
          encode_word(text.substr(at, length), out);
          at += length;
        }
        continue;
      }
      encode_word(text.substr(ov[0], ov[1] - ov[0]), out);
      at = ov[1];
    }
    if (at < text.size()) encode_word(text.substr(at), out);
  }

  void encode_word(std::string_view word, std::vector<uint32_t>& out) const {
    // Words repeat (Zipf): their ids are cached, shared by the threads that encode at once.
    {
      std::shared_lock lock(cache_mutex_);
      if (auto it = cache_.find(std::string(word)); it != cache_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    const size_t before = out.size();
    encode_word_uncached(word, out);
    std::unique_lock lock(cache_mutex_);
    if (cache_.size() < kCacheWords) cache_.emplace(std::string(word), std::vector<uint32_t>(out.begin() + static_cast<long>(before), out.end()));
  }

  // A symbol of a word as a number: its token id, or for a byte's character the
  // vocabulary lacks, kByteSymbol + the byte. Anything else never occurs in a word.
  static constexpr uint32_t kByteSymbol = 0x80000000u;  // above every token id (add_token)
  std::optional<uint32_t> symbol_id(const std::string& symbol) const {
    if (auto it = vocab_.find(symbol); it != vocab_.end()) return it->second;
    if (auto b = byte_map().to_byte.find(symbol); b != byte_map().to_byte.end()) return kByteSymbol + b->second;
    return std::nullopt;
  }
  static uint64_t pair_key(uint32_t left, uint32_t right) { return (static_cast<uint64_t>(left) << 32) | right; }

  // BPE on one word: merge the lowest-ranked adjacent pair (the leftmost of equal
  // ranks) until none is a merge. The symbols form a linked list and the candidate
  // pairs a min-heap of (rank, left position), so a word of n bytes takes
  // O(n log n), not a rescan per merge; an entry whose pair has changed since it
  // was pushed no longer has its rank and is skipped.
  void encode_word_uncached(std::string_view word, std::vector<uint32_t>& out) const {
    if (ignore_merges_) {
      std::string whole;
      for (unsigned char b : word) whole += byte_map().to_char[b];
      if (auto it = vocab_.find(whole); it != vocab_.end()) {
        out.push_back(it->second);
        return;
      }
    }
    const int n = static_cast<int>(word.size());
    std::vector<uint32_t> symbol(static_cast<size_t>(n));
    std::vector<int> next(static_cast<size_t>(n)), prev(static_cast<size_t>(n));
    for (int k = 0; k < n; ++k) {
      symbol[k] = byte_symbol_[static_cast<unsigned char>(word[k])];
      next[k] = k + 1;  // n: none
      prev[k] = k - 1;  // -1: none
    }
    using Candidate = std::pair<int, int>;  // (rank, left position)
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
    auto rank_at = [&](int k) {  // the merge rank of the pair starting at k, or -1
      if (next[k] >= n) return -1;
      auto it = merges_.find(pair_key(symbol[k], symbol[next[k]]));
      return it == merges_.end() ? -1 : it->second.rank;
    };
    auto push = [&](int k) {
      if (const int r = rank_at(k); r >= 0) heap.push({r, k});
    };
    for (int k = 0; k + 1 < n; ++k) push(k);
    while (!heap.empty()) {
      const auto [r, k] = heap.top();
      heap.pop();
      if (symbol[k] == UINT32_MAX || rank_at(k) != r) continue;  // merged away, or another pair now
      const int right = next[k];
      symbol[k] = merges_.at(pair_key(symbol[k], symbol[right])).merged;
      symbol[right] = UINT32_MAX;
      next[k] = next[right];
      if (next[k] < n) prev[next[k]] = k;
      if (prev[k] >= 0) push(prev[k]);
      push(k);
    }
    for (int k = 0; k < n; k = next[k]) {
      if (symbol[k] < kByteSymbol) {
        out.push_back(symbol[k]);
        continue;
      }
      // A byte whose character model.vocab lacks (an added token may still be it).
      const auto byte = static_cast<unsigned char>(symbol[k] - kByteSymbol);
      if (auto it = vocab_.find(byte_map().to_char[byte]); it != vocab_.end()) {
        out.push_back(it->second);
        continue;
      }
      char piece[8];
      std::snprintf(piece, sizeof(piece), "<0x%02X>", byte);
      if (byte_fallback_ && vocab_.count(piece)) {
        out.push_back(vocab_.at(piece));
      } else if (unk_) {
        out.push_back(*unk_);
      } else {
        throw TokenizerError(path_ + ": '" + byte_map().to_char[byte] +
                             "' is not in the vocabulary and the model has no unk_token");
      }
    }
  }

  std::string path_;
  std::unordered_map<std::string, uint32_t> vocab_;
  std::map<uint32_t, std::string> id_to_token_;
  struct Merge {
    int rank;
    uint32_t merged;  // the token of the pair joined
  };
  std::unordered_map<uint64_t, Merge> merges_;  // pair_key(left, right) of symbol ids
  std::array<uint32_t, 256> byte_symbol_{};     // each byte's symbol id
  std::vector<AddedToken> added_;
  std::array<std::vector<size_t>, 256> added_by_first_byte_;  // indexes into added_
  std::unordered_map<uint32_t, bool> added_ids_, special_;
  std::optional<uint32_t> unk_;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  static constexpr size_t kCacheWords = 1 << 20;  // a bound on its memory; later words are not cached
  mutable std::shared_mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<uint32_t>> cache_;
  bool add_prefix_space_ = false;
  // Owned, so a constructor that fails after compiling it (a bad added token) does not leak it.
  std::unique_ptr<pcre2_code, decltype(&pcre2_code_free)> regex_{nullptr, &pcre2_code_free};
};

}  // namespace

std::unique_ptr<Tokenizer> load_bpe_tokenizer(const std::string& path) { return std::make_unique<BpeTokenizer>(path); }

}  // namespace hdp

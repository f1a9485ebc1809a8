#pragma once
// Tokenizers: text to token ids and back.
//
// - The byte-level tokenizer: ids 0..255 are the bytes of the (UTF-8) text,
//   256 is BOS, 257 is EOS; the vocabulary has 258 entries (free functions below).
// - A SentencePiece model file (tokenizer.model of LLaMA-1/2 and Mistral), run
//   through Debian's libsentencepiece (data/sentencepiece_tokenizer.cpp).
// - A Hugging Face tokenizer.json with a byte-level BPE model (GPT-2, LLaMA-3),
//   written here with PCRE2 for the pre-tokenizer regex (data/bpe_tokenizer.cpp).
//
// `load_tokenizer` gives either behind one interface, with the facts a dataset
// records: vocabulary size, BOS/EOS ids and a name that identifies the exact
// tokenizer (for a model file, a hash of its bytes).

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/errors.h"

namespace hdp {

inline constexpr uint32_t kByteBos = 256;
inline constexpr uint32_t kByteEos = 257;
inline constexpr uint64_t kByteVocabSize = 258;
inline constexpr const char* kByteTokenizerName = "byte-level";

// One id per byte; no BOS/EOS added.
std::vector<uint32_t> encode_bytes(std::string_view text);
// Appends the ids of `text` to `out` (no allocation per call beyond growth).
void encode_bytes_append(std::string_view text, std::vector<uint32_t>& out);

// Bytes back to text. BOS and EOS are dropped unless keep_special, in which
// case they are rendered as "<bos>" / "<eos>". Any id > 257 (or negative)
// throws std::invalid_argument naming the id and its position.
std::string decode_bytes(std::span<const uint32_t> ids, bool keep_special = false);
std::string decode_bytes(std::span<const int32_t> ids, bool keep_special = false);

// A tokenizer file that cannot be used: missing, not a model, no EOS piece.
class TokenizerError : public InputError {
 public:
  using InputError::InputError;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Appends the ids of `text` (no BOS/EOS) to `out`. Safe to call from several
  // threads at once.
  virtual void encode_append(std::string_view text, std::vector<uint32_t>& out) const = 0;
  // Ids back to text; BOS, EOS and other control tokens are dropped.
  virtual std::string decode(std::span<const uint32_t> ids) const = 0;
  // The vocabulary's text of one id (a SentencePiece piece, a tokenizer.json token),
  // e.g. "</s>" for EOS: what Hugging Face's tokenizer_config.json names special
  // tokens by. "" for an id outside the vocabulary and for byte-level ids.
  virtual std::string piece(uint32_t id) const = 0;
  // Whether encoding may split text anywhere (bytes) or only between lines
  // without changing the result (subword models see whole words).
  virtual bool splits_anywhere() const { return false; }

  uint64_t vocab_size() const { return vocab_size_; }
  uint32_t bos_id() const { return bos_id_; }
  uint32_t eos_id() const { return eos_id_; }
  // Whether documents start with BOS (SentencePiece models: LLaMA's convention;
  // byte-level datasets never had one, and keep it that way).
  bool adds_bos() const { return adds_bos_; }
  // What the dataset's `tokenizer` attribute records, e.g. "byte-level" or
  // "sentencepiece tokenizer.model fnv1a64:0123456789abcdef".
  const std::string& name() const { return name_; }

 protected:
  uint64_t vocab_size_ = 0;
  uint32_t bos_id_ = 0, eos_id_ = 0;
  bool adds_bos_ = false;
  std::string name_;
};

// "" or "byte-level": the byte-level tokenizer; a file ending in .json: a Hugging Face
// tokenizer.json with a byte-level BPE model (data/bpe_tokenizer.cpp; BOS and EOS from
// the tokenizer_config.json beside it); any other file: a SentencePiece model
// (tokenizer.model). Throws TokenizerError naming the path (and the key).
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);
// The tokenizer.json reader alone (load_tokenizer calls it for .json files).
std::unique_ptr<Tokenizer> load_bpe_tokenizer(const std::string& path);

// FNV-1a 64 of a file's bytes as 16 hex digits: how a dataset names the exact
// tokenizer file that made it.
std::string file_fingerprint(const std::string& path);
// The same hash of bytes in memory (a copy of a tokenizer file, data/tokenizer_files.h).
std::string bytes_fingerprint(std::string_view bytes);

}  // namespace hdp

// SentencePiece models (tokenizer.model) through Debian's libsentencepiece, and
// load_tokenizer, which picks the tokenizer a path names.

#include <sentencepiece_processor.h>

#include <filesystem>

#include "data/tokenizer.h"

namespace hdp {
namespace {

class ByteTokenizer : public Tokenizer {
 public:
  ByteTokenizer() {
    vocab_size_ = kByteVocabSize;
    bos_id_ = kByteBos;
    eos_id_ = kByteEos;
    name_ = kByteTokenizerName;
  }
  void encode_append(std::string_view text, std::vector<uint32_t>& out) const override {
    encode_bytes_append(text, out);
  }
  std::string decode(std::span<const uint32_t> ids) const override { return decode_bytes(ids); }
  std::string piece(uint32_t) const override { return ""; }
  bool splits_anywhere() const override { return true; }
};

class SentencePieceTokenizer : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) {
    const auto status = processor_.Load(path);
    if (!status.ok())
      throw TokenizerError(path + ": not a SentencePiece model (" + status.ToString() + ")");
    const int pieces = processor_.GetPieceSize();
    if (pieces <= 0) throw TokenizerError(path + ": the SentencePiece model has no pieces");
    if (processor_.eos_id() < 0)
      throw TokenizerError(path + ": the SentencePiece model has no EOS piece (eos_id = -1); datasets end every "
                           "document with EOS, so train it with --eos_id set");
    vocab_size_ = static_cast<uint64_t>(pieces);
    eos_id_ = static_cast<uint32_t>(processor_.eos_id());
    // Without a BOS piece documents simply start with their text.
    adds_bos_ = processor_.bos_id() >= 0;
    bos_id_ = adds_bos_ ? static_cast<uint32_t>(processor_.bos_id()) : eos_id_;
    name_ = "sentencepiece " + std::filesystem::path(path).filename().string() + " fnv1a64:" + file_fingerprint(path);
  }
  void encode_append(std::string_view text, std::vector<uint32_t>& out) const override {
    std::vector<int> ids;
    const auto status = processor_.Encode(text, &ids);
    if (!status.ok()) throw TokenizerError("SentencePiece encode failed: " + status.ToString());
    out.insert(out.end(), ids.begin(), ids.end());
  }
  std::string decode(std::span<const uint32_t> ids) const override {
    std::vector<int> v(ids.begin(), ids.end());
    std::string text;
    const auto status = processor_.Decode(v, &text);
    if (!status.ok()) throw TokenizerError("SentencePiece decode failed: " + status.ToString());
    return text;
  }
  std::string piece(uint32_t id) const override {
    return id < vocab_size_ ? processor_.IdToPiece(static_cast<int>(id)) : std::string();
  }

 private:
  sentencepiece::SentencePieceProcessor processor_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  if (path.empty() || path == kByteTokenizerName) return std::make_unique<ByteTokenizer>();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw TokenizerError(path + ": no such tokenizer file (give a SentencePiece tokenizer.model, or byte-level)");
  if (std::filesystem::path(path).extension() == ".json") return load_bpe_tokenizer(path);
  return std::make_unique<SentencePieceTokenizer>(path);
}

}  // namespace hdp

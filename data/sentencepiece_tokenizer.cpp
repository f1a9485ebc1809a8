// SentencePiece models (tokenizer.model) through Debian's libsentencepiece, and
// load_tokenizer, which picks the tokenizer a path names.

#include <sentencepiece_processor.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string_view>

#include "data/tokenizer.h"

namespace hdp {
namespace {

// libsentencepiece builds a double-array trie (Darts-clone) of a model's pieces
// and throws on a piece holding a NUL byte from code the exception cannot leave,
// so the process aborts inside SentencePieceProcessor::Load. The pieces are read
// here first, from the protobuf wire format (https://protobuf.dev/programming-guides/encoding/)
// of ModelProto (sentencepiece_model.proto: field 1, repeated SentencePiece, whose
// field 1 is the piece). Returns the index of the first piece holding a NUL byte,
// or -1; a file that is not a well-formed ModelProto is left to Load to refuse.
int64_t first_piece_with_nul(std::string_view proto) {
  size_t at = 0;
  auto varint = [&](std::string_view bytes, size_t& pos, uint64_t& value) {
    value = 0;
    for (int shift = 0; shift < 64 && pos < bytes.size(); shift += 7) {
      const auto byte = static_cast<uint8_t>(bytes[pos++]);
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return true;
    }
    return false;
  };
  // The next field of `bytes` at `pos`: its number, and its bytes when length-delimited.
  auto field = [&](std::string_view bytes, size_t& pos, uint64_t& number, std::string_view& payload) {
    uint64_t tag = 0, value = 0;
    if (!varint(bytes, pos, tag)) return false;
    number = tag >> 3;
    switch (tag & 7) {
      case 0: return varint(bytes, pos, value);
      case 1: pos += 8; return pos <= bytes.size();
      case 5: pos += 4; return pos <= bytes.size();
      case 2:
        if (!varint(bytes, pos, value) || value > bytes.size() - pos) return false;
        payload = bytes.substr(pos, value);
        pos += value;
        return true;
      default: return false;  // groups: not in ModelProto
    }
  };
  int64_t piece = 0;
  uint64_t number = 0;
  std::string_view message;
  while (at < proto.size()) {
    message = {};
    if (!field(proto, at, number, message)) return -1;
    if (number != 1) continue;
    size_t inner = 0;
    std::string_view text;
    while (inner < message.size()) {
      text = {};
      if (!field(message, inner, number, text)) return -1;
      if (number == 1 && text.find('\0') != std::string_view::npos) return piece;
    }
    ++piece;
  }
  return -1;
}

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
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (const int64_t piece = first_piece_with_nul(bytes); piece >= 0)
      throw TokenizerError(path + ": piece " + std::to_string(piece) +
                           " of the SentencePiece model holds a NUL byte, which libsentencepiece cannot load");
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

#pragma once
// The byte-level tokenizer: ids 0..255 are the bytes of the (UTF-8) text,
// 256 is BOS, 257 is EOS; the vocabulary has 258 entries.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

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

}  // namespace hdp

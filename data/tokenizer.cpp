#include "data/tokenizer.h"

#include <stdexcept>

namespace hdp {

void encode_bytes_append(std::string_view text, std::vector<uint32_t>& out) {
  size_t base = out.size();
  out.resize(base + text.size());
  for (size_t i = 0; i < text.size(); ++i) out[base + i] = static_cast<unsigned char>(text[i]);
}

std::vector<uint32_t> encode_bytes(std::string_view text) {
  std::vector<uint32_t> out;
  encode_bytes_append(text, out);
  return out;
}

namespace {

template <class T>
std::string decode_impl(std::span<const T> ids, bool keep_special) {
  std::string out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    int64_t id = static_cast<int64_t>(ids[i]);
    if (id >= 0 && id < 256) {
      out.push_back(static_cast<char>(static_cast<unsigned char>(id)));
    } else if (id == kByteBos || id == kByteEos) {
      if (keep_special) out += (id == kByteBos) ? "<bos>" : "<eos>";
    } else {
      throw std::invalid_argument("decode_bytes: token id " + std::to_string(id) + " at position " +
                                  std::to_string(i) + " is outside the byte-level vocabulary (0..257)");
    }
  }
  return out;
}

}  // namespace

std::string decode_bytes(std::span<const uint32_t> ids, bool keep_special) {
  return decode_impl(ids, keep_special);
}

std::string decode_bytes(std::span<const int32_t> ids, bool keep_special) {
  return decode_impl(ids, keep_special);
}

}  // namespace hdp

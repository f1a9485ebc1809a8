#include "data/tokenizer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
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

namespace {

// FNV-1a 64 (Fowler, Noll, Vo), fed in pieces.
class Fnv1a64 {
 public:
  void add(std::string_view bytes) {
    for (const char c : bytes) hash_ = (hash_ ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  }
  std::string hex() const {
    char out[17];
    std::snprintf(out, sizeof(out), "%016llx", static_cast<unsigned long long>(hash_));
    return out;
  }

 private:
  uint64_t hash_ = 0xcbf29ce484222325ull;
};

}  // namespace

std::string file_fingerprint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw TokenizerError(path + ": cannot open: " + std::strerror(errno));
  Fnv1a64 hash;
  char block[1 << 16];
  while (in.read(block, sizeof(block)) || in.gcount() > 0) {
    hash.add(std::string_view(block, static_cast<size_t>(in.gcount())));
    if (!in) break;
  }
  return hash.hex();
}

std::string bytes_fingerprint(std::string_view bytes) {
  Fnv1a64 hash;
  hash.add(bytes);
  return hash.hex();
}

}  // namespace hdp

#pragma once
// What every fuzz target shares: the input as a file (the readers take paths, as
// the commands give them, so a target fuzzes the very entry a command uses, file
// size checks included), a sequential reader of the structure-aware targets' bytes,
// and the one rule of what a reader may throw.
//
// A fuzz target (LLVMFuzzerTestOneInput) hands the bytes to a reader, which must
// either accept them or throw an InputError (base/errors.h: the documented bad-input
// error, exit code 2, whose message names the file and field). Anything else (a
// crash, a sanitizer report, another exception escaping, an allocation beyond
// libFuzzer's -malloc_limit_mb, a hang) is a finding.

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <fstream>
#include <string>
#include <string_view>

#include "base/errors.h"

namespace hdp::fuzz {

// A directory of this process's own under $TMPDIR (or /tmp), removed at exit;
// each input overwrites the files of the one before.
inline const std::filesystem::path& scratch_dir() {
  struct Dir {
    std::filesystem::path path;
    Dir() {
      const char* tmp = std::getenv("TMPDIR");
      path = std::filesystem::path(tmp && *tmp ? tmp : "/tmp") / ("hdp-fuzz-" + std::to_string(::getpid()));
      std::filesystem::create_directories(path);
    }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

// Writes `bytes` to scratch_dir()/name and returns the file's path.
inline std::string write_input(const std::string& name, std::string_view bytes) {
  const std::string path = (scratch_dir() / name).string();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) throw std::runtime_error("fuzz: cannot write " + path);  // the machine's fault, not a finding
  return path;
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Reads the bytes of a structure-aware input from the front, little-endian; past
// the end every value reads as zero, so every input describes something.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t u8() { return at_ < size_ ? data_[at_++] : 0; }
  uint64_t u64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(u8()) << (8 * i);
    return v;
  }
  // `n` bytes (fewer at the end).
  std::string bytes(size_t n) {
    n = std::min(n, size_ - at_);
    std::string s(reinterpret_cast<const char*>(data_ + at_), n);
    at_ += n;
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

// Runs `parse`, letting the documented bad-input error through as an accepted outcome.
// With HDP_FUZZ_SHOW_REFUSALS set, prints what each refused input was told (to see
// how far a seed or a reproducer gets).
template <class Parse>
int accept_or_refuse(Parse&& parse) {
  try {
    parse();
    if (std::getenv("HDP_FUZZ_SHOW_REFUSALS")) std::fprintf(stderr, "accepted\n");
  } catch (const InputError& e) {
    if (std::getenv("HDP_FUZZ_SHOW_REFUSALS")) std::fprintf(stderr, "refused: %s\n", e.what());
  }
  return 0;
}

}  // namespace hdp::fuzz

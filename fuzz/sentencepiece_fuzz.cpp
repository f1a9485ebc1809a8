// A SentencePiece model file (tokenizer.model; data/sentencepiece_tokenizer.cpp),
// loaded as `prepare-data --tokenizer` loads it, then a fixed text encoded and the
// ids decoded.
#include "data/tokenizer.h"
#include "fuzz/fuzz_input.h"

namespace {
constexpr std::string_view kText = "Hello, world! 1234 naïve  tabs\tand\nnew lines \xF0\x9F\x98\x80";
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = hdp::fuzz::write_input("tokenizer.model", hdp::fuzz::as_text(data, size));
  return hdp::fuzz::accept_or_refuse([&] {
    const auto tokenizer = hdp::load_tokenizer(path);
    std::vector<uint32_t> ids;
    tokenizer->encode_append(kText, ids);
    tokenizer->decode(ids);
  });
}

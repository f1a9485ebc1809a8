// A Hugging Face tokenizer.json with its tokenizer_config.json (data/bpe_tokenizer.cpp),
// loaded as `prepare-data --tokenizer` loads it, then a fixed text encoded and the ids
// decoded. The input is tokenizer.json, or tokenizer.json, the separator line below
// and tokenizer_config.json; without the separator the config names <|endoftext|>.
#include "data/tokenizer.h"
#include "fuzz/fuzz_input.h"

namespace {
constexpr std::string_view kSeparator = "\n--- tokenizer_config.json ---\n";
constexpr std::string_view kDefaultConfig = R"({"bos_token": null, "eos_token": "<|endoftext|>"})";
constexpr std::string_view kText = "Hello, world! 1234 naïve  tabs\tand\nnew lines \xF0\x9F\x98\x80 <|endoftext|>";
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input = hdp::fuzz::as_text(data, size);
  const size_t split = input.find(kSeparator);
  const std::string path = hdp::fuzz::write_input("tokenizer.json", input.substr(0, split));
  hdp::fuzz::write_input("tokenizer_config.json",
                         split == std::string_view::npos ? kDefaultConfig : input.substr(split + kSeparator.size()));
  return hdp::fuzz::accept_or_refuse([&] {
    const auto tokenizer = hdp::load_tokenizer(path);
    std::vector<uint32_t> ids;
    tokenizer->encode_append(kText, ids);
    tokenizer->decode(ids);
  });
}

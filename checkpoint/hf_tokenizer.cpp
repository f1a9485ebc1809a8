#include "checkpoint/hf_tokenizer.h"

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <filesystem>

#include "base/errors.h"
#include "checkpoint/tokenizer_copy.h"

namespace hdp {
namespace {

namespace fs = std::filesystem;

// config.json's special ids: the given one, which must agree with the tokenizer's.
int64_t special_id(const char* flag, std::optional<int64_t> given, uint32_t tokenizer_id, const std::string& identity) {
  if (given && *given != static_cast<int64_t>(tokenizer_id))
    throw UsageError(std::string(flag) + " " + std::to_string(*given) + " contradicts the checkpoint's tokenizer '" +
                     identity + "', whose id is " + std::to_string(tokenizer_id) + "; leave " + flag + " out");
  return tokenizer_id;
}

}  // namespace

HfSpecialIds export_hf_tokenizer(const std::string& checkpoint, const Manifest& manifest, int64_t vocab_size,
                                 std::optional<int64_t> bos, std::optional<int64_t> eos, const std::string& hf_dir) {
  HfSpecialIds ids;
  if (manifest.tokenizer.empty()) {
    if (vocab_size == static_cast<int64_t>(kByteVocabSize)) {
      bos = bos.value_or(kByteBos);
      eos = eos.value_or(kByteEos);
    }
    if (!bos || !eos)
      throw UsageError(checkpoint + " records no tokenizer (written before checkpoints kept one), and its vocabulary "
                       "of " + std::to_string(vocab_size) + " is not the byte-level 258: give the tokenizer's ids, "
                       "--bos-id and --eos-id");
    ids = {*bos, *eos};
  } else {
    const std::unique_ptr<Tokenizer> tokenizer = checkpoint_tokenizer(checkpoint, manifest, "", vocab_size);
    ids.bos = special_id("--bos-id", bos, tokenizer->bos_id(), manifest.tokenizer);
    ids.eos = special_id("--eos-id", eos, tokenizer->eos_id(), manifest.tokenizer);
    const TokenizerFiles files = read_checkpoint_tokenizer(checkpoint, manifest);
    if (files.byte_level()) {
      spdlog::info("export-hf: the byte-level tokenizer has no Hugging Face tokenizer file (ids 0-255 are the UTF-8 "
                   "bytes, 256 BOS, 257 EOS); none written");
    } else if (parse_tokenizer_identity(files.identity, checkpoint).kind == "bpe") {
      // tokenizer.json and the tokenizer_config.json it came with, as they were.
      write_tokenizer_files(hf_dir, {{"tokenizer.json", files.files[0].bytes}, files.files[1]});
    } else {
      // transformers' LlamaTokenizer reads tokenizer.model; its config names the special pieces.
      nlohmann::ordered_json config = {{"tokenizer_class", "LlamaTokenizer"},
                                       {"add_bos_token", tokenizer->adds_bos()},
                                       {"add_eos_token", false},
                                       {"eos_token", tokenizer->piece(tokenizer->eos_id())}};
      if (tokenizer->adds_bos()) config["bos_token"] = tokenizer->piece(tokenizer->bos_id());
      write_tokenizer_files(hf_dir, {{"tokenizer.model", files.files[0].bytes},
                                     {kTokenizerConfigFile, config.dump(2) + "\n"}});
    }
  }
  for (int64_t id : {ids.bos, ids.eos})
    if (id < 0 || id >= vocab_size)
      throw UsageError("token id " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(vocab_size));
  return ids;
}

std::optional<TokenizerFiles> read_hf_tokenizer(const std::string& hf_dir, int64_t vocab_size) {
  std::string path;
  for (const char* name : {"tokenizer.model", "tokenizer.json"}) {
    std::error_code ec;
    if (fs::is_regular_file(fs::path(hf_dir) / name, ec)) {
      path = (fs::path(hf_dir) / name).string();
      break;
    }
  }
  if (path.empty()) {
    spdlog::warn("import-hf: {} holds no tokenizer.model or tokenizer.json; the checkpoint records no tokenizer "
                 "(generate needs --tokenizer)", hf_dir);
    return std::nullopt;
  }
  std::unique_ptr<Tokenizer> tokenizer;
  try {
    tokenizer = load_tokenizer(path);
  } catch (const TokenizerError& e) {
    spdlog::warn("import-hf: the tokenizer is not imported: {}; the checkpoint records no tokenizer (generate "
                 "needs --tokenizer)", e.what());
    return std::nullopt;
  }
  if (tokenizer->vocab_size() > static_cast<uint64_t>(vocab_size))
    throw CheckpointError(path + ": the tokenizer's vocabulary has " + std::to_string(tokenizer->vocab_size()) +
                          " entries, more than config.json's vocab_size " + std::to_string(vocab_size));
  spdlog::info("import-hf: tokenizer {} (BOS {}, EOS {})", tokenizer->name(), tokenizer->bos_id(), tokenizer->eos_id());
  return tokenizer_files(path, *tokenizer);
}

}  // namespace hdp

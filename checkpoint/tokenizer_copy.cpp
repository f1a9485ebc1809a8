#include "checkpoint/tokenizer_copy.h"

#include <filesystem>

#include "base/errors.h"
#include "data/dataset.h"

namespace hdp {
namespace {

namespace fs = std::filesystem;

std::string copy_dir(const std::string& checkpoint) { return (fs::path(checkpoint) / kCheckpointTokenizerDir).string(); }

// Whether an identity names a tokenizer (a Megatron index without its copy does not).
bool recorded(const std::string& identity) { return !identity.empty() && identity != kMegatronUnknownTokenizer; }

// The prepare-data option that makes data with the checkpoint's tokenizer.
std::string prepare_hint(const std::string& checkpoint, const std::string& identity) {
  if (identity == kByteTokenizerName) return "trainer prepare-data without --tokenizer (byte-level)";
  try {
    return "trainer prepare-data --tokenizer " +
           (fs::path(copy_dir(checkpoint)) / parse_tokenizer_identity(identity, checkpoint).file).string();
  } catch (const TokenizerError&) {
    return "the tokenizer '" + identity + "'";
  }
}

}  // namespace

void write_checkpoint_tokenizer(const std::string& step_dir, const TokenizerFiles& files) {
  try {
    write_tokenizer_directory(copy_dir(step_dir), files);
  } catch (const TokenizerError& e) {
    throw CheckpointError(e.what());
  }
}

TokenizerFiles read_checkpoint_tokenizer(const std::string& checkpoint, const Manifest& manifest) {
  TokenizerFiles files;
  try {
    files = read_tokenizer_directory(copy_dir(checkpoint));
  } catch (const TokenizerError& e) {
    throw CheckpointError(checkpoint + ": the tokenizer its manifest records ('" + manifest.tokenizer +
                          "') cannot be read: " + e.what());
  }
  if (files.identity != manifest.tokenizer)
    throw CheckpointError(checkpoint + ": " + kCheckpointTokenizerDir + "/ holds tokenizer '" + files.identity +
                          "', but the manifest records '" + manifest.tokenizer + "'");
  return files;
}

std::unique_ptr<Tokenizer> checkpoint_tokenizer(const std::string& checkpoint, const Manifest& manifest,
                                                const std::string& given, int64_t vocab_size) {
  if (manifest.tokenizer.empty()) {
    if (!given.empty()) return load_tokenizer(given);
    if (vocab_size == static_cast<int64_t>(kByteVocabSize)) return load_tokenizer(kByteTokenizerName);
    throw UsageError(checkpoint + " records no tokenizer (it was written before checkpoints kept one) and its "
                     "model.vocab_size is " + std::to_string(vocab_size) + ", not the byte-level " +
                     std::to_string(kByteVocabSize) + ": pass the tokenizer its data was made with, --tokenizer PATH");
  }
  const TokenizerFiles files = read_checkpoint_tokenizer(checkpoint, manifest);
  std::unique_ptr<Tokenizer> tokenizer;
  try {
    tokenizer = files.byte_level() ? load_tokenizer(kByteTokenizerName)
                                   : load_tokenizer((fs::path(copy_dir(checkpoint)) / files.files[0].name).string());
  } catch (const TokenizerError& e) {
    throw CheckpointError(checkpoint + ": its tokenizer copy does not load: " + e.what());
  }
  if (!given.empty()) {
    std::unique_ptr<Tokenizer> other = load_tokenizer(given);
    if (!same_tokenizer(other->name(), tokenizer->name()))
      throw UsageError("--tokenizer " + given + " is tokenizer '" + other->name() + "', but " + checkpoint +
                       " was trained with tokenizer '" + tokenizer->name() + "' (its copy is in " +
                       copy_dir(checkpoint) + "); leave --tokenizer out to use it");
    return other;
  }
  return tokenizer;
}

void check_data_tokenizer(const std::string& checkpoint, const Manifest& manifest, const std::string& data,
                          const std::string& data_tokenizer, const std::string& what) {
  if (!recorded(manifest.tokenizer) || !recorded(data_tokenizer)) return;
  if (same_tokenizer(manifest.tokenizer, data_tokenizer)) return;
  throw ConfigError(what + ": the data '" + data + "' was made with tokenizer '" + data_tokenizer + "', but " +
                    checkpoint + " was trained with tokenizer '" + manifest.tokenizer +
                    "'; its token ids mean other text. Prepare the data with the checkpoint's tokenizer: " +
                    prepare_hint(checkpoint, manifest.tokenizer));
}

}  // namespace hdp

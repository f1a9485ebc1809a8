#pragma once
// The tokenizer a checkpoint was trained with (docs/checkpoint-format.md,
// "tokenizer/"): the manifest's `tokenizer` names it and CHECKPOINT/tokenizer/
// holds the copy of its files that came with the data (data/tokenizer_files.h).
// generate decodes with it, eval and training refuse data made with another one,
// export-hf writes it into the Hugging Face directory.

#include <memory>
#include <string>

#include "checkpoint/manifest.h"
#include "data/tokenizer_files.h"

namespace hdp {

inline constexpr const char* kCheckpointTokenizerDir = "tokenizer";

// Writes the copy into a step directory being committed (rank 0, before the manifest).
void write_checkpoint_tokenizer(const std::string& step_dir, const TokenizerFiles& files);

// The checked copy of a checkpoint whose manifest records a tokenizer.
// CheckpointError naming the checkpoint when it is missing, damaged or of another
// tokenizer than the manifest's.
TokenizerFiles read_checkpoint_tokenizer(const std::string& checkpoint, const Manifest& manifest);

// The tokenizer to encode and decode a checkpoint's text with:
// - the manifest records one: its copy; `given` (a --tokenizer path, may be "")
//   only when it is the same tokenizer, else a UsageError naming both;
// - it records none (written before tokenizers travelled): `given`, or the
//   byte-level tokenizer when model.vocab_size is the byte-level 258; any other
//   vocabulary is a UsageError asking for --tokenizer (bytes would be garbage).
std::unique_ptr<Tokenizer> checkpoint_tokenizer(const std::string& checkpoint, const Manifest& manifest,
                                                const std::string& given, int64_t vocab_size);

// Refuses (ConfigError) data made with a tokenizer other than the one the
// checkpoint recorded, naming both and both paths; `what` says who asks (e.g.
// "eval", "train.init_from"). Passes when either side records none.
void check_data_tokenizer(const std::string& checkpoint, const Manifest& manifest, const std::string& data,
                          const std::string& data_tokenizer, const std::string& what);

}  // namespace hdp

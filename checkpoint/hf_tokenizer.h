#pragma once
// The tokenizer's part of Hugging Face interchange (docs/checkpoint-format.md,
// "Hugging Face interchange"): export-hf writes the checkpoint's tokenizer into the
// model directory and takes the special ids from it; import-hf reads the
// directory's tokenizer into the checkpoint it writes.

#include <cstdint>
#include <optional>
#include <string>

#include "checkpoint/manifest.h"
#include "data/tokenizer_files.h"

namespace hdp {

struct HfSpecialIds {
  int64_t bos = 0, eos = 0;
};

// Writes the tokenizer a checkpoint records into HF_DIR: tokenizer.model and a
// tokenizer_config.json naming its BOS/EOS pieces (SentencePiece), or
// tokenizer.json and its tokenizer_config.json as they came (byte-level BPE). The
// byte-level tokenizer has no Hugging Face file (ids 0-255 are the UTF-8 bytes, 256
// BOS, 257 EOS): nothing is written and a line says so. Returns the special ids for
// config.json: the tokenizer's, where given ones must agree (UsageError naming both);
// without a recorded tokenizer, the given ones, or 256/257 for a vocabulary of 258
// (UsageError asking for --bos-id/--eos-id otherwise).
HfSpecialIds export_hf_tokenizer(const std::string& checkpoint, const Manifest& manifest, int64_t vocab_size,
                                 std::optional<int64_t> bos, std::optional<int64_t> eos, const std::string& hf_dir);

// The tokenizer of a Hugging Face directory, for import-hf: tokenizer.model
// (SentencePiece, what LLaMA-2 and Mistral ship) when present, else tokenizer.json
// (byte-level BPE, LLaMA-3) with its tokenizer_config.json; nullopt when there is
// neither, or when the file does not load (a warning names it and why: generate
// then needs --tokenizer). A vocabulary larger than the model's is refused.
std::optional<TokenizerFiles> read_hf_tokenizer(const std::string& hf_dir, int64_t vocab_size);

}  // namespace hdp

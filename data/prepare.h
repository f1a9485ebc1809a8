#pragma once
// `trainer prepare-data --input FILE... --output DATA.h5`: turns text files into
// a byte-level token dataset (docs/dataset-format.md).
//
// - An input whose name ends in ".jsonl" holds one JSON object per line; each
//   non-blank line is one document, the object's "text" string (fully
//   unescaped, \uXXXX and surrogate pairs to UTF-8). Other members are ignored.
// - Any other input is one document: the file's bytes, unchanged.
// - Compressed inputs (gzip, zstd, xz) and NUL bytes are refused; bytes that are
//   not UTF-8 are kept, with one warning per file counting them.
// - Every document gets EOS (257) appended; documents with empty text are
//   skipped (counted in stats.skipped), so no document is just an EOS.

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/tokenizer.h"
#include "data/tokenizer_files.h"

namespace hdp {

// A problem with an input file; the message starts with "<file>:" or
// "<file>:<line>:" and says what is wrong.
class DataInputError : public InputError {
 public:
  using InputError::InputError;
};

struct PrepareOptions {
  int64_t progress_every_bytes = 64ll << 20;  // log progress after each such amount of input
  // nullptr: the byte-level tokenizer. Documents get the tokenizer's BOS first
  // when it adds one (data/tokenizer.h) and its EOS last.
  const Tokenizer* tokenizer = nullptr;
  // The tokenizer's files (tokenizer_files(path, *tokenizer), data/tokenizer_files.h),
  // kept in the dataset so that checkpoints, generate and eval use the same
  // tokenizer: HDF5 in the group `tokenizer_files`, Megatron in PREFIX.tokenizer/.
  // nullopt: no copy is kept (the byte-level tokenizer needs none).
  std::optional<TokenizerFiles> tokenizer_copy;
  // Megatron: `output` is the PREFIX of PREFIX.bin and PREFIX.idx (data/megatron.h).
  DatasetFormat format = DatasetFormat::Hdf5;
  // Workers that parse and tokenize JSON Lines documents; 0: every core.
  int threads = 0;
  // Replace a dataset already at `output` (else refused).
  bool overwrite = false;
};

// Writes `output` (via output + ".tmp", see TokenDatasetWriter). Throws a
// UsageError when a file the writer creates is one of the inputs (by path or as a
// link to it), or when a dataset is already there and options.overwrite is not set;
// DataInputError for input problems (missing/unreadable file, compressed file,
// NUL byte at file:line, invalid JSON at
// file:line, missing or non-string "text" at file:line, no documents at all)
// and DatasetError for output problems. Logs progress and a summary via spdlog.
DatasetBuildStats prepare_dataset(const std::vector<std::string>& inputs, const std::string& output,
                                  const PrepareOptions& options = {});

}  // namespace hdp

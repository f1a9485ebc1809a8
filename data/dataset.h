#pragma once
// The HDF5 token dataset (format: docs/dataset-format.md): all documents' token
// ids back to back in `tokens` (uint32), document boundaries in `doc_offsets`
// (uint64, documents + 1 entries), tokenizer facts as file attributes.
//
// Thread-safety: every method takes hdf5_mutex() itself, so const methods of
// one TokenDataset may be called from several threads (e.g. a prefetch thread
// and an evaluation loop); HDF5 work is serialised process-wide.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/errors.h"
#include "data/batch.h"
#include "data/hdf5_util.h"
#include "data/tokenizer_files.h"

namespace hdp {

inline constexpr uint32_t kDatasetFormatVersion = 1;
inline constexpr int64_t kTokenChunkElements = 65536;  // tokens per HDF5 chunk
inline constexpr int kDeflateLevel = 4;

// Anything wrong with a dataset file: it is missing, not HDF5, lacks a dataset
// or attribute, has the wrong type/shape, inconsistent offsets, or token ids
// outside the vocabulary. The message names the file (and document if any).
class DatasetError : public InputError {
 public:
  using InputError::InputError;
};

// Writes a dataset document by document. The data goes to `path + ".tmp"`,
// which finish() renames to `path`; a writer destroyed without finish() deletes
// the temporary file, so an interrupted run never leaves a file that looks
// complete. Not thread-safe (one writer, one thread); takes hdf5_mutex().
class TokenDatasetWriter {
 public:
  TokenDatasetWriter(const std::string& path, uint64_t vocab_size, const std::string& tokenizer, uint32_t bos_id,
                     uint32_t eos_id);
  static TokenDatasetWriter create(const std::string& path, uint64_t vocab_size, const std::string& tokenizer,
                                   uint32_t bos_id, uint32_t eos_id) {
    return TokenDatasetWriter(path, vocab_size, tokenizer, bos_id, eos_id);
  }
  TokenDatasetWriter(TokenDatasetWriter&&) noexcept;
  TokenDatasetWriter& operator=(TokenDatasetWriter&&) = delete;
  TokenDatasetWriter(const TokenDatasetWriter&) = delete;
  TokenDatasetWriter& operator=(const TokenDatasetWriter&) = delete;
  ~TokenDatasetWriter();

  // Appends one whole document; returns its index. Ids must be < vocab_size
  // (DatasetError otherwise, nothing appended). Empty documents are allowed.
  int64_t append(std::span<const uint32_t> tokens);
  // Streaming form for documents too large to hold at once: append_partial any
  // number of times, then end_document() (returns the index).
  void append_partial(std::span<const uint32_t> tokens);
  int64_t end_document();

  // A copy of the tokenizer's files, written by finish() into the group
  // `tokenizer_files` (docs/dataset-format.md); its identity must be the writer's
  // `tokenizer` (DatasetError otherwise). Byte-level: nothing to store.
  void store_tokenizer_copy(TokenizerFiles files);

  // Flushes tokens, writes doc_offsets and the attributes, closes, renames.
  // A document begun with append_partial and not ended is ended first.
  void finish();

  int64_t num_documents() const { return static_cast<int64_t>(offsets_.size()) - 1; }
  int64_t num_tokens() const { return static_cast<int64_t>(total_); }
  const std::string& path() const { return path_; }
  bool finished() const { return finished_; }

 private:
  void flush_pending();  // hdf5_mutex() held
  void abandon() noexcept;

  std::string path_, tmp_path_;
  uint64_t vocab_size_;
  std::string tokenizer_;
  TokenizerFiles tokenizer_copy_;
  uint32_t bos_id_, eos_id_;
  H5Handle file_, tokens_;
  std::vector<uint32_t> pending_;
  std::vector<uint64_t> offsets_{0};
  uint64_t total_ = 0;       // tokens appended so far (flushed + pending)
  uint64_t written_ = 0;     // tokens already in the HDF5 dataset
  uint32_t max_token_id_ = 0;
  bool open_document_ = false;
  bool finished_ = false;
};

// A read-only view of a dataset file. open() validates the whole structure and
// loads doc_offsets (8 bytes per document); tokens are read on demand.
// Move-only. Methods are safe to call concurrently (see above).
// data.format: hdf5 (this file format) or megatron (PREFIX.bin + PREFIX.idx, data/megatron.h).
enum class DatasetFormat { Hdf5, Megatron };
struct MegatronSource;

class TokenDataset {
 public:
  explicit TokenDataset(const std::string& path, DatasetFormat format = DatasetFormat::Hdf5);
  static TokenDataset open(const std::string& path, DatasetFormat format = DatasetFormat::Hdf5) {
    return TokenDataset(path, format);
  }
  TokenDataset(TokenDataset&&) noexcept;
  TokenDataset& operator=(TokenDataset&&) noexcept;
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;
  ~TokenDataset();

  const std::string& path() const { return path_; }
  int64_t num_documents() const { return static_cast<int64_t>(offsets_.size()) - 1; }
  int64_t num_tokens() const { return static_cast<int64_t>(offsets_.back()); }
  int64_t document_length(int64_t document) const;
  const std::vector<uint64_t>& doc_offsets() const { return offsets_; }
  uint64_t vocab_size() const { return vocab_size_; }
  uint32_t bos_id() const { return bos_id_; }
  uint32_t eos_id() const { return eos_id_; }
  uint32_t max_token_id() const { return max_token_id_; }
  const std::string& tokenizer() const { return tokenizer_; }
  uint32_t format_version() const { return format_version_; }

  // Tokens [offset, offset + length) of `document` into out[0..length).
  // std::out_of_range if the range is not inside the document; DatasetError
  // (naming file and document) if the read fails or an id is >= vocab_size.
  void read(int64_t document, int64_t offset, int64_t length, int32_t* out) const;
  void read(const SequenceSpan& span, int32_t* out) const { read(span.document, span.offset, span.length, out); }
  std::vector<int32_t> read(const SequenceSpan& span) const;
  std::vector<int32_t> read_document(int64_t document) const;

 private:
  void close() noexcept;
  void open_megatron();

  std::string path_;
  H5Handle file_, tokens_;
  std::vector<uint64_t> offsets_{0};
  uint64_t vocab_size_ = 0;
  uint32_t bos_id_ = 0, eos_id_ = 0, max_token_id_ = 0, format_version_ = 0;
  std::string tokenizer_;
  std::shared_ptr<const MegatronSource> megatron_;  // set for data.format megatron
};

// The copy of its tokenizer that a dataset holds, read and checked (its model
// file's hash against the identity in the `tokenizer` attribute; sizes bounded by
// kMaxTokenizerFileBytes before anything is allocated): for HDF5 the group
// `tokenizer_files`, for Megatron the directory PREFIX.tokenizer beside PREFIX.bin.
// A byte-level dataset needs no files; nullopt when the dataset holds no copy
// (written before copies were kept, or by another tool). DatasetError naming the
// file when the copy is damaged.
std::optional<TokenizerFiles> dataset_tokenizer_copy(const std::string& path, DatasetFormat format);
// The `tokenizer` of a Megatron dataset without that copy.
inline constexpr const char* kMegatronUnknownTokenizer = "megatron (the index records no tokenizer)";
// PREFIX.tokenizer: where a Megatron dataset's tokenizer copy lives.
std::string megatron_tokenizer_directory(const std::string& prefix);

}  // namespace hdp

namespace hdp {

// What building a dataset file produced (prepare-data, make-corpus).
struct DatasetBuildStats {
  int64_t documents = 0;
  int64_t tokens = 0;         // including the EOS of each document
  int64_t input_bytes = 0;    // bytes of text read or generated
  int64_t skipped = 0;        // inputs/lines skipped because their text was empty
  int64_t max_document_tokens = 0;
  double seconds = 0;
};

}  // namespace hdp

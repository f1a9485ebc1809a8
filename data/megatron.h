#pragma once
// Megatron-LM's indexed dataset (MMIDIDX version 1, megatron/core/datasets/
// indexed_dataset.py): PREFIX.bin holds the token arrays back to back, PREFIX.idx
// says where each sequence is (docs/dataset-format.md, "Megatron .bin/.idx"):
//
//   9 bytes   magic "MMIDIDX\0\0"
//   uint64    version, 1
//   uint8     dtype code: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64,
//             7 float32, 8 uint16
//   uint64    S, the number of sequences
//   uint64    D, the number of document indices (documents + 1)
//   int32[S]  sequence lengths (elements)
//   int64[S]  sequence pointers (byte offsets into PREFIX.bin)
//   int64[D]  document indices: document d is sequences [idx[d], idx[d+1])
//
// all little-endian. Our writer makes one sequence per document (Megatron's
// preprocess_data.py without sentence splitting) in uint16 when the vocabulary
// fits (below 65500, Megatron's rule) and int32 otherwise. The reader takes any
// integer dtype, memory-maps PREFIX.bin and reads a document as its sequences'
// tokens, which must be contiguous (as every Megatron writer makes them).

#include <cstdint>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace hdp {

enum class MegatronDtype : uint8_t { U8 = 1, I8 = 2, I16 = 3, I32 = 4, I64 = 5, F64 = 6, F32 = 7, U16 = 8 };

size_t megatron_dtype_bytes(MegatronDtype dtype);
// uint16 below 65500 entries, else int32 (Megatron's DType.optimal_dtype).
MegatronDtype megatron_dtype_for_vocab(uint64_t vocab_size);

struct MegatronIndex {
  MegatronDtype dtype = MegatronDtype::U16;
  std::vector<int32_t> sequence_lengths;
  std::vector<int64_t> sequence_pointers;
  std::vector<int64_t> document_indices;
};

// Reads and checks PREFIX.idx against PREFIX.bin's size. Throws DatasetError
// "dataset 'PREFIX': ..." naming the file and the field.
MegatronIndex read_megatron_index(const std::string& prefix);

// The tokens of PREFIX.bin, memory-mapped (read-only, shared by threads).
class MegatronTokens {
 public:
  MegatronTokens(const std::string& prefix, MegatronDtype dtype);
  ~MegatronTokens();
  MegatronTokens(const MegatronTokens&) = delete;
  MegatronTokens& operator=(const MegatronTokens&) = delete;
  uint64_t size() const { return count_; }  // tokens
  // Tokens [first, first + n) widened to int64 (negative ids are the caller's to refuse).
  void read(uint64_t first, uint64_t n, int64_t* out) const;

 private:
  const uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
  uint64_t count_ = 0;
  MegatronDtype dtype_;
};

// Writes PREFIX.bin and PREFIX.idx document by document (one sequence each),
// through PREFIX.bin.tmp / PREFIX.idx.tmp renamed by finish(); the same calls as
// TokenDatasetWriter so prepare-data drives either.
class MegatronWriter {
 public:
  MegatronWriter(const std::string& prefix, uint64_t vocab_size);
  ~MegatronWriter();
  MegatronWriter(const MegatronWriter&) = delete;
  MegatronWriter& operator=(const MegatronWriter&) = delete;
  int64_t append(std::span<const uint32_t> tokens);
  void append_partial(std::span<const uint32_t> tokens);
  int64_t end_document();
  void finish();
  MegatronDtype dtype() const { return dtype_; }

 private:
  std::string prefix_;
  uint64_t vocab_size_;
  MegatronDtype dtype_;
  std::ofstream bin_;
  MegatronIndex index_;
  int64_t open_length_ = 0;  // elements of the document begun with append_partial
  int64_t written_ = 0;      // bytes in PREFIX.bin so far
  bool finished_ = false;
};

}  // namespace hdp

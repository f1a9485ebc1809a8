#include "data/batch.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace hdp {

int64_t sequence_length_at(int64_t document_length, int64_t offset, int64_t max_seq_len) {
  if (max_seq_len < 1 || offset < 0 || offset >= document_length) {
    throw std::invalid_argument("sequence_length_at: offset " + std::to_string(offset) + " in a document of " +
                                std::to_string(document_length) + " tokens, max_seq_len " + std::to_string(max_seq_len));
  }
  return std::min(document_length - offset, max_seq_len);
}

std::vector<int64_t> sequence_lengths(std::span<const SequenceSpan> sequences) {
  std::vector<int64_t> lengths;
  lengths.reserve(sequences.size());
  for (const SequenceSpan& s : sequences) lengths.push_back(s.length);
  return lengths;
}

int64_t PackedMicroBatch::num_predictions() const {
  int64_t n = 0;
  for (int32_t t : targets) n += (t >= 0);
  return n;
}

}  // namespace hdp

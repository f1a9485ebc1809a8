#pragma once
// `trainer eval CHECKPOINT --data DATA`: the loss and perplexity of a checkpoint
// (written under any layout; its whole weights are loaded into one process) on
// held-out data. Every document is cut into sequences of at most max_seq_len
// tokens as training cuts them (sequence_length_at, data/batch.h), each token
// predicts the next one of its sequence, and the loss is the mean cross-entropy
// over all predicted tokens.

#include <cstdint>
#include <string>

#include "data/dataset.h"

namespace hdp {

struct EvalOptions {
  DatasetFormat format = DatasetFormat::Hdf5;
  int64_t max_seq_len = 0;       // 0: the checkpoint config's data.max_seq_len
  int64_t max_documents = 0;     // 0: every document
  int64_t threads = 0;           // 0: every core
};

struct EvalResult {
  std::string checkpoint;        // the step directory evaluated
  int64_t step = 0;
  int64_t documents = 0, sequences = 0, predicted_tokens = 0;
  double loss = 0;               // mean cross-entropy (nats per token)
  double perplexity = 0;         // exp(loss)
  double seconds = 0;
};

EvalResult evaluate_checkpoint(const std::string& checkpoint, const std::string& data, const EvalOptions& options);

}  // namespace hdp

#pragma once
// Deterministic sampling of global batches: which sequences a step trains on.
//
// Stream: epoch e visits the documents in document_order(e) (file order, or a
// Fisher-Yates shuffle seeded by (seed, e)); each document is cut into
// sequences as sequence_length_at (data/batch.h) says: consecutive pieces of at
// most max_seq_len tokens (2500 with max 1024 -> 1024, 1024, 452). Empty
// documents are skipped. Sequences of length 1 are KEPT (they carry 0
// predictions), so every token of the dataset is in exactly one sequence per
// epoch.
//
// Batches: a global batch takes sequences in stream order while its total
// stays <= global_batch_tokens; the first sequence that would exceed it starts
// the next batch. The stream runs on across epochs within a batch. Which rank
// trains on which pieces is the step plan's business (planning/plan.h), and
// reading their tokens data/materialize.h's.
//
// Resumption: SamplerState (epoch, cursor, document_offset) is the position of
// the next sequence; a BatchSampler built from batch k's `next` state yields
// batch k+1 exactly as an uninterrupted run would.

#include <cstdint>
#include <vector>

#include "data/batch.h"
#include "data/dataset.h"

namespace hdp {

struct SamplerOptions {
  int64_t max_seq_len = 1024;
  int64_t global_batch_tokens = 4096;
  bool shuffle = true;
  uint64_t seed = 1234;
};

// Throws std::invalid_argument naming the option: all sizes must be >= 1,
// max_seq_len <= global_batch_tokens.
void validate_sampler_options(const SamplerOptions& options);

// The order of documents in `epoch`: 0..n-1 when !shuffle, otherwise a
// Fisher-Yates permutation drawn from Rng(seed, epoch) (base/rng.h).
std::vector<int64_t> document_order(int64_t num_documents, bool shuffle, uint64_t seed, uint64_t epoch);

// Produces global batches from a dataset. The dataset must outlive the
// sampler and must not be moved while the sampler exists (it keeps a
// pointer). One sampler is for one thread (it holds no locks of its own; the
// dataset reads lock hdf5_mutex()). state() before the first next() is the
// given state moved past empty documents / an epoch end.
class BatchSampler {
 public:
  // Throws std::invalid_argument for bad options, a dataset without tokens or
  // a state that does not point into the dataset.
  BatchSampler(const TokenDataset& dataset, const SamplerOptions& options, const SamplerState& state = {});

  // The next batch: its sequences, their total and the start/next states; no
  // micro-batches (a step plan places the sequences on ranks).
  GlobalBatch next();

  SamplerState state() const { return state_; }
  const SamplerOptions& options() const { return options_; }
  const TokenDataset& dataset() const { return *dataset_; }

 private:
  const std::vector<int64_t>& order(uint64_t epoch);
  // Moves past empty documents and epoch ends so that state_ names a real token.
  void normalize();

  const TokenDataset* dataset_;
  SamplerOptions options_;
  SamplerState state_;
  uint64_t order_epoch_ = UINT64_MAX;
  std::vector<int64_t> order_;
};

}  // namespace hdp

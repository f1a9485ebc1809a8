#pragma once
// Deterministic sampling of global batches and their packing into micro-batches.
//
// Stream: epoch e visits the documents in document_order(e) (file order, or a
// Fisher-Yates shuffle seeded by (seed, e)); each document is cut into
// consecutive sequences of at most max_seq_len tokens (2500 with max 1024 ->
// 1024, 1024, 452). Empty documents are skipped. Sequences of length 1 are
// KEPT (they carry 0 predictions), so every token of the dataset is in exactly
// one sequence per epoch.
//
// Batches: a global batch takes sequences in stream order while its total
// stays <= global_batch_tokens; the first sequence that would exceed it starts
// the next batch. The stream runs on across epochs within a batch.
// Packing: best-fit decreasing into micro-batches of micro_batch_tokens.
//
// Resumption: SamplerState (epoch, cursor, document_offset) is the position of
// the next sequence; a BatchSampler built from batch k's `next` state yields
// batch k+1 exactly as an uninterrupted run would.

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "data/batch.h"
#include "data/dataset.h"
#include "planning/plan.h"

namespace hdp {

struct SamplerOptions {
  int64_t max_seq_len = 1024;
  int64_t global_batch_tokens = 4096;
  int64_t micro_batch_tokens = 4096;
  bool shuffle = true;
  uint64_t seed = 1234;
};

// Throws std::invalid_argument naming the option: all sizes must be >= 1,
// max_seq_len <= global_batch_tokens (packing with next() also needs
// max_seq_len <= micro_batch_tokens).
void validate_sampler_options(const SamplerOptions& options);

// The order of documents in `epoch`: 0..n-1 when !shuffle, otherwise a
// Fisher-Yates permutation drawn from Rng(seed, epoch) (base/rng.h).
std::vector<int64_t> document_order(int64_t num_documents, bool shuffle, uint64_t seed, uint64_t epoch);


// best_fit_decreasing (planning/plan.h) over sequences: micro-batches with only `spans` filled.
std::vector<PackedMicroBatch> pack_best_fit(std::span<const SequenceSpan> sequences, int64_t capacity);

// Reads the tokens of `spans` back to back and fills tokens, targets (next
// token of the same sequence, -1 on each sequence's last token), positions
// (0..len-1 per sequence) and cu_seqlens (size spans + 1, first 0).
PackedMicroBatch materialize_micro_batch(const TokenDataset& dataset, std::span<const SequenceSpan> spans);

// Reads a planned micro-batch (planning/plan.h): its pieces of the batch's
// `sequences` in row order, positions = the pieces' true positions, targets = the
// next token of the same sequence (which may lie in another piece or on another
// rank; -1 after a sequence's last token), cu_seqlens over the whole sequences.
PackedMicroBatch materialize_planned(const TokenDataset& dataset, std::span<const SequenceSpan> sequences,
                                     const PlannedMicroBatch& planned);
// The same from any source of tokens: read(document, offset, length, out).
using TokenReader = std::function<void(int64_t, int64_t, int64_t, int32_t*)>;
PackedMicroBatch materialize_planned(const TokenReader& read, std::span<const SequenceSpan> sequences,
                                     const PlannedMicroBatch& planned);
void materialize_micro_batch(const TokenDataset& dataset, PackedMicroBatch& micro_batch);

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

  // The next batch: sequences, best-fit packed micro-batches with their tokens
  // read, tokens/predictions totals, start/next states.
  GlobalBatch next();
  // The same batch without packing or reading tokens (micro_batches empty),
  // for a planner that packs differently. Advances the sampler like next().
  GlobalBatch next_plan();
  // Packs and materialises a planned batch (what next() does after next_plan()).
  void pack(GlobalBatch& batch) const;

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

#pragma once
// What one optimizer step trains on: sequences (spans of documents, each a
// causal unit whose positions start at 0) packed into micro-batches.

#include <cstdint>
#include <span>
#include <vector>

#include "planning/ring_layout.h"

namespace hdp {

// Tokens [offset, offset + length) of document `document`.
struct SequenceSpan {
  int64_t document = 0;
  int64_t offset = 0;
  int64_t length = 0;
};

// How documents become sequences, for training (data/sampler.h), evaluation and
// `trainer plan`'s length sources alike: a document is cut into consecutive
// sequences of max_seq_len tokens, the last one shorter (2500 tokens at 1024 ->
// 1024, 1024, 452). The length of the sequence that starts `offset` tokens into a
// document of `document_length` tokens. Throws std::invalid_argument unless
// 0 <= offset < document_length and max_seq_len >= 1.
int64_t sequence_length_at(int64_t document_length, int64_t offset, int64_t max_seq_len);

// The sequences' lengths, in order: what a step planner plans with.
std::vector<int64_t> sequence_lengths(std::span<const SequenceSpan> sequences);

// Where the sampler stands in the document stream; stored in checkpoints so a
// resumed run continues with exactly the next batch.
struct SamplerState {
  uint64_t epoch = 0;
  int64_t cursor = 0;           // index into the epoch's document order
  int64_t document_offset = 0;  // tokens of the cursor's document already consumed
  bool operator==(const SamplerState&) const = default;
};

// One micro-batch, ready for the model: several sequences back to back, and,
// when it takes part in a ring, this rank's chunks of the ring's sequences after
// them (rows from cu_seqlens.back() on).
struct PackedMicroBatch {
  std::vector<SequenceSpan> spans;  // the tokens of each piece, in row order
  std::vector<int32_t> tokens;      // input ids
  std::vector<int32_t> targets;     // next token of the same sequence; -1 at each sequence's last token
  std::vector<int32_t> positions;   // true position inside the sequence (RoPE), 0 at its first token
  std::vector<int32_t> cu_seqlens;  // whole sequence i holds rows [cu_seqlens[i], cu_seqlens[i+1])
  int ring = -1;                    // index of the step plan's ring, -1 for none
  RingLayout ring_layout;           // that ring's members and their rows, from this rank's view
  double offload_ratio = 0;         // fraction of rows whose saved activations go to host memory
  int64_t recompute_layers = 0;     // the stage's first layers that recompute for it (planned per micro-batch)

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t num_predictions() const;
};

struct GlobalBatch {
  std::vector<SequenceSpan> sequences;              // in sampling order
  std::vector<PackedMicroBatch> local_micro_batches;  // this hdp rank's share of the step's plan, with tokens
  int64_t tokens = 0;
  SamplerState start;                               // sampler position before this batch
  SamplerState next;                                // sampler position after this batch
  // The plan's prediction (cost model) of this rank's and the busiest rank's
  // forward+backward seconds, to compare with what the step measures.
  double planned_busy_s = 0;
  double planned_max_busy_s = 0;
  double planned_bound_s = 0;  // the step no plan beats (planning/step_bound.h)
  double planned_step_s = 0;   // the plan's simulated step (run/step_planner.h's StepPrediction)
};

}  // namespace hdp

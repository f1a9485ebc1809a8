#pragma once
// Reads the tokens of micro-batches whose pieces are already decided: one hdp
// rank's share of a step plan (planning/plan.h, rank_work) for training, or
// whole sequences back to back for evaluation. Only the pieces' tokens are
// read, plus, where a piece's sequence goes on after it, the one token its last
// row predicts.

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "data/batch.h"
#include "data/dataset.h"
#include "planning/plan.h"

namespace hdp {

// A source of tokens: read(document, offset, length, out) writes tokens
// [offset, offset + length) of `document` to out.
using TokenReader = std::function<void(int64_t, int64_t, int64_t, int32_t*)>;
// Reads from a local dataset (which must outlive the reader).
TokenReader dataset_reader(const TokenDataset& dataset);

// The micro-batches of `work` with their tokens, one per entry: its pieces of
// the batch's `sequences` in row order, positions = the pieces' true positions,
// targets = the next token of the same sequence (which may lie in another piece
// or on another rank; -1 after a sequence's last token), cu_seqlens over the
// whole sequences, and the plan's ring, ring layout and offload ratio. Throws
// std::invalid_argument for a piece outside its sequence or a micro-batch of
// more rows than int32 counts.
std::vector<PackedMicroBatch> materialize_rank_work(const TokenReader& read, std::span<const SequenceSpan> sequences,
                                                    std::span<const RankMicroBatch> work);

// Whole sequences back to back in one micro-batch without a ring: positions
// 0..length-1 and targets -1 on the last token of each sequence.
PackedMicroBatch materialize_sequences(const TokenReader& read, std::span<const SequenceSpan> sequences);

}  // namespace hdp

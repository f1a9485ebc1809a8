#pragma once
// A step's work: for every hybrid-data-parallel rank, an ordered list of
// micro-batches, each a list of pieces of the global batch's sequences.
//
// This is the contract between planners and the training engine. Today's
// planner keeps every sequence whole on one rank; data-aware sharding will put
// pieces of one long sequence on several ranks (a piece then also names its ring).

#include <cstdint>
#include <span>
#include <vector>

namespace hdp {

// Tokens [offset, offset + length) of sequence `sequence` of the global batch.
struct PlannedPiece {
  int64_t sequence = 0;
  int64_t offset = 0;
  int64_t length = 0;
};

struct PlannedMicroBatch {
  std::vector<PlannedPiece> pieces;
  int64_t tokens() const;
};

struct StepPlan {
  int64_t capacity = 0;                                // tokens per micro-batch
  std::vector<std::vector<PlannedMicroBatch>> ranks;   // [hdp rank][micro-batch]
};

// Best-fit decreasing over lengths: items sorted by length descending (stable
// in input order); each goes into the open bin with the least remaining room
// that still fits (ties: the bin opened first), else into a new bin. Returns,
// per bin in opening order, the item indices in placement order. Throws
// std::invalid_argument if a length is < 1 or > capacity.
std::vector<std::vector<size_t>> best_fit_decreasing(std::span<const int64_t> lengths, int64_t capacity);

// Whole sequences packed into micro-batches (best fit decreasing), then dealt to
// the hdp ranks largest first, each to the rank with the fewest tokens so far.
StepPlan plan_whole_sequences(std::span<const int64_t> sequence_lengths, int hdp, int64_t capacity);

// Throws std::invalid_argument naming the first problem: a token of a sequence
// missing or assigned twice, a micro-batch over capacity, an empty micro-batch.
void check_plan(const StepPlan& plan, std::span<const int64_t> sequence_lengths);

}  // namespace hdp

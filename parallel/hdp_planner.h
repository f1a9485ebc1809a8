#pragma once
// Step planners: how a global batch's sequences become a StepPlan (parallel/plan.h).
//
// plan_naive is ByteScale's Algorithm 1 (docs/background.md section 2): sequences
// that fit one rank are packed whole into micro-batches (no communication); a
// longer one gets the fewest ranks the cost model allows, with a selective
// activation-offload ratio, and runs as a zig-zag ring over exactly those ranks.
// plan_static is the baseline of static systems: a fixed dp x cp grid, every
// packed row split over the cp ranks of its group whatever its sequences' lengths.

#include <cstdint>
#include <span>

#include "parallel/cost_model.h"
#include "parallel/plan.h"

namespace hdp {

struct OffloadSettings {
  bool enabled = true;
  double forced_ratio = -1;  // < 0: chosen by the cost model; else used for every long sequence
};

struct PlannerSettings {
  int hdp = 1;
  int64_t capacity = 0;          // C: tokens per rank and micro-batch without offload
  int64_t layers_per_stage = 1;  // l
  int pipeline_stages = 1;
  CostModel cost;
  OffloadSettings offload;
};

struct LongSequenceChoice {
  double ratio = 0;  // offload ratio of the sequence's micro-batches
  int ranks = 1;     // ring size D
};

// The most tokens any member of a ring of `ring_size` ranks holds of a sequence of
// `length` tokens (its two zig-zag chunks).
int64_t zigzag_max_member_tokens(int64_t length, int ring_size);

// Offload ratio r and ranks D for a sequence of `length` tokens. With
// l = layers_per_stage and C = capacity, D is the smallest count that satisfies
// both the memory model, D >= (2 + (1 - r)(l - 2)) Act(s) / (l Act(C)) (for l <= 2:
// Act(s) / Act(C), and r = 0 since offload frees nothing; skipped if Act(C) <= 0),
// and the token limit: every member's two zig-zag chunks together hold at most
// max_micro_batch_tokens(C, l, r) tokens. r is 0 if offload is disabled or l <= 2;
// else forced_ratio if that is >= 0; else the largest r whose copies hide under
// compute, T(s) >= Act(s) r / min(B_d2h, B_h2d), lowered to the smallest r that
// needs no more ranks. Throws std::invalid_argument if D > hdp.
LongSequenceChoice choose_ranks(int64_t length, const PlannerSettings& settings);

// Algorithm 1. Sequences of at most C tokens are packed best-fit decreasing into
// micro-batches of C tokens (r = 0). Longer ones take choose_ranks; one that still
// needs one rank (thanks to offload) is a micro-batch of its own. The others, in
// descending length, each take the first slot with D free ranks (the D lowest free
// ones, in increasing order, form its ring) and occupy that slot on all of them.
// Then packed micro-batches, largest first, fill free cells: each into the earliest
// free cell of the rank with the fewest tokens so far that has one; the rest go
// after the slots, each to the rank with the fewest tokens.
// With one pipeline stage, free cells left over are dropped (ring order follows the
// slot order on every rank, which is all the plan needs). With several stages they
// stay as empty micro-batches on ranks in rings, and all ranks of a connected group
// of rings are padded with empty micro-batches to one count, so their 1F1B
// schedules are identical.
StepPlan plan_naive(std::span<const int64_t> lengths, const PlannerSettings& settings);

// Static dp x cp baseline (r = 0). cp must divide hdp; cp = 0 picks the smallest
// divisor of hdp whose zig-zag split fits the longest sequence into C tokens per
// rank. Group g is hdp ranks [g cp, (g + 1) cp). Sequences are packed best-fit
// decreasing into rows of cp C tokens, where a sequence fits a row only if every
// member's tokens (counted exactly, chunk by chunk) stay within C. With cp > 1 a
// row is one ring of its group's ranks holding all the row's sequences; with
// cp = 1 its sequences are local. Rows go largest first to the group with the
// fewest tokens; a group's members run identical lists.
StepPlan plan_static(std::span<const int64_t> lengths, const PlannerSettings& settings, int cp);

}  // namespace hdp

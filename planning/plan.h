#pragma once
// A step's work: for every hybrid-data-parallel rank, an ordered list of
// micro-batches, each a list of pieces of the global batch's sequences.
//
// This is the contract between planners (planning/hdp_planner.h) and the
// training engine. A sequence that fits one rank is a single piece. A longer one
// is spread over a ring of k hdp ranks: it is cut into 2k zig-zag chunks and the
// ring member at position j holds chunks j and 2k-1-j, so causal work and ring
// traffic are equal on every member; the members compute its attention together
// with ring attention in the micro-batch that carries the ring. A member's
// micro-batch may also hold whole short sequences, which never communicate.

#include <cstdint>
#include <span>
#include <vector>

#include "planning/ring_layout.h"

namespace hdp {

// Tokens [offset, offset + length) of sequence `sequence` of the global batch. The
// offset is the tokens' true position in the sequence (RoPE, causal masking).
struct PlannedPiece {
  int64_t sequence = 0;
  int64_t offset = 0;
  int64_t length = 0;
  int ring = -1;  // index into StepPlan::rings, or -1 for a whole local sequence
  bool operator==(const PlannedPiece&) const = default;
};

// Row order of a micro-batch: its local pieces first, then its ring pieces: for
// each sequence of the ring in ring order, chunk j then chunk 2k-1-j (empty chunks
// of sequences shorter than 2k are left out).
struct PlannedMicroBatch {
  std::vector<PlannedPiece> pieces;
  int ring = -1;              // the ring this micro-batch takes part in, if any
  double offload_ratio = 0;   // fraction of its tokens whose saved activations go to host memory
  // Layers of its stage, the first ones, that recompute in backward what they do not
  // keep (planning/activation_mix.h): offload's alternative for a micro-batch above
  // the capacity. They are never offloaded; offload_ratio applies to the others.
  int64_t recompute_layers = 0;
  int64_t tokens() const;
  bool operator==(const PlannedMicroBatch&) const = default;
};

// The hdp ranks (in ring order) that run one micro-batch slot together, and the
// sequences they share.
struct Ring {
  std::vector<int> ranks;
  std::vector<int64_t> sequences;
  bool operator==(const Ring&) const = default;
};

struct StepPlan {
  int64_t capacity = 0;                                // tokens per micro-batch without offload
  std::vector<std::vector<PlannedMicroBatch>> ranks;   // [hdp rank][micro-batch]
  std::vector<Ring> rings;
  // What a micro-batch's recomputed layer keeps per token, as a share of a whole
  // layer's saved bytes (1: recomputation frees nothing, or none is planned).
  double recomputed_layer_share = 1;
  // Per pipeline stage, the last forward it runs before each backward k
  // (planning/pipeline_schedule.h, deepest_forward_limits; one model chunk per stage
  // only); empty: 1F1B's. Only the step simulator runs limits other than 1F1B's: the
  // trainer's executor (parallel/pipeline.h) runs 1F1B, and rank_work, the one way a
  // plan reaches training ranks, refuses a plan with limits.
  std::vector<std::vector<int>> forward_limits;
  bool operator==(const StepPlan&) const = default;
};

// One micro-batch of one hdp rank's share of a plan: the planned micro-batch and,
// when it takes part in a ring, that ring's layout from this rank's view (the
// members' zig-zag chunks, planning/ring_layout.h; no peers outside a ring).
struct RankMicroBatch {
  PlannedMicroBatch planned;
  RingLayout ring_layout;
};

// The micro-batches of hdp rank `hdp_rank` of `plan`, in the plan's order; lengths
// are the global batch's sequence lengths. What the rank trains on, without its
// tokens (data/materialize.h reads them). Throws std::invalid_argument for a rank
// outside the plan, a ring that does not count this rank among its members, or a plan
// with forward limits (StepPlan::forward_limits: the trainer's executor runs 1F1B).
std::vector<RankMicroBatch> rank_work(const StepPlan& plan, std::span<const int64_t> lengths, int hdp_rank);


// The ring pieces of the member at `position` of `ring` (index ring_index in the
// plan), in row order; lengths are the global batch's sequence lengths.
std::vector<PlannedPiece> zigzag_ring_pieces(const Ring& ring, int ring_index, int position,
                                             std::span<const int64_t> lengths);
// zigzag_ring_pieces of every member, by position: each sequence's chunk bounds
// computed once for all members (static plans at thousands of GPUs have rings of
// hundreds of members).
std::vector<std::vector<PlannedPiece>> zigzag_ring_pieces_by_member(const Ring& ring, int ring_index,
                                                                    std::span<const int64_t> lengths);

// The most tokens a micro-batch may hold when a pipeline stage has `layers` layers
// (l), its first k = recompute_layers of them recompute and keep a share rho =
// recomputed_share of a whole layer's bytes, and a fraction r of the saved rows of the
// others but the last two is offloaded: device memory holds k rho + h + m (1 - r)
// whole layers per token (h = min(2, l - k) held in full, m = max(0, l - k - 2)
// offloaded), within the budget of l layers at `capacity` tokens:
// floor(l C / (k rho + h + m (1 - r))). Without recomputation that is
// floor(l C / (2 + (1 - r)(l - 2))) (ByteScale's offload), capacity at r = 0.
// Throws std::invalid_argument for k outside [0, l] or rho outside (0, 1].
int64_t max_micro_batch_tokens(int64_t capacity, int64_t layers, double offload_ratio, int64_t recompute_layers = 0,
                               double recomputed_share = 1);

// m = max(0, l - k - 2): the layers of a stage of l whose saved rows may be offloaded
// when its first k recompute (the last two stay whole on the device).
int64_t offloaded_layers(int64_t layers, int64_t recompute_layers);

// What micro-batch mb keeps on the device until its backward on a stage of `layers`
// layers, as a share of a micro-batch of `capacity` tokens with every layer whole:
// tokens x (k rho + h + m (1 - r)) / (l C), the memory model of
// max_micro_batch_tokens (1 for a micro-batch at that limit, 0 for an empty one).
double micro_batch_device_share(const PlannedMicroBatch& mb, int64_t capacity, int64_t layers,
                                double recomputed_share);
// Whether micro-batch mb parks rows in host memory until its backward on a stage of
// `layers` layers: it has tokens, an offload ratio above 0 and layers to offload
// (l - k - 2 > 0, k its recomputed layers; max_micro_batch_tokens's memory model).
bool micro_batch_offloads(const PlannedMicroBatch& mb, int64_t layers);
// The deepest forward limits (planning/pipeline_schedule.h, deepest_forward_limits) of
// the plan's micro-batches, whose shares micro_batch_device_share gives at the plan's
// capacity and recomputed layer share, and whose offloading ones micro_batch_offloads.
std::vector<std::vector<int>> plan_deepest_forward_limits(const StepPlan& plan, int64_t layers_per_stage,
                                                          int pipeline_stages);

// Best-fit decreasing over lengths: items sorted by length descending (stable
// in input order); each goes into the open bin with the least remaining room
// that still fits (ties: the bin opened first), else into a new bin. Returns,
// per bin in opening order, the item indices in placement order. Throws
// std::invalid_argument if a length is < 1 or > capacity.
std::vector<std::vector<size_t>> best_fit_decreasing(std::span<const int64_t> lengths, int64_t capacity);

// Throws std::invalid_argument naming the first problem:
// - a token of a sequence missing or assigned twice, a piece outside its sequence;
// - a micro-batch above max_micro_batch_tokens(capacity, layers, its ratio, its
//   recompute layers, the plan's recomputed_layer_share), a ratio outside [0, 1], or
//   recompute layers outside [0, layers];
// - forward limits (StepPlan::forward_limits) that are not valid
//   (validate_forward_limits, one chunk per stage) or whose forwards in flight do not
//   fit a stage's memory (forward_limits_fit of micro_batch_device_share and
//   micro_batch_offloads);
// - a ring whose members do not each hold exactly their zig-zag chunks of its
//   sequences, in the row order above, in exactly one micro-batch;
// - ranks that share rings reaching them in different orders. With pipeline
//   stages > 1 the order is that of the 1F1B schedule of each rank's micro-batch
//   count (planning/pipeline_schedule.h; with the plan's forward limits where it has them;
//   with chunks > 1 model chunks per stage, the interleaved order over the stages x
//   chunks virtual stages), so ring micro-batches must meet in every (virtual) stage.
void check_plan(const StepPlan& plan, std::span<const int64_t> sequence_lengths, int64_t layers_per_stage,
                int pipeline_stages, int chunks = 1);

}  // namespace hdp

#pragma once
// The order in which a pipeline stage runs its micro-batches, shared by the
// executor (parallel/pipeline.h), the plan check (planning/plan.h) and the step
// simulator (whatif/step_simulation.h):
//
// - one forward-one backward (1F1B; Narayanan et al., "Memory-Efficient
//   Pipeline-Parallel DNN Training", PipeDream-Flush, 2021), each stage holding
//   one contiguous range of layers;
// - interleaved 1F1B (Narayanan et al., "Efficient Large-Scale Language Model
//   Training on GPU Clusters Using Megatron-LM", SC 2021, section 2.2.2): each of
//   the pp stages holds `chunks` (vpp) model chunks, chunk c of stage s being
//   virtual stage c x pp + s of pp x vpp, so a micro-batch passes every stage vpp
//   times and the fill and drain shrink by vpp: the bubble is (pp - 1) / (vpp m)
//   of the ideal step instead of (pp - 1) / m;
// - 1F1B with a deeper warm-up (deepest_warmups): stage s runs more than
//   pp - s - 1 forwards before its first backward where the activations in flight
//   fit its memory, so that a long micro-batch's round trip through the later
//   stages leaves stage 0 less idle. Backwards stay in micro-batch order.

#include <span>
#include <vector>

namespace hdp {

struct PipelineOp {
  bool forward = true;
  int micro_batch = 0;
  int chunk = 0;  // the stage's model chunk: virtual stage chunk x stages + stage
};

// One forward-one backward: stage s of p runs min(p - s - 1, m) warm-up forwards,
// then alternates forward and backward, then drains the remaining backwards.
std::vector<PipelineOp> one_f_one_b(int stage, int stages, int micro_batches);
// The same order with min(warmup, m) warm-up forwards: before backward k the stage
// has run forwards 0 ... min(warmup + k, m - 1), so micro-batches k ... warmup + k are
// in flight (warmup + 1 of them).
std::vector<PipelineOp> one_f_one_b_with_warmup(int micro_batches, int warmup);

// Per-stage warm-up counts (one per stage, empty: 1F1B's p - s - 1) are valid when
// none is negative and none is larger than the previous stage's. That rule is what
// keeps the stages free of deadlock, whatever their transfers' buffering: stage s
// runs backward k after forwards up to w_s + k; stage s + 1 needs forwards up to
// w_(s+1) + k <= w_s + k from stage s before its own backward k, so stage s has sent
// them before it waits for that backward (by induction from the last stage, whose
// backward k needs only its own forward k). Throws std::invalid_argument naming the
// first stage that breaks it, or a count of entries other than `stages`.
void validate_warmups(std::span<const int> warmups, int stages);

// The deepest warm-ups the stages' memory allows. kept[r][i]: what micro-batch i of
// hdp rank r keeps on the device until its backward, as a share of one micro-batch at
// the capacity with every layer whole (planning/plan.h, micro_batch_device_share);
// stage s's budget is 1F1B's, p - s such micro-batches. Per stage but the last the
// largest w (at least 1F1B's p - s - 1, at most the most micro-batches of a rank less
// one) such that on every rank every w + 1 consecutive micro-batches together keep at
// most p - s; then each stage's count is lowered to one below the previous stage's,
// as in 1F1B: with equal counts stage s + 1's backward k waits for stage s's forward
// w + k, which stage s runs only after its backward k - 1, so every backward waits for
// a round trip between the two (simulated: LLaMA-70B, pp 4, GitHub 1M, warm-ups
// 5, 5, 5, 0 take twice 5, 4, 3, 0's step). The last stage keeps 1F1B's 0: its
// backward needs only its own forward, and a warm-up there would only hold the
// gradients back.
// Shares above 1 (a plan over its capacity) leave 1F1B's counts.
std::vector<int> deepest_warmups(const std::vector<std::vector<double>>& kept, int stages);
// Whether warm-up w on stage s of p keeps every rank's forwards in flight within the
// budget of deepest_warmups: every min(w + 1, m) consecutive shares sum to at most
// p - s (with a relative tolerance of 1e-9 for rounding).
bool warmup_fits(const std::vector<std::vector<double>>& kept, int stage, int stages, int warmup);
// Micro-batches whose forward can be in flight before their backward on that stage
// (stages - stage); with `chunks` > 1, the (micro-batch, chunk) pairs of the
// interleaved order: its warm-up plus one.
int pipeline_slots(int stage, int stages, int chunks = 1);

// Interleaved 1F1B over `chunks` model chunks per stage, in Megatron-LM's order:
// forwards go through the micro-batches in groups of `stages`, each group through
// chunk 0, 1, ..., chunks - 1; backwards the same groups with the chunks reversed.
// Stage s runs min(2 (p - s - 1) + (chunks - 1) p, chunks m) warm-up forwards, then
// one forward and one backward in turn, then the drain. Any m runs: when p does not
// divide it, the order is that of the next multiple of p with the missing
// micro-batches' operations left out.
// Throws std::invalid_argument for chunks < 1, and for chunks > 1 with one stage
// (nothing to interleave).
std::vector<PipelineOp> interleaved_one_f_one_b(int stage, int stages, int chunks, int micro_batches);

// The schedule of a stage: one_f_one_b for one chunk, interleaved_one_f_one_b for more;
// with warm-up counts (validate_warmups; one chunk only, else std::invalid_argument)
// one_f_one_b_with_warmup(m, warmups[stage]).
std::vector<PipelineOp> pipeline_schedule(int stage, int stages, int chunks, int micro_batches,
                                          std::span<const int> warmups = {});

// The pipeline bubble over the ideal step (every stage busy with its m micro-batches'
// forward and backward), for equal micro-batches and free transfers: (p - 1) / (vpp m).
double pipeline_bubble_fraction(int stages, int chunks, int micro_batches);

}  // namespace hdp

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
// - 1F1B with deeper warm-ups (deepest_forward_limits): before its backward k, stage
//   s may have run more than 1F1B's forwards 0 ... k + p - s - 1 where the
//   activations in flight fit its memory, so that a long micro-batch's round trip
//   through the later stages leaves the stage less idle. Forwards and backwards each
//   stay in micro-batch order (the gradient sums keep their order).

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
// Forwards and backwards each in micro-batch order, backward k right after forward
// min(last_forward[k], m - 1) (or after backward k - 1 when that forward ran earlier):
// before backward k the stage has run forwards 0 ... last_forward[k], so micro-batches
// k ... last_forward[k] are in flight. 1F1B is last_forward[k] = k + p - s - 1.
// Throws std::invalid_argument unless last_forward has at least m entries, each at
// least k and none below the one before.
std::vector<PipelineOp> forwards_ahead_of_backwards(int micro_batches, std::span<const int> last_forward);

// Per stage the last forward before each backward k, for k below the most
// micro-batches of a rank (StepPlan::forward_limits); empty: 1F1B's. Valid when each
// stage's list is one forwards_ahead_of_backwards takes and no stage's entry exceeds
// the previous stage's. That rule is what keeps the stages free of deadlock with sends
// that do not block the sender (the simulator's; the executor's send_async with
// receives posted in advance; blocking rendezvous sends deadlock even 1F1B at p 2):
// stage s runs backward k after forwards up to W_s(k);
// stage s + 1 needs forwards up to W_(s+1)(k) <= W_s(k) from stage s before its own
// backward k, so stage s has sent them before it waits for that backward (by
// induction from the last stage, whose backward k needs only its own forward k).
// Throws std::invalid_argument naming the first stage and backward that break it.
void validate_forward_limits(const std::vector<std::vector<int>>& limits, int stages, int micro_batches);

// The deepest limits the stages' memory allows. kept[r][i]: what micro-batch i of hdp
// rank r keeps on the device until its backward, as a share of one micro-batch at the
// capacity with every layer whole (planning/plan.h, micro_batch_device_share);
// offloads[r][i]: 1 where it parks rows in host memory (micro_batch_offloads), else 0
// (kept's shape; empty: none does). Stage s's budget is 1F1B's, p - s such
// micro-batches on the device and at most p - s offloading ones: the planner sized
// each micro-batch's offload so that host memory holds the p in flight on 1F1B's
// stage 0 (choose_ranks, activation_mix_settings), which a small device share does
// not bound (each stage keeps to its own 1F1B count, as on the device). For every
// stage but the last and every backward k, the largest W (at least 1F1B's
// min(k + p - s - 1, M - 1), M the most micro-batches of a rank) such that on every
// rank micro-batches k ... W keep at most p - s together and at most p - s of them
// offload; then lowered to one below the previous stage's W, as in 1F1B:
// with equal limits stage s + 1's backward k waits for stage s's forward W(k), which
// stage s runs only after its backward k - 1, so every backward waits for a round trip
// between the two (simulated: LLaMA-70B, pp 4, GitHub 1M, constant warm-ups 5, 5, 5, 0
// took 1.8-2.0 times 1F1B's step on every balance candidate; 5, 4, 3, 0 4% less than
// 1F1B on one). The last stage keeps 1F1B's W(k) = k: its backward
// needs only its own forward, and running ahead there would only hold the gradients
// back. Where 1F1B's own windows exceed a budget (shares above 1), 1F1B's.
// Throws std::invalid_argument for offloads of another shape than kept's.
std::vector<std::vector<int>> deepest_forward_limits(const std::vector<std::vector<double>>& kept,
                                                     const std::vector<std::vector<int>>& offloads, int stages);
// Whether stage s of p keeps every rank's forwards in flight within the budget of
// deepest_forward_limits wherever last_forward runs ahead of 1F1B: micro-batches
// k ... min(last_forward[k], m - 1) keep at most p - s (relative tolerance 1e-9) and
// at most p - s of them offload. Throws as deepest_forward_limits.
bool forward_limits_fit(const std::vector<std::vector<double>>& kept, const std::vector<std::vector<int>>& offloads,
                        int stage, int stages, std::span<const int> last_forward);

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
// with limits (validate_forward_limits; one chunk only, else std::invalid_argument)
// forwards_ahead_of_backwards(m, limits[stage]).
std::vector<PipelineOp> pipeline_schedule(int stage, int stages, int chunks, int micro_batches,
                                          const std::vector<std::vector<int>>& limits = {});

// The pipeline bubble over the ideal step (every stage busy with its m micro-batches'
// forward and backward), for equal micro-batches and free transfers: (p - 1) / (vpp m).
double pipeline_bubble_fraction(int stages, int chunks, int micro_batches);

}  // namespace hdp

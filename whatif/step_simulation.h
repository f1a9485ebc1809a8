#pragma once
// The operation graph of one planned training step (planning/plan.h) on a
// described cluster, replayed with whatif/simulator.h: `trainer plan`'s
// simulator (docs/planning.md).
//
// A simulated process is one tensor-parallel group (its tp GPUs run in lock step
// and are folded into one), at one pipeline stage of one hdp rank:
// process = hdp_rank + hdp * stage, whose GPUs are world ranks
// tp * process ... tp * process + tp - 1 (the trainer's rank order,
// spec/parallel_degrees.h), gpus_per_node to a node.
//
// Streams of a process: compute, pp-fwd-send, pp-fwd-recv, pp-bwd-send,
// pp-bwd-recv, dp (gradient reduce-scatter and parameter all-gather), d2h and h2d
// (activation offload copies).
//
// Per pipeline stage and hdp rank, the rank's planned micro-batches run in the
// 1F1B order of planning/pipeline_schedule.h (with the plan's forward limits where
// it has them, StepPlan::forward_limits), or with vpp model chunks per stage
// (StepCosts::chunk_layers) in its interleaved order over the pp x vpp virtual
// stages. Forward of micro-batch i on virtual stage v > 0 waits for the activation
// receive paired with virtual stage v-1's send (a group: the transfer starts when
// both have started); backward likewise from v+1.
// A ring micro-batch's compute operations on all members form a group: the ring
// starts when its last member arrives and runs in lock step for the slowest
// member's time (ring attention: every ring step waits for the previous block).
// After its last backward, every process joins its stage's gradient
// reduce-scatter over the hdp ranks (a collective: the DP bubble shows as the
// wait for the slowest rank), runs the optimizer on its ZeRO-1 shard, and joins
// the parameter all-gather. The step time is the makespan.
//
// Expert parallelism (ep, MoE models only; GShard: Lepikhin et al., 2021, "GShard:
// Scaling Giant Models with Conditional Computation and Automatic Sharding"; Switch
// Transformer: Fedus et al., 2022): the hdp ranks of a stage form groups of ep
// consecutive ranks (neighbouring GPUs, as tp's). A group holds every expert once,
// each member num_experts / ep of them (tp shards each as any FFN), and every MoE
// layer sends each token to its experts' members and back, as model/moe.h runs it:
// per GPU and layer forward an exchange of the per-expert row counts (num_experts
// fp32 values) and then a dispatch and a combine all-to-all, backward two (the output
// gradients out, the input gradients back; the counts are reused); each row
// all-to-all moves tokens x hidden x 2 bytes x experts_per_token, of which
// (ep - 1) / ep leaves the GPU. The all-to-all blocks the layer (its output is the next operation's input), so
// it is an operation on the dp stream after the micro-batch's compute that the next
// compute waits for. Routing is taken as balanced: every member receives as many
// tokens as it sends, and runs experts_per_token experts' FLOPs per token whatever ep.
// An expert's gradients are reduce-scattered over the hdp / ep ranks that hold it
// (ranks r, r + ep, ...), the rest over all hdp ranks.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "spec/model_shape.h"
#include "spec/parallel_degrees.h"
#include "planning/cost_model.h"
#include "whatif/hardware.h"
#include "planning/plan.h"
#include "whatif/simulator.h"

namespace hdp {

// The counts of spec/model_shape.h for one model under one layout, per GPU of a
// tp group, with the precision of large-model training: mixed precision as in
// Megatron-LM with a distributed (ZeRO-1) optimizer, bf16 weights (2 bytes per
// parameter), fp32 gradients (4), fp32 master weights and Adam moments (12)
// sharded over the hdp ranks, and bf16 activations (kActivationBytes per value).
constexpr int kActivationBytes = 2;  // bf16

struct ModelCosts {
  double layer_parameters = 0;         // one layer, all experts, whole model (not per GPU)
  double embedding_parameters = 0;     // vocab x hidden
  double head_parameters = 0;          // LM head (0 when tied and pp = 1) + final norm
  double layer_matmul_flops_per_token = 0;  // forward + backward, per GPU: 6 x active matmul parameters / tp
  double attention_flops_per_token_pair = 0;  // forward + backward per (query, visible key) pair, per GPU: 12 qdim / tp
  double head_flops_per_token = 0;     // LM head forward + backward per GPU: 6 vocab hidden / tp
  // One layer's values saved for backward, per GPU (spec/model_shape.h), under the
  // recompute mode; under full a ring layer's, the larger: capacity must hold any
  // micro-batch, and which of them join rings is the plan's choice.
  double saved_bytes_per_token = 0;
  double kv_bytes_per_token = 0;       // K and V of one layer per GPU (ring attention block), bf16
  double boundary_bytes_per_token = 0;  // activation (or its gradient) sent between pipeline stages, per GPU
  double expert_parameters = 0;        // one layer's experts (all of them, whole model): what ep shards
  // One dispatch (or combine) all-to-all per GPU, layer and token: the token's
  // hidden values in bf16 for each of its experts, hidden x 2 x experts_per_token
  // (of which (ep - 1) / ep leaves the GPU); 0 for a dense model.
  double all_to_all_bytes_per_token = 0;
  // The count exchange before dispatch, per GPU, layer and micro-batch: one fp32 row
  // count per expert, 4 x num_experts bytes (model/moe.h); 0 for a dense model.
  double all_to_all_count_bytes = 0;
};
// recompute: what every layer keeps for backward (saved_bytes_per_token's mode);
// sequence_parallel: the norms' and residual stream's part of it for 1/tp of the
// tokens, and the stage boundary's send: each rank of tp sends its 1/tp of the
// residual stream's rows, as the trainer does (model/model.h residual_rows; with
// whole rows per rank, the padding of a micro-batch to a multiple of tp, at most
// tp - 1 rows, is not counted). Sequence parallelism changes no other cost here: the
// simulator does not model tp's collectives, and its all-gather and reduce-scatter
// move the bytes of the all-reduce they replace (Korthikanti et al. 2022, section
// 4.2.2).
ModelCosts model_costs(const ModelShape& model, int tp, int pp, RecomputeMode recompute = RecomputeMode::None,
                       bool sequence_parallel = false);

// Throws std::invalid_argument unless ep is at least 1 and divides num_experts and
// hdp; a dense model (num_experts 1) takes ep 1 only: the layout rules of
// spec/model_checks.h (layout_issue) the trainer's config checks too.
void validate_expert_parallel(const ModelShape& model, int hdp, int ep);
// The degrees of expert parallelism a model may use over hdp ranks: the divisors of
// hdp that divide num_experts, ascending ({1} for a dense model).
std::vector<int> expert_parallel_candidates(const ModelShape& model, int hdp);

// Per-stage memory and the capacity C it allows.
struct MemoryBudget {
  int64_t capacity = 0;  // C: the smallest over stages of floor(free / (in_flight x layers x saved bytes))
  int limiting_stage = 0;
  std::vector<double> parameters_per_gpu;  // per stage, experts sharded over ep
  std::vector<double> static_bytes;        // weights + gradients + optimizer shard, per GPU and stage
  std::vector<double> free_bytes;          // hbm - reserved - static, per stage
};
// virtual_stage_layers: the layers of each virtual stage c x pp + s, pp x degrees.vpp
// of them (with vpp 1, each stage's; planning/stage_split.h).
// Stage s keeps pp - s micro-batches in flight under 1F1B, each of at most C
// tokens over its layers. Under interleaved 1F1B it keeps pipeline_slots (micro-batch, chunk)
// pairs in flight (planning/pipeline_schedule.h), each over at most its largest chunk. With ep > 1 a GPU holds the weights and gradients of
// 1 / ep of the experts; the optimizer state of an expert is sharded over the
// hdp / ep ranks that hold it, so per GPU it is 12 / hdp of all parameters / tp
// whatever ep. Throws std::invalid_argument if a stage has no room for a single
// token or ep is not valid (validate_expert_parallel). recompute: every layer keeps
// what that mode keeps (ModelCosts::saved_bytes_per_token). sequence_parallel: as
// model_costs.
MemoryBudget memory_budget(const ModelShape& model, const HardwareProfile& hardware, const ParallelDegrees& degrees,
                           std::span<const int64_t> virtual_stage_layers, int ep = 1,
                           RecomputeMode recompute = RecomputeMode::None, bool sequence_parallel = false);

// Everything the step graph needs; make_step_costs derives it from the model and
// cluster, tests set it by hand.
struct StepCosts {
  // Per layer of one GPU: T(s) forward + backward seconds, Act(s) saved bytes,
  // copy rates.
  CostModel cost;
  // A micro-batch's recomputed layers (PlannedMicroBatch::recompute_layers, the
  // planners' activation mixes): their rerun, this model's recompute_seconds, adds to
  // the backward of each; they offload nothing.
  CostModel recomputed;
  // Forward + backward per token outside the layers: the embedding on the first
  // stage, the final norm, LM head and loss on the last.
  double embedding_seconds_per_token = 0, head_seconds_per_token = 0;
  double forward_fraction = 1.0 / 3.0;  // forward's share of every compute time (backward: the rest)
  std::vector<int64_t> stage_layers;    // layers of each pipeline stage; size = pp
  // Interleaved 1F1B (planning/pipeline_schedule.h): the layers of each virtual stage
  // c x pp + s, pp x vpp of them; empty with one chunk per stage. The embedding is
  // on virtual stage 0, the head on the last; each stage runs its chunks in the
  // interleaved order and sends between virtual stages, the last stage's chunk c to
  // the first stage's chunk c + 1.
  std::vector<int64_t> chunk_layers;
  int tp = 1, hdp = 1;
  HardwareProfile hardware;             // links, latencies, gpus_per_node (placement)
  double kv_bytes_per_token = 0;        // ring attention forward traffic per token of the block, per layer
  double boundary_bytes_per_token = 0;  // pipeline send per token
  std::vector<double> gradient_bytes;   // per stage: per GPU, reduce-scattered over hdp
  std::vector<double> parameter_bytes;  // per stage: per GPU, all-gathered over hdp
  // With ep > 1, gradient_bytes and parameter_bytes are the parameters outside
  // the experts and these the experts' (per stage, per GPU), synchronised over the
  // hdp / ep ranks that hold the same experts; with ep = 1 they are empty.
  std::vector<double> expert_gradient_bytes, expert_parameter_bytes;
  std::vector<double> optimizer_seconds;  // per stage: the update of one ZeRO-1 shard
  // Expert parallelism: ep, a dispatch all-to-all's buffer per token (hidden x 2 x
  // experts_per_token; 0 for a dense model), the count exchange's buffer per layer
  // and micro-batch (4 x num_experts), and the link of an ep group (NVLink when its
  // GPUs share a node, else the network; every group is placed alike).
  int ep = 1;
  double all_to_all_bytes_per_token = 0;
  double all_to_all_count_bytes = 0;
  double all_to_all_bytes_per_s = 0, all_to_all_latency_s = 0;
  int pp() const { return static_cast<int>(stage_layers.size()); }
  int vpp() const { return chunk_layers.empty() ? 1 : static_cast<int>(chunk_layers.size()) / pp(); }
};
// Compute rate: hardware.flops_per_second() per GPU. Copies at pcie_bytes_per_s.
// Optimizer: 32 bytes of HBM traffic per parameter of the shard. recompute: every layer
// keeps what that mode keeps and reruns its forward's part in backward
// (CostModel::recompute_seconds), which simulate_step adds to every backward.
StepCosts make_step_costs(const ModelShape& model, const HardwareProfile& hardware, const ParallelDegrees& degrees,
                          std::span<const int64_t> virtual_stage_layers, int ep = 1,
                          RecomputeMode recompute = RecomputeMode::None, bool sequence_parallel = false);

// The all-to-all seconds of one layer's forward and backward per token (four row
// all-to-alls, bandwidth terms only), which the planners add to the layer's linear
// cost: 4 x all_to_all_bytes_per_token x (ep - 1) / ep / all_to_all_bytes_per_s.
// The latencies and the count exchange, constants per micro-batch, are not in it.
double all_to_all_seconds_per_token(const StepCosts& costs);

// What every rank of stage s runs after its last backward, each part after the one
// before: the gradient reduce-scatter over the stage's hdp ranks (with ep > 1 then
// the experts' over the hdp / ep ranks holding them), the optimizer on its ZeRO-1
// shard, the parameter all-gather (and the experts'). A collective starts when its
// last member does, so the step ends no earlier than the stage's slowest rank's last
// backward plus seconds() (the tail of planning/step_bound.h).
struct GradientSync {
  double reduce_scatter = 0, expert_reduce_scatter = 0, optimizer = 0, all_gather = 0, expert_all_gather = 0;
  double seconds() const { return reduce_scatter + expert_reduce_scatter + optimizer + all_gather + expert_all_gather; }
};
GradientSync gradient_sync(const StepCosts& costs, int stage);

struct StepSimulation {
  double step_seconds = 0;          // makespan
  int processes = 0;                // hdp x pp
  double compute_seconds = 0;       // pure compute (no communication waits) summed over processes
  double compute_busy_seconds = 0;  // compute streams' busy time (ring steps at max(compute, transfer))
  double idle_fraction = 0;         // 1 - compute_busy / (processes x step)
  double min_busy_seconds = 0, max_busy_seconds = 0;  // per process
  double attention_bytes = 0;       // ring attention traffic of all GPUs (tp included)
  double pipeline_bytes = 0;        // pipeline sends of all GPUs
  double gradient_bytes = 0;        // reduce-scatter + all-gather input of all GPUs
  double all_to_all_bytes = 0;      // expert all-to-all bytes sent by all GPUs (tp included)
  double all_to_all_seconds = 0;    // expert all-to-all operations' time, summed over processes
  double offloaded_bytes = 0;       // device -> host copies of all GPUs
  double max_offloaded_bytes_per_gpu = 0;  // the largest single micro-batch's offloaded bytes on one GPU
  double gradient_sync_seconds = 0;  // the latest reduce-scatter start to the end of the step
  // Time compute streams spend inside ring operations waiting for the ring's last
  // member to arrive, summed over processes (part of the idle time).
  double ring_wait_seconds = 0;
  // Per hdp rank, per micro-batch of its list: its forward and backward compute
  // seconds summed over the stages, without waits and offload stalls (a ring's are the
  // ring's, its slowest member's, as its members run it in lock step).
  std::vector<std::vector<double>> micro_batch_seconds;
  size_t operations = 0, dependencies = 0;
  std::optional<sim::OpGraph> graph;  // kept when asked for (traces)
  std::optional<sim::Replay> replay;
  std::vector<std::string> process_names;
};

// Throws std::invalid_argument if the plan does not match the costs (hdp,
// sequences) and sim::SimulationError if the graph deadlocks (a plan that fails
// check_plan may).
StepSimulation simulate_step(const StepPlan& plan, std::span<const int64_t> lengths, const StepCosts& costs,
                             bool keep_graph = false);

// Ring statistics of a plan: how many ranks each sequence spread over more than
// one rank occupies.
struct RingStats {
  int64_t rings = 0;
  int64_t spread_sequences = 0;   // sequences held by more than one rank
  int64_t spread_tokens = 0;
  double mean_ranks = 0;          // over spread sequences
  int max_ranks = 0;
  std::vector<int64_t> histogram;  // [b]: spread sequences over (2^(b-1), 2^b] ranks, b >= 1
  int64_t micro_batches = 0;
  int64_t max_micro_batches_per_rank = 0, min_micro_batches_per_rank = 0;
};
RingStats ring_stats(const StepPlan& plan, std::span<const int64_t> lengths);

}  // namespace hdp

#pragma once
// The sparse mixture-of-experts block of Mixtral (Jiang et al. 2024, "Mixtral of
// Experts"; Hugging Face MixtralSparseMoeBlock), which replaces the SwiGLU MLP: a
// router (linear, no bias) gives each token one logit per expert, softmax in fp32,
// the top k experts are chosen and their probabilities renormalised to sum to 1 over
// the k, and the token's output is the weighted sum of those experts' SwiGLU FFNs
// (w1 = gate, w3 = up, w2 = down). Dropless: every token reaches all its k experts;
// tokens are grouped by expert and each expert runs one GEMM per projection over its
// group, with no capacity factor.
//
// The load-balancing loss is Switch Transformer's (Fedus et al. 2022), as Hugging
// Face's load_balancing_loss_func computes it for Mixtral over the N tokens of one
// forward: aux = E sum_e f_e P_e, with f_e the fraction of (token, choice) pairs routed
// to expert e (summing to k) and P_e the mean router probability of e. It is k when the
// load is perfectly balanced. Its gradient flows through P only (f counts choices).
//
// Tensor parallelism (Megatron style, Shoeybi et al. 2019): every expert's FFN is
// split like the dense MLP, w1 and w3 by rows (column-parallel), w2 by columns
// (row-parallel), so `shape.ffn` is this rank's F / tp; the router is replicated and
// every tp rank routes identically. The block makes three all-reduces on the tp
// group: forward, of the combined partial output (g, identity backward); backward,
// of the combine weights' partial gradients <dout, Y> (Y is partial on each rank)
// before the router's backward, and of the experts' partial input gradient (f,
// identity forward) before the replicated router adds its own, whole, part.
//
// Expert parallelism (GShard, Lepikhin et al. 2021; Megatron-core's token
// dispatcher): the ep ranks of an expert-parallel group each hold E / ep whole
// experts (their tp slices), rank r experts [r E / ep, (r + 1) E / ep). Every rank
// routes its own tokens over all E experts (the router is replicated), then two
// all-to-alls on the ep group: dispatch sends each (token, choice) row to the rank
// of its expert (first the row counts per expert, then the rows), the owner runs its
// experts over everything it received and combine sends the outputs back; backward
// sends the output gradients the same way and the input gradients back. The
// combine weights, the aux loss and the routing statistics stay with the token's
// rank, so they are the same as without ep. Under tp x ep each tp rank exchanges
// with the ep peers of its own tp rank, and the tp all-reduces are unchanged.
//
// Any device and either precision: the router, the experts' GEMMs and the row
// movement (kernels/ops.h: gather_rows, combine_rows) run as ops on the block's device
// in the activations' dtype; the routing decisions (softmax in fp32, top-k, the
// grouping of rows by expert) are made on the host from the router's logits [T, E],
// which come back once per forward (a device synchronisation: the sizes of the
// experts' GEMMs depend on them, as in every dropless implementation that runs one
// GEMM per expert), and the router's gradient [T, E] goes back once per backward.
//
// Host waits (kernels/ops.h), per MoE layer and micro-batch, each needed where it is:
// - forward, the router's logits [T, E] read (MoeBlock::route): the top-k choice and the
//   grouping by expert decide the experts' GEMM sizes and the rows they gather, so
//   nothing of the block can be enqueued before it; it cannot be deferred.
// - forward, 4 uploads of what routing decided (row -> token, token -> rows, the rows'
//   and the choices' weights; 2 more under ep), from pageable host memory just after
//   the read, when the device has nothing else queued.
// - backward, <dout, Y> [T, k] read: the router's gradient (the renormalised top-k's
//   and the softmax's backward, with the load-balancing loss's gradient) is computed on
//   the host from the routing kept there, under tp after the host all-reduce of the
//   partial dots; the router's GEMM backward and the block's input gradient need it.
// - backward, 1 upload of the router's logit gradient [T, E].
// The backward read and its upload would go with a device kernel for the router's
// backward (the probabilities and choices are small: [T, E], [T, k]); the forward's
// read stays. The uploads could go through a pinned staging buffer as a micro-batch's
// tokens do (kernels/upload_staging.h); each follows a read that drained the stream,
// so it waits only for its own small copy. tests/mpi_parallel_test.cpp counts them (MixtralRoutingReadsPerLayerAndMicroBatch).
// Tested standalone against a naive reference (tests/model_moe_test.cpp), in bf16
// against fp32 and on the guarded device against the CPU.

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/tensor.h"
#include "parallel/communicator.h"
#include "parallel/ring_attention.h"
#include "parallel/tensor_parallel.h"

namespace hdp {

struct MoeShape {
  int64_t hidden = 0, ffn = 0, experts = 0, top_k = 2;
};

// The block's weights (or their gradients) under Hugging Face's names:
// block_sparse_moe.gate.weight [E, H], block_sparse_moe.experts.e.w1.weight [F, H],
// .w3.weight [F, H], .w2.weight [H, F]. w1, w2, w3 hold this rank's experts only
// (E / ep of them, in expert order).
struct MoeTensors {
  Tensor gate;
  std::vector<Tensor> w1, w2, w3;
};

// What a block needs only while its forward or backward runs, shared by every block
// of a model (one per pipeline slot and layer would hold layers x slots copies):
// the router's logits and their gradient, the experts' activation and the gradients
// in expert order, and under expert parallelism the rows in transit. Sized for
// max_tokens x k rows in expert order (every row a rank ever runs without ep, and
// what a balanced router sends it with ep); a forward that receives more under ep
// grows it (reserve).
class MoeWorkspace {
 public:
  MoeWorkspace(const MoeShape& shape, int64_t max_tokens, Device device, DType dtype, bool expert_parallel);

  Device device() const { return device_; }
  DType dtype() const { return dtype_; }
  // Makes room for `rows` rows in expert order (grow-only).
  void reserve(int64_t rows);
  size_t bytes() const { return fixed_.capacity() + rows_.capacity(); }

  Tensor logits, dlogits;          // [max_tokens, E], the activations' dtype
  Tensor dweights;                 // [max_tokens, k] fp32
  Tensor routed, transit;          // [max_tokens k, H]: routing order; in transit (ep: rows of the ep group, grown)
  Tensor act, dact, dgate, dup;    // [rows, F], expert order
  Tensor expert_out, expert_grad;  // [rows, H], expert order (ep: outputs and output gradients; without ep unused)
  Tensor expert_dx;                // [rows, H], expert order: the experts' input gradients
  int64_t rows() const { return rows_capacity_; }

 private:
  MoeShape shape_;
  Device device_;
  DType dtype_;
  bool expert_parallel_;
  Arena fixed_, rows_;
  int64_t rows_capacity_ = 0;
};

class MoeBlock {
 public:
  // Throws std::invalid_argument for a shape with no expert, top_k outside [1, E], or
  // an ep group whose size does not divide E.
  // workspace: the model's shared scratch (its device and dtype are the block's).
  // tp: the tensor-parallel group the experts are split over (nullptr: none).
  // ep: the expert-parallel group the experts are shared out over (nullptr: none).
  // Every rank of the ep group must run forward and backward the same number of
  // times in the same order (each is a collective), with its own tokens (T may be 0).
  MoeBlock(const MoeShape& shape, int64_t max_tokens, MoeWorkspace& workspace, Communicator* tp = nullptr,
           Communicator* ep = nullptr);

  int64_t local_experts() const { return local_experts_; }
  int64_t first_local_expert() const { return first_expert_; }
  // Device memory this block keeps for its backward.
  size_t bytes() const { return fixed_.capacity() + rows_.capacity(); }

  // out [T, H] = sum over the token's k experts of weight x expert(x). Keeps what
  // backward needs (the routing, each expert's inputs and gate/up projections, the
  // experts' outputs).
  void forward(Tensor out, const Tensor& x, const MoeTensors& weights);
  // dx [T, H] is overwritten; the weights' gradients are added into `grads`.
  // aux_grad [E]: d(loss)/d(p_te), the same for every token t, from a load-balancing
  // loss over this forward's router probabilities p (empty: none). For this block's
  // own aux_loss() with weight c it is c E f_e / T (aux_gradient below); a caller
  // that pools several blocks (Hugging Face concatenates all layers) passes its own.
  void backward(Tensor dx, const MoeTensors& grads, const Tensor& dout, const Tensor& x, const MoeTensors& weights,
                std::span<const double> aux_grad);
  // c E f_e / T of the last forward: the gradient of c x aux_loss() per probability.
  std::vector<double> aux_gradient(double c) const;

  // Of the last forward: the load-balancing loss, the (token, choice) pairs each
  // expert received, and the token's chosen experts [T, k] and their weights.
  double aux_loss() const { return aux_; }
  const std::vector<int64_t>& expert_tokens() const { return counts_; }
  // Per expert: the sum over the last forward's tokens of its router probability.
  const std::vector<double>& probability_sums() const { return prob_sums_; }
  int64_t tokens() const { return tokens_; }
  std::span<const int32_t> chosen() const { return {chosen_.data(), static_cast<size_t>(tokens_ * shape_.top_k)}; }
  std::span<const float> weights() const { return {weights_.data(), static_cast<size_t>(tokens_ * shape_.top_k)}; }

 private:
  // The routing on the host: softmax, top k, renormalised weights, counts and the
  // grouping of the (token, choice) rows by expert (routing order); uploads the
  // index and weight tensors.
  void route(int64_t T);
  // Exchanges the per-expert row counts of this forward (sets the members below),
  // makes room for the rows that will arrive and, under ep, uploads the permutations
  // between the order in which the all-to-all delivers rows and expert order.
  void exchange_counts();
  // One all-to-all on the ep group: send_rows[p] rows to rank p, recv_rows[p] from it.
  void exchange_rows(const Tensor& send, std::span<const int64_t> send_rows, Tensor recv,
                     std::span<const int64_t> recv_rows);
  // The saved rows in expert order hold at least `rows` rows (grow-only; the
  // workspace likewise): max_tokens x k from the start, more only under ep.
  void reserve_expert_rows(int64_t rows);

  MoeShape shape_;
  MoeWorkspace& ws_;
  Communicator* tp_;
  Communicator* ep_;  // nullptr when the experts are not shared out
  int ep_size_ = 1;
  int64_t local_experts_ = 0, first_expert_ = 0;
  CopyToTensorParallelRegion input_;       // f: into the column-parallel w1, w3 of every expert
  ReduceFromTensorParallelRegion output_;  // g: out of the row-parallel w2, after the combine
  int64_t max_tokens_, tokens_ = 0;
  double aux_ = 0;
  // Host: the routing and its statistics.
  std::vector<float> logits_, probs_;      // [T, E]
  std::vector<int32_t> chosen_;            // [T, k]
  std::vector<float> weights_;             // [T, k], renormalised
  std::vector<int64_t> counts_, first_;    // per expert: rows, first row of its group
  std::vector<double> prob_sums_;          // per expert: summed router probability
  std::vector<int32_t> row_token_, token_row_;  // routing row -> its token; (token, choice) -> its routing row
  std::vector<float> row_weight_;          // routing row -> its combine weight
  std::vector<float> dweights_, dlogits_;  // backward: [T, k], [T, E]
  // Per call, kept so that no forward or backward allocates: the experts in
  // probability order (route), a write cursor per group, d(loss)/d(p) of one token.
  std::vector<int32_t> order_;
  std::vector<int64_t> cursor_;
  std::vector<double> dp_;
  std::vector<int64_t> send_rows_, recv_rows_;  // per ep rank: rows sent to it, received from it
  std::vector<int64_t> arrived_;   // [ep][local expert]: rows from each rank for each of its experts
  std::vector<int64_t> expert_first_;  // per local expert: its first row in expert order (+ the total)
  std::vector<int32_t> to_expert_, from_expert_;  // ep: expert row <- arrival row, arrival row <- expert row
  std::vector<int64_t> send_elements_, recv_elements_;  // exchange_rows: the counts in elements
  std::vector<float> count_send_, count_recv_;  // the counts as they travel (fp32, exact below 2^24)
  std::vector<int64_t> counts_per_rank_;        // local_experts_ counts to and from every ep rank
  // Device, kept for backward. Routing order (max_tokens x k rows):
  Arena fixed_;
  IndexTensor d_row_token_, d_token_row_;  // [N], [T, k]
  Tensor d_row_weight_, d_weights_;        // [N], [T, k] fp32
  Tensor ys_;                              // [N, H]: the experts' outputs
  // Expert order (reserve_expert_rows):
  Arena rows_;
  int64_t rows_capacity_ = 0;
  Tensor xs_, gate_, up_;                  // [R, H], [R, F], [R, F]
  IndexTensor d_to_expert_, d_from_expert_;  // [R] (ep only)
};

// Mixtral in one pipeline stage of the model: a block per (slot, layer) (each keeps the
// routing and saved rows of its slot's micro-batch) sharing one workspace, and the
// load-balancing loss, which pools the routing of every layer of a micro-batch.
//
// The loss is Hugging Face's load_balancing_loss_func (Switch Transformer's: Fedus et
// al. 2022) over all layers' routing of the micro-batch (its router logits
// concatenated over the layers): N = layers x T, aux = E sum_e f_e P_e with f_e the
// fraction of the N tokens' choices that went to expert e and P_e the mean router
// probability of e over the N. One forward call is one micro-batch, and Hugging Face
// computes the loss per forward call (data-parallel replicas and accumulation steps
// each over their own batch), so the statistics pool over the micro-batch's layers
// only, whichever stages hold them, never over data-parallel ranks; since every
// planner packs the global batch into the same micro-batches for a given capacity
// before assigning them to ranks, the loss is the same in every layout.
// A ring micro-batch is one forward spread over the ring's members (each holds its
// chunks of the ring's sequences, and its own whole sequences beside them), so its
// statistics pool over the members too: one process that holds the members'
// micro-batches as one computes the same loss.
//
// Under pipeline parallelism the statistics travel beside the activations (the
// pipeline executor sends them in the same 1F1B order): routing_input / output: [2E]
// floats, per expert the (token, choice) count and then the summed router probability
// of the layers before this stage (received before forward; zero on the first stage)
// and up to its end (sent after forward). routing_totals: [E + 2], the counts of all
// layers, then the forward's tokens and predicted tokens (over the members of a ring
// micro-batch, whose forward they share), which the last stage fills in forward and
// the others receive before backward and pass on after it; backward's gradient of the
// loss needs them. Counts travel as fp32, exact below 2^24 choices per forward.
class MoeLayers {
 public:
  // model_layers: the layers of the whole model (N counts them all); stage_layers: this
  // stage's; slots: its micro-batches in flight; has_head: the last stage, which
  // completes the loss.
  MoeLayers(const MoeShape& shape, int64_t model_layers, int64_t stage_layers, int slots, int64_t max_tokens,
            Device device, DType dtype, double aux_loss_coef, bool has_head, Communicator* tp, Communicator* ep);
  MoeLayers(const MoeLayers&) = delete;  // the blocks hold the workspace
  MoeLayers& operator=(const MoeLayers&) = delete;

  MoeBlock& block(int slot, int64_t layer) { return blocks_[slot][layer]; }
  // Device memory of the blocks and their workspace.
  size_t bytes() const;

  // A new micro-batch in `slot`: counts its predicted tokens (targets >= 0) and clears
  // the statistics it receives.
  void begin_micro_batch(int slot, std::span<const int32_t> targets);
  // After the stage's forward of `tokens` rows: adds its layers to the statistics it
  // received (routing_input) and, on the last stage, where they cover every layer,
  // returns coef aux P with P the micro-batch's predicted tokens (this member's, in a
  // ring: the members' terms add up to the forward's), so that the caller's division by
  // the step's predicted tokens (the token-level loss, loss_scale) weights each
  // micro-batch by its share and one micro-batch adds exactly coef aux, as Hugging Face
  // does. Other stages: 0. ring: the micro-batch's ring (nullptr: none), whose members
  // sum their statistics through ring_attention.
  double pool_load_balancing(int slot, float loss_scale, int64_t tokens, RingAttention* ring_attention,
                             const RingLayout* ring);
  // Before the stage's backward: the gradient of coef aux P loss_scale per router
  // probability, the same for every token and layer of the forward: coef P loss_scale
  // E f_e / N, from the counts of every layer, the forward's tokens and its predictions
  // P (routing_totals: this stage's own on the last stage, received from the next stage
  // on the others; over the members of a ring). Valid until the next call.
  std::span<const double> load_balancing_gradient(int slot);

  Tensor routing_input(int slot);
  Tensor routing_output(int slot);
  Tensor routing_totals(int slot);
  // Of the last forward on the last stage: the load-balancing loss aux over all layers
  // (its coef x aux x P is in pool_load_balancing's return value), and the (token,
  // choice) pairs each expert received, summed over the layers. Other stages: 0 and empty.
  double aux_loss() const { return aux_loss_; }
  const std::vector<int64_t>& expert_tokens() const { return expert_tokens_; }

 private:
  // What a micro-batch in flight carries: routing_input / output / totals (above), its
  // predicted tokens and the loss scale of its forward.
  struct SlotStatistics {
    std::vector<float> routing_before, routing_through, routing_totals;
    int64_t predictions = 0;
    float loss_scale = 0;
  };

  int64_t experts_;
  int64_t model_layers_;
  double aux_loss_coef_;
  bool has_head_;
  MoeWorkspace workspace_;
  std::vector<std::vector<MoeBlock>> blocks_;  // [slot][layer]
  std::vector<SlotStatistics> slots_;
  double aux_loss_ = 0;
  std::vector<double> aux_grad_;
  std::vector<float> forward_routing_;  // the last stage's statistics of a forward ([2E + 2])
  std::vector<int64_t> expert_tokens_;
};

}  // namespace hdp

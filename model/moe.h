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
// CPU tensors only (the config refuses other devices for Mixtral); tested standalone
// against a naive reference (tests/model_moe_test.cpp).

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/tensor.h"
#include "parallel/communicator.h"
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

class MoeBlock {
 public:
  // Throws std::invalid_argument for a shape with no expert, top_k outside [1, E], or
  // an ep group whose size does not divide E.
  // tp: the tensor-parallel group the experts are split over (nullptr: none).
  // ep: the expert-parallel group the experts are shared out over (nullptr: none).
  // Every rank of the ep group must run forward and backward the same number of
  // times in the same order (each is a collective), with its own tokens (T may be 0).
  MoeBlock(const MoeShape& shape, int64_t max_tokens, Communicator* tp = nullptr, Communicator* ep = nullptr);

  int64_t local_experts() const { return local_experts_; }
  int64_t first_local_expert() const { return first_expert_; }

  // out [T, H] = sum over the token's k experts of weight x expert(x). Keeps what
  // backward needs (the routing, each expert's inputs and gate/up projections).
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
  // Rows travel between the routing order (grouped by expert: the rows of the ep
  // group's rank p are contiguous, expert by expert) and this rank's expert order
  // (its local expert j's rows from every rank p, contiguous). dispatch: routing
  // order here -> expert order at the owners; combine: the way back. `width` floats
  // per row.
  void dispatch(const float* rows, float* expert_rows, int64_t width);
  void combine(const float* expert_rows, float* rows, int64_t width);
  // One all-to-all on the ep group: send_rows[p] rows of `width` floats to rank p,
  // recv_rows[p] from it.
  void exchange_rows(const float* send, std::span<const int64_t> send_rows, float* recv,
                     std::span<const int64_t> recv_rows, int64_t width);
  // Exchanges the per-expert row counts of this forward (sets the members below) and
  // makes room for the rows that will arrive.
  void exchange_counts();
  // The expert-order buffers hold at least `rows` rows. They start at max_tokens x k
  // rows, all a rank ever receives without ep and what a balanced router sends it with
  // ep, and grow only when a forward receives more (at most ep x max_tokens x k):
  // sized for the worst case up front, every block of every layer and pipeline slot
  // would hold ep times the memory a balanced router needs.
  void reserve_expert_rows(int64_t rows);

  MoeShape shape_;
  Communicator* tp_;
  Communicator* ep_;  // nullptr when the experts are not shared out
  int ep_size_ = 1;
  int64_t local_experts_ = 0, first_expert_ = 0;
  CopyToTensorParallelRegion input_;       // f: into the column-parallel w1, w3 of every expert
  ReduceFromTensorParallelRegion output_;  // g: out of the row-parallel w2, after the combine
  int64_t max_tokens_, tokens_ = 0;
  double aux_ = 0;
  std::vector<float> logits_, probs_;      // [T, E]
  std::vector<int32_t> chosen_;            // [T, k]
  std::vector<float> weights_;             // [T, k], renormalised
  std::vector<int64_t> counts_, first_;    // per expert: rows, first row of its group
  std::vector<double> prob_sums_;          // per expert: summed router probability
  std::vector<int32_t> row_token_, row_choice_;  // per grouped row: its token and choice slot
  std::vector<float> xs_, ys_, dys_, dxs_;  // routing order: inputs, outputs and their gradients
  // Expert order (reserve_expert_rows): the rows this rank's experts run.
  std::vector<int64_t> send_rows_, recv_rows_;  // per ep rank: rows sent to it, received from it
  std::vector<int64_t> arrived_;   // [ep][local expert]: rows from each rank for each of its experts
  std::vector<int64_t> expert_first_;  // per local expert: its first row in expert order (+ the total)
  std::vector<int64_t> next_;          // per local expert: where its next row goes (dispatch, combine)
  std::vector<int64_t> send_elements_, recv_elements_;  // exchange_rows: the counts in floats
  std::vector<float> count_send_, count_recv_;  // the counts as they travel (fp32, exact below 2^24)
  std::vector<int64_t> counts_per_rank_;        // local_experts_ counts to and from every ep rank
  std::vector<float> transit_;     // rows in the ep group's rank order, as the all-to-all moves them
  std::vector<float> ex_xs_, gate_, up_, act_, ex_ys_;  // inputs, projections, outputs
  std::vector<float> ex_dys_, dacts_, dgate_, dup_, ex_dxs_;
  std::vector<float> dweights_, dlogits_;
};

}  // namespace hdp

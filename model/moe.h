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
// .w3.weight [F, H], .w2.weight [H, F].
struct MoeTensors {
  Tensor gate;
  std::vector<Tensor> w1, w2, w3;
};

class MoeBlock {
 public:
  // Throws std::invalid_argument for a shape with no expert, top_k outside [1, E].
  // tp: the tensor-parallel group the experts are split over (nullptr: none).
  MoeBlock(const MoeShape& shape, int64_t max_tokens, Communicator* tp = nullptr);

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
  MoeShape shape_;
  Communicator* tp_;
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
  std::vector<float> xs_, gate_, up_, act_, ys_;  // grouped rows: inputs, projections, outputs
  std::vector<float> dys_, dacts_, dgate_, dup_, dxs_;
  std::vector<float> dweights_, dlogits_;
};

}  // namespace hdp

#include "model/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

#include "kernels/ops.h"
#include "parallel/op_tracer.h"

namespace hdp {
namespace {

Tensor view(std::vector<float>& v, int64_t rows, int64_t cols) { return Tensor(v.data(), {rows, cols}); }

void require_cpu(const Tensor& t, const char* what) {
  if (t.device != Device::CPU) {
    throw std::invalid_argument(std::string("MoE block: ") + what + " is not on the CPU (the block runs there only so far)");
  }
}

}  // namespace

MoeBlock::MoeBlock(const MoeShape& shape, int64_t max_tokens, Communicator* tp, Communicator* ep)
    : shape_(shape), tp_(tp), ep_(ep != nullptr && ep->size() > 1 ? ep : nullptr), input_(tp), output_(tp),
      max_tokens_(max_tokens) {
  if (shape.experts < 1 || shape.hidden < 1 || shape.ffn < 1 || shape.top_k < 1 || shape.top_k > shape.experts) {
    throw std::invalid_argument("MoE block: needs at least one expert and 1 <= top_k <= experts, got " +
                                std::to_string(shape.experts) + " experts, top_k " + std::to_string(shape.top_k));
  }
  ep_size_ = ep_ ? ep_->size() : 1;
  if (shape.experts % ep_size_ != 0) {
    throw std::invalid_argument("MoE block: " + std::to_string(shape.experts) + " experts cannot be shared out over " +
                                std::to_string(ep_size_) + " expert-parallel ranks");
  }
  local_experts_ = shape.experts / ep_size_;
  first_expert_ = (ep_ ? ep_->rank() : 0) * local_experts_;
  const int64_t T = max_tokens, E = shape.experts, k = shape.top_k, H = shape.hidden, F = shape.ffn;
  logits_.resize(T * E);
  probs_.resize(T * E);
  dlogits_.resize(T * E);
  chosen_.resize(T * k);
  weights_.resize(T * k);
  dweights_.resize(T * k);
  row_token_.resize(T * k);
  row_choice_.resize(T * k);
  for (auto* v : {&xs_, &ys_, &dys_, &dxs_}) v->resize(T * k * H);
  reserve_expert_rows(T * k);
  counts_.assign(E, 0);
  prob_sums_.assign(E, 0.0);
  first_.assign(E + 1, 0);
  send_rows_.assign(ep_size_, 0);
  recv_rows_.assign(ep_size_, 0);
  send_elements_.assign(ep_size_, 0);
  recv_elements_.assign(ep_size_, 0);
  next_.assign(local_experts_, 0);
  arrived_.assign(ep_size_ * local_experts_, 0);
  expert_first_.assign(local_experts_ + 1, 0);
  count_send_.resize(E);
  count_recv_.resize(E);
  counts_per_rank_.assign(ep_size_, local_experts_);
}

void MoeBlock::reserve_expert_rows(int64_t rows) {
  const int64_t H = shape_.hidden, F = shape_.ffn;
  if (static_cast<int64_t>(ex_xs_.size()) >= rows * H) return;
  for (auto* v : {&ex_xs_, &ex_ys_, &ex_dys_, &ex_dxs_}) v->resize(rows * H);
  for (auto* v : {&gate_, &up_, &act_, &dacts_, &dgate_, &dup_}) v->resize(rows * F);
  if (ep_) transit_.resize(rows * H);
}

void MoeBlock::exchange_counts() {
  const int64_t El = local_experts_;
  if (ep_) {
    // Rank p's experts are [p El, (p + 1) El): the counts go to their owners as one
    // all-to-all of El numbers per rank.
    for (int64_t e = 0; e < shape_.experts; ++e) count_send_[e] = static_cast<float>(counts_[e]);
    TraceSpan span(trace_ops::kExpertAllToAll.data());  // nested in forward-compute
    ep_->all_to_all_v(Tensor(count_send_.data(), {shape_.experts}), counts_per_rank_,
                      Tensor(count_recv_.data(), {shape_.experts}), counts_per_rank_);
    for (int64_t i = 0; i < ep_size_ * El; ++i) arrived_[i] = static_cast<int64_t>(count_recv_[i]);
  } else {
    for (int64_t j = 0; j < El; ++j) arrived_[j] = counts_[j];
  }
  for (int p = 0; p < ep_size_; ++p) {
    send_rows_[p] = first_[(p + 1) * El] - first_[p * El];
    recv_rows_[p] = 0;
    for (int64_t j = 0; j < El; ++j) recv_rows_[p] += arrived_[p * El + j];
  }
  for (int64_t j = 0; j < El; ++j) {
    int64_t n = 0;
    for (int p = 0; p < ep_size_; ++p) n += arrived_[p * El + j];
    expert_first_[j + 1] = expert_first_[j] + n;
  }
  reserve_expert_rows(expert_first_[El]);
}

void MoeBlock::exchange_rows(const float* send, std::span<const int64_t> send_rows, float* recv,
                             std::span<const int64_t> recv_rows, int64_t width) {
  int64_t send_total = 0, recv_total = 0;
  for (int p = 0; p < ep_size_; ++p) {
    send_elements_[p] = send_rows[p] * width;
    recv_elements_[p] = recv_rows[p] * width;
    send_total += send_elements_[p];
    recv_total += recv_elements_[p];
  }
  TraceSpan span(trace_ops::kExpertAllToAll.data());  // nested in forward- or backward-compute
  ep_->all_to_all_v(Tensor(const_cast<float*>(send), {send_total}), send_elements_, Tensor(recv, {recv_total}),
                    recv_elements_);
}

// Between the rank order in which the all-to-all delivers rows (rank p's rows for
// expert 0, 1, ..., then rank p + 1's) and the expert order the GEMMs want.
void MoeBlock::dispatch(const float* rows, float* expert_rows, int64_t width) {
  const int64_t El = local_experts_;
  const float* arrived = rows;
  if (ep_) {
    exchange_rows(rows, send_rows_, transit_.data(), recv_rows_, width);
    arrived = transit_.data();
  }
  std::copy(expert_first_.begin(), expert_first_.end() - 1, next_.begin());
  for (int p = 0; p < ep_size_; ++p)
    for (int64_t j = 0; j < El; ++j) {
      const int64_t n = arrived_[p * El + j] * width;
      std::copy(arrived, arrived + n, expert_rows + next_[j] * width);
      arrived += n;
      next_[j] += arrived_[p * El + j];
    }
}

void MoeBlock::combine(const float* expert_rows, float* rows, int64_t width) {
  const int64_t El = local_experts_;
  float* departing = ep_ ? transit_.data() : rows;
  float* out = departing;
  std::copy(expert_first_.begin(), expert_first_.end() - 1, next_.begin());
  for (int p = 0; p < ep_size_; ++p)
    for (int64_t j = 0; j < El; ++j) {
      const int64_t n = arrived_[p * El + j];
      std::copy(expert_rows + next_[j] * width, expert_rows + (next_[j] + n) * width, out);
      out += n * width;
      next_[j] += n;
    }
  // The way back: what this rank received from rank p returns to it.
  if (ep_) exchange_rows(departing, recv_rows_, rows, send_rows_, width);
}

void MoeBlock::forward(Tensor out, const Tensor& x, const MoeTensors& w) {
  const int64_t T = x.dim(0), E = shape_.experts, k = shape_.top_k, H = shape_.hidden, F = shape_.ffn;
  if (T > max_tokens_ || x.dim(1) != H || out.dim(0) != T || out.dim(1) != H) {
    throw std::invalid_argument("MoE block: x and out must be [T, " + std::to_string(H) + "] with T <= " +
                                std::to_string(max_tokens_));
  }
  require_cpu(x, "x");
  require_cpu(out, "out");
  if (static_cast<int64_t>(w.w1.size()) != local_experts_ || static_cast<int64_t>(w.w2.size()) != local_experts_ ||
      static_cast<int64_t>(w.w3.size()) != local_experts_) {
    throw std::invalid_argument("MoE block: weights of " + std::to_string(w.w1.size()) + " experts for the " +
                                std::to_string(local_experts_) + " this rank runs (an ep group missing?)");
  }
  tokens_ = T;
  // Router logits and softmax in fp32 (Mixtral computes the routing in fp32 whatever
  // the activations' type), accumulated in double for the normaliser.
  linear_forward(view(logits_, T, E), x, w.gate);
  std::fill(counts_.begin(), counts_.end(), 0);
  std::vector<int32_t> order(E);
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits_.data() + t * E;
    float* p = probs_.data() + t * E;
    const float mx = *std::max_element(l, l + E);
    double z = 0;
    for (int64_t e = 0; e < E; ++e) z += std::exp(static_cast<double>(l[e] - mx));
    for (int64_t e = 0; e < E; ++e) p[e] = static_cast<float>(std::exp(static_cast<double>(l[e] - mx)) / z);
    // Top k by probability; equal probabilities go to the lower expert index.
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [p](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += p[order[j]];
    for (int64_t j = 0; j < k; ++j) {
      chosen_[t * k + j] = order[j];
      weights_[t * k + j] = static_cast<float>(p[order[j]] / sum);
      ++counts_[order[j]];
    }
  }
  // Group the (token, choice) pairs by expert: expert e's rows are [first_[e], first_[e + 1]).
  for (int64_t e = 0; e < E; ++e) first_[e + 1] = first_[e] + counts_[e];
  std::vector<int64_t> next(first_.begin(), first_.end() - 1);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = next[chosen_[t * k + j]]++;
      row_token_[r] = static_cast<int32_t>(t);
      row_choice_[r] = static_cast<int32_t>(j);
      std::copy(x.data + t * H, x.data + (t + 1) * H, xs_.data() + r * H);
    }
  // The rows go to their experts' ranks; each local expert runs over its rows from
  // every rank: one GEMM per projection.
  exchange_counts();
  dispatch(xs_.data(), ex_xs_.data(), H);
  for (int64_t e = 0; e < local_experts_; ++e) {
    const int64_t b = expert_first_[e], n = expert_first_[e + 1] - b;
    if (n == 0) continue;
    const Tensor xe(ex_xs_.data() + b * H, {n, H}), g(gate_.data() + b * F, {n, F}), u(up_.data() + b * F, {n, F}),
        a(act_.data() + b * F, {n, F}), y(ex_ys_.data() + b * H, {n, H});
    linear_forward(g, xe, w.w1[e]);
    linear_forward(u, xe, w.w3[e]);
    swiglu_forward(a, g, u);
    linear_forward(y, a, w.w2[e]);
  }
  combine(ex_ys_.data(), ys_.data(), H);
  std::fill(out.data, out.data + T * H, 0.0f);
  for (int64_t r = 0; r < T * k; ++r) {
    const int64_t t = row_token_[r];
    const float c = weights_[t * k + row_choice_[r]];
    for (int64_t h = 0; h < H; ++h) out.data[t * H + h] += c * ys_[r * H + h];
  }
  // Each tp rank combined its slice of every expert's w2 output: their sum is the output.
  output_.forward(out);
  // Load balancing: E sum_e f_e P_e over the T tokens.
  double aux = 0;
  for (int64_t e = 0; e < E; ++e) {
    double p_sum = 0;
    for (int64_t t = 0; t < T; ++t) p_sum += probs_[t * E + e];
    prob_sums_[e] = p_sum;
    aux += (static_cast<double>(counts_[e]) / T) * (p_sum / T);
  }
  aux_ = T > 0 ? static_cast<double>(E) * aux : 0.0;
}

std::vector<double> MoeBlock::aux_gradient(double c) const {
  std::vector<double> g(shape_.experts, 0.0);
  if (tokens_ == 0) return g;
  const double T = static_cast<double>(tokens_);
  for (int64_t e = 0; e < shape_.experts; ++e) g[e] = c * shape_.experts * (static_cast<double>(counts_[e]) / T) / T;
  return g;
}

void MoeBlock::backward(Tensor dx, const MoeTensors& grads, const Tensor& dout, const Tensor& x,
                        const MoeTensors& w, std::span<const double> aux_grad) {
  const int64_t T = tokens_, E = shape_.experts, k = shape_.top_k, H = shape_.hidden, F = shape_.ffn;
  if (x.dim(0) != T || dout.dim(0) != T || dx.dim(0) != T) {
    throw std::invalid_argument("MoE block: backward over another number of tokens than the forward");
  }
  require_cpu(dx, "dx");
  require_cpu(dout, "dout");
  // Per grouped row: dY = weight x dout of its token; d(weight) = <dout, Y>.
  for (int64_t r = 0; r < T * k; ++r) {
    const int64_t t = row_token_[r], j = row_choice_[r];
    const float c = weights_[t * k + j];
    double dot = 0;
    for (int64_t h = 0; h < H; ++h) {
      dys_[r * H + h] = c * dout.data[t * H + h];
      dot += static_cast<double>(dout.data[t * H + h]) * ys_[r * H + h];
    }
    dweights_[t * k + j] = static_cast<float>(dot);
  }
  // <dout, Y> over this rank's slice of Y: the sum over the tp ranks is the whole dot.
  if (tp_ != nullptr && tp_->size() > 1) tp_->all_reduce(view(dweights_, T, k), ReduceOp::Sum);
  // The output gradients travel to the experts' ranks as the rows did, the input
  // gradients come back.
  dispatch(dys_.data(), ex_dys_.data(), H);
  for (int64_t e = 0; e < local_experts_; ++e) {
    const int64_t b = expert_first_[e], n = expert_first_[e + 1] - b;
    if (n == 0) continue;
    const Tensor xe(ex_xs_.data() + b * H, {n, H}), g(gate_.data() + b * F, {n, F}), u(up_.data() + b * F, {n, F}),
        a(act_.data() + b * F, {n, F}), dy(ex_dys_.data() + b * H, {n, H}), da(dacts_.data() + b * F, {n, F}),
        dg(dgate_.data() + b * F, {n, F}), du(dup_.data() + b * F, {n, F}), dxe(ex_dxs_.data() + b * H, {n, H});
    linear_backward(da, grads.w2[e], dy, a, w.w2[e], false);
    swiglu_backward(dg, du, da, g, u);
    linear_backward(dxe, grads.w1[e], dg, xe, w.w1[e], false);
    linear_backward(dxe, grads.w3[e], du, xe, w.w3[e], true);
  }
  combine(ex_dxs_.data(), dxs_.data(), H);
  std::fill(dx.data, dx.data + T * H, 0.0f);
  for (int64_t r = 0; r < T * k; ++r) {
    const int64_t t = row_token_[r];
    for (int64_t h = 0; h < H; ++h) dx.data[t * H + h] += dxs_[r * H + h];
  }
  // Each rank's expert slices gave part of dx; the router's part below is whole on every rank.
  input_.backward(dx);
  // Router. The weights are p_j / S over the chosen j (S their sum), so
  // dp_j = (dw_j - sum_i dw_i w_i) / S for chosen j and 0 otherwise; the aux loss adds
  // aux_grad[e] to every dp_e; then the softmax's backward.
  std::vector<double> dp(E);
  for (int64_t t = 0; t < T; ++t) {
    const float* p = probs_.data() + t * E;
    for (int64_t e = 0; e < E; ++e) dp[e] = aux_grad.empty() ? 0.0 : aux_grad[e];
    double s = 0, dot = 0;
    for (int64_t j = 0; j < k; ++j) {
      s += p[chosen_[t * k + j]];
      dot += static_cast<double>(dweights_[t * k + j]) * weights_[t * k + j];
    }
    for (int64_t j = 0; j < k; ++j) dp[chosen_[t * k + j]] += (dweights_[t * k + j] - dot) / s;
    double pdp = 0;
    for (int64_t e = 0; e < E; ++e) pdp += p[e] * dp[e];
    for (int64_t e = 0; e < E; ++e) dlogits_[t * E + e] = static_cast<float>(p[e] * (dp[e] - pdp));
  }
  linear_backward(dx, grads.gate, view(dlogits_, T, E), x, w.gate, true);
}

}  // namespace hdp

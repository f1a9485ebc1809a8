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

// Host memory as a CPU tensor, for copies to and from the device.
Tensor host(std::vector<float>& v, int64_t rows, int64_t cols) { return Tensor(v.data(), {rows, cols}); }
Tensor host(std::vector<float>& v) { return Tensor(v.data(), {static_cast<int64_t>(v.size())}); }
IndexTensor host(std::vector<int32_t>& v, int64_t n) { return IndexTensor(v.data(), {n}); }

}  // namespace

MoeWorkspace::MoeWorkspace(const MoeShape& shape, int64_t max_tokens, Device device, DType dtype,
                           bool expert_parallel)
    : shape_(shape), device_(device), dtype_(dtype), expert_parallel_(expert_parallel),
      fixed_(Arena::counting(device, "MoE workspace")), rows_(Arena::counting(device, "MoE workspace rows")) {
  const int64_t T = max_tokens, E = shape.experts, k = shape.top_k, H = shape.hidden;
  for (int pass = 0; pass < 2; ++pass) {
    logits = fixed_.tensor({T, E}, dtype);
    dlogits = fixed_.tensor({T, E}, dtype);
    dweights = fixed_.tensor({T, k});
    routed = fixed_.tensor({T * k, H}, dtype);
    if (pass == 0) fixed_ = Arena(device, fixed_.used(), "MoE workspace");
  }
  reserve(T * k);
}

void MoeWorkspace::reserve(int64_t rows) {
  if (rows <= rows_capacity_) return;
  const int64_t H = shape_.hidden, F = shape_.ffn;
  rows_ = Arena::counting(device_, "MoE workspace rows");
  for (int pass = 0; pass < 2; ++pass) {
    act = rows_.tensor({rows, F}, dtype_);
    dact = rows_.tensor({rows, F}, dtype_);
    dgate = rows_.tensor({rows, F}, dtype_);
    dup = rows_.tensor({rows, F}, dtype_);
    expert_dx = rows_.tensor({rows, H}, dtype_);
    if (expert_parallel_) {
      expert_out = rows_.tensor({rows, H}, dtype_);
      transit = rows_.tensor({rows, H}, dtype_);
    }
    if (pass == 0) rows_ = Arena(device_, rows_.used(), "MoE workspace rows");
  }
  rows_capacity_ = rows;
}

MoeBlock::MoeBlock(const MoeShape& shape, int64_t max_tokens, MoeWorkspace& workspace, Communicator* tp,
                   Communicator* ep)
    : shape_(shape), ws_(workspace), tp_(tp), ep_(ep != nullptr && ep->size() > 1 ? ep : nullptr), input_(tp),
      output_(tp), max_tokens_(max_tokens), fixed_(Arena::counting(workspace.device(), "MoE block")),
      rows_(Arena::counting(workspace.device(), "MoE block rows")) {
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
  const int64_t T = max_tokens, E = shape.experts, k = shape.top_k, H = shape.hidden;
  logits_.resize(T * E);
  probs_.resize(T * E);
  dlogits_.resize(T * E);
  chosen_.resize(T * k);
  weights_.resize(T * k);
  dweights_.resize(T * k);
  row_token_.resize(T * k);
  token_row_.resize(T * k);
  row_weight_.resize(T * k);
  for (int pass = 0; pass < 2; ++pass) {
    d_row_token_ = fixed_.index_tensor({T * k});
    d_token_row_ = fixed_.index_tensor({T, k});
    d_row_weight_ = fixed_.tensor({T * k});
    d_weights_ = fixed_.tensor({T, k});
    ys_ = fixed_.tensor({T * k, H}, workspace.dtype());
    if (pass == 0) fixed_ = Arena(workspace.device(), fixed_.used(), "MoE block");
  }
  reserve_expert_rows(T * k);
  counts_.assign(E, 0);
  prob_sums_.assign(E, 0.0);
  first_.assign(E + 1, 0);
  send_rows_.assign(ep_size_, 0);
  recv_rows_.assign(ep_size_, 0);
  send_elements_.assign(ep_size_, 0);
  recv_elements_.assign(ep_size_, 0);
  arrived_.assign(ep_size_ * local_experts_, 0);
  expert_first_.assign(local_experts_ + 1, 0);
  count_send_.resize(E);
  count_recv_.resize(E);
  order_.resize(E);
  dp_.resize(E);
  cursor_.reserve(E);
  counts_per_rank_.assign(ep_size_, local_experts_);
}

void MoeBlock::reserve_expert_rows(int64_t rows) {
  ws_.reserve(rows);
  if (rows <= rows_capacity_) return;
  const int64_t H = shape_.hidden, F = shape_.ffn;
  const Device device = ws_.device();
  rows_ = Arena::counting(device, "MoE block rows");
  for (int pass = 0; pass < 2; ++pass) {
    xs_ = rows_.tensor({rows, H}, ws_.dtype());
    gate_ = rows_.tensor({rows, F}, ws_.dtype());
    up_ = rows_.tensor({rows, F}, ws_.dtype());
    if (ep_) {
      d_to_expert_ = rows_.index_tensor({rows});
      d_from_expert_ = rows_.index_tensor({rows});
    }
    if (pass == 0) rows_ = Arena(device, rows_.used(), "MoE block rows");
  }
  if (ep_) {
    to_expert_.resize(rows);
    from_expert_.resize(rows);
  }
  rows_capacity_ = rows;
}

void MoeBlock::route(int64_t T) {
  const int64_t E = shape_.experts, k = shape_.top_k;
  // Router softmax in fp32 (Mixtral computes the routing in fp32 whatever the
  // activations' type), accumulated in double for the normaliser.
  copy(host(logits_, T, E), ws_.logits.rows(0, T));
  std::fill(counts_.begin(), counts_.end(), 0);
  std::vector<int32_t>& order = order_;
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
  std::vector<int64_t>& next = cursor_;
  next.assign(first_.begin(), first_.end() - 1);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = next[chosen_[t * k + j]]++;
      row_token_[r] = static_cast<int32_t>(t);
      token_row_[t * k + j] = static_cast<int32_t>(r);
      row_weight_[r] = weights_[t * k + j];
    }
  const int64_t N = T * k;
  copy(d_row_token_.rows(0, N), host(row_token_, N));
  copy(d_token_row_.rows(0, T), IndexTensor(token_row_.data(), {T, k}));
  copy(d_row_weight_.rows(0, N), Tensor(row_weight_.data(), {N}));
  copy(d_weights_.rows(0, T), host(weights_, T, k));
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
  const int64_t R = expert_first_[El];
  reserve_expert_rows(R);
  if (!ep_) return;
  // The all-to-all delivers rank p's rows for its experts 0, 1, ... then rank p + 1's;
  // the experts' GEMMs want each expert's rows from every rank together.
  std::vector<int64_t>& next = cursor_;
  next.assign(expert_first_.begin(), expert_first_.end() - 1);
  int64_t arrival = 0;
  for (int p = 0; p < ep_size_; ++p)
    for (int64_t j = 0; j < El; ++j)
      for (int64_t i = 0; i < arrived_[p * El + j]; ++i, ++arrival) {
        const int64_t row = next[j]++;
        to_expert_[row] = static_cast<int32_t>(arrival);
        from_expert_[arrival] = static_cast<int32_t>(row);
      }
  copy(d_to_expert_.rows(0, R), host(to_expert_, R));
  copy(d_from_expert_.rows(0, R), host(from_expert_, R));
}

void MoeBlock::exchange_rows(const Tensor& send, std::span<const int64_t> send_rows, Tensor recv,
                             std::span<const int64_t> recv_rows) {
  const int64_t width = shape_.hidden;  // every row moved is a hidden-size row
  for (int p = 0; p < ep_size_; ++p) {
    send_elements_[p] = send_rows[p] * width;
    recv_elements_[p] = recv_rows[p] * width;
  }
  TraceSpan span(trace_ops::kExpertAllToAll.data());  // nested in forward- or backward-compute
  ep_->all_to_all_v(send.view({send.numel()}), send_elements_, recv.view({recv.numel()}), recv_elements_);
}

void MoeBlock::forward(Tensor out, const Tensor& x, const MoeTensors& w) {
  const int64_t T = x.dim(0), H = shape_.hidden, k = shape_.top_k, N = T * k;
  if (T > max_tokens_ || x.dim(1) != H || out.dim(0) != T || out.dim(1) != H) {
    throw std::invalid_argument("MoE block: x and out must be [T, " + std::to_string(H) + "] with T <= " +
                                std::to_string(max_tokens_));
  }
  if (x.device != ws_.device() || out.device != ws_.device() || x.dtype != ws_.dtype()) {
    throw std::invalid_argument(std::string("MoE block: x is a ") + dtype_name(x.dtype) + " tensor on " +
                                device_name(x.device) + ", the block runs " + dtype_name(ws_.dtype()) + " on " +
                                device_name(ws_.device()));
  }
  if (static_cast<int64_t>(w.w1.size()) != local_experts_ || static_cast<int64_t>(w.w2.size()) != local_experts_ ||
      static_cast<int64_t>(w.w3.size()) != local_experts_) {
    throw std::invalid_argument("MoE block: weights of " + std::to_string(w.w1.size()) + " experts for the " +
                                std::to_string(local_experts_) + " this rank runs (an ep group missing?)");
  }
  tokens_ = T;
  linear_forward(ws_.logits.rows(0, T), x, w.gate);
  route(T);
  // The rows go to their experts' ranks; each local expert runs over its rows from
  // every rank: one GEMM per projection. Without ep, expert order is routing order.
  exchange_counts();
  const int64_t R = expert_first_[local_experts_];
  if (ep_) {
    gather_rows(ws_.routed.rows(0, N), x, d_row_token_.rows(0, N));
    exchange_rows(ws_.routed.rows(0, N), send_rows_, ws_.transit.rows(0, R), recv_rows_);
    gather_rows(xs_.rows(0, R), ws_.transit.rows(0, R), d_to_expert_.rows(0, R));
  } else {
    gather_rows(xs_.rows(0, R), x, d_row_token_.rows(0, N));
  }
  const Tensor expert_out = ep_ ? ws_.expert_out : ys_;
  for (int64_t e = 0; e < local_experts_; ++e) {
    const int64_t b = expert_first_[e], n = expert_first_[e + 1] - b;
    if (n == 0) continue;
    const Tensor g = gate_.rows(b, b + n), u = up_.rows(b, b + n), a = ws_.act.rows(b, b + n);
    linear_forward(g, xs_.rows(b, b + n), w.w1[e]);
    linear_forward(u, xs_.rows(b, b + n), w.w3[e]);
    swiglu_forward(a, g, u);
    linear_forward(expert_out.rows(b, b + n), a, w.w2[e]);
  }
  if (ep_) {
    // The way back: what this rank received from rank p returns to it.
    gather_rows(ws_.transit.rows(0, R), ws_.expert_out.rows(0, R), d_from_expert_.rows(0, R));
    exchange_rows(ws_.transit.rows(0, R), recv_rows_, ys_.rows(0, N), send_rows_);
  }
  combine_rows(out, ys_.rows(0, N), d_token_row_.rows(0, T), d_weights_.rows(0, T));
  // Each tp rank combined its slice of every expert's w2 output: their sum is the output.
  output_.forward(out);
  // Load balancing: E sum_e f_e P_e over the T tokens.
  const int64_t E = shape_.experts;
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
  const int64_t T = tokens_, E = shape_.experts, k = shape_.top_k, N = T * k;
  if (x.dim(0) != T || dout.dim(0) != T || dx.dim(0) != T) {
    throw std::invalid_argument("MoE block: backward over another number of tokens than the forward");
  }
  const int64_t R = expert_first_[local_experts_];
  // Per routing row: dY = weight x dout of its token; per (token, choice): d(weight) = <dout, Y>.
  const Tensor dys = ws_.routed.rows(0, N);
  gather_rows(dys, dout, d_row_token_.rows(0, N), d_row_weight_.rows(0, N));
  combine_rows_weight_backward(ws_.dweights.rows(0, T), dout, ys_.rows(0, N), d_token_row_.rows(0, T));
  copy(host(dweights_, T, k), ws_.dweights.rows(0, T));
  // <dout, Y> over this rank's slice of Y: the sum over the tp ranks is the whole dot.
  if (tp_ != nullptr && tp_->size() > 1) tp_->all_reduce(host(dweights_, T, k), ReduceOp::Sum);
  // The output gradients travel to the experts' ranks as the rows did, the input
  // gradients come back.
  Tensor expert_dy = dys;
  if (ep_) {
    exchange_rows(dys, send_rows_, ws_.transit.rows(0, R), recv_rows_);
    gather_rows(ws_.expert_out.rows(0, R), ws_.transit.rows(0, R), d_to_expert_.rows(0, R));
    expert_dy = ws_.expert_out;
  }
  for (int64_t e = 0; e < local_experts_; ++e) {
    const int64_t b = expert_first_[e], n = expert_first_[e + 1] - b;
    if (n == 0) continue;
    const Tensor xe = xs_.rows(b, b + n), g = gate_.rows(b, b + n), u = up_.rows(b, b + n),
                 a = ws_.act.rows(b, b + n), da = ws_.dact.rows(b, b + n), dg = ws_.dgate.rows(b, b + n),
                 du = ws_.dup.rows(b, b + n), dxe = ws_.expert_dx.rows(b, b + n);
    // a is recomputed rather than kept, as the dense MLP does (decoder_blocks.cpp).
    const Tensor dy = expert_dy.rows(b, b + n);
    linear_backward(da, Tensor(), dy, a, w.w2[e], false);
    swiglu_backward(dg, du, da, g, u, a);
    linear_backward(Tensor(), grads.w2[e], dy, a, w.w2[e], false);
    linear_backward(dxe, grads.w1[e], dg, xe, w.w1[e], false);
    linear_backward(dxe, grads.w3[e], du, xe, w.w3[e], true);
  }
  Tensor dxs = ws_.expert_dx.rows(0, R);
  if (ep_) {
    gather_rows(ws_.transit.rows(0, R), ws_.expert_dx.rows(0, R), d_from_expert_.rows(0, R));
    exchange_rows(ws_.transit.rows(0, R), recv_rows_, ws_.routed.rows(0, N), send_rows_);
    dxs = ws_.routed.rows(0, N);
  }
  // Each token's input gradient: the sum over its k rows.
  combine_rows(dx, dxs, d_token_row_.rows(0, T));
  // Each rank's expert slices gave part of dx; the router's part below is whole on every rank.
  input_.backward(dx);
  // Router. The weights are p_j / S over the chosen j (S their sum), so
  // dp_j = (dw_j - sum_i dw_i w_i) / S for chosen j and 0 otherwise; the aux loss adds
  // aux_grad[e] to every dp_e; then the softmax's backward.
  std::vector<double>& dp = dp_;
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
  copy(ws_.dlogits.rows(0, T), host(dlogits_, T, E));
  linear_backward(dx, grads.gate, ws_.dlogits.rows(0, T), x, w.gate, true);
}

MoeLayers::MoeLayers(const MoeShape& shape, int64_t model_layers, int64_t stage_layers, int slots,
                     int64_t max_tokens, Device device, DType dtype, double aux_loss_coef, bool has_head,
                     Communicator* tp, Communicator* ep)
    : experts_(shape.experts),
      model_layers_(model_layers),
      aux_loss_coef_(aux_loss_coef),
      has_head_(has_head),
      workspace_(shape, max_tokens, device, dtype, ep != nullptr && ep->size() > 1),
      blocks_(slots),
      slots_(slots) {
  for (std::vector<MoeBlock>& blocks : blocks_)
    for (int64_t l = 0; l < stage_layers; ++l) blocks.emplace_back(shape, max_tokens, workspace_, tp, ep);
  for (SlotStatistics& s : slots_) {
    s.routing_before.assign(2 * experts_, 0.0f);
    s.routing_through.assign(2 * experts_, 0.0f);
    s.routing_totals.assign(experts_ + 2, 0.0f);
  }
}

size_t MoeLayers::bytes() const {
  size_t bytes = workspace_.bytes();
  for (const std::vector<MoeBlock>& blocks : blocks_)
    for (const MoeBlock& block : blocks) bytes += block.bytes();
  return bytes;
}

void MoeLayers::begin_micro_batch(int slot, std::span<const int32_t> targets) {
  SlotStatistics& s = slots_.at(slot);
  s.predictions = 0;
  for (int32_t target : targets) s.predictions += target >= 0;
  std::fill(s.routing_before.begin(), s.routing_before.end(), 0.0f);
}

double MoeLayers::pool_load_balancing(int slot, float loss_scale, int64_t tokens, RingAttention* ring_attention,
                                      const RingLayout* ring) {
  const int64_t E = experts_;
  SlotStatistics& s = slots_.at(slot);
  s.loss_scale = loss_scale;
  s.routing_through = s.routing_before;
  for (const MoeBlock& block : blocks_[slot]) {
    for (int64_t e = 0; e < E; ++e) {
      s.routing_through[e] += static_cast<float>(block.expert_tokens()[e]);
      s.routing_through[E + e] += static_cast<float>(block.probability_sums()[e]);
    }
  }
  if (!has_head_) return 0.0;
  expert_tokens_.assign(E, 0);
  for (int64_t e = 0; e < E; ++e) expert_tokens_[e] = static_cast<int64_t>(s.routing_through[e]);
  // The forward's statistics: counts, probability sums, tokens and predictions.
  forward_routing_.assign(s.routing_through.begin(), s.routing_through.end());
  forward_routing_.push_back(static_cast<float>(tokens));
  forward_routing_.push_back(static_cast<float>(s.predictions));
  if (ring != nullptr) ring_attention->sum_over_members(forward_routing_, *ring);
  const double N = static_cast<double>(model_layers_) * static_cast<double>(forward_routing_[2 * E]);
  double aux = 0;
  for (int64_t e = 0; e < E; ++e) {
    s.routing_totals[e] = forward_routing_[e];
    aux += (static_cast<double>(forward_routing_[e]) / N) * (static_cast<double>(forward_routing_[E + e]) / N);
  }
  s.routing_totals[E] = forward_routing_[2 * E];
  s.routing_totals[E + 1] = forward_routing_[2 * E + 1];
  aux_loss_ = N > 0 ? static_cast<double>(E) * aux : 0.0;
  return aux_loss_coef_ * aux_loss_ * static_cast<double>(s.predictions);
}

std::span<const double> MoeLayers::load_balancing_gradient(int slot) {
  const SlotStatistics& s = slots_.at(slot);
  const int64_t E = experts_;
  const double N = static_cast<double>(model_layers_) * static_cast<double>(s.routing_totals[E]);
  const double c = aux_loss_coef_, P = static_cast<double>(s.routing_totals[E + 1]);
  aux_grad_.assign(E, 0.0);
  for (int64_t e = 0; e < E && N > 0; ++e)
    aux_grad_[e] = c * P * s.loss_scale * static_cast<double>(E) * (static_cast<double>(s.routing_totals[e]) / N) / N;
  return aux_grad_;
}

Tensor MoeLayers::routing_input(int slot) { return host(slots_.at(slot).routing_before); }
Tensor MoeLayers::routing_output(int slot) { return host(slots_.at(slot).routing_through); }
Tensor MoeLayers::routing_totals(int slot) { return host(slots_.at(slot).routing_totals); }

}  // namespace hdp

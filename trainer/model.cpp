#include "trainer/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "kernels/ops.h"
#include "trainer/init_rng.h"

namespace hdp {
namespace {

constexpr int64_t kParamAlignFloats = 16;  // 64-byte alignment of every tensor in the flat buffer
constexpr int64_t kLogitsBudgetFloats = int64_t{1} << 24;

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Tokens per LM-head chunk: bounds the [chunk, vocab] logits buffer.
int64_t head_chunk_for(int64_t vocab, int64_t capacity) {
  int64_t chunk = std::max<int64_t>(1, kLogitsBudgetFloats / vocab);
  if (chunk >= 64) chunk = chunk / 64 * 64;
  return std::min(chunk, capacity);
}

}  // namespace

LlamaModel::LlamaModel(const ModelConfig& config, int64_t capacity_tokens, Device device)
    : config_(config),
      capacity_(capacity_tokens),
      head_chunk_tokens_(head_chunk_for(config.vocab_size, capacity_tokens)),
      device_(device),
      param_arena_(Arena::counting(device, "parameters")),
      grad_arena_(Arena::counting(device, "gradients")),
      activation_arena_(Arena::counting(device, "activations")) {
  if (capacity_tokens <= 0) throw std::invalid_argument("model: capacity_tokens must be positive");
  if (config.hidden_size % config.num_heads != 0 || config.num_heads % config.num_kv_heads != 0 ||
      config.head_dim() % 2 != 0) {
    throw std::invalid_argument("model: heads must divide hidden size, kv heads must divide heads, head_dim even");
  }
  build_parameter_table();
  param_arena_ = Arena(device, static_cast<size_t>(flat_numel_) * sizeof(float), "parameters");
  grad_arena_ = Arena(device, static_cast<size_t>(flat_numel_) * sizeof(float), "gradients");
  params_ = param_arena_.tensor({flat_numel_});
  grads_ = grad_arena_.tensor({flat_numel_});
  fill(params_, 0.0f);
  fill(grads_, 0.0f);
  bind_weights(params_, w_, embed_, final_norm_, head_);
  bind_weights(grads_, dw_, d_embed_, d_final_norm_, d_head_);

  Arena sizing = Arena::counting(device, "activations");
  layout_activations(sizing);
  activation_arena_ = Arena(device, sizing.used(), "activations");
  layout_activations(activation_arena_);
}

void LlamaModel::build_parameter_table() {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, F = c.ffn_hidden_size, qdim = c.num_heads * c.head_dim(), kv = c.kv_dim();
  int64_t offset = 0;
  auto add = [&](std::string name, std::vector<int64_t> shape, bool decay, bool scaled, bool ones) {
    ParameterInfo p;
    p.name = std::move(name);
    p.numel = 1;
    for (int64_t d : shape) p.numel *= d;
    p.shape = std::move(shape);
    p.offset = offset;
    p.weight_decay = decay;
    p.scaled_init = scaled;
    p.ones_init = ones;
    offset += round_up(p.numel, kParamAlignFloats);
    parameters_.push_back(std::move(p));
  };
  add("model.embed_tokens.weight", {c.vocab_size, H}, true, false, false);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    add(pre + "input_layernorm.weight", {H}, false, false, true);
    add(pre + "self_attn.q_proj.weight", {qdim, H}, true, false, false);
    add(pre + "self_attn.k_proj.weight", {kv, H}, true, false, false);
    add(pre + "self_attn.v_proj.weight", {kv, H}, true, false, false);
    add(pre + "self_attn.o_proj.weight", {H, qdim}, true, true, false);
    add(pre + "post_attention_layernorm.weight", {H}, false, false, true);
    add(pre + "mlp.gate_proj.weight", {F, H}, true, false, false);
    add(pre + "mlp.up_proj.weight", {F, H}, true, false, false);
    add(pre + "mlp.down_proj.weight", {H, F}, true, true, false);
  }
  add("model.norm.weight", {H}, false, false, true);
  if (!c.tie_embeddings) add("lm_head.weight", {c.vocab_size, H}, true, false, false);
  flat_numel_ = offset;
}

void LlamaModel::bind_weights(Tensor flat, std::vector<LayerWeights>& layers, Tensor& embed, Tensor& final_norm,
                              Tensor& head) {
  auto view = [&](const ParameterInfo& p) {
    Tensor t(flat.data + p.offset, {}, device_);
    for (int64_t d : p.shape) t.shape[t.ndim++] = d;
    return t;
  };
  size_t i = 0;
  embed = view(parameters_[i++]);
  layers.resize(config_.num_layers);
  for (LayerWeights& L : layers) {
    L.input_norm = view(parameters_[i++]);
    L.q = view(parameters_[i++]);
    L.k = view(parameters_[i++]);
    L.v = view(parameters_[i++]);
    L.o = view(parameters_[i++]);
    L.post_norm = view(parameters_[i++]);
    L.gate = view(parameters_[i++]);
    L.up = view(parameters_[i++]);
    L.down = view(parameters_[i++]);
  }
  final_norm = view(parameters_[i++]);
  head = config_.tie_embeddings ? embed : view(parameters_[i++]);
}

void LlamaModel::layout_activations(Arena& arena) {
  const int64_t T = capacity_, H = config_.hidden_size, F = config_.ffn_hidden_size;
  const int64_t qdim = config_.num_heads * config_.head_dim(), kv = config_.kv_dim();
  tokens_ = arena.index_tensor({T});
  targets_ = arena.index_tensor({T});
  positions_ = arena.index_tensor({T});
  cu_seqlens_ = arena.index_tensor({T + 1});
  acts_.assign(config_.num_layers, {});
  for (LayerActivations& a : acts_) {
    a.x_in = arena.tensor({T, H});
    a.rstd1 = arena.tensor({T});
    a.ln1 = arena.tensor({T, H});
    a.q = arena.tensor({T, qdim});
    a.k = arena.tensor({T, kv});
    a.v = arena.tensor({T, kv});
    a.attn = arena.tensor({T, qdim});
    a.lse = arena.tensor({config_.num_heads * T});
    a.x_mid = arena.tensor({T, H});
    a.rstd2 = arena.tensor({T});
    a.ln2 = arena.tensor({T, H});
    a.gate = arena.tensor({T, F});
    a.up = arena.tensor({T, F});
  }
  x_final_ = arena.tensor({T, H});
  rstd_final_ = arena.tensor({T});
  ln_final_ = arena.tensor({T, H});
  Scratch& s = scratch_;
  s.residual_grad = arena.tensor({T, H});
  s.norm_grad = arena.tensor({T, H});
  s.dq = arena.tensor({T, qdim});
  s.dk = arena.tensor({T, kv});
  s.dv = arena.tensor({T, kv});
  s.dattn = arena.tensor({T, qdim});
  s.dgate = arena.tensor({T, F});
  s.dup = arena.tensor({T, F});
  s.ffn_act = arena.tensor({T, F});
  s.dffn_act = arena.tensor({T, F});
  s.logits = arena.tensor({head_chunk_tokens_, config_.vocab_size});
  s.ce_stats = arena.tensor({3 * head_chunk_tokens_});
}

const ParameterInfo& LlamaModel::parameter(const std::string& name) const {
  for (const ParameterInfo& p : parameters_)
    if (p.name == name) return p;
  throw std::out_of_range("model has no parameter '" + name + "'");
}

Tensor LlamaModel::parameter_tensor(const ParameterInfo& p) const {
  return Tensor(params_.data + p.offset, {p.numel}, device_);
}

Tensor LlamaModel::gradient_tensor(const ParameterInfo& p) const {
  return Tensor(grads_.data + p.offset, {p.numel}, device_);
}

int64_t LlamaModel::num_parameters() const {
  int64_t n = 0;
  for (const ParameterInfo& p : parameters_) n += p.numel;
  return n;
}

void LlamaModel::init_weights(uint64_t seed) {
  fill(params_, 0.0f);
  const double std_out = config_.init_std / std::sqrt(2.0 * static_cast<double>(config_.num_layers));
  std::vector<float> host;
  for (const ParameterInfo& p : parameters_) {
    host.resize(p.numel);
    if (p.ones_init) {
      std::fill(host.begin(), host.end(), 1.0f);
    } else {
      NormalStream normal(hash_name(p.name, seed));
      const double std = p.scaled_init ? std_out : config_.init_std;
      for (float& x : host) x = static_cast<float>(normal.next() * std);
    }
    copy(parameter_tensor(p), Tensor(host.data(), {p.numel}, Device::CPU));
  }
}

void LlamaModel::zero_grad() { fill(grads_, 0.0f); }

int64_t LlamaModel::load_inputs(const MicroBatchView& batch) {
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  if (T == 0 || T > capacity_) {
    throw std::invalid_argument("micro-batch of " + std::to_string(T) + " tokens; the model holds 1.." +
                                std::to_string(capacity_));
  }
  if (static_cast<int64_t>(batch.targets.size()) != T || static_cast<int64_t>(batch.positions.size()) != T ||
      batch.cu_seqlens.size() < 2 || batch.cu_seqlens.front() != 0 || batch.cu_seqlens.back() != T) {
    throw std::invalid_argument("micro-batch: tokens, targets, positions and cu_seqlens disagree");
  }
  for (int64_t i = 0; i < T; ++i) {
    if (batch.tokens[i] < 0 || batch.tokens[i] >= config_.vocab_size || batch.targets[i] < -1 ||
        batch.targets[i] >= config_.vocab_size) {
      throw std::invalid_argument("micro-batch: token id outside the vocabulary at row " + std::to_string(i));
    }
  }
  num_sequences_ = static_cast<int64_t>(batch.cu_seqlens.size()) - 1;
  auto to_device = [&](IndexTensor dst, std::span<const int32_t> src) {
    std::memcpy(dst.data, src.data(), src.size_bytes());  // CPU backend: host and device are one memory
  };
  to_device(tokens_, batch.tokens);
  to_device(targets_, batch.targets);
  to_device(positions_, batch.positions);
  to_device(cu_seqlens_, batch.cu_seqlens);
  return T;
}

void LlamaModel::forward(int64_t T) {
  const ModelConfig& c = config_;
  const int64_t Hq = c.num_heads, Hkv = c.num_kv_heads, d = c.head_dim();
  const float eps = static_cast<float>(c.norm_eps), theta = static_cast<float>(c.rope_theta);
  const IndexTensor tokens = tokens_.rows(0, T), positions = positions_.rows(0, T);
  const IndexTensor cu = cu_seqlens_.rows(0, num_sequences_ + 1);

  embedding_forward(acts_[0].x_in.rows(0, T), tokens, embed_, 0);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = w_[l];
    LayerActivations& a = acts_[l];
    const Tensor x = a.x_in.rows(0, T), ln1 = a.ln1.rows(0, T), q = a.q.rows(0, T), k = a.k.rows(0, T),
                 v = a.v.rows(0, T), attn = a.attn.rows(0, T), x_mid = a.x_mid.rows(0, T), ln2 = a.ln2.rows(0, T),
                 gate = a.gate.rows(0, T), up = a.up.rows(0, T), act = scratch_.ffn_act.rows(0, T);
    rmsnorm_forward(ln1, a.rstd1.rows(0, T), x, w.input_norm, eps);
    linear_forward(q, ln1, w.q);
    linear_forward(k, ln1, w.k);
    linear_forward(v, ln1, w.v);
    rope_forward(q.view({T, Hq, d}), positions, theta);
    rope_forward(k.view({T, Hkv, d}), positions, theta);
    attention_forward(attn.view({T, Hq, d}), Tensor(a.lse.data, {Hq, T}, device_), q.view({T, Hq, d}),
                      k.view({T, Hkv, d}), v.view({T, Hkv, d}), cu);
    linear_forward(x_mid, attn, w.o);
    add_inplace(x_mid, x);
    rmsnorm_forward(ln2, a.rstd2.rows(0, T), x_mid, w.post_norm, eps);
    linear_forward(gate, ln2, w.gate);
    linear_forward(up, ln2, w.up);
    swiglu_forward(act, gate, up);
    const Tensor out = (l + 1 < c.num_layers ? acts_[l + 1].x_in : x_final_).rows(0, T);
    linear_forward(out, act, w.down);
    add_inplace(out, x_mid);
  }
  rmsnorm_forward(ln_final_.rows(0, T), rstd_final_.rows(0, T), x_final_.rows(0, T), final_norm_, eps);
}

// The LM head and loss run chunk by chunk over tokens; with backward, each chunk's
// logits are turned into their gradient in place and pushed through the head at
// once, so only one [chunk, vocab] buffer ever exists.
double LlamaModel::head_forward_backward(int64_t T, float loss_scale, bool backward) {
  double loss_sum = 0;
  for (int64_t c0 = 0; c0 < T; c0 += head_chunk_tokens_) {
    const int64_t c1 = std::min(T, c0 + head_chunk_tokens_);
    const Tensor ln = ln_final_.rows(c0, c1), logits = scratch_.logits.rows(0, c1 - c0);
    linear_forward(logits, ln, head_);
    loss_sum += cross_entropy_forward_backward(logits, targets_.rows(c0, c1), loss_scale, scratch_.ce_stats);
    if (backward) linear_backward(scratch_.norm_grad.rows(c0, c1), d_head_, logits, ln, head_, false);
  }
  return loss_sum;
}

void LlamaModel::backward(int64_t T) {
  const ModelConfig& c = config_;
  const int64_t Hq = c.num_heads, Hkv = c.num_kv_heads, d = c.head_dim();
  const float theta = static_cast<float>(c.rope_theta);
  const IndexTensor positions = positions_.rows(0, T), cu = cu_seqlens_.rows(0, num_sequences_ + 1);
  const Scratch& s = scratch_;
  const Tensor dres = s.residual_grad.rows(0, T), dnorm = s.norm_grad.rows(0, T);

  fill(dres, 0.0f);
  rmsnorm_backward(dres, d_final_norm_, dnorm, x_final_.rows(0, T), final_norm_, rstd_final_.rows(0, T));
  for (int64_t l = c.num_layers - 1; l >= 0; --l) {
    const LayerWeights& w = w_[l];
    const LayerWeights& dw = dw_[l];
    const LayerActivations& a = acts_[l];
    const Tensor x = a.x_in.rows(0, T), ln1 = a.ln1.rows(0, T), q = a.q.rows(0, T), k = a.k.rows(0, T),
                 v = a.v.rows(0, T), attn = a.attn.rows(0, T), x_mid = a.x_mid.rows(0, T), ln2 = a.ln2.rows(0, T),
                 gate = a.gate.rows(0, T), up = a.up.rows(0, T);
    const Tensor act = s.ffn_act.rows(0, T), dact = s.dffn_act.rows(0, T), dgate = s.dgate.rows(0, T),
                 dup = s.dup.rows(0, T), dattn = s.dattn.rows(0, T), dq = s.dq.rows(0, T), dk = s.dk.rows(0, T),
                 dv = s.dv.rows(0, T);

    // MLP block: dres is the gradient of the layer output.
    swiglu_forward(act, gate, up);  // recomputed rather than stored
    linear_backward(dact, dw.down, dres, act, w.down, false);
    swiglu_backward(dgate, dup, dact, gate, up);
    linear_backward(dnorm, dw.gate, dgate, ln2, w.gate, false);
    linear_backward(dnorm, dw.up, dup, ln2, w.up, true);
    rmsnorm_backward(dres, dw.post_norm, dnorm, x_mid, w.post_norm, a.rstd2.rows(0, T));

    // Attention block: dres is now the gradient of x_mid.
    linear_backward(dattn, dw.o, dres, attn, w.o, false);
    attention_backward(dq.view({T, Hq, d}), dk.view({T, Hkv, d}), dv.view({T, Hkv, d}), dattn.view({T, Hq, d}),
                       q.view({T, Hq, d}), k.view({T, Hkv, d}), v.view({T, Hkv, d}), attn.view({T, Hq, d}),
                       Tensor(a.lse.data, {Hq, T}, device_), cu);
    rope_backward(dq.view({T, Hq, d}), positions, theta);
    rope_backward(dk.view({T, Hkv, d}), positions, theta);
    linear_backward(dnorm, dw.q, dq, ln1, w.q, false);
    linear_backward(dnorm, dw.k, dk, ln1, w.k, true);
    linear_backward(dnorm, dw.v, dv, ln1, w.v, true);
    rmsnorm_backward(dres, dw.input_norm, dnorm, x, w.input_norm, a.rstd1.rows(0, T));
  }
  embedding_backward(d_embed_, tokens_.rows(0, T), dres, 0);
}

double LlamaModel::forward_backward(const MicroBatchView& batch, float loss_scale) {
  const int64_t T = load_inputs(batch);
  forward(T);
  double loss = head_forward_backward(T, loss_scale, true);
  backward(T);
  return loss;
}

double LlamaModel::forward_loss(const MicroBatchView& batch) {
  const int64_t T = load_inputs(batch);
  forward(T);
  return head_forward_backward(T, 1.0f, false);
}

double LlamaModel::training_flops(std::span<const int64_t> sequence_lengths) const {
  const ModelConfig& c = config_;
  const double H = static_cast<double>(c.hidden_size), F = static_cast<double>(c.ffn_hidden_size);
  const double qdim = static_cast<double>(c.num_heads * c.head_dim()), kv = static_cast<double>(c.kv_dim());
  const double layer_matmul = H * (qdim + 2 * kv) + qdim * H + 3 * H * F;
  const double matmul_params = static_cast<double>(c.num_layers) * layer_matmul + static_cast<double>(c.vocab_size) * H;
  double tokens = 0, causal_pairs = 0;
  for (int64_t s : sequence_lengths) {
    tokens += static_cast<double>(s);
    causal_pairs += 0.5 * static_cast<double>(s) * static_cast<double>(s + 1);
  }
  // Forward: 2 FLOPs per multiply-add; QK^T and PV each cost 2 * qdim per causal pair.
  // Backward costs twice the forward.
  const double attention = 4.0 * qdim * causal_pairs * static_cast<double>(c.num_layers);
  return 3.0 * (2.0 * matmul_params * tokens + attention);
}

}  // namespace hdp

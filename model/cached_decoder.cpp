#include "model/cached_decoder.h"

#include <stdexcept>
#include <string>

#include "kernels/ops.h"

namespace hdp {

namespace {

Tensor weight(const LlamaModel& model, const std::string& name) {
  const ParameterInfo& p = model.parameter(name);
  const Tensor flat = model.parameter_tensor(p);
  if (p.shape.size() == 1) return flat;
  return flat.view({p.shape[0], p.shape[1]});
}

}  // namespace

CachedDecoder::CachedDecoder(const LlamaModel& model, int64_t max_positions)
    : config_(model.config()), max_positions_(max_positions) {
  const ModelPartition& part = model.partition();
  if (part.tp_size != 1 || part.first_layer != 0 || model.num_layers() != config_.num_layers || !part.has_embedding ||
      !part.has_head)
    throw std::invalid_argument("cached decoder: needs the whole model on one process");
  if (model.device() != Device::CPU || model.precision() != DType::F32)
    throw std::invalid_argument("cached decoder: runs fp32 on the CPU only");
  if (max_positions < 1) throw std::invalid_argument("cached decoder: the context must hold at least one token");
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, kv = c.kv_dim(), qdim = c.num_heads * c.head_dim(), F = c.ffn_hidden_size;
  embed_ = weight(model, "model.embed_tokens.weight");
  final_norm_ = weight(model, "model.norm.weight");
  head_ = weight(model, c.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    Layer layer;
    layer.input_norm = weight(model, pre + "input_layernorm.weight");
    layer.q = weight(model, pre + "self_attn.q_proj.weight");
    layer.k = weight(model, pre + "self_attn.k_proj.weight");
    layer.v = weight(model, pre + "self_attn.v_proj.weight");
    layer.o = weight(model, pre + "self_attn.o_proj.weight");
    layer.post_norm = weight(model, pre + "post_attention_layernorm.weight");
    if (c.moe()) {
      layer.moe.gate = weight(model, pre + "block_sparse_moe.gate.weight");
      for (int64_t e = 0; e < c.num_experts; ++e) {
        const std::string ex = pre + "block_sparse_moe.experts." + std::to_string(e) + ".";
        layer.moe.w1.push_back(weight(model, ex + "w1.weight"));
        layer.moe.w2.push_back(weight(model, ex + "w2.weight"));
        layer.moe.w3.push_back(weight(model, ex + "w3.weight"));
      }
    } else {
      layer.gate = weight(model, pre + "mlp.gate_proj.weight");
      layer.up = weight(model, pre + "mlp.up_proj.weight");
      layer.down = weight(model, pre + "mlp.down_proj.weight");
    }
    layer.keys.resize(static_cast<size_t>(max_positions * kv));
    layer.values.resize(static_cast<size_t>(max_positions * kv));
    layers_.push_back(std::move(layer));
  }
  if (c.moe()) {
    const MoeShape shape{H, F, c.num_experts, c.experts_per_token};
    moe_workspace_.emplace(shape, max_positions, Device::CPU, DType::F32, false);
    moe_.emplace(shape, max_positions, *moe_workspace_);
  }
  const auto rows = [&](int64_t width) { return static_cast<size_t>(max_positions * width); };
  x_.resize(rows(H));
  normed_.resize(rows(H));
  mid_.resize(rows(H));
  q_.resize(rows(qdim));
  attn_.resize(rows(qdim));
  lse_.resize(rows(c.num_heads));
  rstd_.resize(rows(1));
  if (!c.moe()) {
    gate_.resize(rows(F));
    up_.resize(rows(F));
    act_.resize(rows(F));
  }
  logits_.resize(static_cast<size_t>(c.vocab_size));
}

std::span<const float> CachedDecoder::append(std::span<const int32_t> tokens) {
  const ModelConfig& c = config_;
  const int64_t T = static_cast<int64_t>(tokens.size()), begin = length_, end = length_ + T;
  if (T == 0) throw std::invalid_argument("cached decoder: nothing to append");
  if (end > max_positions_)
    throw std::length_error("cached decoder: " + std::to_string(end) + " positions exceed the cache of " +
                            std::to_string(max_positions_));
  const int64_t H = c.hidden_size, Hq = c.num_heads, Hkv = c.num_kv_heads, d = c.head_dim(), F = c.ffn_hidden_size;
  const float eps = static_cast<float>(c.norm_eps);
  tokens_.assign(tokens.begin(), tokens.end());
  positions_.resize(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) positions_[t] = static_cast<int32_t>(begin + t);
  const IndexTensor token_ids(tokens_.data(), {T}), positions(positions_.data(), {T});
  const Tensor x(x_.data(), {T, H}), normed(normed_.data(), {T, H}), mid(mid_.data(), {T, H});
  const Tensor q(q_.data(), {T, Hq * d}), attn(attn_.data(), {T, Hq * d}), lse(lse_.data(), {Hq, T});
  const Tensor rstd(rstd_.data(), {T});
  // The new queries against every cached key, masked by true positions (and the window).
  const AttentionBlock block{0, static_cast<int32_t>(T), 0, static_cast<int32_t>(end), static_cast<int32_t>(begin), 0};

  embedding_forward(x, token_ids, embed_, /*vocab_begin=*/0);
  for (size_t l = 0; l < layers_.size(); ++l) {
    Layer& w = layers_[l];
    const Tensor keys(w.keys.data(), {max_positions_, Hkv * d}), values(w.values.data(), {max_positions_, Hkv * d});
    const Tensor new_keys = keys.rows(begin, end), new_values = values.rows(begin, end);
    rmsnorm_forward(normed, rstd, x, w.input_norm, eps);
    linear_forward(q, normed, w.q);
    linear_forward(new_keys, normed, w.k);
    linear_forward(new_values, normed, w.v);
    rope_forward(q.view({T, Hq, d}), positions, c, new_keys.view({T, Hkv, d}));
    attention_reset_rows(attn.view({T, Hq, d}), lse, 0, T);
    attention_forward_blocks(attn.view({T, Hq, d}), lse, q.view({T, Hq, d}), keys.rows(0, end).view({end, Hkv, d}),
                             values.rows(0, end).view({end, Hkv, d}), std::span(&block, 1), c.attention_window());
    linear_forward(mid, attn, w.o, x);
    rmsnorm_forward(normed, rstd, mid, w.post_norm, eps);
    if (c.moe()) {
      moe_->forward(x, normed, w.moe);
      add_inplace(x, mid);
    } else {
      const Tensor gate(gate_.data(), {T, F}), up(up_.data(), {T, F}), act(act_.data(), {T, F});
      linear_forward(gate, normed, w.gate);
      linear_forward(up, normed, w.up);
      swiglu_forward(act, gate, up);
      linear_forward(x, act, w.down, mid);
    }
  }
  length_ = end;
  // The final norm and the LM head for the last position only.
  const Tensor last_normed = normed.rows(0, 1);
  rmsnorm_forward(last_normed, rstd.rows(0, 1), x.rows(T - 1, T), final_norm_, eps);
  linear_forward(Tensor(logits_.data(), {1, c.vocab_size}), last_normed, head_);
  return logits_;
}

}  // namespace hdp

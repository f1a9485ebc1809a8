#include "model/decoder_blocks.h"

#include <algorithm>

#include "kernels/ops.h"

namespace hdp {

DecoderBlocks::DecoderBlocks(const ModelConfig& config, const ModelSlice& slice, Communicator* tp,
                             RingAttention* ring_attention, const ActivationScratch& scratch)
    : heads_(slice.heads),
      kv_heads_(slice.kv_heads),
      head_dim_(config.head_dim()),
      window_(config.attention_window()),
      vocab_begin_(slice.vocab_begin),
      norm_eps_(static_cast<float>(config.norm_eps)),
      rope_(config),
      tp_(tp),
      regions_(tp),
      ring_attention_(ring_attention),
      scratch_(scratch) {}

// ---- token embedding (vocabulary-parallel: each rank looks up the tokens of its range) ----

void DecoderBlocks::token_embedding_forward(Tensor x, const MicroBatchSlot& s, const Tensor& embed) {
  embedding_forward(x, s.tokens.rows(0, s.tokens_used), embed, vocab_begin_);
  regions_.embedding_output.forward(x);
}

void DecoderBlocks::token_embedding_backward(Tensor d_embed, const MicroBatchSlot& s) {
  const int64_t T = s.tokens_used;
  const Tensor dx = regions_.embedding_output.backward(scratch_.residual_grad.rows(0, T));
  embedding_backward(d_embed, s.tokens.rows(0, T), dx, vocab_begin_);
}

// ---- attention block ----

void DecoderBlocks::attention_projections(const MicroBatchSlot& s, const LayerTensors& w, const LayerActivations& a) {
  const int64_t T = s.tokens_used;
  const IndexTensor positions = s.positions.rows(0, T);
  rmsnorm_forward(a.ln1, a.rstd1, a.x_in, w.input_norm, norm_eps_);
  const Tensor attention_in = regions_.attention_input.forward(a.ln1);
  linear_forward(a.q, attention_in, w.q);
  linear_forward(a.k, attention_in, w.k);
  linear_forward(a.v, attention_in, w.v);
  rope_forward(a.q.view({T, heads_, head_dim_}), positions, rope_);
  rope_forward(a.k.view({T, kv_heads_, head_dim_}), positions, rope_);
}

void DecoderBlocks::attention_core(const MicroBatchSlot& s, const LayerActivations& a) {
  const int64_t T = s.tokens_used, Hq = heads_, Hkv = kv_heads_, d = head_dim_;
  const Tensor out = a.attn.view({T, Hq, d}), q = a.q.view({T, Hq, d}), k = a.k.view({T, Hkv, d}),
               v = a.v.view({T, Hkv, d});
  if (s.has_ring) {
    ring_attention_->forward(out, a.lse, q, k, v, s.local_blocks, s.ring, s.ring_begin);
  } else {
    attention_forward(out, a.lse, q, k, v, s.cu_seqlens.rows(0, s.num_sequences + 1), window_);
  }
}

void DecoderBlocks::attention_residual(const LayerTensors& w, const LayerActivations& a) {
  linear_forward(a.x_mid, a.attn, w.o);
  regions_.attention_output.forward(a.x_mid);
  add_inplace(a.x_mid, a.x_in);
}

void DecoderBlocks::attention_block_forward(const MicroBatchSlot& s, const LayerTensors& w, const LayerActivations& a) {
  attention_projections(s, w, a);
  attention_core(s, a);
  attention_residual(w, a);
}

void DecoderBlocks::attention_block_recompute(const MicroBatchSlot& s, const LayerTensors& w,
                                              const LayerActivations& a, RecomputeMode mode) {
  if (mode == RecomputeMode::Selective) {
    rmsnorm_forward(a.ln1, a.rstd1, a.x_in, w.input_norm, norm_eps_);
    return;
  }
  attention_projections(s, w, a);
  if (!s.has_ring) attention_core(s, a);
  attention_residual(w, a);
}

void DecoderBlocks::attention_block_backward(const MicroBatchSlot& s, const LayerTensors& w, const LayerTensors& dw,
                                             const LayerActivations& a) {
  const int64_t T = s.tokens_used, Hq = heads_, Hkv = kv_heads_, d = head_dim_;
  const IndexTensor positions = s.positions.rows(0, T);
  const ActivationScratch& sc = scratch_;
  const Tensor dres = sc.residual_grad.rows(0, T), dnorm = sc.norm_grad.rows(0, T);
  const Tensor dattn = sc.dattn.rows(0, T), dq = sc.dq.rows(0, T), dk = sc.dk.rows(0, T), dv = sc.dv.rows(0, T);
  // dres is the gradient of x_mid.
  linear_backward(dattn, dw.o, regions_.attention_output.backward(dres), a.attn, w.o, false);
  const Tensor dq3 = dq.view({T, Hq, d}), dk3 = dk.view({T, Hkv, d}), dv3 = dv.view({T, Hkv, d}),
               dout = dattn.view({T, Hq, d});
  const Tensor out = a.attn.view({T, Hq, d}), q = a.q.view({T, Hq, d}), k = a.k.view({T, Hkv, d}),
               v = a.v.view({T, Hkv, d});
  if (s.has_ring) {
    ring_attention_->backward(dq3, dk3, dv3, dout, q, k, v, out, a.lse, s.local_blocks, s.ring, s.ring_begin);
  } else {
    attention_backward(dq3, dk3, dv3, dout, q, k, v, out, a.lse, s.cu_seqlens.rows(0, s.num_sequences + 1), window_);
  }
  rope_backward(dq3, positions, rope_);
  rope_backward(dk3, positions, rope_);
  linear_backward(dnorm, dw.q, dq, a.ln1, w.q, false);
  linear_backward(dnorm, dw.k, dk, a.ln1, w.k, true);
  linear_backward(dnorm, dw.v, dv, a.ln1, w.v, true);
  regions_.attention_input.backward(dnorm);
  rmsnorm_backward(dres, dw.input_norm, dnorm, a.x_in, w.input_norm, a.rstd1);
}

// ---- MLP block (SwiGLU) ----

void DecoderBlocks::post_attention_norm(const LayerTensors& w, const LayerActivations& a) {
  rmsnorm_forward(a.ln2, a.rstd2, a.x_mid, w.post_norm, norm_eps_);
}

void DecoderBlocks::mlp_projections(const LayerTensors& w, const LayerActivations& a) {
  post_attention_norm(w, a);
  const Tensor mlp_in = regions_.mlp_input.forward(a.ln2);
  linear_forward(a.gate, mlp_in, w.gate);
  linear_forward(a.up, mlp_in, w.up);
}

void DecoderBlocks::mlp_block_forward(Tensor out, const MicroBatchSlot& s, const LayerTensors& w,
                                      const LayerActivations& a, const CopyEvent& out_free) {
  const Tensor act = scratch_.ffn_act.rows(0, s.tokens_used);
  mlp_projections(w, a);
  swiglu_forward(act, a.gate, a.up);
  out_free.wait();
  linear_forward(out, act, w.down);
  regions_.mlp_output.forward(out);
  add_inplace(out, a.x_mid);
}

void DecoderBlocks::mlp_block_recompute(const LayerTensors& w, const LayerActivations& a, RecomputeMode mode) {
  if (mode == RecomputeMode::Selective) {
    post_attention_norm(w, a);
  } else {
    mlp_projections(w, a);
  }
}

void DecoderBlocks::mlp_block_backward(const MicroBatchSlot& s, const LayerTensors& w, const LayerTensors& dw,
                                       const LayerActivations& a) {
  const int64_t T = s.tokens_used;
  const ActivationScratch& sc = scratch_;
  const Tensor dres = sc.residual_grad.rows(0, T), dnorm = sc.norm_grad.rows(0, T);
  const Tensor act = sc.ffn_act.rows(0, T), dact = sc.dffn_act.rows(0, T), dgate = sc.dgate.rows(0, T),
               dup = sc.dup.rows(0, T);
  // dres is the gradient of the layer output.
  swiglu_forward(act, a.gate, a.up);  // recomputed rather than stored
  linear_backward(dact, dw.down, regions_.mlp_output.backward(dres), act, w.down, false);
  swiglu_backward(dgate, dup, dact, a.gate, a.up);
  linear_backward(dnorm, dw.gate, dgate, a.ln2, w.gate, false);
  linear_backward(dnorm, dw.up, dup, a.ln2, w.up, true);
  regions_.mlp_input.backward(dnorm);
  rmsnorm_backward(dres, dw.post_norm, dnorm, a.x_mid, w.post_norm, a.rstd2);
}

// ---- MoE block (Mixtral; its tp all-reduces are its own) ----

void DecoderBlocks::moe_block_forward(Tensor out, MoeBlock& moe, const LayerTensors& w, const LayerActivations& a,
                                      const CopyEvent& out_free) {
  post_attention_norm(w, a);
  out_free.wait();
  moe.forward(out, a.ln2, w.moe);
  add_inplace(out, a.x_mid);
}

void DecoderBlocks::moe_block_recompute(const LayerTensors& w, const LayerActivations& a) { post_attention_norm(w, a); }

void DecoderBlocks::moe_block_backward(const MicroBatchSlot& s, MoeBlock& moe, const LayerTensors& w,
                                       const LayerTensors& dw, const LayerActivations& a,
                                       std::span<const double> aux_grad) {
  const int64_t T = s.tokens_used;
  const Tensor dres = scratch_.residual_grad.rows(0, T), dnorm = scratch_.norm_grad.rows(0, T);
  // dres is the gradient of the layer output; the router also gets the pooled
  // load-balancing loss's gradient.
  moe.backward(dnorm, dw.moe, dres, a.ln2, w.moe, aux_grad);
  rmsnorm_backward(dres, dw.post_norm, dnorm, a.x_mid, w.post_norm, a.rstd2);
}

// ---- head: final norm, LM head, cross-entropy ----

// The LM head and loss run chunk by chunk over tokens; with backward, each chunk's
// logits are turned into their gradient in place and pushed through the head at
// once, so only one [chunk, vocab] buffer ever exists.
double DecoderBlocks::head_forward(const MicroBatchSlot& s, const EndParameters& p, float loss_scale,
                                   bool with_backward) {
  const int64_t T = s.tokens_used, chunk = scratch_.head_chunk_tokens;
  const ActivationScratch& sc = scratch_;
  rmsnorm_forward(s.ln_final.rows(0, T), s.rstd_final.rows(0, T), s.x_out.rows(0, T), p.final_norm, norm_eps_);
  double loss_sum = 0;
  for (int64_t c0 = 0; c0 < T; c0 += chunk) {
    const int64_t c1 = std::min(T, c0 + chunk);
    const Tensor ln = s.ln_final.rows(c0, c1), logits = sc.logits.rows(0, c1 - c0);
    linear_forward(logits, regions_.head_input.forward(ln), p.head);
    loss_sum += vocab_parallel_cross_entropy(tp_, logits, s.targets.rows(c0, c1), vocab_begin_, loss_scale,
                                             sc.ce_stats, sc.ce_global);
    if (with_backward) linear_backward(sc.norm_grad.rows(c0, c1), p.d_head, logits, ln, p.head, false);
  }
  if (with_backward) regions_.head_input.backward(sc.norm_grad.rows(0, T));
  return loss_sum;
}

void DecoderBlocks::head_backward(const MicroBatchSlot& s, const EndParameters& p) {
  const int64_t T = s.tokens_used;
  const Tensor dres = scratch_.residual_grad.rows(0, T);
  fill(dres, 0.0f);
  rmsnorm_backward(dres, p.d_final_norm, scratch_.norm_grad.rows(0, T), s.x_out.rows(0, T), p.final_norm,
                   s.rstd_final.rows(0, T));
}

}  // namespace hdp

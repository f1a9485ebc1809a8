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
      sequence_shards_(slice.sequence_shards),
      norm_eps_(static_cast<float>(config.norm_eps)),
      rope_(config),
      tp_(tp),
      regions_(tp),
      ring_attention_(ring_attention),
      scratch_(scratch) {}

// ---- the tensor-parallel entries and exits (f and g, or sequence parallelism's pairs) ----

Tensor DecoderBlocks::whole_rows(const Tensor& scratch, const MicroBatchSlot& s) const {
  return scratch.rows(0, sequence_shards_ * s.shard_rows);
}

Tensor DecoderBlocks::enter(const TensorParallelEntry& e, const MicroBatchSlot& s, const Tensor& normed) const {
  if (sequence_shards_ == 1) return e.copy.forward(normed);
  return e.gather.forward(normed, whole_rows(scratch_.sequence_whole, s)).rows(0, s.tokens_used);
}

Tensor DecoderBlocks::enter_backward(const TensorParallelEntry& e, const MicroBatchSlot& s) const {
  const int64_t T = s.tokens_used;
  if (sequence_shards_ == 1) {
    e.copy.backward(scratch_.norm_grad.rows(0, T));
  } else {
    const Tensor whole = whole_rows(scratch_.norm_grad, s);
    fill(whole.rows(T, whole.dim(0)), 0.0f);  // the padding rows: nothing flows back from them
    e.gather.backward(whole, norm_grad(s));
  }
  return norm_grad(s);
}

Tensor DecoderBlocks::norm_grad(const MicroBatchSlot& s) const {
  return sequence_shards_ == 1 ? scratch_.norm_grad.rows(0, s.tokens_used)
                               : scratch_.norm_grad_shard.rows(0, s.shard_rows);
}

Tensor DecoderBlocks::leave_output(const MicroBatchSlot& s, const Tensor& out) const {
  return sequence_shards_ == 1 ? out : scratch_.sequence_whole.rows(0, s.tokens_used);
}

void DecoderBlocks::leave(const TensorParallelExit& x, const MicroBatchSlot& s, Tensor out) const {
  if (sequence_shards_ == 1) return x.reduce.forward(out);
  const Tensor whole = whole_rows(scratch_.sequence_whole, s);
  fill(whole.rows(s.tokens_used, whole.dim(0)), 0.0f);  // the padding rows stay zero through every layer
  x.scatter.forward(whole, out);
}

Tensor DecoderBlocks::leave_backward(const TensorParallelExit& x, const MicroBatchSlot& s,
                                     const Tensor& out_grad) const {
  if (sequence_shards_ == 1) return x.reduce.backward(out_grad);
  return x.scatter.backward(out_grad, whole_rows(scratch_.sequence_whole, s)).rows(0, s.tokens_used);
}

void DecoderBlocks::norm_backward(Tensor dres, Tensor dw, const Tensor& dnorm, const Tensor& x, const Tensor& w,
                                  const Tensor& rstd) const {
  if (sequence_shards_ == 1) return rmsnorm_backward(dres, dw, dnorm, x, w, rstd);
  // This micro-batch's partial gradient, summed over tp before it is added: every
  // rank then holds the whole gradient of the replicated weight, as without sequence
  // parallelism, which ZeRO's reduction and the gradient norm assume.
  const Tensor partial = scratch_.norm_weight_grad;
  fill(partial, 0.0f);
  rmsnorm_backward(dres, partial, dnorm, x, w, rstd);
  regions_.norm_weights.backward(partial);
  add_inplace(dw, partial);
}

// ---- token embedding (vocabulary-parallel: each rank looks up the tokens of its range) ----

void DecoderBlocks::token_embedding_forward(Tensor x, const MicroBatchSlot& s, const Tensor& embed) {
  embedding_forward(leave_output(s, x), s.tokens.rows(0, s.tokens_used), embed, vocab_begin_);
  leave(regions_.embedding_output, s, x);
}

void DecoderBlocks::token_embedding_backward(Tensor d_embed, const MicroBatchSlot& s) {
  const Tensor dx = leave_backward(regions_.embedding_output, s, scratch_.residual_grad.rows(0, s.shard_rows));
  embedding_backward(d_embed, s.tokens.rows(0, s.tokens_used), dx, vocab_begin_);
}

// ---- attention block ----

void DecoderBlocks::attention_projections(const MicroBatchSlot& s, const LayerTensors& w, const LayerActivations& a) {
  const int64_t T = s.tokens_used;
  const IndexTensor positions = s.positions.rows(0, T);
  rmsnorm_forward(a.ln1, a.rstd1, a.x_in, w.input_norm, norm_eps_);
  const Tensor attention_in = enter(regions_.attention_input, s, a.ln1);
  linear_forward(a.q, attention_in, w.q);
  linear_forward(a.k, attention_in, w.k);
  linear_forward(a.v, attention_in, w.v);
  rope_forward(a.q.view({T, heads_, head_dim_}), positions, rope_, a.k.view({T, kv_heads_, head_dim_}));
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

void DecoderBlocks::row_parallel_residual(const TensorParallelExit& x, const MicroBatchSlot& s, Tensor out,
                                          const Tensor& in, const Tensor& w, const Tensor& residual) const {
  if (!splits(tp_)) return linear_forward(out, in, w, residual);
  linear_forward(leave_output(s, out), in, w);
  leave(x, s, out);
  add_inplace(out, residual);
}

void DecoderBlocks::attention_residual(const MicroBatchSlot& s, const LayerTensors& w, const LayerActivations& a) {
  row_parallel_residual(regions_.attention_output, s, a.x_mid, a.attn, w.o, a.x_in);
}

void DecoderBlocks::attention_block_forward(const MicroBatchSlot& s, const LayerTensors& w, const LayerActivations& a) {
  attention_projections(s, w, a);
  attention_core(s, a);
  attention_residual(s, w, a);
}

void DecoderBlocks::attention_block_recompute(const MicroBatchSlot& s, const LayerTensors& w,
                                              const LayerActivations& a, RecomputeMode mode) {
  if (mode == RecomputeMode::Selective) {
    rmsnorm_forward(a.ln1, a.rstd1, a.x_in, w.input_norm, norm_eps_);
    return;
  }
  attention_projections(s, w, a);
  if (!s.has_ring) attention_core(s, a);
  attention_residual(s, w, a);
}

void DecoderBlocks::attention_block_backward(const MicroBatchSlot& s, const LayerTensors& w, const LayerTensors& dw,
                                             const LayerActivations& a) {
  const int64_t T = s.tokens_used, Hq = heads_, Hkv = kv_heads_, d = head_dim_;
  const IndexTensor positions = s.positions.rows(0, T);
  const ActivationScratch& sc = scratch_;
  const Tensor dres = sc.residual_grad.rows(0, s.shard_rows), dnorm = sc.norm_grad.rows(0, T);
  const Tensor dattn = sc.dattn.rows(0, T), dq = sc.dq.rows(0, T), dk = sc.dk.rows(0, T), dv = sc.dv.rows(0, T);
  // dres is the gradient of x_mid.
  linear_backward(dattn, dw.o, leave_backward(regions_.attention_output, s, dres), a.attn, w.o, false);
  const Tensor dq3 = dq.view({T, Hq, d}), dk3 = dk.view({T, Hkv, d}), dv3 = dv.view({T, Hkv, d}),
               dout = dattn.view({T, Hq, d});
  const Tensor out = a.attn.view({T, Hq, d}), q = a.q.view({T, Hq, d}), k = a.k.view({T, Hkv, d}),
               v = a.v.view({T, Hkv, d});
  if (s.has_ring) {
    ring_attention_->backward(dq3, dk3, dv3, dout, q, k, v, out, a.lse, s.local_blocks, s.ring, s.ring_begin);
  } else {
    attention_backward(dq3, dk3, dv3, dout, q, k, v, out, a.lse, s.cu_seqlens.rows(0, s.num_sequences + 1), window_);
  }
  rope_backward(dq3, positions, rope_, dk3);
  const Tensor attention_in = enter(regions_.attention_input, s, a.ln1);
  linear_backward(dnorm, dw.q, dq, attention_in, w.q, false);
  linear_backward(dnorm, dw.k, dk, attention_in, w.k, true);
  linear_backward(dnorm, dw.v, dv, attention_in, w.v, true);
  norm_backward(dres, dw.input_norm, enter_backward(regions_.attention_input, s), a.x_in, w.input_norm, a.rstd1);
}

// ---- MLP block (SwiGLU) ----

void DecoderBlocks::post_attention_norm(const LayerTensors& w, const LayerActivations& a) {
  rmsnorm_forward(a.ln2, a.rstd2, a.x_mid, w.post_norm, norm_eps_);
}

void DecoderBlocks::mlp_projections(const MicroBatchSlot& s, const LayerTensors& w, const LayerActivations& a) {
  post_attention_norm(w, a);
  const Tensor mlp_in = enter(regions_.mlp_input, s, a.ln2);
  linear_forward(a.gate, mlp_in, w.gate);
  linear_forward(a.up, mlp_in, w.up);
}

void DecoderBlocks::mlp_block_forward(Tensor out, const MicroBatchSlot& s, const LayerTensors& w,
                                      const LayerActivations& a, const CopyEvent& out_free) {
  const Tensor act = scratch_.ffn_act.rows(0, s.tokens_used);
  mlp_projections(s, w, a);
  swiglu_forward(act, a.gate, a.up);
  out_free.wait();
  row_parallel_residual(regions_.mlp_output, s, out, act, w.down, a.x_mid);
}

void DecoderBlocks::mlp_block_recompute(const MicroBatchSlot& s, const LayerTensors& w, const LayerActivations& a,
                                        RecomputeMode mode) {
  if (mode == RecomputeMode::Selective) {
    post_attention_norm(w, a);
  } else {
    mlp_projections(s, w, a);
  }
}

void DecoderBlocks::mlp_block_backward(const MicroBatchSlot& s, const LayerTensors& w, const LayerTensors& dw,
                                       const LayerActivations& a) {
  const int64_t T = s.tokens_used;
  const ActivationScratch& sc = scratch_;
  const Tensor dres = sc.residual_grad.rows(0, s.shard_rows), dnorm = sc.norm_grad.rows(0, T);
  const Tensor act = sc.ffn_act.rows(0, T), dact = sc.dffn_act.rows(0, T), dgate = sc.dgate.rows(0, T),
               dup = sc.dup.rows(0, T);
  // dres is the gradient of the layer output. The SwiGLU output is recomputed rather
  // than stored, by the backward kernel from its own loads of gate and up, between
  // the down projection's input gradient (which does not need it) and its weight
  // gradient (which does).
  const Tensor dy = leave_backward(regions_.mlp_output, s, dres);
  linear_backward(dact, Tensor(), dy, act, w.down, false);
  swiglu_backward(dgate, dup, dact, a.gate, a.up, act);
  linear_backward(Tensor(), dw.down, dy, act, w.down, false);
  const Tensor mlp_in = enter(regions_.mlp_input, s, a.ln2);
  linear_backward(dnorm, dw.gate, dgate, mlp_in, w.gate, false);
  linear_backward(dnorm, dw.up, dup, mlp_in, w.up, true);
  norm_backward(dres, dw.post_norm, enter_backward(regions_.mlp_input, s), a.x_mid, w.post_norm, a.rstd2);
}

// ---- MoE block (Mixtral; its tp all-reduces are its own, and it runs without sequence parallelism) ----

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
void DecoderBlocks::head_forward(const MicroBatchSlot& s, const EndParameters& p, float loss_scale,
                                 bool with_backward, DoubleTensor loss_sum) {
  const int64_t T = s.tokens_used, n = s.shard_rows, chunk = scratch_.head_chunk_tokens;
  const ActivationScratch& sc = scratch_;
  rmsnorm_forward(s.ln_final.rows(0, n), s.rstd_final.rows(0, n), s.x_out.rows(0, n), p.final_norm, norm_eps_);
  const Tensor head_in = enter(regions_.head_input, s, s.ln_final.rows(0, n));
  for (int64_t c0 = 0; c0 < T; c0 += chunk) {
    const int64_t c1 = std::min(T, c0 + chunk);
    const Tensor ln = head_in.rows(c0, c1), logits = sc.logits.rows(0, c1 - c0);
    linear_forward(logits, ln, p.head);
    vocab_parallel_cross_entropy(tp_, logits, s.targets.rows(c0, c1), vocab_begin_, loss_scale, sc.ce_stats,
                                 sc.ce_global, loss_sum);
    if (with_backward) linear_backward(sc.norm_grad.rows(c0, c1), p.d_head, logits, ln, p.head, false);
  }
  if (with_backward) enter_backward(regions_.head_input, s);
}

void DecoderBlocks::head_backward(const MicroBatchSlot& s, const EndParameters& p) {
  const int64_t n = s.shard_rows;
  const Tensor dres = scratch_.residual_grad.rows(0, n);
  fill(dres, 0.0f);
  norm_backward(dres, p.d_final_norm, norm_grad(s), s.x_out.rows(0, n), p.final_norm, s.rstd_final.rows(0, n));
}

}  // namespace hdp

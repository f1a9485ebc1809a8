#pragma once
// The math of one rank's part of the decoder, block by block, each block's forward
// beside its backward (as llm.c keeps each layer's): the token embedding, the
// attention block, the MLP block (or Mixtral's MoE block in its place), and the head
// (final norm, LM head and cross-entropy). The blocks follow Hugging Face
// LlamaForCausalLM: pre-norm residual blocks, RMSNorm, rotate-half RoPE,
// grouped-query causal attention (with Mistral's sliding window when the config has
// one), SwiGLU, no biases. They run on the kernels (kernels/ops.h), read the
// parameters' views (model/parameters.h) and the slot's saved activations
// (model/activations.h), and own nothing but the places of the tensor-parallel
// collectives.
//
// Tensor parallelism is Megatron's (Shoeybi et al. 2019): q/k/v and gate/up are
// column-parallel behind f, o and down row-parallel followed by g, the embedding
// and LM head vocabulary-parallel (parallel/tensor_parallel.h). With sequence
// parallelism (Korthikanti et al. 2022) the norms and the residual adds run on this
// rank's shard of the sequence (ModelSlice::shard_rows), f becomes an all-gather
// and g a reduce-scatter; the norm outputs are kept as shards and gathered again in
// backward, as Megatron does.
//
// Activation recomputation (spec/model_shape.h, RecomputeMode): a layer that kept
// only part of its forward reruns the rest at the start of its backward with the
// same kernels in the same order (each block's *_recompute, beside its forward), so
// the rebuilt tensors are bit-identical to forward's and so are the gradients.
//
// Backward runs on the scratch's residual_grad (d of the residual stream at the
// block's output on entry, at its input on return; a shard's rows under sequence
// parallelism) and norm_grad, and adds into the gradients.

#include <cstdint>
#include <span>

#include "kernels/copy_engine.h"
#include "kernels/tensor.h"
#include "model/activations.h"
#include "model/moe.h"
#include "model/parameters.h"
#include "model/partition.h"
#include "parallel/communicator.h"
#include "parallel/ring_attention.h"
#include "parallel/tensor_parallel.h"
#include "spec/model_config.h"
#include "spec/model_shape.h"

namespace hdp {

class DecoderBlocks {
 public:
  // tp: the tensor-parallel group (nullptr without one); ring_attention: attention
  // across the ranks of a ring, for micro-batches that take part in one (nullptr: none).
  DecoderBlocks(const ModelConfig& config, const ModelSlice& slice, Communicator* tp, RingAttention* ring_attention,
                const ActivationScratch& scratch);

  // x [T, H] = the rows of embed for the slot's tokens (this rank's vocabulary range).
  void token_embedding_forward(Tensor x, const MicroBatchSlot& s, const Tensor& embed);
  void token_embedding_backward(Tensor d_embed, const MicroBatchSlot& s);

  // a.x_mid = a.x_in + o(attention(rope(q), rope(k), v)), q, k, v of rmsnorm(a.x_in).
  void attention_block_forward(const MicroBatchSlot& s, const LayerTensors& w, const LayerActivations& a);
  // What backward needs of the attention block that `mode` did not keep: selective,
  // ln1 and its 1/rms; full, the whole block but attention itself when the
  // micro-batch takes part in a ring (its output and log-sum-exp were kept).
  void attention_block_recompute(const MicroBatchSlot& s, const LayerTensors& w, const LayerActivations& a,
                                 RecomputeMode mode);
  void attention_block_backward(const MicroBatchSlot& s, const LayerTensors& w, const LayerTensors& dw,
                                const LayerActivations& a);

  // out = a.x_mid + down(swiglu(gate, up)), gate and up of rmsnorm(a.x_mid). out_free:
  // the copy that must finish before out is written (offload).
  void mlp_block_forward(Tensor out, const MicroBatchSlot& s, const LayerTensors& w, const LayerActivations& a,
                         const CopyEvent& out_free);
  // What backward needs of the MLP block that `mode` did not keep: ln2 and its
  // 1/rms; full, gate and up too.
  void mlp_block_recompute(const MicroBatchSlot& s, const LayerTensors& w, const LayerActivations& a,
                           RecomputeMode mode);
  void mlp_block_backward(const MicroBatchSlot& s, const LayerTensors& w, const LayerTensors& dw,
                          const LayerActivations& a);

  // Mixtral: out = a.x_mid + moe(rmsnorm(a.x_mid)) (model/moe.h). aux_grad: the
  // load-balancing loss's gradient per router probability (MoeLayers).
  void moe_block_forward(Tensor out, MoeBlock& moe, const LayerTensors& w, const LayerActivations& a,
                         const CopyEvent& out_free);
  // ln2 and its 1/rms: the experts keep their own routed rows (model/moe.h).
  void moe_block_recompute(const LayerTensors& w, const LayerActivations& a);
  void moe_block_backward(const MicroBatchSlot& s, MoeBlock& moe, const LayerTensors& w, const LayerTensors& dw,
                          const LayerActivations& a, std::span<const double> aux_grad);

  // The final norm of the stage output, the LM head and the cross-entropy: adds the sum
  // of the predicted tokens' cross-entropies, chunk by chunk, into loss_sum[0] on the
  // device (kernels/ops.h; nothing is read back). With backward, the LM head's gradient
  // (of the loss times loss_scale) is computed at once, chunk by chunk, into d_head and
  // norm_grad; head_backward then takes it through the final norm.
  void head_forward(const MicroBatchSlot& s, const EndParameters& p, float loss_scale, bool with_backward,
                    DoubleTensor loss_sum);
  void head_backward(const MicroBatchSlot& s, const EndParameters& p);

 private:
  // The pieces forward and recomputation share: the attention block's norm, q, k, v
  // and RoPE; attention itself; o and the residual; the MLP's (or MoE's) norm; its
  // gate and up.
  void attention_projections(const MicroBatchSlot& s, const LayerTensors& w, const LayerActivations& a);
  void attention_core(const MicroBatchSlot& s, const LayerActivations& a);
  void attention_residual(const MicroBatchSlot& s, const LayerTensors& w, const LayerActivations& a);
  void post_attention_norm(const LayerTensors& w, const LayerActivations& a);
  void mlp_projections(const MicroBatchSlot& s, const LayerTensors& w, const LayerActivations& a);

  // Where the stage's tensor-parallel collectives are: one region per place, whose
  // forward the forward pass runs and whose backward the backward pass runs. An
  // entry into column-parallel layers is Megatron's f, or under sequence parallelism
  // the all-gather of the shards; an exit from row-parallel layers is g, or the
  // reduce-scatter onto the shards.
  struct TensorParallelEntry {
    explicit TensorParallelEntry(Communicator* tp) : copy(tp), gather(tp) {}
    CopyToTensorParallelRegion copy;
    GatherFromSequenceParallelRegion gather;
  };
  struct TensorParallelExit {
    explicit TensorParallelExit(Communicator* tp) : reduce(tp), scatter(tp) {}
    ReduceFromTensorParallelRegion reduce;
    ReduceScatterToSequenceParallelRegion scatter;
  };
  struct TensorParallelRegions {
    explicit TensorParallelRegions(Communicator* tp)
        : embedding_output(tp), attention_input(tp), attention_output(tp), mlp_input(tp), mlp_output(tp),
          head_input(tp), norm_weights(tp) {}
    TensorParallelExit embedding_output;   // each rank looked up the tokens of its vocabulary slice
    TensorParallelEntry attention_input;   // into the column-parallel q, k, v (heads split)
    TensorParallelExit attention_output;   // out of the row-parallel o: the heads' partial outputs
    TensorParallelEntry mlp_input;         // into the column-parallel gate and up (FFN split)
    TensorParallelExit mlp_output;         // out of the row-parallel down
    TensorParallelEntry head_input;        // into the vocabulary-parallel LM head
    // Sequence parallelism: every rank's norms see only its shard's rows, so a norm
    // weight (replicated) gets a partial gradient from each, summed as f sums an
    // input's (Megatron's "sequence_parallel" parameters).
    CopyToTensorParallelRegion norm_weights;
  };

  // The column-parallel layers' input from a norm output: the norm output itself
  // (f), or under sequence parallelism the shards all-gathered into the whole
  // sequence's scratch; its first T rows. Run again in backward: the weight
  // gradients need the input, which sequence parallelism keeps only as the shard.
  Tensor enter(const TensorParallelEntry& e, const MicroBatchSlot& s, const Tensor& normed) const;
  // Backward of enter, once the column-parallel layers wrote the gradient of its
  // output into norm_grad's first T rows: the gradient of the norm output, summed over
  // the ranks (all-reduced in place, or reduce-scattered onto norm_grad_shard).
  Tensor enter_backward(const TensorParallelEntry& e, const MicroBatchSlot& s) const;
  // The norm output's gradient that enter_backward left (what the norm's backward reads).
  Tensor norm_grad(const MicroBatchSlot& s) const;
  // Where the row-parallel layer ahead of an exit (leave) writes its partial output: `out`, or
  // under sequence parallelism the first T rows of the whole sequence's scratch.
  Tensor leave_output(const MicroBatchSlot& s, const Tensor& out) const;
  // Sums the ranks' partial outputs into out (g's all-reduce in place, or the
  // reduce-scatter of the whole sequence, its padding rows zeroed, onto out's shard).
  void leave(const TensorParallelExit& x, const MicroBatchSlot& s, Tensor out) const;
  // Backward of leave: the gradient of the partial output, whole (the residual
  // gradient itself, or its shards all-gathered); its first T rows.
  Tensor leave_backward(const TensorParallelExit& x, const MicroBatchSlot& s, const Tensor& out_grad) const;
  // out = the row-parallel layer (in w^T) through exit x, plus the residual stream.
  // Without tensor parallelism the GEMM adds the residual in its epilogue
  // (kernels/ops.h: one pass fewer and, in bf16, one rounding fewer); with it the
  // ranks' partial outputs are summed (leave) before the add.
  void row_parallel_residual(const TensorParallelExit& x, const MicroBatchSlot& s, Tensor out, const Tensor& in,
                             const Tensor& w, const Tensor& residual) const;
  // RMSNorm's backward, its weight gradient summed over tp under sequence parallelism.
  void norm_backward(Tensor dres, Tensor dw, const Tensor& dnorm, const Tensor& x, const Tensor& w,
                     const Tensor& rstd) const;
  // The whole padded sequence's rows of a scratch under sequence parallelism.
  Tensor whole_rows(const Tensor& scratch, const MicroBatchSlot& s) const;

  int64_t heads_, kv_heads_, head_dim_, window_, vocab_begin_;
  int sequence_shards_;  // ModelSlice::sequence_shards
  float norm_eps_;
  RopeSettings rope_;
  Communicator* tp_;
  TensorParallelRegions regions_;
  RingAttention* ring_attention_;
  const ActivationScratch& scratch_;
};

}  // namespace hdp

#pragma once
// The activation memory of one rank's part of the model: per micro-batch in flight
// (a slot: pipeline schedules keep several forwards ahead of their backwards) its
// tokens and what every layer's forward saves for its backward, plus the scratch that
// backward and the LM head reuse across layers and slots. One arena is laid out at
// construction for the largest micro-batch, so a step allocates nothing; each
// micro-batch then carves its layers' blocks from its slot's region.
//
// Selective offload (as ByteScale does it): a micro-batch may send part of the rows
// its layers saved to a host pool during forward and bring them back during backward,
// on a copy engine (kernels/copy_engine.h) whose copies overlap the compute.
//
// Activation recomputation (spec/model_shape.h, RecomputeMode): a micro-batch's
// first recompute_layers layers keep only part of what they save in their own
// blocks; the rest of their tensors live in one shared layer block, which each of
// them overwrites in forward and which backward rebuilds for one layer at a time
// (DecoderBlocks' *_recompute). Recomputed layers are never offloaded: offload and
// recomputation are alternatives per layer. The count is the model's for every
// micro-batch, or (ActivationCapacity::planned_recompute) each micro-batch's own,
// as the step planner chose it with its offload ratio (planning/activation_mix.h).
//
// Sequence parallelism (ModelSlice::shard_rows): the norms' and the residual
// stream's tensors (x_in, ln1, x_mid, ln2 and the two 1/rms; the stage output and
// the final norm) hold this rank's shard of the sequence, the others all its rows.
// Offload, which moves the same rows of every tensor, is refused with it.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/copy_engine.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"
#include "kernels/upload_staging.h"
#include "model/partition.h"
#include "planning/ring_layout.h"
#include "spec/model_config.h"
#include "spec/model_shape.h"

namespace hdp {

// A micro-batch as the model sees it (host memory): whole sequences packed back to
// back, then (when it takes part in a ring) this rank's zig-zag chunks of the
// ring's sequences.
struct MicroBatchView {
  std::span<const int32_t> tokens;
  std::span<const int32_t> targets;     // -1 where nothing is predicted
  std::span<const int32_t> positions;   // true positions in their sequences (RoPE, causal masks)
  std::span<const int32_t> cu_seqlens;  // boundaries of the whole sequences: first 0, last = ring_begin
  const RingLayout* ring = nullptr;     // rows [cu_seqlens.back(), tokens.size()) are ring rows
  double offload_ratio = 0;             // fraction of rows whose saved activations go to host memory
  // With ActivationCapacity::planned_recompute: how many of the slot's first layers
  // recompute for this micro-batch (0 .. ActivationCapacity::recompute_layers); 0
  // otherwise (the model's count applies).
  int64_t recompute_layers = 0;
};

// Activation memory actually used, for reports and tests.
struct ActivationUsage {
  size_t device_peak_bytes = 0;     // the most of the device activation memory any micro-batch used
  size_t host_pool_bytes = 0;       // reserved host memory for offloaded activations
  size_t host_peak_bytes = 0;       // the most of it any micro-batch used
  int64_t offloaded_bytes = 0;      // copied to host so far (cumulative)
};

// What one layer's forward saves for its backward. The "row" tensors ([T, width])
// can be split by rows for offload; rstd1, rstd2 and lse are small and stay.
struct LayerActivations {
  Tensor x_in, rstd1, ln1, q, k, v, attn, lse, x_mid, rstd2, ln2, gate, up;
};

// One micro-batch in flight: its tokens on the device, how attention sees it, and
// where each layer's saved activations are.
struct MicroBatchSlot {
  IndexTensor tokens, targets, positions, cu_seqlens;
  int64_t tokens_used = 0;
  int64_t shard_rows = 0;        // rows of the norms' and residual stream's tensors (ModelSlice::shard_rows)
  int64_t num_sequences = 0;     // whole sequences (cu_seqlens)
  int64_t ring_begin = 0;        // first ring row (tokens_used without a ring)
  bool has_ring = false;
  RingLayout ring;
  std::vector<AttentionBlock> local_blocks;  // whole sequences as attention blocks (ring micro-batches)
  Tensor region;                 // the slot's device activation memory
  Tensor host;                   // its host pool for offloaded rows (empty without offload)
  // Where each layer's activations are during its forward and backward. Without
  // offload every layer has its own block; with offload the layers that are not
  // recomputed alternate between two working blocks and wait in `kept` (device
  // rows) and `parked` (host rows). A recomputed layer's tensors that it does not
  // keep are the shared block's.
  std::vector<LayerActivations> layers;
  std::vector<LayerActivations> kept, parked;
  std::vector<CopyEvent> offload_done, restore_done;
  int64_t recompute_layers = 0;  // the micro-batch's first layers that recompute
  int64_t keep_rows = 0;         // rows that stay on the device for offloaded layers
  bool offloaded = false;        // layers [recompute_layers, num_layers - 2) go through host memory
  Tensor x_out, rstd_final, ln_final;  // stage output; final norm on the last stage (shard_rows rows)
};

// Reused across layers and slots: backward's gradients of the activations, the MLP's
// activation, the LM head's logits and cross-entropy statistics for one chunk of
// head_chunk_tokens tokens, and the shared block of the recomputed layers (raw
// bytes; empty without recomputation). Under sequence parallelism residual_grad
// holds a shard's rows and norm_grad the whole padded sequence's; the whole
// sequence of the norm outputs (gathered for the column-parallel layers) or of the
// row-parallel layers' partial outputs (before their reduce-scatter), the norm
// gradient's shard and a norm weight's gradient from this micro-batch (summed over
// tp before it is added) have their own (empty without).
struct ActivationScratch {
  Tensor residual_grad, norm_grad, dq, dk, dv, dattn, dgate, dup, ffn_act, dffn_act;
  Tensor sequence_whole, norm_grad_shard, norm_weight_grad;
  Tensor recomputed;
  Tensor logits, ce_stats, ce_global;
  int64_t head_chunk_tokens = 0;
};

// How much activation memory to lay out.
struct ActivationCapacity {
  int64_t capacity_tokens = 0;  // a micro-batch that every layer holds whole
  int64_t max_tokens = 0;       // the largest micro-batch (offloaded or in a ring), >= capacity_tokens
  int slots = 1;                // micro-batches in flight
  bool offload = false;         // keep a host pool and a copy engine for offloaded micro-batches
  bool rings = false;           // micro-batches may take part in ring attention
  RecomputeMode recompute = RecomputeMode::None;
  int64_t recompute_layers = 0; // the stage's first layers that recompute (0 .. its layers)
  // false: every micro-batch recomputes recompute_layers layers; true: each says how
  // many (MicroBatchView::recompute_layers, at most recompute_layers), and the arena
  // holds the worst case the planners' memory limit admits.
  bool planned_recompute = false;
  // The largest micro-batch that offloads: the host pool holds its rows of every
  // offloadable layer (0: max_tokens).
  int64_t offloaded_tokens = 0;
};

class ModelActivations {
 public:
  ModelActivations(const ModelConfig& config, const ModelPartition& partition, const ModelSlice& slice,
                   const ActivationCapacity& capacity, Device device, DType precision);
  ~ModelActivations();
  ModelActivations(const ModelActivations&) = delete;
  ModelActivations& operator=(const ModelActivations&) = delete;

  MicroBatchSlot& slot(int i) { return slots_.at(i); }
  const MicroBatchSlot& slot(int i) const { return slots_.at(i); }
  const ActivationScratch& scratch() const { return scratch_; }

  // Takes a checked micro-batch into `slot`: its tokens to the device, and its layers'
  // blocks (offloaded when batch.offload_ratio > 0). Throws std::invalid_argument when
  // it does not fit the slot's memory, or asks for offload that was not laid out.
  void load(int slot, const MicroBatchView& batch);

  // Offload, in forward: layer `layer` writes its output into the working block that
  // layer - 1 used, whose rows must have left for the host first. The copy to wait for
  // (an empty event when there is none).
  const CopyEvent& output_block_free(const MicroBatchSlot& s, int64_t layer) const;
  // After layer's forward: keeps its first rows (and the small tensors) in a smaller
  // device block and sends the other rows to the host.
  void offload_after_forward(MicroBatchSlot& s, int64_t layer);
  // Before layer's backward: issues the copy-in of the layer below, so that it overlaps
  // this layer's backward, and waits for this layer's rows.
  void restore_before_backward(MicroBatchSlot& s, int64_t layer);

  size_t bytes() const { return arena_.capacity(); }
  const ActivationUsage& usage() const { return usage_; }
  // Floats one layer saves per token for backward (Act(s) = 4 x this x s bytes),
  // averaged over the stage's layers, recomputed or not (rounded up); with planned
  // recomputation a whole layer's (what a micro-batch within the capacity saves).
  int64_t saved_floats_per_token() const;
  // Whether layer `layer` of the slot's micro-batch reruns part of its forward in
  // backward, and how.
  static bool recomputed(const MicroBatchSlot& s, int64_t layer) { return layer < s.recompute_layers; }
  RecomputeMode recompute_mode() const { return recompute_; }
  // The layers every micro-batch recomputes, or with planned_recompute() the most any does.
  int64_t recompute_layers() const { return recompute_layers_; }
  bool planned_recompute() const { return planned_recompute_; }
  // Bytes per token that `layer` saves for backward when it recomputes (it is below
  // recompute_layers()) or not: spec/model_shape.h's saved_bytes_per_token in this
  // precision, for its mode (a ring micro-batch's, when the model has rings).
  double saved_bytes_per_token(int64_t layer) const;
  // The same for a layer that keeps everything, whether or not one of the stage does.
  double whole_layer_bytes_per_token() const;

  // Which of a layer's saved tensors a block holds: one bit per tensor, in the
  // order of LayerActivations (kAllTensors: all of them).
  using TensorSet = uint32_t;

 private:
  void lay_out(Arena& arena);
  size_t layer_block_bytes(int64_t rows, int64_t tokens, TensorSet tensors) const;
  LayerActivations carve_layer(char* base, int64_t rows, int64_t tokens, TensorSet tensors) const;
  TensorSet kept_tensors(bool ring) const;
  bool offloaded_layer(const MicroBatchSlot& s, int64_t layer) const;
  void lay_out_micro_batch(MicroBatchSlot& s, double offload_ratio);
  int64_t fewest_recompute_layers() const { return planned_recompute_ ? 0 : recompute_layers_; }
  void park_layer(MicroBatchSlot& s, int64_t layer);
  void restore_layer(MicroBatchSlot& s, int64_t layer);

  int64_t hidden_, head_dim_, heads_, kv_heads_, ffn_, vocab_, layers_;
  bool has_head_;
  int64_t capacity_, max_tokens_;
  ActivationWidths widths_, kept_widths_;  // values per token of a layer's / a recomputed layer's tensors
  RecomputeMode recompute_;
  int64_t recompute_layers_;
  bool planned_recompute_;
  bool rings_;
  bool offload_;  // micro-batches beyond the capacity may offload (ActivationCapacity)
  int sequence_shards_;  // ModelSlice::sequence_shards
  Device device_;
  DType precision_;  // of the activations
  Arena arena_;
  Arena host_arena_;
  std::unique_ptr<CopyEngine> copy_engine_;
  std::vector<MicroBatchSlot> slots_;
  std::vector<UploadStaging> uploads_;  // per slot: its micro-batch's index lists on their way up (load)
  ActivationScratch scratch_;
  ActivationUsage usage_;
};

}  // namespace hdp

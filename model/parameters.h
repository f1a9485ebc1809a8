#pragma once
// The parameters of one rank's part of the model (model/partition.h): the table of
// its tensors under their Hugging Face names, laid out in one flat fp32 buffer (the
// master weights, which the optimizer, ZeRO and checkpoints use) with a flat buffer of
// their gradients at the same offsets; in bf16 mixed precision (Micikevicius et al.
// 2018) a bf16 copy of the weights, which forward and backward read; the views of
// each layer's tensors that the blocks take; and the initialisation. Everything is
// sized at construction.

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/tensor.h"
#include "model/moe.h"
#include "model/partition.h"
#include "parallel/zero_optimizer.h"
#include "spec/model_config.h"

namespace hdp {

// One tensor inside the flat parameter buffer, under its Hugging Face name.
struct ParameterInfo {
  std::string name;                   // e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;         // this rank's slice, [out, in] for projections
  std::vector<int64_t> global_shape;  // the whole tensor
  int shard_dim = -1;                 // dimension split across tp ranks; -1 = replicated
  int64_t shard_begin = 0;            // this rank's range along shard_dim
  int64_t shard_end = 0;
  int64_t offset = 0;                 // in floats from the start of the flat buffer
  int64_t numel = 0;
  bool weight_decay = false;          // matrices decay; norm weights do not
  bool scaled_init = false;           // output projections: std / sqrt(2 * layers)
  bool ones_init = false;             // norm weights start at 1
  // The last stage's copy of tied embeddings (pipeline parallel): kept equal to the
  // first stage's, which is the one that counts (checkpoints, gradient norm).
  bool tied_copy = false;
  // An expert's weight (Mixtral): under expert parallelism only the ranks that hold the
  // expert have it, and its gradient is reduced over the expert-data-parallel group.
  bool expert = false;
};

// A transformer layer's tensors in one flat buffer (parameters or gradients).
struct LayerTensors {
  Tensor input_norm, q, k, v, o, post_norm, gate, up, down;
  MoeTensors moe;  // Mixtral: the sparse MoE block in place of gate, up, down
};

// One layer of this stage, found by name in the table once, at construction:
// nothing depends on the order of the table.
struct LayerParameters {
  LayerTensors weights, gradients;
  int64_t gradients_begin = 0;  // the lowest flat offset of its tensors (GradientsReady)
};

// The ends of the stack: the embedding on the first stage, the final norm and the LM
// head on the last (empty tensors elsewhere).
struct EndParameters {
  Tensor embed, final_norm, head;         // weights
  Tensor d_embed, d_final_norm, d_head;   // gradients
  int64_t embedding_gradients_begin = 0;  // GradientsReady after the embedding's backward
  int64_t head_gradients_begin = 0;       // after the final norm's and the LM head's
};

class ParameterTable {
 public:
  // precision: DType::BF16 keeps the bf16 compute copy beside the fp32 master weights.
  // Weights and gradients start at zero (init_weights gives the weights values).
  ParameterTable(const ModelConfig& config, const ModelPartition& partition, const ModelSlice& slice, Device device,
                 DType precision);
  ParameterTable(const ParameterTable&) = delete;
  ParameterTable& operator=(const ParameterTable&) = delete;

  // In forward order (embedding, layers, final norm and LM head), so that backward
  // finishes the gradients from the end of the flat buffer down (GradientsReady).
  const std::vector<ParameterInfo>& entries() const { return entries_; }
  // Throws std::out_of_range naming a name the table does not have.
  const ParameterInfo& find(const std::string& name) const;
  const ModelPartition& partition() const { return partition_; }
  bool tie_embeddings() const { return config_.tie_embeddings; }

  // The fp32 master weights, whole or one parameter's [numel]. Handing them out, to
  // read or to write, marks the bf16 copy stale (refresh_compute_weights).
  Tensor master_weights() const;
  Tensor master_weight(const ParameterInfo& p) const;
  Tensor gradients() const { return grads_; }   // fp32
  Tensor gradient(const ParameterInfo& p) const;  // [numel] in the gradients
  // bf16: the weights forward and backward read, rounded from the master weights by
  // refresh_compute_weights(). fp32: the master weights.
  Tensor compute_weights() const { return precision_ == DType::BF16 ? compute_params_ : params_; }
  // Rounds the master weights into the bf16 copy unless it is current (nothing to do
  // in fp32).
  void refresh_compute_weights();
  // The caller has just left the bf16 copy equal to the master weights rounded (the
  // optimizer's update, which rounds what it writes: ZeroAdamW::step), having taken
  // the master weights for that update: the next refresh has nothing to do, unless
  // they are handed out again before it.
  void compute_weights_written() { compute_current_ = true; }
  // Normal(0, init_std) per whole tensor from a stream keyed by (seed, tensor name),
  // then this rank's slice: the weights do not depend on the layout or the partition.
  void init_weights(uint64_t seed);
  void zero_grad();

  int64_t num_parameters() const;  // excluding alignment padding
  size_t parameter_bytes() const { return param_arena_.capacity(); }
  size_t gradient_bytes() const { return grad_arena_.capacity(); }

  // Views of the compute weights and of the gradients, as the blocks read them.
  const LayerParameters& layer(int64_t local_layer) const { return layers_[local_layer]; }
  const EndParameters& ends() const { return ends_; }

 private:
  void build();
  void bind();

  ModelConfig config_;
  ModelPartition partition_;
  ModelSlice slice_;
  Device device_;
  DType precision_;
  std::vector<ParameterInfo> entries_;
  int64_t flat_numel_ = 0;
  Arena param_arena_;
  Arena grad_arena_;
  Tensor params_, grads_;
  Tensor compute_params_;  // bf16 copy of params_ (empty in fp32)
  // Whether compute_params_ equals params_ rounded. A flag on the accessors because a
  // view of the master weights can be written by anyone who holds it: every hand-out
  // clears it, so a refresh is skipped only right after the optimizer's own update
  // (the bf16 pass that saves: the whole fp32 buffer read once a step).
  mutable std::atomic<bool> compute_current_ = false;
  std::vector<LayerParameters> layers_;
  EndParameters ends_;
};

// The table as the optimizer sees it, in entries() order (ZeroAdamW::Segment::parameter
// indexes both). Tensor-parallel replicas count in the gradient norm on tp rank 0
// only, and a tied copy never.
std::vector<FlatParameter> flat_parameters(const ParameterTable& table);

}  // namespace hdp

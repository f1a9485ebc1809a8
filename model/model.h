#pragma once
// A LLaMA decoder (Hugging Face LlamaForCausalLM semantics) with hand-written
// forward and backward over packed micro-batches: the facade that the engine,
// checkpoints and tools use over the rooms the model is built of. Parameters,
// gradients and activations live in flat arenas sized up front from the config and
// the micro-batch capacity, so a training step allocates nothing.
//
// One LlamaModel is one rank's part of the network (model/partition.h): a pipeline
// stage and a tensor-parallel slice of it, and for Mixtral a share of its experts.
// With the default partition it is the whole model on one rank. It holds
//   its parameters: the table, the flat buffers, initialisation (model/parameters.h);
//   its activations: the saved slots, the arena, offload (model/activations.h);
//   for Mixtral, the MoE blocks and their load-balancing loss (model/moe.h);
//   and runs the math block by block (model/decoder_blocks.h).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/tensor.h"
#include "model/activations.h"
#include "model/decoder_blocks.h"
#include "model/moe.h"
#include "model/parameters.h"
#include "model/partition.h"
#include "parallel/communicator.h"
#include "parallel/ring_attention.h"
#include "spec/model_config.h"
#include "spec/model_shape.h"

namespace hdp {

// Memory for micro-batches beyond the plain capacity: long sequences that take
// part in rings, and offloaded micro-batches that hold more tokens than the
// capacity because part of their activations wait in host memory.
struct LongSequenceOptions {
  int64_t max_tokens = 0;          // the largest micro-batch (0: the capacity)
  bool offload = false;            // keep a host pool and a copy engine for offloaded micro-batches
  // The largest micro-batch that offloads, which sizes the host pool (0: max_tokens).
  // Below max_tokens under planned recomputation: the micro-batches above the
  // offload-only limit recompute layers, and their fewer offloaded layers park fewer rows.
  int64_t offloaded_tokens = 0;
  Communicator* hdp = nullptr;     // the ring attention communicator; nullptr: no rings
};

// Activation recomputation (spec/model_shape.h, RecomputeMode): the mode, and how
// many of the stage's layers recompute, counted from the stage's first layer; with
// several model chunks, from each chunk's first layer (nullopt: all of them).
// planned: `layers` is the most; each micro-batch says how many of them recompute
// for it (MicroBatchView::recompute_layers, as the step planner chose), and the
// activation memory holds the worst case (ActivationCapacity::planned_recompute).
struct RecomputeOptions {
  RecomputeMode mode = RecomputeMode::None;
  std::optional<int64_t> layers;
  bool planned = false;
};

// Called during backward: gradients at flat offsets >= `offset` are final for this pass.
using GradientsReady = std::function<void(int64_t offset)>;

class LlamaModel {
 public:
  // capacity_tokens: the plain micro-batch capacity; activation_slots: micro-batches whose
  // forward may be in flight before their backward (pipeline schedules).
  // tp: the tensor-parallel group (nullptr or size 1 without tensor parallelism);
  // ep: Mixtral's expert-parallel group (partition.ep_size ranks; nullptr when 1).
  // precision: DType::F32 runs everything in fp32. DType::BF16 is mixed precision
  // (Micikevicius et al. 2018): the flat parameters and gradients stay fp32 (the
  // master weights, which the optimizer, ZeRO and checkpoints use), forward and
  // backward read a bf16 copy of the parameters (refresh_compute_weights) and
  // keep their activations in bf16; RMSNorm's 1/rms, attention's log-sum-exp and
  // the cross-entropy statistics and loss stay fp32.
  // recompute: which layers rerun part of their forward in backward (throws
  // std::invalid_argument for more layers than the stage, or a chunk, has, or fewer
  // than 0).
  LlamaModel(const ModelConfig& config, int64_t capacity_tokens, const ModelPartition& partition = {},
             int activation_slots = 1, Communicator* tp = nullptr, const LongSequenceOptions& long_sequences = {},
             Device device = Device::CPU,
             DType precision = DType::F32, Communicator* ep = nullptr, const RecomputeOptions& recompute = {});
  // Its parts refer to each other (the blocks read the activations' scratch).
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  const ModelConfig& config() const { return config_; }
  const ModelPartition& partition() const { return partition_; }
  Device device() const { return device_; }
  DType precision() const { return precision_; }
  const ParameterTable& parameter_table() const { return parameters_; }
  const std::vector<ParameterInfo>& parameters() const { return parameters_.entries(); }
  const ParameterInfo& parameter(const std::string& name) const { return parameters_.find(name); }
  Tensor parameter_tensor(const ParameterInfo& p) const { return parameters_.master_weight(p); }
  Tensor gradient_tensor(const ParameterInfo& p) const { return parameters_.gradient(p); }
  Tensor flat_parameters() const { return parameters_.master_weights(); }
  Tensor flat_gradients() const { return parameters_.gradients(); }
  // bf16: the parameters forward and backward read, rounded from the fp32 master
  // weights (flat_parameters()) by refresh_compute_weights(). fp32: flat_parameters().
  Tensor compute_parameters() const { return parameters_.compute_weights(); }
  // Rounds the fp32 master weights into the bf16 copy (nothing to do in fp32). Run
  // after every change of the master weights: init_weights does; the trainer runs
  // it at the start of every step, which covers loads. It skips the pass while the
  // copy is current: right after the optimizer's update, which rounds what it writes
  // and says so (compute_parameters_written), unless the master weights were handed
  // out since (ParameterTable::master_weights).
  void refresh_compute_weights() { parameters_.refresh_compute_weights(); }
  void compute_parameters_written() { parameters_.compute_weights_written(); }
  int64_t num_parameters() const { return parameters_.num_parameters(); }  // this rank's, excluding alignment padding
  int64_t num_layers() const { return slice_.num_layers; }

  // Normal(0, init_std) per whole tensor from a stream keyed by (seed, tensor name),
  // then this rank's slice: the weights do not depend on the layout or the partition.
  void init_weights(uint64_t seed) { parameters_.init_weights(seed); }
  void zero_grad() { parameters_.zero_grad(); }

  // ---- pipeline-stage interface (slot = which in-flight micro-batch) ----
  // Loads `batch` into `slot` for model chunk `chunk` (ModelSlice::chunks; 0 without
  // interleaving): the slot's forward and backward then run that chunk's layers, the
  // embedding when it is chunk 0 of the first stage and the head when it is the last
  // chunk of the last stage, and its activation tensors below are the chunk's.
  void set_batch(int slot, const MicroBatchView& batch, int chunk = 0);
  int num_chunks() const { return static_cast<int>(slice_.chunks.size()); }
  int64_t batch_tokens(int slot) const { return activations_.slot(slot).tokens_used; }
  // Rows of the activations and gradients that travel between stages for a
  // micro-batch of `tokens` tokens: the tokens, or under sequence parallelism this
  // rank's shard of them (ModelSlice::shard_rows).
  int64_t residual_rows(int64_t tokens) const { return slice_.shard_rows(tokens); }
  bool sequence_parallel() const { return slice_.sequence_shards > 1; }
  // [residual rows, H]: where a stage that is not first receives its input before forward(slot).
  Tensor input_activation(int slot) const;
  // [residual rows, H]: the stage output after forward(slot) (stages that are not last).
  Tensor output_activation(int slot) const;
  // [residual rows, H]: where a stage that is not last receives d(output) before backward(slot).
  Tensor output_gradient(int slot) const;
  // [residual rows, H]: d(input) after backward(slot) (stages that are not first); valid until the next backward.
  Tensor input_gradient(int slot) const;
  // Runs the stage's layers. On the last stage also the final norm, LM head and loss,
  // whose gradient (scaled by loss_scale) is computed right away when with_backward;
  // then backward(slot) must follow before the next forward. Returns the sum of the
  // cross-entropies of the predicted tokens where it was added up: on the device, [1]
  // fp64 (kernels/ops.h, "sums on the device"), valid until the next forward; nothing
  // is read back to the host. A slot whose chunk has no head has no loss: nothing is
  // returned and nothing launched for it.
  std::optional<DoubleTensor> forward(int slot, float loss_scale, bool with_backward = true);
  // Backward of the stage, adding into the gradients.
  void backward(int slot, const GradientsReady& ready = {});

  // ---- whole-model conveniences (single stage, slot 0) ----
  // They return the loss sum on the host (one host read each).
  double forward_backward(const MicroBatchView& batch, float loss_scale, const GradientsReady& ready = {});
  double forward_loss(const MicroBatchView& batch);

  size_t parameter_bytes() const { return parameters_.parameter_bytes(); }
  size_t gradient_bytes() const { return parameters_.gradient_bytes(); }
  // The activation arena, and Mixtral's MoE blocks' saved rows and their workspace
  // (which grow past their start only under expert parallelism, model/moe.h).
  size_t activation_bytes() const { return activations_.bytes() + (moe_ ? moe_->bytes() : 0); }
  const ActivationUsage& activation_usage() const { return activations_.usage(); }
  size_t ring_buffer_bytes() const { return ring_attention_ ? ring_attention_->buffer_bytes() : 0; }
  // Mixtral, of the last forward on the last stage: the load-balancing loss over all
  // layers' routing (Hugging Face's load_balancing_loss_func over the concatenated
  // layers; its coef x aux x P, P the micro-batch's predicted tokens, is in forward's
  // return value), and the (token, choice) pairs each expert received, summed over
  // the layers. Other stages and architectures: 0 and empty.
  double aux_loss() const { return moe_ ? moe_->aux_loss() : 0.0; }
  const std::vector<int64_t>& expert_tokens() const;
  // Mixtral under pipeline parallelism: the routing statistics that travel beside the
  // activations (MoeLayers::routing_input / output / totals). Empty for other
  // architectures.
  Tensor routing_input(int slot) { return moe_ ? moe_->routing_input(slot) : Tensor(); }
  Tensor routing_output(int slot) { return moe_ ? moe_->routing_output(slot) : Tensor(); }
  Tensor routing_totals(int slot) { return moe_ ? moe_->routing_totals(slot) : Tensor(); }
  // Floats one layer saves per token for backward (Act(s) = 4 x this x s bytes),
  // averaged over the stage's layers when some recompute.
  int64_t saved_floats_per_token() const { return activations_.saved_floats_per_token(); }
  RecomputeMode recompute_mode() const { return activations_.recompute_mode(); }
  // The stage's layers that recompute (each chunk's first recompute.layers); planned
  // per micro-batch, the most that do.
  int64_t recompute_layers() const;
  bool planned_recompute() const { return activations_.planned_recompute(); }
  // Bytes per token that layer `layer` of the stage saves for backward (its mode's
  // saved_bytes_per_token, spec/model_shape.h).
  double saved_bytes_per_token(int64_t layer) const;
  // The same for a layer that keeps everything (the share a recomputed layer keeps is
  // saved_bytes_per_token over it).
  double whole_layer_bytes_per_token() const { return activations_.whole_layer_bytes_per_token(); }

 private:
  ModelConfig config_;
  ModelPartition partition_;
  ModelSlice slice_;
  int64_t max_tokens_;
  Communicator* tp_;
  Device device_;
  DType precision_;  // of the compute weights and the activations
  ParameterTable parameters_;
  std::unique_ptr<MoeLayers> moe_;  // Mixtral only
  std::unique_ptr<RingAttention> ring_attention_;
  ModelActivations activations_;
  DecoderBlocks blocks_;
  int head_gradient_pending_ = -1;  // slot whose head gradient awaits backward
  std::vector<int> slot_chunks_;    // the model chunk each slot was loaded for (set_batch)
  // The slot's chunk's layers [begin, end) in the rank's numbering (its activations
  // are the slot's layers 0 .. end - begin - 1), and whether it runs the embedding
  // and the head.
  struct ChunkRun {
    int64_t begin, end;
    bool embedding, head;
  };
  ChunkRun chunk_run(int slot) const;
  Arena loss_arena_;
  DoubleTensor loss_sum_;  // forward's result
};

}  // namespace hdp

#pragma once
// A LLaMA decoder (Hugging Face LlamaForCausalLM semantics) with hand-written
// forward and backward over packed micro-batches. Parameters, gradients and
// activations live in flat arenas sized up front from the config and the
// micro-batch capacity, so a training step allocates nothing.
//
// One LlamaModel is one rank's part of the network: a pipeline stage (a range
// of layers, plus the embedding on the first stage and the final norm, LM head
// and loss on the last) and a tensor-parallel slice of it (Megatron style:
// column-parallel q/k/v and gate/up, row-parallel o and down, heads split across
// ranks, vocabulary-parallel embedding, LM head and cross-entropy; the collectives
// are the regions of parallel/tensor_parallel.h). With the default partition it
// is the whole model on one rank.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/copy_engine.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"
#include "spec/model_config.h"
#include "spec/model_shape.h"
#include "model/moe.h"
#include "parallel/communicator.h"
#include "parallel/ring_attention.h"
#include "parallel/tensor_parallel.h"

namespace hdp {

// Which part of the model this rank holds.
struct ModelPartition {
  int tp_rank = 0;
  int tp_size = 1;
  int64_t first_layer = 0;
  int64_t num_layers = -1;   // -1: every layer from first_layer on
  bool has_embedding = true; // first pipeline stage
  bool has_head = true;      // last pipeline stage: final norm, LM head, loss
  // Mixtral under expert parallelism (model/moe.h): this rank holds experts
  // [ep_rank E / ep_size, (ep_rank + 1) E / ep_size) of every MoE layer.
  int ep_rank = 0;
  int ep_size = 1;
};

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
};

// Memory for micro-batches beyond the plain capacity: long sequences that take
// part in rings, and offloaded micro-batches that hold more tokens than the
// capacity because part of their activations wait in host memory.
struct LongSequenceOptions {
  int64_t max_tokens = 0;          // the largest micro-batch (0: the capacity)
  bool offload = false;            // keep a host pool and a copy engine for offloaded micro-batches
  Communicator* hdp = nullptr;     // the ring attention communicator; nullptr: no rings
};

// Activation memory actually used, for reports and tests.
struct ActivationUsage {
  size_t device_peak_bytes = 0;     // the most of the device activation memory any micro-batch used
  size_t host_pool_bytes = 0;       // reserved host memory for offloaded activations
  size_t host_peak_bytes = 0;       // the most of it any micro-batch used
  int64_t offloaded_bytes = 0;      // copied to host so far (cumulative)
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
  LlamaModel(const ModelConfig& config, int64_t capacity_tokens, const ModelPartition& partition = {},
             int activation_slots = 1, Communicator* tp = nullptr, const LongSequenceOptions& long_sequences = {},
             Device device = Device::CPU,
             DType precision = DType::F32, Communicator* ep = nullptr);
  ~LlamaModel();

  const ModelConfig& config() const { return config_; }
  const ModelPartition& partition() const { return partition_; }
  Device device() const { return device_; }
  DType precision() const { return precision_; }
  const std::vector<ParameterInfo>& parameters() const { return parameters_; }
  const ParameterInfo& parameter(const std::string& name) const;
  Tensor parameter_tensor(const ParameterInfo& p) const;
  Tensor gradient_tensor(const ParameterInfo& p) const;
  Tensor flat_parameters() const { return params_; }
  Tensor flat_gradients() const { return grads_; }
  // bf16: the parameters forward and backward read, rounded from the fp32 master
  // weights (flat_parameters()) by refresh_compute_weights(). fp32: flat_parameters().
  Tensor compute_parameters() const { return precision_ == DType::BF16 ? compute_params_ : params_; }
  // Rounds the fp32 master weights into the bf16 copy (nothing to do in fp32). Run
  // after every change of the master weights: init_weights does; the trainer runs
  // it at the start of every step, which covers the optimizer update and loads.
  void refresh_compute_weights();
  int64_t num_parameters() const;  // this rank's, excluding alignment padding
  int64_t num_layers() const { return num_local_layers_; }

  // Normal(0, init_std) per whole tensor from a stream keyed by (seed, tensor name),
  // then this rank's slice: the weights do not depend on the layout or the partition.
  void init_weights(uint64_t seed);
  void zero_grad();

  // ---- pipeline-stage interface (slot = which in-flight micro-batch) ----
  void set_batch(int slot, const MicroBatchView& batch);
  int64_t batch_tokens(int slot) const { return slots_[slot].tokens_used; }
  // [T, H]: where a stage that is not first receives its input before forward(slot).
  Tensor input_activation(int slot) const;
  // [T, H]: the stage output after forward(slot) (stages that are not last).
  Tensor output_activation(int slot) const;
  // [T, H]: where a stage that is not last receives d(output) before backward(slot).
  Tensor output_gradient(int slot) const;
  // [T, H]: d(input) after backward(slot) (stages that are not first); valid until the next backward.
  Tensor input_gradient(int slot) const;
  // Runs the stage's layers. On the last stage also the final norm, LM head and loss,
  // whose gradient (scaled by loss_scale) is computed right away when with_backward;
  // then backward(slot) must follow before the next forward. Returns the sum of the
  // cross-entropies of the predicted tokens (0 on other stages).
  double forward(int slot, float loss_scale, bool with_backward = true);
  // Backward of the stage, adding into the gradients.
  void backward(int slot, const GradientsReady& ready = {});

  // ---- whole-model conveniences (single stage, slot 0) ----
  double forward_backward(const MicroBatchView& batch, float loss_scale, const GradientsReady& ready = {});
  double forward_loss(const MicroBatchView& batch);

  size_t parameter_bytes() const { return param_arena_.capacity(); }
  size_t gradient_bytes() const { return grad_arena_.capacity(); }
  // The activation arena, and Mixtral's MoE blocks' saved rows and their workspace
  // (which grow past their start only under expert parallelism, model/moe.h).
  size_t activation_bytes() const;
  const ActivationUsage& activation_usage() const { return usage_; }
  size_t ring_buffer_bytes() const { return ring_attention_ ? ring_attention_->buffer_bytes() : 0; }
  // Mixtral, of the last forward on the last stage: the load-balancing loss over all
  // layers' routing (Hugging Face's load_balancing_loss_func over the concatenated
  // layers; its coef x aux x P, P the micro-batch's predicted tokens, is in forward's
  // return value), and the (token, choice) pairs each expert received, summed over
  // the layers. Other stages: 0 and empty.
  double aux_loss() const { return aux_loss_; }
  const std::vector<int64_t>& expert_tokens() const { return expert_tokens_; }
  // Mixtral under pipeline parallelism: a micro-batch's load-balancing loss pools the
  // routing of every layer, so its statistics travel beside the activations (the
  // pipeline executor sends them with the same 1F1B order). routing_input / output:
  // [2E] floats, per expert the (token, choice) count and then the summed router
  // probability of the layers before this stage (received before forward; zero on the
  // first stage) and up to its end (sent after forward). routing_totals: [E + 2], the
  // counts of all layers, then the forward's tokens and predicted tokens (over the
  // members of a ring micro-batch, whose forward they share), which the last stage fills
  // in forward and the others receive before backward and pass on after it; backward's
  // gradient of the loss needs them. Counts travel as fp32, exact below 2^24 choices
  // per forward. Empty for other architectures.
  Tensor routing_input(int slot);
  Tensor routing_output(int slot);
  Tensor routing_totals(int slot);
  // Floats one layer saves per token for backward (Act(s) = 4 x this x s bytes).
  int64_t saved_floats_per_token() const { return row_width_ + small_width_; }

 private:
  // A transformer layer's tensors in one flat buffer (parameters or gradients).
  struct LayerTensors {
    Tensor input_norm, q, k, v, o, post_norm, gate, up, down;
    MoeTensors moe;  // Mixtral: the sparse MoE block in place of gate, up, down
  };
  // One layer of this stage, found by name in the parameter table once, at
  // construction: nothing depends on the order of the table.
  struct LayerParameters {
    LayerTensors weights, gradients;
    int64_t gradients_begin = 0;  // the lowest flat offset of its tensors (GradientsReady)
  };
  // Where the stage's tensor-parallel collectives are (Megatron's f and g,
  // parallel/tensor_parallel.h): one region per place, whose forward the forward
  // pass runs and whose backward the backward pass runs.
  struct TensorParallelRegions {
    explicit TensorParallelRegions(Communicator* tp)
        : embedding_output(tp), attention_input(tp), attention_output(tp), mlp_input(tp), mlp_output(tp),
          head_input(tp) {}
    ReduceFromTensorParallelRegion embedding_output;  // each rank looked up the tokens of its vocabulary slice
    CopyToTensorParallelRegion attention_input;       // into the column-parallel q, k, v (heads split)
    ReduceFromTensorParallelRegion attention_output;  // out of the row-parallel o: the heads' partial outputs
    CopyToTensorParallelRegion mlp_input;             // into the column-parallel gate and up (FFN split)
    ReduceFromTensorParallelRegion mlp_output;        // out of the row-parallel down
    CopyToTensorParallelRegion head_input;            // into the vocabulary-parallel LM head
  };
  // What one layer's forward saves for its backward. The "row" tensors ([T, width])
  // can be split by rows for offload; rstd1, rstd2 and lse are small and stay.
  struct LayerActivations {
    Tensor x_in, rstd1, ln1, q, k, v, attn, lse, x_mid, rstd2, ln2, gate, up;
  };
  struct Slot {
    IndexTensor tokens, targets, positions, cu_seqlens;
    int64_t tokens_used = 0;
    int64_t num_sequences = 0;     // whole sequences (cu_seqlens)
    int64_t ring_begin = 0;        // first ring row (tokens_used without a ring)
    bool has_ring = false;
    RingLayout ring;
    std::vector<AttentionBlock> local_blocks;  // whole sequences as attention blocks (ring micro-batches)
    Tensor region;                 // the slot's device activation memory
    Tensor host;                   // its host pool for offloaded rows (empty without offload)
    // Where each layer's activations are during its forward and backward. Without
    // offload every layer has its own block; with offload layers alternate between
    // two working blocks and wait in `kept` (device rows) and `parked` (host rows).
    std::vector<LayerActivations> layers;
    std::vector<LayerActivations> kept, parked;
    std::vector<CopyEvent> offload_done, restore_done;
    int64_t keep_rows = 0;         // rows that stay on the device for offloaded layers
    bool offloaded = false;        // layers [0, num_layers - 2) go through host memory
    Tensor x_out, rstd_final, ln_final;  // stage output; final norm on the last stage
    // Mixtral: routing_input / output / totals (above), the micro-batch's predicted
    // tokens and the loss scale of its forward.
    std::vector<float> routing_before, routing_through, routing_totals;
    int64_t predictions = 0;
    float loss_scale = 0;
  };
  // Reused across layers and slots.
  struct Scratch {
    Tensor residual_grad, norm_grad, dq, dk, dv, dattn, dgate, dup, ffn_act, dffn_act;
    Tensor logits, ce_stats, ce_global;
  };

  void build_parameter_table();
  // Mixtral: the experts this rank holds (all, or its share under expert parallelism).
  std::vector<int64_t> local_experts() const;
  void bind_parameters();
  void layout_activations(Arena& arena);
  size_t layer_block_bytes(int64_t rows, int64_t tokens) const;
  LayerActivations carve_layer(char* base, int64_t rows, int64_t tokens) const;
  void layout_micro_batch(Slot& s, double offload_ratio);
  void park_layer(Slot& s, int64_t layer);
  void restore_layer(Slot& s, int64_t layer);
  void attention_forward_of(Slot& s, const LayerActivations& a);
  void attention_backward_of(Slot& s, const LayerActivations& a);
  double head_forward_backward(Slot& s, float loss_scale, bool backward);

  ModelConfig config_;
  ModelPartition partition_;
  int64_t capacity_;
  int64_t max_tokens_;
  int64_t num_local_layers_;
  int64_t head_chunk_tokens_;
  int64_t local_heads_, local_kv_heads_, local_ffn_, vocab_begin_, local_vocab_;
  int64_t row_width_ = 0, small_width_ = 0;  // floats per token of a layer's row / small tensors
  Communicator* tp_;
  TensorParallelRegions tp_regions_;
  Device device_;
  DType precision_;  // of the compute weights and the activations
  std::vector<ParameterInfo> parameters_;
  int64_t flat_numel_ = 0;

  Arena param_arena_;
  Arena grad_arena_;
  Arena activation_arena_;
  Arena host_arena_;
  std::unique_ptr<CopyEngine> copy_engine_;
  std::unique_ptr<RingAttention> ring_attention_;
  Tensor params_, grads_;
  Tensor compute_params_;  // bf16 copy of params_ (empty in fp32)
  std::vector<LayerParameters> layer_parameters_;
  Tensor embed_, final_norm_, head_;
  Tensor d_embed_, d_final_norm_, d_head_;
  int64_t embedding_gradients_begin_ = 0;  // GradientsReady after the embedding's backward
  int64_t head_gradients_begin_ = 0;       // after the final norm's and LM head's

  std::vector<Slot> slots_;
  Scratch scratch_;
  ActivationUsage usage_;
  int head_gradient_pending_ = -1;  // slot whose head gradient awaits backward
  // Mixtral: one block per slot and layer (each keeps the routing and saved rows of its
  // slot's micro-batch), the pooled load-balancing loss and its gradient per router
  // probability.
  std::unique_ptr<MoeWorkspace> moe_workspace_;
  std::vector<std::vector<MoeBlock>> moe_;  // [slot][layer]
  double pool_load_balancing(Slot& s);
  void load_balancing_gradient(const Slot& s);
  double aux_loss_ = 0;
  std::vector<double> aux_grad_;
  std::vector<float> forward_routing_;  // the last stage's statistics of a forward ([2E + 2])
  std::vector<int64_t> expert_tokens_;
};

}  // namespace hdp

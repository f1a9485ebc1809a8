#pragma once
// A LLaMA decoder (Hugging Face LlamaForCausalLM semantics) with hand-written
// forward and backward over packed micro-batches. Parameters, gradients and
// activations live in flat arenas sized up front from the config and the
// micro-batch capacity, so a training step allocates nothing.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/tensor.h"
#include "trainer/model_config.h"

namespace hdp {

// One tensor inside the flat parameter buffer, under its Hugging Face name.
struct ParameterInfo {
  std::string name;              // e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;    // [out, in] for projections, as Hugging Face stores them
  int64_t offset = 0;            // in floats from the start of the flat buffer
  int64_t numel = 0;
  bool weight_decay = false;     // matrices decay; norm weights do not
  bool scaled_init = false;      // output projections: std / sqrt(2 * layers)
  bool ones_init = false;        // norm weights start at 1
};

// A micro-batch as the model sees it (host memory): sequences packed back to back.
struct MicroBatchView {
  std::span<const int32_t> tokens;
  std::span<const int32_t> targets;     // -1 where nothing is predicted
  std::span<const int32_t> positions;
  std::span<const int32_t> cu_seqlens;  // sequence boundaries, first 0, last = tokens.size()
};

class LlamaModel {
 public:
  // capacity_tokens: the largest micro-batch this model will be given.
  LlamaModel(const ModelConfig& config, int64_t capacity_tokens, Device device = Device::CPU);

  const ModelConfig& config() const { return config_; }
  const std::vector<ParameterInfo>& parameters() const { return parameters_; }
  const ParameterInfo& parameter(const std::string& name) const;
  Tensor parameter_tensor(const ParameterInfo& p) const;
  Tensor gradient_tensor(const ParameterInfo& p) const;
  Tensor flat_parameters() const { return params_; }
  Tensor flat_gradients() const { return grads_; }
  int64_t num_parameters() const;  // excluding alignment padding

  // Normal(0, init_std) per tensor from a stream keyed by (seed, tensor name), so the
  // weights do not depend on the layout of the flat buffer.
  void init_weights(uint64_t seed);
  void zero_grad();

  // Forward and backward of one micro-batch. Returns the sum of the cross-entropies
  // of its predicted tokens; adds loss_scale * d(sum)/d(params) into the gradients.
  double forward_backward(const MicroBatchView& batch, float loss_scale);
  // Forward only; returns the same sum. Gradients are untouched.
  double forward_loss(const MicroBatchView& batch);

  // Matmul FLOPs of forward+backward for a micro-batch with these sequence lengths.
  double training_flops(std::span<const int64_t> sequence_lengths) const;

  size_t parameter_bytes() const { return param_arena_.capacity(); }
  size_t gradient_bytes() const { return grad_arena_.capacity(); }
  size_t activation_bytes() const { return activation_arena_.capacity(); }

 private:
  struct LayerWeights {
    Tensor input_norm, q, k, v, o, post_norm, gate, up, down;
  };
  // Saved by forward for backward, one contiguous block per layer.
  struct LayerActivations {
    Tensor x_in, rstd1, ln1, q, k, v, attn, lse, x_mid, rstd2, ln2, gate, up;
  };
  // Reused across layers.
  struct Scratch {
    Tensor residual_grad, norm_grad, dq, dk, dv, dattn, dgate, dup, ffn_act, dffn_act;
    Tensor logits, ce_stats;
  };

  void build_parameter_table();
  void bind_weights(Tensor flat, std::vector<LayerWeights>& layers, Tensor& embed, Tensor& final_norm, Tensor& head);
  void layout_activations(Arena& arena);
  int64_t load_inputs(const MicroBatchView& batch);
  void forward(int64_t T);
  double head_forward_backward(int64_t T, float loss_scale, bool backward);
  void backward(int64_t T);

  ModelConfig config_;
  int64_t capacity_;
  int64_t head_chunk_tokens_;
  Device device_;
  std::vector<ParameterInfo> parameters_;
  int64_t flat_numel_ = 0;

  Arena param_arena_;
  Arena grad_arena_;
  Arena activation_arena_;
  Tensor params_, grads_;
  std::vector<LayerWeights> w_, dw_;
  Tensor embed_, final_norm_, head_;
  Tensor d_embed_, d_final_norm_, d_head_;

  IndexTensor tokens_, targets_, positions_, cu_seqlens_;
  int64_t num_sequences_ = 0;
  std::vector<LayerActivations> acts_;
  Tensor x_final_, rstd_final_, ln_final_;
  Scratch scratch_;
};

}  // namespace hdp

#pragma once
// Incremental decoding with a key/value cache, for generation: each layer keeps the
// rotated keys and the values of every position seen so far, so a new token costs
// one row through the projections and one query row of attention against the cache
// (O(context) per token) instead of a forward over the whole context (O(context^2)).
//
// It reads the weights of a whole LlamaModel (one process, one stage, no tensor
// parallelism, fp32 on the CPU) and runs the same ops in the same order as
// LlamaModel::forward, so its logits equal those of a full forward over the same
// tokens up to the summation order of attention (tests/model_cached_decoder_test.cpp).

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kernels/tensor.h"
#include "model/model.h"
#include "model/moe.h"

namespace hdp {

class CachedDecoder {
 public:
  // max_positions: the most tokens the cache holds (the context length).
  // Throws std::invalid_argument when the model is not whole, fp32 and on the CPU.
  CachedDecoder(const LlamaModel& model, int64_t max_positions);

  // Runs `tokens` at the next positions (a prompt at once, or one token), adding their
  // keys and values to the cache, and returns the logits [vocab] of the last of them,
  // valid until the next call. Throws std::length_error when the cache would overflow.
  std::span<const float> append(std::span<const int32_t> tokens);
  // Positions in the cache so far.
  int64_t length() const { return length_; }
  int64_t capacity() const { return max_positions_; }
  // Empties the cache (the next append starts at position 0).
  void clear() { length_ = 0; }

 private:
  struct Layer {
    Tensor input_norm, q, k, v, o, post_norm, gate, up, down;
    MoeTensors moe;
    std::vector<float> keys, values;  // [max_positions, kv_dim]: rotated keys, values
  };

  const ModelConfig config_;
  const int64_t max_positions_;
  int64_t length_ = 0;
  Tensor embed_, final_norm_, head_;
  std::vector<Layer> layers_;
  // Mixtral: one block serves every layer in turn (forward only, so nothing it keeps
  // for backward outlives the layer; one set of its buffers, not one per layer).
  std::optional<MoeWorkspace> moe_workspace_;
  std::optional<MoeBlock> moe_;
  // Scratch for up to max_positions rows (a prompt), reused by every layer.
  std::vector<float> x_, normed_, q_, attn_, lse_, mid_, gate_, up_, act_, rstd_, logits_;
  std::vector<int32_t> tokens_, positions_;
};

}  // namespace hdp

#include "model/model.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace hdp {
namespace {

// The arguments no part of the model checks itself, then this rank's slice (which
// checks that the partition splits the config).
ModelSlice checked_slice(const ModelConfig& config, const ModelPartition& partition, int64_t capacity_tokens,
                         int activation_slots, DType precision, Communicator* tp, Communicator* ep) {
  if (capacity_tokens <= 0) throw std::invalid_argument("model: capacity_tokens must be positive");
  if (precision != DType::F32 && precision != DType::BF16)
    throw std::invalid_argument(std::string("model: precision ") + dtype_name(precision) + " is not fp32 or bf16");
  if (activation_slots <= 0) throw std::invalid_argument("model: activation_slots must be positive");
  // Without a communicator a tp slice can hold and load weights (checkpoint tools)
  // but not run.
  if (tp != nullptr && tp->size() != partition.tp_size) {
    throw std::invalid_argument("model: the tp communicator size differs from partition.tp_size");
  }
  if (ep != nullptr && (ep->size() != partition.ep_size || ep->rank() != partition.ep_rank)) {
    throw std::invalid_argument(
        "model: the ep communicator's size or rank differs from partition.ep_size or ep_rank");
  }
  return ModelSlice(config, partition);
}

// The layers one activation slot holds: a slot carries one (micro-batch, chunk) pair,
// so those of the largest chunk (with one chunk, the stage's), numbered from 0.
ModelSlice slot_slice(ModelSlice slice) {
  slice.num_layers = 0;
  for (const LayerRange& r : slice.chunks) slice.num_layers = std::max(slice.num_layers, r.count);
  return slice;
}

// Recomputed layers counted from each chunk's first: at most the smallest chunk's;
// all of them: the largest chunk's (a slot's layers).
int64_t checked_recompute_layers(const ModelSlice& slice, const RecomputeOptions& recompute) {
  if (!recompute.layers) return slot_slice(slice).num_layers;
  int64_t smallest = slice.chunks.front().count;
  for (const LayerRange& r : slice.chunks) smallest = std::min(smallest, r.count);
  if (slice.chunks.size() > 1 && *recompute.layers > smallest)
    throw std::invalid_argument("model: recompute_layers " + std::to_string(*recompute.layers) +
                                " is more than the smallest model chunk's " + std::to_string(smallest) + " layers");
  return *recompute.layers;
}

std::unique_ptr<MoeLayers> moe_layers_for(const ModelConfig& c, const ModelPartition& partition,
                                          const ModelSlice& slice, int slots, int64_t max_tokens, Device device,
                                          DType precision, Communicator* tp, Communicator* ep) {
  if (!c.moe()) return nullptr;
  // Each block holds this rank's tp slice of its experts (all, or its share under ep).
  const MoeShape shape{c.hidden_size, slice.ffn, c.num_experts, c.experts_per_token};
  return std::make_unique<MoeLayers>(shape, c.num_layers, slice.num_layers, slots, max_tokens, device, precision,
                                     c.router_aux_loss_coef, partition.has_head, tp, ep);
}

std::unique_ptr<RingAttention> ring_attention_for(const ModelConfig& c, const ModelSlice& slice, Communicator* hdp,
                                                  int64_t max_tokens, Device device, DType precision) {
  if (hdp == nullptr || hdp->size() <= 1) return nullptr;
  return std::make_unique<RingAttention>(*hdp, max_tokens, slice.heads, slice.kv_heads, c.head_dim(),
                                         c.attention_window(), precision, device);
}

}  // namespace

LlamaModel::LlamaModel(const ModelConfig& config, int64_t capacity_tokens, const ModelPartition& partition,
                       int activation_slots, Communicator* tp, const LongSequenceOptions& long_sequences,
                       Device device, DType precision, Communicator* ep, const RecomputeOptions& recompute)
    : config_(config),
      partition_(partition),
      slice_(checked_slice(config, partition, capacity_tokens, activation_slots, precision, tp, ep)),
      max_tokens_(std::max(capacity_tokens, long_sequences.max_tokens)),
      tp_(tp),
      device_(device),
      precision_(precision),
      parameters_(config, partition, slice_, device, precision),
      moe_(moe_layers_for(config, partition, slice_, activation_slots, max_tokens_, device, precision, tp, ep)),
      ring_attention_(ring_attention_for(config, slice_, long_sequences.hdp, max_tokens_, device, precision)),
      activations_(config, partition, slot_slice(slice_),
                   {capacity_tokens, max_tokens_, activation_slots, long_sequences.offload, ring_attention_ != nullptr,
                    recompute.mode, checked_recompute_layers(slice_, recompute), recompute.planned,
                    long_sequences.offloaded_tokens},
                   device, precision),
      blocks_(config, slice_, tp, ring_attention_.get(), activations_.scratch()),
      slot_chunks_(static_cast<size_t>(activation_slots), 0),
      loss_arena_(device, Arena::kAlignment, "loss sum"),
      loss_sum_(loss_arena_.double_tensor({1})) {
  // Not built: offload of model chunks (a slot offloads its layers below the slot's
  // last two, which for a chunk smaller than the slot are not the chunk's last two,
  // and the planners budget offload for a stage's layers as one range), and
  // Mixtral's routing statistics, which pool on the last stage's one pass (MoeLayers).
  // Nor recomputation planned per micro-batch: the planners count a micro-batch's
  // recomputed layers from its stage's first (planning/activation_mix.h).
  if (slice_.chunks.size() > 1 && (long_sequences.offload || config.moe() || recompute.planned))
    throw std::invalid_argument("model: " + std::to_string(slice_.chunks.size()) +
                                " model chunks per stage run neither offload, recomputation planned per micro-batch "
                                "nor a mixture of experts");
}

int64_t LlamaModel::recompute_layers() const {
  int64_t layers = 0;
  for (const LayerRange& r : slice_.chunks) layers += std::min(activations_.recompute_layers(), r.count);
  return layers;
}

double LlamaModel::saved_bytes_per_token(int64_t layer) const {
  size_t c = 0;
  while (c + 1 < slice_.chunks.size() && slice_.chunk_begin(c + 1) <= layer) ++c;
  return activations_.saved_bytes_per_token(layer - slice_.chunk_begin(c));
}

LlamaModel::ChunkRun LlamaModel::chunk_run(int slot) const {
  const size_t c = static_cast<size_t>(slot_chunks_.at(static_cast<size_t>(slot)));
  return {slice_.chunk_begin(c), slice_.chunk_begin(c + 1), partition_.has_embedding && c == 0,
          partition_.has_head && c + 1 == slice_.chunks.size()};
}

const std::vector<int64_t>& LlamaModel::expert_tokens() const {
  static const std::vector<int64_t> kNone;
  return moe_ ? moe_->expert_tokens() : kNone;
}

void LlamaModel::set_batch(int slot, const MicroBatchView& batch, int chunk) {
  if (chunk < 0 || chunk >= num_chunks())
    throw std::invalid_argument("model: chunk " + std::to_string(chunk) + " of " + std::to_string(num_chunks()));
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  if (T > max_tokens_) {
    throw std::invalid_argument("micro-batch of " + std::to_string(T) + " tokens; the model holds at most " +
                                std::to_string(max_tokens_));
  }
  const int64_t ring_begin = batch.cu_seqlens.empty() ? -1 : batch.cu_seqlens.back();
  if (static_cast<int64_t>(batch.targets.size()) != T || static_cast<int64_t>(batch.positions.size()) != T ||
      batch.cu_seqlens.empty() || batch.cu_seqlens.front() != 0 ||
      (batch.ring == nullptr ? ring_begin != T : ring_begin > T)) {
    throw std::invalid_argument("micro-batch: tokens, targets, positions and cu_seqlens disagree");
  }
  for (int64_t i = 0; i < T; ++i) {
    if (batch.tokens[i] < 0 || batch.tokens[i] >= config_.vocab_size || batch.targets[i] < -1 ||
        batch.targets[i] >= config_.vocab_size) {
      throw std::invalid_argument("micro-batch: token id outside the vocabulary at row " + std::to_string(i));
    }
  }
  if (batch.ring != nullptr) {
    if (!ring_attention_) throw std::invalid_argument("micro-batch with a ring but the model has no ring communicator");
    if (batch.ring->rows(batch.ring->self) != T - ring_begin) {
      throw std::invalid_argument("micro-batch: the ring layout holds " +
                                  std::to_string(batch.ring->rows(batch.ring->self)) + " rows of this rank, the batch " +
                                  std::to_string(T - ring_begin));
    }
  }
  if (moe_) moe_->begin_micro_batch(slot, batch.targets);
  activations_.load(slot, batch);
  slot_chunks_.at(static_cast<size_t>(slot)) = chunk;
}

Tensor LlamaModel::input_activation(int slot) const {
  const MicroBatchSlot& s = activations_.slot(slot);
  const ChunkRun run = chunk_run(slot);
  return run.begin < run.end ? s.layers[0].x_in : s.x_out.rows(0, s.shard_rows);
}

Tensor LlamaModel::output_activation(int slot) const {
  const MicroBatchSlot& s = activations_.slot(slot);
  return s.x_out.rows(0, s.shard_rows);
}

Tensor LlamaModel::output_gradient(int slot) const {
  return activations_.scratch().residual_grad.rows(0, activations_.slot(slot).shard_rows);
}

Tensor LlamaModel::input_gradient(int slot) const {
  return activations_.scratch().residual_grad.rows(0, activations_.slot(slot).shard_rows);
}

std::optional<DoubleTensor> LlamaModel::forward(int slot, float loss_scale, bool with_backward) {
  const ChunkRun run = chunk_run(slot);
  MicroBatchSlot& s = activations_.slot(slot);
  const int64_t T = s.tokens_used;
  if (partition_.tp_size > 1 && tp_ == nullptr) {
    throw std::logic_error("model: a tp slice needs its communicator to run");
  }

  const EndParameters& ends = parameters_.ends();
  if (run.embedding) blocks_.token_embedding_forward(input_activation(slot), s, ends.embed);
  for (int64_t l = run.begin; l < run.end; ++l) {
    const int64_t k = l - run.begin;  // the layer's place in the slot
    const LayerTensors& w = parameters_.layer(l).weights;
    const LayerActivations& a = s.layers[k];
    blocks_.attention_block_forward(s, w, a);
    // The output becomes the next layer's input, in the working block that layer
    // l - 1 used: its rows must have left for the host first.
    const Tensor out = l + 1 < run.end ? s.layers[k + 1].x_in : s.x_out.rows(0, s.shard_rows);
    const CopyEvent& out_free = activations_.output_block_free(s, k);
    if (moe_) {
      blocks_.moe_block_forward(out, moe_->block(slot, l), w, a, out_free);
    } else {
      blocks_.mlp_block_forward(out, s, w, a, out_free);
    }
    activations_.offload_after_forward(s, k);
  }
  const double aux_term =
      moe_ ? moe_->pool_load_balancing(slot, loss_scale, T, ring_attention_.get(), s.has_ring ? &s.ring : nullptr)
           : 0.0;
  if (!run.head) return std::nullopt;
  fill(loss_sum_, 0.0);
  blocks_.head_forward(s, ends, loss_scale, with_backward, loss_sum_);
  if (moe_) add_scalar(loss_sum_, aux_term);
  head_gradient_pending_ = with_backward ? slot : -1;
  return loss_sum_;
}

void LlamaModel::backward(int slot, const GradientsReady& ready) {
  MicroBatchSlot& s = activations_.slot(slot);
  const ChunkRun run = chunk_run(slot);
  auto report = [&](int64_t gradients_begin) {
    if (ready) ready(gradients_begin);
  };

  const std::span<const double> aux_grad = moe_ ? moe_->load_balancing_gradient(slot) : std::span<const double>();
  const EndParameters& ends = parameters_.ends();
  if (run.head) {
    if (head_gradient_pending_ != slot) {
      throw std::logic_error("model: backward of the last stage must follow forward(slot, scale, true)");
    }
    head_gradient_pending_ = -1;
    blocks_.head_backward(s, ends);
    report(ends.head_gradients_begin);
  }
  for (int64_t l = run.end - 1; l >= run.begin; --l) {
    const int64_t k = l - run.begin;  // the layer's place in the slot
    activations_.restore_before_backward(s, k);
    const LayerParameters& p = parameters_.layer(l);
    const LayerActivations& a = s.layers[k];
    if (ModelActivations::recomputed(s, k)) {
      const RecomputeMode mode = activations_.recompute_mode();
      blocks_.attention_block_recompute(s, p.weights, a, mode);
      if (moe_) {
        blocks_.moe_block_recompute(p.weights, a);
      } else {
        blocks_.mlp_block_recompute(s, p.weights, a, mode);
      }
    }
    if (moe_) {
      blocks_.moe_block_backward(s, moe_->block(slot, l), p.weights, p.gradients, a, aux_grad);
    } else {
      blocks_.mlp_block_backward(s, p.weights, p.gradients, a);
    }
    blocks_.attention_block_backward(s, p.weights, p.gradients, a);
    report(p.gradients_begin);
  }
  if (run.embedding) {
    blocks_.token_embedding_backward(ends.d_embed, s);
    report(ends.embedding_gradients_begin);
  }
}

double LlamaModel::forward_backward(const MicroBatchView& batch, float loss_scale, const GradientsReady& ready) {
  set_batch(0, batch);
  const DoubleTensor loss = forward(0, loss_scale, true).value();
  backward(0, ready);
  return read_back(loss)[0];
}

double LlamaModel::forward_loss(const MicroBatchView& batch) {
  set_batch(0, batch);
  return read_back(forward(0, 1.0f, false).value())[0];
}

}  // namespace hdp

#include "model/activations.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace hdp {
namespace {

constexpr int64_t kActivationAlignBytes = 64;  // of every saved activation tensor
constexpr int64_t kLogitsBudgetFloats = int64_t{1} << 24;

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Tokens per LM-head chunk: bounds the [chunk, vocab] logits buffer.
int64_t head_chunk_for(int64_t vocab, int64_t capacity) {
  int64_t chunk = std::max<int64_t>(1, kLogitsBudgetFloats / std::max<int64_t>(1, vocab));
  if (chunk >= 64) chunk = chunk / 64 * 64;
  return std::min(chunk, capacity);
}

// A tensor of `dtype` at `base` (activation memory carved by hand).
Tensor tensor_at(char* base, std::initializer_list<int64_t> dims, DType dtype, Device device) {
  if (dtype == DType::BF16) return Tensor::of_bf16(reinterpret_cast<bf16*>(base), dims, device);
  return Tensor(reinterpret_cast<float*>(base), dims, device);
}

// The tensors of a layer whose rows can move to host memory, and the small ones.
template <class A, class Fn>
void for_each_row_tensor(A& a, A& b, Fn&& fn) {
  fn(a.x_in, b.x_in);
  fn(a.ln1, b.ln1);
  fn(a.q, b.q);
  fn(a.k, b.k);
  fn(a.v, b.v);
  fn(a.attn, b.attn);
  fn(a.x_mid, b.x_mid);
  fn(a.ln2, b.ln2);
  fn(a.gate, b.gate);
  fn(a.up, b.up);
}

template <class A, class Fn>
void for_each_small_tensor(A& a, A& b, Fn&& fn) {
  fn(a.rstd1, b.rstd1);
  fn(a.rstd2, b.rstd2);
  fn(a.lse, b.lse);
}

}  // namespace

ModelActivations::ModelActivations(const ModelConfig& config, const ModelPartition& partition,
                                   const ModelSlice& slice, const ActivationCapacity& capacity, Device device,
                                   DType precision)
    : hidden_(config.hidden_size),
      head_dim_(config.head_dim()),
      heads_(slice.heads),
      kv_heads_(slice.kv_heads),
      ffn_(slice.ffn),
      vocab_(slice.vocab),
      layers_(slice.num_layers),
      has_head_(partition.has_head),
      capacity_(capacity.capacity_tokens),
      max_tokens_(capacity.max_tokens),
      device_(device),
      precision_(precision),
      arena_(Arena::counting(device, "activations")),
      host_arena_(Arena::counting(Device::CPU, "offloaded activations")),
      slots_(capacity.slots) {
  const ActivationWidths widths = activation_widths(config.shape(), partition.tp_size);
  row_width_ = widths.row;
  small_width_ = widths.small;
  scratch_.head_chunk_tokens = head_chunk_for(vocab_, max_tokens_);
  if (capacity.offload && layers_ >= 3) {
    copy_engine_ = std::make_unique<CopyEngine>(device);
    const size_t host_layer_bytes = static_cast<size_t>(layers_ - 2) * layer_block_bytes(max_tokens_, 0);
    // Pinned on CUDA, so the copy stream moves rows asynchronously at full bandwidth.
    const size_t host_bytes = host_layer_bytes * slots_.size();
    host_arena_ = device == Device::CUDA ? Arena::pinned_host(host_bytes, "offloaded activations")
                                         : Arena(Device::CPU, host_bytes, "offloaded activations");
    for (MicroBatchSlot& slot : slots_)
      slot.host = host_arena_.tensor({static_cast<int64_t>(host_layer_bytes / sizeof(float))});
    usage_.host_pool_bytes = host_arena_.capacity();
  }
  Arena sizing = Arena::counting(device, "activations");
  lay_out(sizing);
  arena_ = Arena(device, sizing.used(), "activations");
  lay_out(arena_);
  // Host lists sized by the token capacity, once the arena holding far more per
  // token was had: for an impossible capacity the arena's OutOfMemory (bad input,
  // naming the bytes) comes first, not a bare std::bad_alloc from here.
  for (MicroBatchSlot& s : slots_) s.local_blocks.reserve(static_cast<size_t>(max_tokens_));
}

ModelActivations::~ModelActivations() {
  if (copy_engine_) copy_engine_->synchronize();
}

// Bytes of one layer's saved tensors: row tensors (activation dtype) for `rows`
// rows, the small fp32 ones (1/rms twice, log-sum-exp) for `tokens` tokens; every
// tensor 64-byte aligned.
size_t ModelActivations::layer_block_bytes(int64_t rows, int64_t tokens) const {
  auto aligned = [](int64_t n) { return static_cast<size_t>(round_up(n, kActivationAlignBytes)); };
  const int64_t H = hidden_, F = ffn_, qdim = heads_ * head_dim_, kv = kv_heads_ * head_dim_;
  const int64_t row_bytes = static_cast<int64_t>(dtype_size(precision_)), small_bytes = sizeof(float);
  size_t n = 0;
  for (int64_t width : {H, H, qdim, kv, kv, qdim, H, H, F, F}) n += aligned(rows * width * row_bytes);
  for (int64_t width : {int64_t{1}, int64_t{1}, heads_}) n += aligned(tokens * width * small_bytes);
  return n;
}

// One layer's saved tensors, carved from `base`: row tensors with `rows` rows, the
// small ones for `tokens` tokens.
LayerActivations ModelActivations::carve_layer(char* base, int64_t rows, int64_t tokens) const {
  const int64_t H = hidden_, F = ffn_, qdim = heads_ * head_dim_, kv = kv_heads_ * head_dim_;
  auto take = [&](int64_t n, int64_t width, DType dtype) {
    Tensor t = tensor_at(base, {n, width}, dtype, device_);
    base += round_up(static_cast<int64_t>(t.bytes()), kActivationAlignBytes);
    return t;
  };
  LayerActivations a;
  a.x_in = take(rows, H, precision_);
  a.ln1 = take(rows, H, precision_);
  a.q = take(rows, qdim, precision_);
  a.k = take(rows, kv, precision_);
  a.v = take(rows, kv, precision_);
  a.attn = take(rows, qdim, precision_);
  a.x_mid = take(rows, H, precision_);
  a.ln2 = take(rows, H, precision_);
  a.gate = take(rows, F, precision_);
  a.up = take(rows, F, precision_);
  a.rstd1 = take(tokens, 1, DType::F32).view({tokens});
  a.rstd2 = take(tokens, 1, DType::F32).view({tokens});
  a.lse = take(tokens, heads_, DType::F32).view({heads_, tokens});
  return a;
}

void ModelActivations::lay_out(Arena& arena) {
  const int64_t T = max_tokens_, H = hidden_, F = ffn_, L = layers_;
  const int64_t qdim = heads_ * head_dim_, kv = kv_heads_ * head_dim_;
  // A slot holds every layer's block at the plain capacity; offloaded micro-batches
  // of up to max_tokens use the same memory (two working blocks plus the rows kept
  // on the device), which the planner's token limit guarantees fits, up to the
  // small per-token tensors, which are never offloaded.
  // In bytes (activations in the model's precision, the small tensors in fp32).
  size_t region = static_cast<size_t>(L) * layer_block_bytes(capacity_, capacity_);
  if (copy_engine_) {
    // Slack: the kept rows of each layer are rounded to whole rows.
    region = std::max(region, static_cast<size_t>(L) * (layer_block_bytes(capacity_, 0) + layer_block_bytes(0, T) +
                                                        static_cast<size_t>(row_width_) * dtype_size(precision_)));
  }
  for (MicroBatchSlot& s : slots_) {
    s.tokens = arena.index_tensor({T});
    s.targets = arena.index_tensor({T});
    s.positions = arena.index_tensor({T});
    s.cu_seqlens = arena.index_tensor({T + 1});
    s.region = arena.tensor({static_cast<int64_t>(region / sizeof(float))});  // raw bytes, carved by carve_layer
    s.layers.assign(L, {});
    s.kept.assign(L, {});
    s.parked.assign(L, {});
    s.offload_done.assign(L, {});
    s.restore_done.assign(L, {});
    s.x_out = arena.tensor({T, H}, precision_);
    if (has_head_) {
      s.rstd_final = arena.tensor({T});
      s.ln_final = arena.tensor({T, H}, precision_);
    }
  }
  ActivationScratch& s = scratch_;
  s.residual_grad = arena.tensor({T, H}, precision_);
  s.norm_grad = arena.tensor({T, H}, precision_);
  s.dq = arena.tensor({T, qdim}, precision_);
  s.dk = arena.tensor({T, kv}, precision_);
  s.dv = arena.tensor({T, kv}, precision_);
  s.dattn = arena.tensor({T, qdim}, precision_);
  s.dgate = arena.tensor({T, F}, precision_);
  s.dup = arena.tensor({T, F}, precision_);
  s.ffn_act = arena.tensor({T, F}, precision_);
  s.dffn_act = arena.tensor({T, F}, precision_);
  if (has_head_) {
    s.logits = arena.tensor({s.head_chunk_tokens, vocab_}, precision_);
    s.ce_stats = arena.tensor({3 * s.head_chunk_tokens});
    s.ce_global = arena.tensor({s.head_chunk_tokens});
  }
}

void ModelActivations::load(int slot, const MicroBatchView& batch) {
  MicroBatchSlot& s = slots_.at(slot);
  s.tokens_used = static_cast<int64_t>(batch.tokens.size());
  s.num_sequences = static_cast<int64_t>(batch.cu_seqlens.size()) - 1;
  s.ring_begin = batch.cu_seqlens.back();
  s.has_ring = batch.ring != nullptr;
  if (s.has_ring) {
    s.ring = *batch.ring;
    s.local_blocks.clear();
    for (int64_t i = 0; i < s.num_sequences; ++i) {
      const int32_t b = batch.cu_seqlens[i], e = batch.cu_seqlens[i + 1];
      if (e > b) s.local_blocks.push_back({b, e, b, e, 0, 0});
    }
  }
  // Host spans into the slot's device tensors.
  auto upload = [](IndexTensor dst, std::span<const int32_t> src) {
    const int64_t n = static_cast<int64_t>(src.size());
    copy(dst.rows(0, n), IndexTensor(const_cast<int32_t*>(src.data()), {n}, Device::CPU));
  };
  upload(s.tokens, batch.tokens);
  upload(s.targets, batch.targets);
  upload(s.positions, batch.positions);
  upload(s.cu_seqlens, batch.cu_seqlens);
  lay_out_micro_batch(s, batch.offload_ratio);
}

// Where this micro-batch's layer activations live. Without offload, layer i has its
// own block. With offload, layer i runs in working block i % 2; after its forward,
// layers below the last two keep their first keep_rows rows (and the small tensors)
// in a smaller device block and send the other rows to the host pool, and come
// back to their working block before their backward.
void ModelActivations::lay_out_micro_batch(MicroBatchSlot& s, double offload_ratio) {
  const int64_t T = s.tokens_used, L = layers_;
  char* region = reinterpret_cast<char*>(s.region.raw());  // sizes below are in bytes
  const size_t capacity = s.region.bytes();
  s.offloaded = offload_ratio > 0 && L >= 3;
  if (offload_ratio > 0 && !copy_engine_ && L >= 3) {
    throw std::invalid_argument("micro-batch with offload ratio " + std::to_string(offload_ratio) +
                                " but offload is not enabled for this model");
  }
  size_t used = 0;
  if (!s.offloaded) {
    const size_t block = layer_block_bytes(T, T);
    used = static_cast<size_t>(L) * block;
    if (used > capacity) {
      throw std::invalid_argument("micro-batch of " + std::to_string(T) + " tokens does not fit the activation memory "
                                  "of " + std::to_string(capacity_) + " tokens per layer without offload");
    }
    for (int64_t i = 0; i < L; ++i) s.layers[i] = carve_layer(region + i * block, T, T);
  } else {
    const int64_t off = std::clamp<int64_t>(std::llround(offload_ratio * static_cast<double>(T)), 0, T);
    s.keep_rows = T - off;
    const size_t work = layer_block_bytes(T, T), keep = layer_block_bytes(s.keep_rows, T);
    used = 2 * work + static_cast<size_t>(L - 2) * keep;
    if (used > capacity) {
      throw std::invalid_argument("micro-batch of " + std::to_string(T) + " tokens with offload ratio " +
                                  std::to_string(offload_ratio) + " does not fit the activation memory");
    }
    const size_t parked = layer_block_bytes(off, 0);
    for (int64_t i = 0; i < L; ++i) {
      s.layers[i] = carve_layer(region + (i % 2) * work, T, T);
      if (i < L - 2) {
        s.kept[i] = carve_layer(region + 2 * work + i * keep, s.keep_rows, T);
        s.parked[i] = carve_layer(reinterpret_cast<char*>(s.host.raw()) + i * parked, off, 0);
      }
    }
    usage_.host_peak_bytes = std::max(usage_.host_peak_bytes, static_cast<size_t>(L - 2) * parked);
  }
  usage_.device_peak_bytes = std::max(usage_.device_peak_bytes, used);
}

const CopyEvent& ModelActivations::output_block_free(const MicroBatchSlot& s, int64_t layer) const {
  static const CopyEvent kNone;
  return s.offloaded && layer >= 1 && layer - 1 < layers_ - 2 ? s.offload_done[layer - 1] : kNone;
}

void ModelActivations::offload_after_forward(MicroBatchSlot& s, int64_t layer) {
  if (s.offloaded && layer < layers_ - 2) park_layer(s, layer);
}

void ModelActivations::restore_before_backward(MicroBatchSlot& s, int64_t layer) {
  if (s.offloaded && layer >= 1 && layer - 1 < layers_ - 2) restore_layer(s, layer - 1);
  if (s.offloaded && layer < layers_ - 2) s.restore_done[layer].wait();
}

void ModelActivations::park_layer(MicroBatchSlot& s, int64_t layer) {
  const int64_t T = s.tokens_used, keep = s.keep_rows;
  LayerActivations& work = s.layers[layer];
  for_each_row_tensor(s.kept[layer], work, [&](Tensor& dst, Tensor& src) { copy(dst, src.rows(0, keep)); });
  for_each_small_tensor(s.kept[layer], work, [&](Tensor& dst, Tensor& src) { copy(dst, src); });
  CopyEvent last;
  for_each_row_tensor(s.parked[layer], work, [&](Tensor& dst, Tensor& src) {
    last = copy_engine_->copy_async(dst, src.rows(keep, T));
    usage_.offloaded_bytes += static_cast<int64_t>(dst.bytes());
  });
  s.offload_done[layer] = last;
}

void ModelActivations::restore_layer(MicroBatchSlot& s, int64_t layer) {
  const int64_t T = s.tokens_used, keep = s.keep_rows;
  s.offload_done[layer].wait();
  LayerActivations& work = s.layers[layer];
  for_each_row_tensor(work, s.kept[layer], [&](Tensor& dst, Tensor& src) { copy(dst.rows(0, keep), src); });
  for_each_small_tensor(work, s.kept[layer], [&](Tensor& dst, Tensor& src) { copy(dst, src); });
  CopyEvent last;
  for_each_row_tensor(work, s.parked[layer],
                      [&](Tensor& dst, Tensor& src) { last = copy_engine_->copy_async(dst.rows(keep, T), src); });
  s.restore_done[layer] = last;
}

}  // namespace hdp

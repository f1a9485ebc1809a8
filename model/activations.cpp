#include "model/activations.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace hdp {
namespace {

constexpr int64_t kActivationAlignBytes = 64;  // of every saved activation tensor

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Tokens per LM-head chunk: bounds the [chunk, vocab] logits buffer, to 2^24 values
// on the CPU and 2^27 on a GPU (256 MB in bf16). Each chunk's weight-gradient GEMM
// reads and writes the whole fp32 gradient of the head [vocab, hidden]: with 512-token
// chunks (2^24 values at a 32K vocabulary) that traffic bounds the GEMM on a GPU,
// where with 4096 tokens it runs at the tensor cores' rate (docs/performance.md).
int64_t head_chunk_for(int64_t vocab, int64_t capacity, Device device) {
  const int64_t budget = int64_t{1} << (device == Device::CUDA ? 27 : 24);
  int64_t chunk = std::max<int64_t>(1, budget / std::max<int64_t>(1, vocab));
  if (chunk >= 64) chunk = chunk / 64 * 64;
  return std::min(chunk, capacity);
}

// A tensor of `dtype` at `base` (activation memory carved by hand).
Tensor tensor_at(char* base, std::initializer_list<int64_t> dims, DType dtype, Device device) {
  if (dtype == DType::BF16) return Tensor::of_bf16(reinterpret_cast<bf16*>(base), dims, device);
  return Tensor(reinterpret_cast<float*>(base), dims, device);
}

// A layer's saved tensors in the order they are carved from a block: the row
// tensors [rows, width] of the activation dtype, then the small fp32 ones. Bit i of
// a TensorSet stands for kSavedTensors[i].
enum class Width { Hidden, Query, KeyValue, Ffn, One, Heads };
struct SavedTensor {
  Tensor LayerActivations::*member;
  Width width;
};
constexpr SavedTensor kSavedTensors[] = {
    {&LayerActivations::x_in, Width::Hidden},  {&LayerActivations::ln1, Width::Hidden},
    {&LayerActivations::q, Width::Query},      {&LayerActivations::k, Width::KeyValue},
    {&LayerActivations::v, Width::KeyValue},   {&LayerActivations::attn, Width::Query},
    {&LayerActivations::x_mid, Width::Hidden}, {&LayerActivations::ln2, Width::Hidden},
    {&LayerActivations::gate, Width::Ffn},     {&LayerActivations::up, Width::Ffn},
    {&LayerActivations::rstd1, Width::One},    {&LayerActivations::rstd2, Width::One},
    {&LayerActivations::lse, Width::Heads}};
constexpr int kSavedTensorCount = static_cast<int>(std::size(kSavedTensors));
using TensorSet = ModelActivations::TensorSet;
constexpr TensorSet kAllTensors = (TensorSet{1} << kSavedTensorCount) - 1;

constexpr bool is_row(Width w) { return w != Width::One && w != Width::Heads; }

// The norms' and the residual stream's tensors, which sequence parallelism shards.
constexpr bool is_sequence_part(Width w) { return w == Width::Hidden || w == Width::One; }

// Rows (row tensors) or tokens (small ones) of n that a tensor of width w holds: a
// shard's under sequence parallelism over `shards` ranks.
int64_t tensor_rows(Width w, int64_t n, int shards) { return is_sequence_part(w) ? sequence_shard_rows(n, shards) : n; }

// Values per row (row tensors) or per token (small ones) of each Width on this rank.
struct LayerWidths {
  int64_t hidden, query, key_value, ffn, heads;
  int64_t of(Width w) const {
    switch (w) {
      case Width::Hidden:
        return hidden;
      case Width::Query:
        return query;
      case Width::KeyValue:
        return key_value;
      case Width::Ffn:
        return ffn;
      case Width::One:
        return 1;
      case Width::Heads:
        return heads;
    }
    return 0;
  }
};

constexpr TensorSet tensor_bit(Tensor LayerActivations::*member) {
  for (int i = 0; i < kSavedTensorCount; ++i)
    if (kSavedTensors[i].member == member) return TensorSet{1} << i;
  return 0;
}

template <class... Members>
constexpr TensorSet tensor_set(Members... members) {
  return (tensor_bit(members) | ...);
}

// The tensors of a layer whose rows can move to host memory, and the small ones.
template <class A, class Fn>
void for_each_row_tensor(A& a, A& b, Fn&& fn) {
  for (const SavedTensor& t : kSavedTensors)
    if (is_row(t.width)) fn(a.*t.member, b.*t.member);
}

template <class A, class Fn>
void for_each_small_tensor(A& a, A& b, Fn&& fn) {
  for (const SavedTensor& t : kSavedTensors)
    if (!is_row(t.width)) fn(a.*t.member, b.*t.member);
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
      recompute_(capacity.recompute),
      recompute_layers_(capacity.recompute == RecomputeMode::None ? 0 : capacity.recompute_layers),
      planned_recompute_(capacity.planned_recompute && recompute_layers_ > 0),
      rings_(capacity.rings),
      offload_(capacity.offload),
      sequence_shards_(slice.sequence_shards),
      device_(device),
      precision_(precision),
      arena_(Arena::counting(device, "activations")),
      host_arena_(Arena::counting(Device::CPU, "offloaded activations")),
      slots_(capacity.slots) {
  if (recompute_layers_ < 0 || recompute_layers_ > layers_) {
    throw std::invalid_argument("model: recompute_layers " + std::to_string(recompute_layers_) +
                                " outside [0, " + std::to_string(layers_) + "], the stage's layers");
  }
  if (offload_ && sequence_shards_ > 1) {
    throw std::invalid_argument(
        "model: offload moves the same rows of every saved tensor, which sequence parallelism shards unevenly");
  }
  widths_ = activation_widths(config.shape(), partition.tp_size);
  kept_widths_ = activation_widths(config.shape(), partition.tp_size, recompute_, rings_);
  scratch_.head_chunk_tokens = head_chunk_for(vocab_, max_tokens_, device);
  // Layers [recompute_layers, layers - 2) may offload: the last two run their
  // backward at once, recomputed layers keep little.
  const int64_t offloadable = layers_ - 2 - fewest_recompute_layers();
  if (capacity.offload && offloadable > 0) {
    copy_engine_ = std::make_unique<CopyEngine>(device);
    // A micro-batch that recomputes k layers parks its rows of L - 2 - k layers, and
    // the memory limit lets it hold no more tokens per parked layer than the largest
    // offloading micro-batch without recomputation (planning/plan.h): the pool holds
    // that one's rows of every offloadable layer, which lay_out_micro_batch checks.
    const int64_t host_tokens =
        capacity.offloaded_tokens > 0 ? std::min(capacity.offloaded_tokens, max_tokens_) : max_tokens_;
    const size_t host_layer_bytes = static_cast<size_t>(offloadable) * layer_block_bytes(host_tokens, 0, kAllTensors);
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
  // A slot's uploads: tokens, targets and positions (T each) and cu_seqlens (at most T + 1).
  uploads_.reserve(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i) uploads_.emplace_back(device, 4 * max_tokens_ + 1);
}

ModelActivations::~ModelActivations() {
  if (copy_engine_) copy_engine_->synchronize();
}

// What a recomputed layer keeps in its own block (spec/model_shape.h, RecomputeMode);
// ring: its micro-batch takes part in a ring.
ModelActivations::TensorSet ModelActivations::kept_tensors(bool ring) const {
  using A = LayerActivations;
  switch (recompute_) {
    case RecomputeMode::None:
      break;
    case RecomputeMode::Selective:
      return kAllTensors & ~tensor_set(&A::ln1, &A::rstd1, &A::ln2, &A::rstd2);
    case RecomputeMode::Full:
      return ring ? tensor_set(&A::x_in, &A::attn, &A::lse) : tensor_set(&A::x_in);
  }
  return kAllTensors;
}

// Bytes of the saved tensors in `tensors`: row tensors (activation dtype) for `rows`
// rows, the small fp32 ones (1/rms twice, log-sum-exp) for `tokens` tokens, the
// norms' and the residual stream's for a shard of them under sequence parallelism;
// every tensor 64-byte aligned.
size_t ModelActivations::layer_block_bytes(int64_t rows, int64_t tokens, TensorSet tensors) const {
  const LayerWidths widths{hidden_, heads_ * head_dim_, kv_heads_ * head_dim_, ffn_, heads_};
  size_t n = 0;
  for (int i = 0; i < kSavedTensorCount; ++i) {
    if ((tensors >> i & 1) == 0) continue;
    const Width w = kSavedTensors[i].width;
    const int64_t values = tensor_rows(w, is_row(w) ? rows : tokens, sequence_shards_) * widths.of(w);
    const int64_t bytes = values * static_cast<int64_t>(is_row(w) ? dtype_size(precision_) : sizeof(float));
    n += static_cast<size_t>(round_up(bytes, kActivationAlignBytes));
  }
  return n;
}

// The saved tensors in `tensors`, carved from `base`: row tensors with `rows` rows,
// the small ones for `tokens` tokens; the others stay empty.
LayerActivations ModelActivations::carve_layer(char* base, int64_t rows, int64_t tokens, TensorSet tensors) const {
  const LayerWidths widths{hidden_, heads_ * head_dim_, kv_heads_ * head_dim_, ffn_, heads_};
  LayerActivations a;
  for (int i = 0; i < kSavedTensorCount; ++i) {
    if ((tensors >> i & 1) == 0) continue;
    const Width w = kSavedTensors[i].width;
    Tensor t = is_row(w) ? tensor_at(base, {tensor_rows(w, rows, sequence_shards_), widths.of(w)}, precision_, device_)
                         : tensor_at(base, {tensor_rows(w, tokens, sequence_shards_) * widths.of(w)}, DType::F32, device_);
    if (w == Width::Heads) t = t.view({heads_, tokens});  // log-sum-exp: [heads, T]
    base += round_up(static_cast<int64_t>(t.bytes()), kActivationAlignBytes);
    a.*kSavedTensors[i].member = t;
  }
  return a;
}

double ModelActivations::saved_bytes_per_token(int64_t layer) const {
  return (layer < recompute_layers_ ? kept_widths_ : widths_)
      .bytes_per_token(static_cast<int>(dtype_size(precision_)), sequence_shards_);
}

double ModelActivations::whole_layer_bytes_per_token() const {
  return widths_.bytes_per_token(static_cast<int>(dtype_size(precision_)), sequence_shards_);
}

int64_t ModelActivations::saved_floats_per_token() const {
  auto floats = [&](const ActivationWidths& w) { return w.bytes_per_token(4, sequence_shards_) / 4; };
  if (layers_ == 0) return static_cast<int64_t>(std::ceil(floats(widths_)));
  const int64_t R = fewest_recompute_layers();
  const double total = static_cast<double>(R) * floats(kept_widths_) + static_cast<double>(layers_ - R) * floats(widths_);
  return static_cast<int64_t>(std::ceil(total / static_cast<double>(layers_)));
}

void ModelActivations::lay_out(Arena& arena) {
  const int64_t T = max_tokens_, H = hidden_, F = ffn_, L = layers_, R = recompute_layers_;
  // Under sequence parallelism: a shard's rows, and the whole padded sequence's.
  const int64_t shard = sequence_shard_rows(T, sequence_shards_), whole = sequence_shards_ * shard;
  const int64_t qdim = heads_ * head_dim_, kv = kv_heads_ * head_dim_;
  // A slot holds every layer's block at the plain capacity (a recomputed layer's
  // smaller one); offloaded micro-batches of up to max_tokens use the same memory
  // (two working blocks plus the rows kept on the device), which the planner's token
  // limit guarantees fits, up to the small per-token tensors, which are never
  // offloaded. The planner's limit counts every layer of the stage as offloaded
  // (planning/plan.h, max_micro_batch_tokens), so the recomputed layers' blocks come
  // on top of that budget.
  // Planned recomputation: a micro-batch within the capacity recomputes nothing, and
  // one above it recomputes k <= R layers under the limit
  //   t (k rho + min(2, L - k) + (L - k - 2)+ (1 - r)) <= L C
  // with rho the recomputed layer's bytes per token over a whole layer's, which the
  // step planner takes from the same formula as these blocks (spec/model_shape.h,
  // saved_bytes_per_token; a ring layer's when the model has rings). So at any k and
  // ratio the micro-batch's bytes per token times its tokens are within L capacities'
  // whole blocks, up to the small tensors of the offloaded layers and, per layer, the
  // 64-byte alignment of each tensor, the kept rows rounded to whole rows and the
  // sequence shards rounded up: two blocks of one row and one token cover those.
  // In bytes (activations in the model's precision, the small tensors in fp32).
  const TensorSet kept = kept_tensors(rings_);
  const int64_t fewest = fewest_recompute_layers();
  size_t region = static_cast<size_t>(fewest) * layer_block_bytes(capacity_, capacity_, kept) +
                  static_cast<size_t>(L - fewest) * layer_block_bytes(capacity_, capacity_, kAllTensors);
  if (planned_recompute_ && T > capacity_) {
    region += static_cast<size_t>(L) * (layer_block_bytes(0, T, kAllTensors) + 2 * layer_block_bytes(1, 1, kAllTensors));
  } else if (offload_ && L >= 3) {
    // Slack: the kept rows of each layer are rounded to whole rows. A stage whose
    // layers all recompute or run their backward at once holds such micro-batches
    // whole in the same memory (the planner's limit is at most L / 2 capacities).
    region = std::max(region, static_cast<size_t>(R) * layer_block_bytes(T, T, kept) +
                                  static_cast<size_t>(L) * (layer_block_bytes(capacity_, 0, kAllTensors) +
                                                            layer_block_bytes(0, T, kAllTensors) +
                                                            static_cast<size_t>(widths_.row) * dtype_size(precision_)));
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
    s.x_out = arena.tensor({shard, H}, precision_);
    if (has_head_) {
      s.rstd_final = arena.tensor({shard});
      s.ln_final = arena.tensor({shard, H}, precision_);
    }
  }
  ActivationScratch& s = scratch_;
  s.residual_grad = arena.tensor({shard, H}, precision_);
  s.norm_grad = arena.tensor({whole, H}, precision_);
  if (sequence_shards_ > 1) {
    s.sequence_whole = arena.tensor({whole, H}, precision_);
    s.norm_grad_shard = arena.tensor({shard, H}, precision_);
    s.norm_weight_grad = arena.tensor({H});  // fp32, as the gradients
  }
  s.dq = arena.tensor({T, qdim}, precision_);
  s.dk = arena.tensor({T, kv}, precision_);
  s.dv = arena.tensor({T, kv}, precision_);
  s.dattn = arena.tensor({T, qdim}, precision_);
  s.dgate = arena.tensor({T, F}, precision_);
  s.dup = arena.tensor({T, F}, precision_);
  s.ffn_act = arena.tensor({T, F}, precision_);
  s.dffn_act = arena.tensor({T, F}, precision_);
  // The recomputed layers' tensors that none of them keeps (a ring layer keeps more).
  if (R > 0) {
    const size_t shared = layer_block_bytes(T, T, kAllTensors & ~kept_tensors(false));
    s.recomputed = arena.tensor({static_cast<int64_t>(shared / sizeof(float))});  // raw bytes, carved by carve_layer
  }
  if (has_head_) {
    s.logits = arena.tensor({s.head_chunk_tokens, vocab_}, precision_);
    s.ce_stats = arena.tensor({3 * s.head_chunk_tokens});
    s.ce_global = arena.tensor({s.head_chunk_tokens});
  }
}

void ModelActivations::load(int slot, const MicroBatchView& batch) {
  MicroBatchSlot& s = slots_.at(slot);
  s.tokens_used = static_cast<int64_t>(batch.tokens.size());
  s.shard_rows = sequence_shard_rows(s.tokens_used, sequence_shards_);
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
  // Host spans into the slot's device tensors, through its staging buffer: no host wait.
  UploadStaging& staging = uploads_.at(static_cast<size_t>(slot));
  staging.begin();
  staging.upload(s.tokens, batch.tokens);
  staging.upload(s.targets, batch.targets);
  staging.upload(s.positions, batch.positions);
  staging.upload(s.cu_seqlens, batch.cu_seqlens);
  if (batch.recompute_layers != 0 &&
      (!planned_recompute_ || batch.recompute_layers < 0 || batch.recompute_layers > recompute_layers_)) {
    throw std::invalid_argument("micro-batch recomputing " + std::to_string(batch.recompute_layers) + " layers, but " +
                                (planned_recompute_ ? "the model recomputes at most " + std::to_string(recompute_layers_)
                                                    : std::string("the model does not plan recomputation per micro-batch")));
  }
  s.recompute_layers = planned_recompute_ ? batch.recompute_layers : recompute_layers_;
  lay_out_micro_batch(s, batch.offload_ratio);
}

// Where this micro-batch's layer activations live. A recomputed layer i < R has its
// own block of the tensors it keeps, the others in the shared block. Without
// offload, every other layer has its own block. With offload, layer i >= R runs in
// working block (i - R) % 2; after its forward, layers below the last two keep their
// first keep_rows rows (and the small tensors) in a smaller device block and send
// the other rows to the host pool, and come back to their working block before
// their backward.
void ModelActivations::lay_out_micro_batch(MicroBatchSlot& s, double offload_ratio) {
  const int64_t T = s.tokens_used, L = layers_, R = s.recompute_layers;
  char* region = reinterpret_cast<char*>(s.region.raw());  // sizes below are in bytes
  const size_t capacity = s.region.bytes();
  const int64_t offloadable = L - 2 - R;
  s.offloaded = offload_ratio > 0 && offloadable > 0;
  if (s.offloaded && !copy_engine_) {
    throw std::invalid_argument("micro-batch with offload ratio " + std::to_string(offload_ratio) +
                                " but offload is not enabled for this model");
  }
  const TensorSet kept = kept_tensors(s.has_ring);
  const size_t recomputed_block = layer_block_bytes(T, T, kept);
  if (R > 0) {
    const LayerActivations shared =
        carve_layer(reinterpret_cast<char*>(scratch_.recomputed.raw()), T, T, kAllTensors & ~kept_tensors(false));
    for (int64_t i = 0; i < R; ++i) {
      LayerActivations& a = s.layers[i];
      a = carve_layer(region + i * recomputed_block, T, T, kept);
      for (int t = 0; t < kSavedTensorCount; ++t)
        if ((kept >> t & 1) == 0) a.*kSavedTensors[t].member = shared.*kSavedTensors[t].member;
    }
  }
  char* const rest = region + R * recomputed_block;  // the other layers' memory
  size_t used = static_cast<size_t>(R) * recomputed_block;
  if (!s.offloaded) {
    const size_t block = layer_block_bytes(T, T, kAllTensors);
    used += static_cast<size_t>(L - R) * block;
    if (used > capacity) {
      throw std::invalid_argument("micro-batch of " + std::to_string(T) + " tokens does not fit the activation memory "
                                  "of " + std::to_string(capacity_) + " tokens per layer without offload");
    }
    for (int64_t i = R; i < L; ++i) s.layers[i] = carve_layer(rest + (i - R) * block, T, T, kAllTensors);
  } else {
    const int64_t off = std::clamp<int64_t>(std::llround(offload_ratio * static_cast<double>(T)), 0, T);
    s.keep_rows = T - off;
    const size_t work = layer_block_bytes(T, T, kAllTensors), keep = layer_block_bytes(s.keep_rows, T, kAllTensors);
    used += 2 * work + static_cast<size_t>(offloadable) * keep;
    if (used > capacity) {
      throw std::invalid_argument("micro-batch of " + std::to_string(T) + " tokens with offload ratio " +
                                  std::to_string(offload_ratio) + " does not fit the activation memory");
    }
    const size_t parked = layer_block_bytes(off, 0, kAllTensors);
    if (static_cast<size_t>(offloadable) * parked > s.host.bytes()) {
      throw std::invalid_argument("micro-batch of " + std::to_string(T) + " tokens with offload ratio " +
                                  std::to_string(offload_ratio) + " recomputing " + std::to_string(R) +
                                  " layers does not fit the host pool");
    }
    for (int64_t i = R; i < L; ++i) {
      s.layers[i] = carve_layer(rest + ((i - R) % 2) * work, T, T, kAllTensors);
      if (i < L - 2) {
        s.kept[i] = carve_layer(rest + 2 * work + (i - R) * keep, s.keep_rows, T, kAllTensors);
        s.parked[i] = carve_layer(reinterpret_cast<char*>(s.host.raw()) + (i - R) * parked, off, 0, kAllTensors);
      }
    }
    usage_.host_peak_bytes = std::max(usage_.host_peak_bytes, static_cast<size_t>(offloadable) * parked);
  }
  usage_.device_peak_bytes = std::max(usage_.device_peak_bytes, used);
}

bool ModelActivations::offloaded_layer(const MicroBatchSlot& s, int64_t layer) const {
  return s.offloaded && layer >= s.recompute_layers && layer < layers_ - 2;
}

const CopyEvent& ModelActivations::output_block_free(const MicroBatchSlot& s, int64_t layer) const {
  static const CopyEvent kNone;
  return offloaded_layer(s, layer - 1) ? s.offload_done[layer - 1] : kNone;
}

void ModelActivations::offload_after_forward(MicroBatchSlot& s, int64_t layer) {
  if (offloaded_layer(s, layer)) park_layer(s, layer);
}

void ModelActivations::restore_before_backward(MicroBatchSlot& s, int64_t layer) {
  if (offloaded_layer(s, layer - 1)) restore_layer(s, layer - 1);
  if (offloaded_layer(s, layer)) s.restore_done[layer].wait();
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

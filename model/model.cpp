#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "kernels/ops.h"
#include "model/init_rng.h"
#include "parallel/tensor_parallel.h"

namespace hdp {
namespace {

constexpr int64_t kParamAlignFloats = 16;  // 64-byte alignment of every tensor in the flat buffer
constexpr int64_t kActivationAlignBytes = 64;  // of every saved activation tensor
constexpr int64_t kLogitsBudgetFloats = int64_t{1} << 24;

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Tokens per LM-head chunk: bounds the [chunk, vocab] logits buffer.
int64_t head_chunk_for(int64_t vocab, int64_t capacity) {
  int64_t chunk = std::max<int64_t>(1, kLogitsBudgetFloats / std::max<int64_t>(1, vocab));
  if (chunk >= 64) chunk = chunk / 64 * 64;
  return std::min(chunk, capacity);
}

// Rows [begin, end) of an even split of n into parts.
int64_t split_point(int64_t n, int part, int parts) { return n * part / parts; }

// A tensor of `dtype` at `base` (activation memory carved by hand).
Tensor tensor_at(char* base, std::initializer_list<int64_t> dims, DType dtype, Device device) {
  if (dtype == DType::BF16) return Tensor::of_bf16(reinterpret_cast<bf16*>(base), dims, device);
  return Tensor(reinterpret_cast<float*>(base), dims, device);
}

// Where a transformer layer's parameters are named, by its index in the whole model.
std::string layer_prefix(int64_t layer) { return "model.layers." + std::to_string(layer) + "."; }

}  // namespace

LlamaModel::LlamaModel(const ModelConfig& config, int64_t capacity_tokens, const ModelPartition& partition,
                       int activation_slots, Communicator* tp, const LongSequenceOptions& long_sequences,
                       Device device, DType precision, Communicator* ep)
    : config_(config),
      partition_(partition),
      capacity_(capacity_tokens),
      max_tokens_(std::max(capacity_tokens, long_sequences.max_tokens)),
      tp_(tp),
      tp_regions_(tp),
      device_(device),
      precision_(precision),
      param_arena_(Arena::counting(device, "parameters")),
      grad_arena_(Arena::counting(device, "gradients")),
      activation_arena_(Arena::counting(device, "activations")),
      host_arena_(Arena::counting(Device::CPU, "offloaded activations")) {
  const ModelConfig& c = config;
  const int tp_size = partition.tp_size;
  if (capacity_tokens <= 0) throw std::invalid_argument("model: capacity_tokens must be positive");
  if (precision != DType::F32 && precision != DType::BF16)
    throw std::invalid_argument(std::string("model: precision ") + dtype_name(precision) + " is not fp32 or bf16");
  if (activation_slots <= 0) throw std::invalid_argument("model: activation_slots must be positive");
  if (c.hidden_size % c.num_heads != 0 || c.num_heads % c.num_kv_heads != 0 || c.head_dim() % 2 != 0) {
    throw std::invalid_argument("model: heads must divide hidden size, kv heads must divide heads, head_dim even");
  }
  if (!tp_divides_kv_heads(c.num_kv_heads, tp_size) || c.ffn_hidden_size % tp_size != 0 || c.vocab_size < tp_size) {
    throw std::invalid_argument("model: tensor parallel degree " + std::to_string(tp_size) +
                                " must divide num_kv_heads and ffn_hidden_size");
  }
  // Without a communicator a tp slice can hold and load weights (checkpoint tools)
  // but not run.
  if (tp != nullptr && tp->size() != tp_size) {
    throw std::invalid_argument("model: the tp communicator size differs from partition.tp_size");
  }
  if (partition.ep_size < 1 || partition.ep_rank < 0 || partition.ep_rank >= partition.ep_size ||
      (partition.ep_size > 1 && (!c.moe() || c.num_experts % partition.ep_size != 0)) ||
      (ep != nullptr && (ep->size() != partition.ep_size || ep->rank() != partition.ep_rank))) {
    throw std::invalid_argument("model: expert parallelism of " + std::to_string(partition.ep_size) +
                                " needs a mixture of experts whose count it divides, and a matching ep communicator");
  }
  num_local_layers_ = partition.num_layers < 0 ? c.num_layers - partition.first_layer : partition.num_layers;
  if (partition.first_layer < 0 || num_local_layers_ < 0 || partition.first_layer + num_local_layers_ > c.num_layers) {
    throw std::invalid_argument("model: layer range outside the model");
  }
  local_heads_ = c.num_heads / tp_size;
  local_kv_heads_ = c.num_kv_heads / tp_size;
  local_ffn_ = c.ffn_hidden_size / tp_size;
  vocab_begin_ = split_point(c.vocab_size, partition.tp_rank, tp_size);
  local_vocab_ = split_point(c.vocab_size, partition.tp_rank + 1, tp_size) - vocab_begin_;
  head_chunk_tokens_ = head_chunk_for(local_vocab_, max_tokens_);
  const ActivationWidths widths = activation_widths(c.shape(), tp_size);
  row_width_ = widths.row;
  small_width_ = widths.small;

  build_parameter_table();
  // bf16: the compute copy sits behind the fp32 master weights (both 64-byte aligned).
  const size_t compute_bytes =
      precision == DType::BF16 ? static_cast<size_t>(round_up(flat_numel_ * 2, Arena::kAlignment)) : 0;
  param_arena_ = Arena(device, static_cast<size_t>(flat_numel_) * sizeof(float) + compute_bytes, "parameters");
  grad_arena_ = Arena(device, static_cast<size_t>(flat_numel_) * sizeof(float), "gradients");
  params_ = param_arena_.tensor({flat_numel_});
  if (precision == DType::BF16) compute_params_ = param_arena_.tensor({flat_numel_}, DType::BF16);
  grads_ = grad_arena_.tensor({flat_numel_});
  fill(params_, 0.0f);
  fill(grads_, 0.0f);
  refresh_compute_weights();
  bind_parameters();

  slots_.resize(activation_slots);
  if (c.moe()) {
    // The MoE blocks keep their routing and saved rows, one set per slot and layer, and
    // share one workspace; each holds this rank's tp slice of its experts (all, or its
    // share under ep).
    const MoeShape moe{c.hidden_size, local_ffn_, c.num_experts, c.experts_per_token};
    const bool expert_parallel = ep != nullptr && ep->size() > 1;
    moe_workspace_ = std::make_unique<MoeWorkspace>(moe, max_tokens_, device, precision, expert_parallel);
    moe_.resize(activation_slots);
    for (std::vector<MoeBlock>& blocks : moe_)
      for (int64_t l = 0; l < num_local_layers_; ++l) blocks.emplace_back(moe, max_tokens_, *moe_workspace_, tp, ep);
    for (Slot& slot : slots_) {
      slot.routing_before.assign(2 * c.num_experts, 0.0f);
      slot.routing_through.assign(2 * c.num_experts, 0.0f);
      slot.routing_totals.assign(c.num_experts + 2, 0.0f);
    }
  }
  if (long_sequences.offload && num_local_layers_ >= 3) {
    copy_engine_ = std::make_unique<CopyEngine>(device);
    const size_t host_layer_bytes = static_cast<size_t>(num_local_layers_ - 2) * layer_block_bytes(max_tokens_, 0);
    // Pinned on CUDA, so the copy stream moves rows asynchronously at full bandwidth.
    const size_t host_bytes = host_layer_bytes * slots_.size();
    host_arena_ = device == Device::CUDA ? Arena::pinned_host(host_bytes, "offloaded activations")
                                         : Arena(Device::CPU, host_bytes, "offloaded activations");
    for (Slot& slot : slots_) slot.host = host_arena_.tensor({static_cast<int64_t>(host_layer_bytes / sizeof(float))});
    usage_.host_pool_bytes = host_arena_.capacity();
  }
  if (long_sequences.hdp != nullptr && long_sequences.hdp->size() > 1) {
    ring_attention_ = std::make_unique<RingAttention>(*long_sequences.hdp, max_tokens_, local_heads_, local_kv_heads_,
                                                      c.head_dim(), c.attention_window(), precision, device);
  }
  Arena sizing = Arena::counting(device, "activations");
  layout_activations(sizing);
  activation_arena_ = Arena(device, sizing.used(), "activations");
  layout_activations(activation_arena_);
  // Host lists sized by the token capacity, once the arena holding far more per
  // token was had: for an impossible capacity the arena's OutOfMemory (bad input,
  // naming the bytes) comes first, not a bare std::bad_alloc from here.
  for (Slot& s : slots_) s.local_blocks.reserve(static_cast<size_t>(max_tokens_));
}

LlamaModel::~LlamaModel() {
  if (copy_engine_) copy_engine_->synchronize();
}

// In forward order (embedding, layers, final norm and LM head), so that backward
// finishes the gradients from the end of the flat buffer down (GradientsReady).
size_t LlamaModel::activation_bytes() const {
  size_t bytes = activation_arena_.capacity();
  if (moe_workspace_) bytes += moe_workspace_->bytes();
  for (const std::vector<MoeBlock>& blocks : moe_)
    for (const MoeBlock& block : blocks) bytes += block.bytes();
  return bytes;
}

std::vector<int64_t> LlamaModel::local_experts() const {
  const int64_t per_rank = config_.num_experts / partition_.ep_size;
  std::vector<int64_t> experts(per_rank);
  for (int64_t j = 0; j < per_rank; ++j) experts[j] = partition_.ep_rank * per_rank + j;
  return experts;
}

void LlamaModel::build_parameter_table() {
  const ModelConfig& c = config_;
  const int r = partition_.tp_rank;
  const int64_t H = c.hidden_size, F = c.ffn_hidden_size, d = c.head_dim();
  const int64_t q_rows = local_heads_ * d, kv_rows = local_kv_heads_ * d;
  int64_t offset = 0;
  struct Spec {
    int dim = -1;
    int64_t begin = 0, end = 0;
  };
  auto add = [&](std::string name, std::vector<int64_t> global, Spec shard, bool decay, bool scaled, bool ones,
                 bool tied_copy = false, bool expert = false) {
    ParameterInfo p;
    p.name = std::move(name);
    p.global_shape = global;
    p.shape = global;
    p.shard_dim = shard.dim;
    if (shard.dim >= 0) {
      p.shard_begin = shard.begin;
      p.shard_end = shard.end;
      p.shape[shard.dim] = shard.end - shard.begin;
    } else {
      p.shard_end = global[0];
    }
    p.numel = 1;
    for (int64_t x : p.shape) p.numel *= x;
    p.offset = offset;
    p.weight_decay = decay;
    p.scaled_init = scaled;
    p.ones_init = ones;
    p.tied_copy = tied_copy;
    p.expert = expert;
    offset += round_up(p.numel, kParamAlignFloats);
    parameters_.push_back(std::move(p));
  };
  const Spec vocab{0, vocab_begin_, vocab_begin_ + local_vocab_};
  const Spec q_shard{0, r * q_rows, (r + 1) * q_rows}, kv_shard{0, r * kv_rows, (r + 1) * kv_rows};
  const Spec o_shard{1, r * q_rows, (r + 1) * q_rows};
  const Spec ffn_rows{0, r * local_ffn_, (r + 1) * local_ffn_}, ffn_cols{1, r * local_ffn_, (r + 1) * local_ffn_};
  const Spec replicated{};

  if (partition_.has_embedding) add("model.embed_tokens.weight", {c.vocab_size, H}, vocab, true, false, false);
  for (int64_t l = partition_.first_layer; l < partition_.first_layer + num_local_layers_; ++l) {
    const std::string pre = layer_prefix(l);
    add(pre + "input_layernorm.weight", {H}, replicated, false, false, true);
    add(pre + "self_attn.q_proj.weight", {c.num_heads * d, H}, q_shard, true, false, false);
    add(pre + "self_attn.k_proj.weight", {c.num_kv_heads * d, H}, kv_shard, true, false, false);
    add(pre + "self_attn.v_proj.weight", {c.num_kv_heads * d, H}, kv_shard, true, false, false);
    add(pre + "self_attn.o_proj.weight", {H, c.num_heads * d}, o_shard, true, true, false);
    add(pre + "post_attention_layernorm.weight", {H}, replicated, false, false, true);
    if (c.moe()) {
      // Mixtral: the router and every expert under Hugging Face's names; w2 (down) is
      // an output projection, initialised scaled like down_proj.
      add(pre + "block_sparse_moe.gate.weight", {c.num_experts, H}, replicated, true, false, false);
      for (int64_t e : local_experts()) {
        const std::string ex = pre + "block_sparse_moe.experts." + std::to_string(e) + ".";
        add(ex + "w1.weight", {F, H}, ffn_rows, true, false, false, false, true);
        add(ex + "w2.weight", {H, F}, ffn_cols, true, true, false, false, true);
        add(ex + "w3.weight", {F, H}, ffn_rows, true, false, false, false, true);
      }
      continue;
    }
    add(pre + "mlp.gate_proj.weight", {F, H}, ffn_rows, true, false, false);
    add(pre + "mlp.up_proj.weight", {F, H}, ffn_rows, true, false, false);
    add(pre + "mlp.down_proj.weight", {H, F}, ffn_cols, true, true, false);
  }
  if (partition_.has_head) {
    add("model.norm.weight", {H}, replicated, false, false, true);
    if (!c.tie_embeddings) {
      add("lm_head.weight", {c.vocab_size, H}, vocab, true, false, false);
    } else if (!partition_.has_embedding) {
      add("model.embed_tokens.weight", {c.vocab_size, H}, vocab, true, false, false, true);
    }
  }
  flat_numel_ = std::max<int64_t>(offset, kParamAlignFloats);
}

void LlamaModel::bind_parameters() {
  // Weights are read from the compute copy (bf16 in mixed precision), gradients
  // are the fp32 flat buffer: the same offsets in both.
  const Tensor weights = compute_parameters();
  auto view = [&](const Tensor& flat, const ParameterInfo& p) {
    Tensor t = flat.rows(p.offset, p.offset + p.numel);
    t.ndim = 0;
    for (int64_t d : p.shape) t.shape[t.ndim++] = d;
    return t;
  };
  layer_parameters_.resize(num_local_layers_);
  for (int64_t l = 0; l < num_local_layers_; ++l) {
    const std::string pre = layer_prefix(partition_.first_layer + l);
    LayerParameters& layer = layer_parameters_[l];
    layer.gradients_begin = flat_numel_;
    auto bind = [&](const char* name, Tensor LayerTensors::*tensor) {
      const ParameterInfo& p = parameter(pre + name);
      layer.weights.*tensor = view(weights, p);
      layer.gradients.*tensor = view(grads_, p);
      layer.gradients_begin = std::min(layer.gradients_begin, p.offset);
    };
    bind("input_layernorm.weight", &LayerTensors::input_norm);
    bind("self_attn.q_proj.weight", &LayerTensors::q);
    bind("self_attn.k_proj.weight", &LayerTensors::k);
    bind("self_attn.v_proj.weight", &LayerTensors::v);
    bind("self_attn.o_proj.weight", &LayerTensors::o);
    bind("post_attention_layernorm.weight", &LayerTensors::post_norm);
    if (config_.moe()) {
      auto bind_moe = [&](const std::string& name, Tensor& weight, Tensor& gradient) {
        const ParameterInfo& p = parameter(pre + name);
        weight = view(weights, p);
        gradient = view(grads_, p);
        layer.gradients_begin = std::min(layer.gradients_begin, p.offset);
      };
      MoeTensors& w = layer.weights.moe;
      MoeTensors& g = layer.gradients.moe;
      bind_moe("block_sparse_moe.gate.weight", w.gate, g.gate);
      const std::vector<int64_t> experts = local_experts();
      for (MoeTensors* t : {&w, &g}) {
        t->w1.resize(experts.size());
        t->w2.resize(experts.size());
        t->w3.resize(experts.size());
      }
      for (size_t j = 0; j < experts.size(); ++j) {
        const std::string ex = "block_sparse_moe.experts." + std::to_string(experts[j]) + ".";
        bind_moe(ex + "w1.weight", w.w1[j], g.w1[j]);
        bind_moe(ex + "w2.weight", w.w2[j], g.w2[j]);
        bind_moe(ex + "w3.weight", w.w3[j], g.w3[j]);
      }
      continue;
    }
    bind("mlp.gate_proj.weight", &LayerTensors::gate);
    bind("mlp.up_proj.weight", &LayerTensors::up);
    bind("mlp.down_proj.weight", &LayerTensors::down);
  }
  if (partition_.has_embedding) {
    const ParameterInfo& p = parameter("model.embed_tokens.weight");
    embed_ = view(weights, p);
    d_embed_ = view(grads_, p);
    embedding_gradients_begin_ = p.offset;
  }
  if (partition_.has_head) {
    const ParameterInfo& norm = parameter("model.norm.weight");
    // Tied embeddings: the stage's embedding table, or on a last stage without
    // the embedding its tied copy, under the same name.
    const ParameterInfo& head = parameter(config_.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
    final_norm_ = view(weights, norm);
    d_final_norm_ = view(grads_, norm);
    head_ = view(weights, head);
    d_head_ = view(grads_, head);
    // A head that is this stage's embedding table gets its gradient final with the embedding's.
    const bool head_is_embedding = config_.tie_embeddings && partition_.has_embedding;
    head_gradients_begin_ = head_is_embedding ? norm.offset : std::min(norm.offset, head.offset);
  }
}

// Bytes of one layer's saved tensors: row tensors (activation dtype) for `rows`
// rows, the small fp32 ones (1/rms twice, log-sum-exp) for `tokens` tokens; every
// tensor 64-byte aligned.
size_t LlamaModel::layer_block_bytes(int64_t rows, int64_t tokens) const {
  auto aligned = [](int64_t n) { return static_cast<size_t>(round_up(n, kActivationAlignBytes)); };
  const int64_t H = config_.hidden_size, F = local_ffn_, d = config_.head_dim();
  const int64_t qdim = local_heads_ * d, kv = local_kv_heads_ * d;
  const int64_t row_bytes = static_cast<int64_t>(dtype_size(precision_)), small_bytes = sizeof(float);
  size_t n = 0;
  for (int64_t width : {H, H, qdim, kv, kv, qdim, H, H, F, F}) n += aligned(rows * width * row_bytes);
  for (int64_t width : {int64_t{1}, int64_t{1}, local_heads_}) n += aligned(tokens * width * small_bytes);
  return n;
}

// One layer's saved tensors, carved from `base`: row tensors with `rows` rows, the
// small ones for `tokens` tokens.
LlamaModel::LayerActivations LlamaModel::carve_layer(char* base, int64_t rows, int64_t tokens) const {
  const int64_t H = config_.hidden_size, F = local_ffn_, d = config_.head_dim();
  const int64_t qdim = local_heads_ * d, kv = local_kv_heads_ * d;
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
  a.lse = take(tokens, local_heads_, DType::F32).view({local_heads_, tokens});
  return a;
}

void LlamaModel::layout_activations(Arena& arena) {
  const int64_t T = max_tokens_, H = config_.hidden_size, F = local_ffn_, L = num_local_layers_;
  const int64_t qdim = local_heads_ * config_.head_dim(), kv = local_kv_heads_ * config_.head_dim();
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
  for (Slot& s : slots_) {
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
    if (partition_.has_head) {
      s.rstd_final = arena.tensor({T});
      s.ln_final = arena.tensor({T, H}, precision_);
    }
  }
  Scratch& s = scratch_;
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
  if (partition_.has_head) {
    s.logits = arena.tensor({head_chunk_tokens_, local_vocab_}, precision_);
    s.ce_stats = arena.tensor({3 * head_chunk_tokens_});
    s.ce_global = arena.tensor({head_chunk_tokens_});
  }
}

// Where this micro-batch's layer activations live. Without offload, layer i has its
// own block. With offload, layer i runs in working block i % 2; after its forward,
// layers below the last two keep their first keep_rows rows (and the small tensors)
// in a smaller device block and send the other rows to the host pool, and come
// back to their working block before their backward.
void LlamaModel::layout_micro_batch(Slot& s, double offload_ratio) {
  const int64_t T = s.tokens_used, L = num_local_layers_;
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

namespace {

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

void LlamaModel::park_layer(Slot& s, int64_t layer) {
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

void LlamaModel::restore_layer(Slot& s, int64_t layer) {
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

const ParameterInfo& LlamaModel::parameter(const std::string& name) const {
  for (const ParameterInfo& p : parameters_)
    if (p.name == name) return p;
  throw std::out_of_range("model has no parameter '" + name + "'");
}

Tensor LlamaModel::parameter_tensor(const ParameterInfo& p) const {
  return Tensor(params_.data + p.offset, {p.numel}, device_);
}

Tensor LlamaModel::gradient_tensor(const ParameterInfo& p) const {
  return Tensor(grads_.data + p.offset, {p.numel}, device_);
}

int64_t LlamaModel::num_parameters() const {
  int64_t n = 0;
  for (const ParameterInfo& p : parameters_) n += p.numel;
  return n;
}

void LlamaModel::init_weights(uint64_t seed) {
  fill(params_, 0.0f);
  const double std_out = config_.init_std / std::sqrt(2.0 * static_cast<double>(config_.num_layers));
  std::vector<float> whole, local;
  for (const ParameterInfo& p : parameters_) {
    int64_t global_numel = 1;
    for (int64_t x : p.global_shape) global_numel *= x;
    whole.resize(global_numel);
    if (p.ones_init) {
      std::fill(whole.begin(), whole.end(), 1.0f);
    } else {
      NormalStream normal(hash_name(p.name, seed));
      const double std = p.scaled_init ? std_out : config_.init_std;
      for (float& x : whole) x = static_cast<float>(normal.next() * std);
    }
    // This rank's slice: a block of rows, or of columns of every row.
    local.resize(p.numel);
    const int64_t cols = p.global_shape.size() > 1 ? p.global_shape[1] : 1;
    if (p.shard_dim == 1) {
      const int64_t width = p.shard_end - p.shard_begin;
      for (int64_t row = 0; row < p.global_shape[0]; ++row) {
        std::copy_n(whole.begin() + row * cols + p.shard_begin, width, local.begin() + row * width);
      }
    } else {
      const int64_t first_row = p.shard_dim == 0 ? p.shard_begin : 0;
      std::copy_n(whole.begin() + first_row * cols, p.numel, local.begin());
    }
    copy(parameter_tensor(p), Tensor(local.data(), {p.numel}, Device::CPU));
  }
  refresh_compute_weights();
}

void LlamaModel::refresh_compute_weights() {
  if (precision_ == DType::BF16) copy(compute_params_, params_);  // rounds to nearest even
}

void LlamaModel::zero_grad() { fill(grads_, 0.0f); }

void LlamaModel::set_batch(int slot, const MicroBatchView& batch) {
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
  Slot& s = slots_.at(slot);
  s.tokens_used = T;
  if (!moe_.empty()) {
    s.predictions = 0;
    for (int32_t target : batch.targets) s.predictions += target >= 0;
    std::fill(s.routing_before.begin(), s.routing_before.end(), 0.0f);
  }
  s.num_sequences = static_cast<int64_t>(batch.cu_seqlens.size()) - 1;
  s.ring_begin = ring_begin;
  s.has_ring = batch.ring != nullptr;
  if (s.has_ring) {
    if (!ring_attention_) throw std::invalid_argument("micro-batch with a ring but the model has no ring communicator");
    if (batch.ring->rows(batch.ring->self) != T - ring_begin) {
      throw std::invalid_argument("micro-batch: the ring layout holds " +
                                  std::to_string(batch.ring->rows(batch.ring->self)) + " rows of this rank, the batch " +
                                  std::to_string(T - ring_begin));
    }
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
  layout_micro_batch(s, batch.offload_ratio);
}

Tensor LlamaModel::input_activation(int slot) const {
  const Slot& s = slots_.at(slot);
  return num_local_layers_ > 0 ? s.layers[0].x_in : s.x_out.rows(0, s.tokens_used);
}

Tensor LlamaModel::output_activation(int slot) const {
  const Slot& s = slots_.at(slot);
  return s.x_out.rows(0, s.tokens_used);
}

Tensor LlamaModel::output_gradient(int slot) const { return scratch_.residual_grad.rows(0, slots_.at(slot).tokens_used); }

Tensor LlamaModel::input_gradient(int slot) const { return scratch_.residual_grad.rows(0, slots_.at(slot).tokens_used); }

void LlamaModel::attention_forward_of(Slot& s, const LayerActivations& a) {
  const int64_t T = s.tokens_used, Hq = local_heads_, Hkv = local_kv_heads_, d = config_.head_dim();
  const Tensor out = a.attn.view({T, Hq, d}), q = a.q.view({T, Hq, d}), k = a.k.view({T, Hkv, d}),
               v = a.v.view({T, Hkv, d});
  if (s.has_ring) {
    ring_attention_->forward(out, a.lse, q, k, v, s.local_blocks, s.ring, s.ring_begin);
  } else {
    attention_forward(out, a.lse, q, k, v, s.cu_seqlens.rows(0, s.num_sequences + 1), config_.attention_window());
  }
}

void LlamaModel::attention_backward_of(Slot& s, const LayerActivations& a) {
  const int64_t T = s.tokens_used, Hq = local_heads_, Hkv = local_kv_heads_, d = config_.head_dim();
  const Scratch& sc = scratch_;
  const Tensor dq = sc.dq.rows(0, T).view({T, Hq, d}), dk = sc.dk.rows(0, T).view({T, Hkv, d}),
               dv = sc.dv.rows(0, T).view({T, Hkv, d}), dout = sc.dattn.rows(0, T).view({T, Hq, d});
  const Tensor out = a.attn.view({T, Hq, d}), q = a.q.view({T, Hq, d}), k = a.k.view({T, Hkv, d}),
               v = a.v.view({T, Hkv, d});
  if (s.has_ring) {
    ring_attention_->backward(dq, dk, dv, dout, q, k, v, out, a.lse, s.local_blocks, s.ring, s.ring_begin);
  } else {
    attention_backward(dq, dk, dv, dout, q, k, v, out, a.lse, s.cu_seqlens.rows(0, s.num_sequences + 1),
                       config_.attention_window());
  }
}

double LlamaModel::forward(int slot, float loss_scale, bool with_backward) {
  const ModelConfig& c = config_;
  const int64_t Hq = local_heads_, Hkv = local_kv_heads_, d = c.head_dim(), L = num_local_layers_;
  const float eps = static_cast<float>(c.norm_eps), theta = static_cast<float>(c.rope_theta);
  Slot& s = slots_.at(slot);
  const int64_t T = s.tokens_used;
  const IndexTensor positions = s.positions.rows(0, T);
  if (partition_.tp_size > 1 && tp_ == nullptr) throw std::logic_error("model: a tp slice needs its communicator to run");

  if (partition_.has_embedding) {
    const Tensor x0 = input_activation(slot);
    embedding_forward(x0, s.tokens.rows(0, T), embed_, vocab_begin_);
    tp_regions_.embedding_output.forward(x0);
  }
  for (int64_t l = 0; l < L; ++l) {
    const LayerTensors& w = layer_parameters_[l].weights;
    LayerActivations& a = s.layers[l];
    const Tensor act = scratch_.ffn_act.rows(0, T);
    rmsnorm_forward(a.ln1, a.rstd1, a.x_in, w.input_norm, eps);
    const Tensor attention_in = tp_regions_.attention_input.forward(a.ln1);
    linear_forward(a.q, attention_in, w.q);
    linear_forward(a.k, attention_in, w.k);
    linear_forward(a.v, attention_in, w.v);
    rope_forward(a.q.view({T, Hq, d}), positions, theta);
    rope_forward(a.k.view({T, Hkv, d}), positions, theta);
    attention_forward_of(s, a);
    linear_forward(a.x_mid, a.attn, w.o);
    tp_regions_.attention_output.forward(a.x_mid);
    add_inplace(a.x_mid, a.x_in);
    rmsnorm_forward(a.ln2, a.rstd2, a.x_mid, w.post_norm, eps);
    // The output becomes the next layer's input, in the working block that layer
    // l - 1 used: its rows must have left for the host first.
    const Tensor out = l + 1 < L ? s.layers[l + 1].x_in : s.x_out.rows(0, T);
    if (!moe_.empty()) {
      // Mixtral: the sparse MoE block in place of the MLP (its tp all-reduces are its own).
      if (s.offloaded && l >= 1 && l - 1 < L - 2) s.offload_done[l - 1].wait();
      moe_[slot][l].forward(out, a.ln2, w.moe);
    } else {
      const Tensor mlp_in = tp_regions_.mlp_input.forward(a.ln2);
      linear_forward(a.gate, mlp_in, w.gate);
      linear_forward(a.up, mlp_in, w.up);
      swiglu_forward(act, a.gate, a.up);
      if (s.offloaded && l >= 1 && l - 1 < L - 2) s.offload_done[l - 1].wait();
      linear_forward(out, act, w.down);
      tp_regions_.mlp_output.forward(out);
    }
    add_inplace(out, a.x_mid);
    if (s.offloaded && l < L - 2) park_layer(s, l);
  }
  s.loss_scale = loss_scale;
  const double aux_term = moe_.empty() ? 0.0 : pool_load_balancing(s);
  if (!partition_.has_head) return 0.0;
  rmsnorm_forward(s.ln_final.rows(0, T), s.rstd_final.rows(0, T), s.x_out.rows(0, T), final_norm_, eps);
  const double loss = head_forward_backward(s, loss_scale, with_backward);
  head_gradient_pending_ = with_backward ? slot : -1;
  return loss + aux_term;
}

// Mixtral's load-balancing loss as Hugging Face's load_balancing_loss_func computes it
// (Switch Transformer's: Fedus et al. 2022) over all layers' routing of this micro-batch
// (its router logits concatenated over the layers): N = layers x T, aux = E sum_e f_e P_e
// with f_e the fraction of the N tokens' choices that went to expert e and P_e the mean
// router probability of e over the N. One forward call is one micro-batch, and Hugging
// Face computes the loss per forward call (data-parallel replicas and accumulation steps
// each over their own batch), so the statistics pool over the micro-batch's layers only,
// whichever stages hold them, never over data-parallel ranks; since every planner packs
// the global batch into the same micro-batches for a given capacity before assigning
// them to ranks, the loss is the same in every layout.
// A ring micro-batch is one forward spread over the ring's members (each holds its
// chunks of the ring's sequences, and its own whole sequences beside them), so its
// statistics pool over the members too: one process that holds the members'
// micro-batches as one computes the same loss.
// This stage adds its layers to the statistics it received (routing_input) and, on the
// last stage, where they cover every layer, returns coef aux P with P the micro-batch's
// predicted tokens (this member's, in a ring: the members' terms add up to the forward's),
// so that the caller's division by the step's predicted tokens (the token-level loss,
// loss_scale) weights each micro-batch by its share and one micro-batch adds exactly
// coef aux, as Hugging Face does.
double LlamaModel::pool_load_balancing(Slot& s) {
  const int64_t E = config_.num_experts;
  const int slot = static_cast<int>(&s - slots_.data());
  s.routing_through = s.routing_before;
  for (const MoeBlock& block : moe_[slot]) {
    for (int64_t e = 0; e < E; ++e) {
      s.routing_through[e] += static_cast<float>(block.expert_tokens()[e]);
      s.routing_through[E + e] += static_cast<float>(block.probability_sums()[e]);
    }
  }
  if (!partition_.has_head) return 0.0;
  expert_tokens_.assign(E, 0);
  for (int64_t e = 0; e < E; ++e) expert_tokens_[e] = static_cast<int64_t>(s.routing_through[e]);
  // The forward's statistics: counts, probability sums, tokens and predictions.
  forward_routing_.assign(s.routing_through.begin(), s.routing_through.end());
  forward_routing_.push_back(static_cast<float>(s.tokens_used));
  forward_routing_.push_back(static_cast<float>(s.predictions));
  if (s.has_ring) ring_attention_->sum_over_members(forward_routing_, s.ring);
  const double N = static_cast<double>(config_.num_layers) * static_cast<double>(forward_routing_[2 * E]);
  double aux = 0;
  for (int64_t e = 0; e < E; ++e) {
    s.routing_totals[e] = forward_routing_[e];
    aux += (static_cast<double>(forward_routing_[e]) / N) * (static_cast<double>(forward_routing_[E + e]) / N);
  }
  s.routing_totals[E] = forward_routing_[2 * E];
  s.routing_totals[E + 1] = forward_routing_[2 * E + 1];
  aux_loss_ = N > 0 ? static_cast<double>(E) * aux : 0.0;
  return config_.router_aux_loss_coef * aux_loss_ * static_cast<double>(s.predictions);
}

// The gradient of coef aux P loss_scale per router probability, the same for every
// token and layer of the forward: coef P loss_scale E f_e / N, from the counts of every
// layer, the forward's tokens and its predictions P (routing_totals: this stage's own on
// the last stage, received from the next stage on the others; over the members of a ring).
void LlamaModel::load_balancing_gradient(const Slot& s) {
  const int64_t E = config_.num_experts;
  const double N = static_cast<double>(config_.num_layers) * static_cast<double>(s.routing_totals[E]);
  const double c = config_.router_aux_loss_coef, P = static_cast<double>(s.routing_totals[E + 1]);
  aux_grad_.assign(E, 0.0);
  for (int64_t e = 0; e < E && N > 0; ++e)
    aux_grad_[e] = c * P * s.loss_scale * static_cast<double>(E) * (static_cast<double>(s.routing_totals[e]) / N) / N;
}

Tensor LlamaModel::routing_input(int slot) {
  std::vector<float>& v = slots_.at(slot).routing_before;
  return v.empty() ? Tensor() : Tensor(v.data(), {static_cast<int64_t>(v.size())});
}

Tensor LlamaModel::routing_output(int slot) {
  std::vector<float>& v = slots_.at(slot).routing_through;
  return v.empty() ? Tensor() : Tensor(v.data(), {static_cast<int64_t>(v.size())});
}

Tensor LlamaModel::routing_totals(int slot) {
  std::vector<float>& v = slots_.at(slot).routing_totals;
  return v.empty() ? Tensor() : Tensor(v.data(), {static_cast<int64_t>(v.size())});
}

// The LM head and loss run chunk by chunk over tokens; with backward, each chunk's
// logits are turned into their gradient in place and pushed through the head at
// once, so only one [chunk, vocab] buffer ever exists.
double LlamaModel::head_forward_backward(Slot& s, float loss_scale, bool backward) {
  const int64_t T = s.tokens_used;
  double loss_sum = 0;
  for (int64_t c0 = 0; c0 < T; c0 += head_chunk_tokens_) {
    const int64_t c1 = std::min(T, c0 + head_chunk_tokens_);
    const Tensor ln = s.ln_final.rows(c0, c1), logits = scratch_.logits.rows(0, c1 - c0);
    linear_forward(logits, tp_regions_.head_input.forward(ln), head_);
    loss_sum += vocab_parallel_cross_entropy(tp_, logits, s.targets.rows(c0, c1), vocab_begin_, loss_scale,
                                             scratch_.ce_stats, scratch_.ce_global);
    if (backward) linear_backward(scratch_.norm_grad.rows(c0, c1), d_head_, logits, ln, head_, false);
  }
  if (backward) tp_regions_.head_input.backward(scratch_.norm_grad.rows(0, T));
  return loss_sum;
}

void LlamaModel::backward(int slot, const GradientsReady& ready) {
  const ModelConfig& c = config_;
  const int64_t Hq = local_heads_, Hkv = local_kv_heads_, d = c.head_dim(), L = num_local_layers_;
  const float theta = static_cast<float>(c.rope_theta);
  Slot& s = slots_.at(slot);
  const int64_t T = s.tokens_used;
  const IndexTensor positions = s.positions.rows(0, T);
  const Scratch& sc = scratch_;
  const Tensor dres = sc.residual_grad.rows(0, T), dnorm = sc.norm_grad.rows(0, T);
  auto report = [&](int64_t gradients_begin) {
    if (ready) ready(gradients_begin);
  };

  if (!moe_.empty()) load_balancing_gradient(s);
  if (partition_.has_head) {
    if (head_gradient_pending_ != slot) {
      throw std::logic_error("model: backward of the last stage must follow forward(slot, scale, true)");
    }
    head_gradient_pending_ = -1;
    fill(dres, 0.0f);
    rmsnorm_backward(dres, d_final_norm_, dnorm, s.x_out.rows(0, T), final_norm_, s.rstd_final.rows(0, T));
    report(head_gradients_begin_);
  }
  for (int64_t l = L - 1; l >= 0; --l) {
    // Layers come back from host memory in reverse order: the copy-in of the layer
    // below is issued before this layer's backward so the two overlap.
    if (s.offloaded && l >= 1 && l - 1 < L - 2) restore_layer(s, l - 1);
    if (s.offloaded && l < L - 2) s.restore_done[l].wait();
    const LayerTensors& w = layer_parameters_[l].weights;
    const LayerTensors& dw = layer_parameters_[l].gradients;
    const LayerActivations& a = s.layers[l];
    const Tensor act = sc.ffn_act.rows(0, T), dact = sc.dffn_act.rows(0, T), dgate = sc.dgate.rows(0, T),
                 dup = sc.dup.rows(0, T), dattn = sc.dattn.rows(0, T), dq = sc.dq.rows(0, T), dk = sc.dk.rows(0, T),
                 dv = sc.dv.rows(0, T);

    if (!moe_.empty()) {
      // Mixtral: dres is the gradient of the layer output; the router also gets the
      // pooled load-balancing loss's gradient.
      moe_[slot][l].backward(dnorm, dw.moe, dres, a.ln2, w.moe, aux_grad_);
    } else {
      // MLP block: dres is the gradient of the layer output.
      swiglu_forward(act, a.gate, a.up);  // recomputed rather than stored
      linear_backward(dact, dw.down, tp_regions_.mlp_output.backward(dres), act, w.down, false);
      swiglu_backward(dgate, dup, dact, a.gate, a.up);
      linear_backward(dnorm, dw.gate, dgate, a.ln2, w.gate, false);
      linear_backward(dnorm, dw.up, dup, a.ln2, w.up, true);
      tp_regions_.mlp_input.backward(dnorm);
    }
    rmsnorm_backward(dres, dw.post_norm, dnorm, a.x_mid, w.post_norm, a.rstd2);

    // Attention block: dres is now the gradient of x_mid.
    linear_backward(dattn, dw.o, tp_regions_.attention_output.backward(dres), a.attn, w.o, false);
    attention_backward_of(s, a);
    rope_backward(dq.view({T, Hq, d}), positions, theta);
    rope_backward(dk.view({T, Hkv, d}), positions, theta);
    linear_backward(dnorm, dw.q, dq, a.ln1, w.q, false);
    linear_backward(dnorm, dw.k, dk, a.ln1, w.k, true);
    linear_backward(dnorm, dw.v, dv, a.ln1, w.v, true);
    tp_regions_.attention_input.backward(dnorm);
    rmsnorm_backward(dres, dw.input_norm, dnorm, a.x_in, w.input_norm, a.rstd1);
    report(layer_parameters_[l].gradients_begin);
  }
  if (partition_.has_embedding) {
    embedding_backward(d_embed_, s.tokens.rows(0, T), tp_regions_.embedding_output.backward(dres), vocab_begin_);
    report(embedding_gradients_begin_);
  }
}

double LlamaModel::forward_backward(const MicroBatchView& batch, float loss_scale, const GradientsReady& ready) {
  set_batch(0, batch);
  const double loss = forward(0, loss_scale, true);
  backward(0, ready);
  return loss;
}

double LlamaModel::forward_loss(const MicroBatchView& batch) {
  set_batch(0, batch);
  return forward(0, 1.0f, false);
}

}  // namespace hdp

#include "model/parameters.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <stdexcept>
#include <vector>

#include "kernels/ops.h"
#include "model/init_rng.h"

namespace hdp {
namespace {

constexpr int64_t kParamAlignFloats = 16;  // 64-byte alignment of every tensor in the flat buffer

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Where a transformer layer's parameters are named, by its index in the whole model.
std::string layer_prefix(int64_t layer) { return "model.layers." + std::to_string(layer) + "."; }

}  // namespace

ParameterTable::ParameterTable(const ModelConfig& config, const ModelPartition& partition, const ModelSlice& slice,
                               Device device, DType precision)
    : config_(config),
      partition_(partition),
      slice_(slice),
      device_(device),
      precision_(precision),
      param_arena_(Arena::counting(device, "parameters")),
      grad_arena_(Arena::counting(device, "gradients")) {
  build();
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
  bind();
}

void ParameterTable::build() {
  const ModelConfig& c = config_;
  const int r = partition_.tp_rank;
  const int64_t H = c.hidden_size, F = c.ffn_hidden_size, d = c.head_dim();
  const int64_t q_rows = slice_.heads * d, kv_rows = slice_.kv_heads * d;
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
    entries_.push_back(std::move(p));
  };
  const int64_t ffn = slice_.ffn;
  const Spec vocab{0, slice_.vocab_begin, slice_.vocab_begin + slice_.vocab};
  const Spec q_shard{0, r * q_rows, (r + 1) * q_rows}, kv_shard{0, r * kv_rows, (r + 1) * kv_rows};
  const Spec o_shard{1, r * q_rows, (r + 1) * q_rows};
  const Spec ffn_rows{0, r * ffn, (r + 1) * ffn}, ffn_cols{1, r * ffn, (r + 1) * ffn};
  const Spec replicated{};

  if (partition_.has_embedding) add("model.embed_tokens.weight", {c.vocab_size, H}, vocab, true, false, false);
  for (int64_t l = 0; l < slice_.num_layers; ++l) {
    const std::string pre = layer_prefix(slice_.global_layer(l));
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
      for (int64_t e : slice_.experts) {
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

void ParameterTable::bind() {
  // Weights are read from the compute copy (bf16 in mixed precision), gradients
  // are the fp32 flat buffer: the same offsets in both.
  const Tensor weights = compute_weights();
  auto view = [&](const Tensor& flat, const ParameterInfo& p) {
    Tensor t = flat.rows(p.offset, p.offset + p.numel);
    t.ndim = 0;
    for (int64_t d : p.shape) t.shape[t.ndim++] = d;
    return t;
  };
  layers_.resize(slice_.num_layers);
  for (int64_t l = 0; l < slice_.num_layers; ++l) {
    const std::string pre = layer_prefix(slice_.global_layer(l));
    LayerParameters& layer = layers_[l];
    layer.gradients_begin = flat_numel_;
    auto bind_one = [&](const std::string& name, Tensor& weight, Tensor& gradient) {
      const ParameterInfo& p = find(pre + name);
      weight = view(weights, p);
      gradient = view(grads_, p);
      layer.gradients_begin = std::min(layer.gradients_begin, p.offset);
    };
    LayerTensors& w = layer.weights;
    LayerTensors& g = layer.gradients;
    bind_one("input_layernorm.weight", w.input_norm, g.input_norm);
    bind_one("self_attn.q_proj.weight", w.q, g.q);
    bind_one("self_attn.k_proj.weight", w.k, g.k);
    bind_one("self_attn.v_proj.weight", w.v, g.v);
    bind_one("self_attn.o_proj.weight", w.o, g.o);
    bind_one("post_attention_layernorm.weight", w.post_norm, g.post_norm);
    if (config_.moe()) {
      bind_one("block_sparse_moe.gate.weight", w.moe.gate, g.moe.gate);
      const std::vector<int64_t>& experts = slice_.experts;
      for (MoeTensors* t : {&w.moe, &g.moe}) {
        t->w1.resize(experts.size());
        t->w2.resize(experts.size());
        t->w3.resize(experts.size());
      }
      for (size_t j = 0; j < experts.size(); ++j) {
        const std::string ex = "block_sparse_moe.experts." + std::to_string(experts[j]) + ".";
        bind_one(ex + "w1.weight", w.moe.w1[j], g.moe.w1[j]);
        bind_one(ex + "w2.weight", w.moe.w2[j], g.moe.w2[j]);
        bind_one(ex + "w3.weight", w.moe.w3[j], g.moe.w3[j]);
      }
      continue;
    }
    bind_one("mlp.gate_proj.weight", w.gate, g.gate);
    bind_one("mlp.up_proj.weight", w.up, g.up);
    bind_one("mlp.down_proj.weight", w.down, g.down);
  }
  if (partition_.has_embedding) {
    const ParameterInfo& p = find("model.embed_tokens.weight");
    ends_.embed = view(weights, p);
    ends_.d_embed = view(grads_, p);
    ends_.embedding_gradients_begin = p.offset;
  }
  if (partition_.has_head) {
    const ParameterInfo& norm = find("model.norm.weight");
    // Tied embeddings: the stage's embedding table, or on a last stage without
    // the embedding its tied copy, under the same name.
    const ParameterInfo& head = find(config_.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
    ends_.final_norm = view(weights, norm);
    ends_.d_final_norm = view(grads_, norm);
    ends_.head = view(weights, head);
    ends_.d_head = view(grads_, head);
    // A head that is this stage's embedding table gets its gradient final with the embedding's.
    const bool head_is_embedding = config_.tie_embeddings && partition_.has_embedding;
    ends_.head_gradients_begin = head_is_embedding ? norm.offset : std::min(norm.offset, head.offset);
  }
}

const ParameterInfo& ParameterTable::find(const std::string& name) const {
  for (const ParameterInfo& p : entries_)
    if (p.name == name) return p;
  throw std::out_of_range("model has no parameter '" + name + "'");
}

Tensor ParameterTable::master_weights() const {
  compute_current_ = false;
  return params_;
}

Tensor ParameterTable::master_weight(const ParameterInfo& p) const {
  compute_current_ = false;
  return Tensor(params_.data + p.offset, {p.numel}, device_);
}

Tensor ParameterTable::gradient(const ParameterInfo& p) const {
  return Tensor(grads_.data + p.offset, {p.numel}, device_);
}

int64_t ParameterTable::num_parameters() const {
  int64_t n = 0;
  for (const ParameterInfo& p : entries_) n += p.numel;
  return n;
}

namespace {
// The elements of `p` over all ranks (its global shape's product).
int64_t global_numel(const ParameterInfo& p) {
  int64_t n = 1;
  for (int64_t x : p.global_shape) n *= x;
  return n;
}

// This rank's slice of `p`'s initial values: ones, or normals of standard deviation
// `std` from a stream of the parameter's own (its name and the seed), drawn for the
// whole tensor, then a block of rows, or of columns of every row, cut from it.
std::vector<float> initial_slice(const ParameterInfo& p, uint64_t seed, double std) {
  const int64_t whole_numel = global_numel(p);
  std::vector<float> whole(whole_numel);
  if (p.ones_init) {
    std::fill(whole.begin(), whole.end(), 1.0f);
  } else {
    NormalStream normal(hash_name(p.name, seed));
    for (float& x : whole) x = static_cast<float>(normal.next() * std);
  }
  if (p.numel == whole_numel) return whole;
  std::vector<float> local(p.numel);
  const int64_t cols = p.global_shape.size() > 1 ? p.global_shape[1] : 1;
  if (p.shard_dim == 1) {
    const int64_t width = p.shard_end - p.shard_begin;
    for (int64_t row = 0; row < p.global_shape[0]; ++row)
      std::copy_n(whole.begin() + row * cols + p.shard_begin, width, local.begin() + row * width);
  } else {
    const int64_t first_row = p.shard_dim == 0 ? p.shard_begin : 0;
    std::copy_n(whole.begin() + first_row * cols, p.numel, local.begin());
  }
  return local;
}
}  // namespace

// Every parameter has a stream of its own, so the parameters are drawn in parallel,
// as many at a time as there are threads and kInitGroupFloats allow (drawing a 1B
// model's 886M values takes a thread 20 s; a 70B model's vocabulary matrix alone
// holds 1G), and copied to the device in order on this thread: the same weights as
// one thread draws.
constexpr int64_t kInitGroupFloats = int64_t{1} << 28;  // 1 GiB of drawn values at a time

void ParameterTable::init_weights(uint64_t seed) {
  fill(params_, 0.0f);
  const double std_out = config_.init_std / std::sqrt(2.0 * static_cast<double>(config_.num_layers));
  const int64_t n = static_cast<int64_t>(entries_.size());
  const int64_t threads = std::max(1, omp_get_max_threads());
  std::vector<std::vector<float>> slices(static_cast<size_t>(threads));
  for (int64_t first = 0, count = 0; first < n; first += count) {
    // The next parameters, at least one, within the thread count and kInitGroupFloats.
    int64_t floats = 0;
    for (count = 0; first + count < n && count < threads; ++count) {
      const int64_t numel = global_numel(entries_[static_cast<size_t>(first + count)]);
      if (count > 0 && floats + numel > kInitGroupFloats) break;
      floats += numel;
    }
    std::exception_ptr failure;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < count; ++i) {
      const ParameterInfo& p = entries_[static_cast<size_t>(first + i)];
      try {
        slices[static_cast<size_t>(i)] = initial_slice(p, seed, p.scaled_init ? std_out : config_.init_std);
      } catch (...) {
#pragma omp critical(init_weights_failure)
        if (!failure) failure = std::current_exception();
      }
    }
    if (failure) std::rethrow_exception(failure);
    for (int64_t i = 0; i < count; ++i) {
      std::vector<float>& slice = slices[static_cast<size_t>(i)];
      const ParameterInfo& p = entries_[static_cast<size_t>(first + i)];
      copy(master_weight(p), Tensor(slice.data(), {p.numel}, Device::CPU));
      std::vector<float>().swap(slice);
    }
  }
  refresh_compute_weights();
}

void ParameterTable::refresh_compute_weights() {
  if (precision_ != DType::BF16 || compute_current_) return;
  copy(compute_params_, params_);  // rounds to nearest even
  compute_current_ = true;
}

void ParameterTable::zero_grad() { fill(grads_, 0.0f); }

std::vector<FlatParameter> flat_parameters(const ParameterTable& table) {
  std::vector<FlatParameter> out;
  const ModelPartition& partition = table.partition();
  const bool tp_primary = partition.tp_rank == 0;
  for (const ParameterInfo& p : table.entries()) {
    FlatParameter f;
    f.offset = p.offset;
    f.numel = p.numel;
    f.weight_decay = p.weight_decay;
    f.counts_in_norm = !p.tied_copy && (p.shard_dim >= 0 || tp_primary);
    f.expert = p.expert && partition.ep_size > 1;  // otherwise their group is hdp, like the rest
    f.synced_later = table.tie_embeddings() && p.name == "model.embed_tokens.weight" &&
                     !(partition.has_embedding && partition.has_head);
    out.push_back(f);
  }
  return out;
}

}  // namespace hdp

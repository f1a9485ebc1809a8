// Attention over packed documents through cuDNN's fused scaled-dot-product
// attention (FlashAttention-2 style kernels of cuDNN 9; Dao 2023, "FlashAttention-2:
// Faster Attention with Better Parallelism and Work Partitioning"), built with the
// header-only cuDNN frontend graph API (fetched at configure time by
// scripts/fetch-cudnn-frontend.sh). The frontend's headers are heavy: this is the
// one translation unit that includes them.
//
// One graph per shape key (kernels/cuda/cudnn_attention_plan.h): q, k, v, out and
// the gradients in place as cuDNN's packed layout with ragged offsets, the
// documents as sequences of a padded batch (padding mask), causal with the
// diagonal top-left in each document (right bound 0), the sliding window as the
// band's left bound (cuDNN keeps key j for query i iff j + W > i: kernels/ops.h's
// window), scale d^-0.5 as our kernels. The forward writes cuDNN's statistics into
// a scratch buffer and transposes them into lse; the backward transposes lse into
// that buffer first (cudnn_attention_layout.cu). A graph is built on the first
// call of its key and kept with its workspace size; a graph cuDNN refuses is kept
// as that refusal. The workspace is one growing device buffer.
//
// libcudnn is opened with dlopen (the frontend's dynamic loading), so the trainer
// starts on a machine without cuDNN and says why cuDNN is unavailable.

#include "kernels/cuda/cudnn_attention.h"

#include <dlfcn.h>

#include <cuda_runtime.h>
#include <cudnn_frontend.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/cudnn_attention_layout.h"
#include "kernels/cuda/cudnn_attention_plan.h"

// The library handle the frontend resolves cuDNN's symbols in (dynamic loading).
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}

namespace hdp::cuda {
namespace {

namespace fe = cudnn_frontend;
using cudnn_plan::GraphKey;
using TensorAttr = std::shared_ptr<fe::graph::Tensor_attributes>;

// The graphs' tensors, by the uid their device pointers are bound to.
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV,
  kLengthQ, kLengthKV, kQOffset, kKOffset, kVOffset, kOOffset, kStatsOffset,
};

CudnnRuntime probe_runtime() {
  CudnnRuntime r;
  std::string why;
  if (!available(&why)) {
    r.unavailable = "no CUDA device: " + why;
    return r;
  }
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    r.unavailable = "the device's properties cannot be read";
    return r;
  }
  r.sm_version = prop.major * 10 + prop.minor;
  // The frontend resolves a few CUDA runtime calls itself and would take the first of
  // libcudart.so.12 and .13 it finds: name the one this build links.
  const std::string cudart = "libcudart.so." + std::to_string(CUDART_VERSION / 1000);
  setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", cudart.c_str(), /*overwrite=*/0);
  const std::string library = "libcudnn.so." + std::to_string(CUDNN_MAJOR);
  dlerror();
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* error = dlerror();
    r.unavailable = library + " cannot be loaded (" + (error ? error : "not found") + ")";
    return r;
  }
  fe::cudnn_dlhandle = handle;
  r.version = static_cast<int64_t>(fe::detail::get_backend_version());
  return r;
}

struct CachedGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
  std::string refused;  // non-empty: cuDNN refused to build it
};

// The graphs built so far, and the handle they run on; calls are serialized (the
// scratch buffers of cudnn_attention_layout.h are shared).
std::mutex g_mutex;
std::unordered_map<GraphKey, CachedGraph, cudnn_plan::GraphKeyHash> g_graphs;
cudnnHandle_t g_handle = nullptr;

cudnnHandle_t handle() {
  if (!g_handle) {
    if (fe::detail::create_handle(&g_handle) != CUDNN_STATUS_SUCCESS)
      throw std::runtime_error("cuDNN attention: cudnnCreate failed");
    if (fe::detail::set_stream(g_handle, static_cast<cudaStream_t>(compute_stream_handle())) != CUDNN_STATUS_SUCCESS)
      throw std::runtime_error("cuDNN attention: cudnnSetStream failed");
  }
  return g_handle;
}

// A device int tensor of `n` entries (lengths: int32 [B], ragged offsets: int64 [B + 1]).
TensorAttr index_tensor(fe::graph::Graph& g, const char* name, int64_t uid, int64_t n, fe::DataType_t type) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim({n, 1, 1, 1}).set_stride(
      {1, 1, 1, 1}).set_data_type(type));
}

// A [T, heads, width] tensor as B packed sequences of at most S = graph_tokens(T) rows.
void set_packed(fe::graph::Tensor_attributes& t, const GraphKey& key, int64_t heads, int64_t width,
                const TensorAttr& offset) {
  t.set_dim({key.batch, heads, key.tokens, width})
      .set_stride({key.tokens * heads * width, width, heads * width, 1})
      .set_ragged_offset(offset);
}
TensorAttr packed_tensor(fe::graph::Graph& g, const char* name, int64_t uid, const GraphKey& key, int64_t heads,
                         int64_t width, const TensorAttr& offset) {
  TensorAttr t = g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid));
  set_packed(*t, key, heads, width, offset);
  return t;
}

// The mask and scale both directions share (SDPA_attributes, SDPA_backward_attributes).
template <class Attributes>
void set_attention(Attributes& a, const GraphKey& key, const TensorAttr& length_q, const TensorAttr& length_kv) {
  a.set_attn_scale(static_cast<float>(1.0 / std::sqrt(static_cast<double>(key.head_dim))))
      .set_padding_mask(true)
      .set_seq_len_q(length_q)
      .set_seq_len_kv(length_kv)
      .set_max_total_seq_len_q(key.tokens)
      .set_max_total_seq_len_kv(key.tokens)
      .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
      .set_diagonal_band_right_bound(0);
  if (key.window) a.set_diagonal_band_left_bound(static_cast<int>(key.window));
}

std::shared_ptr<fe::graph::Graph> build_graph(const GraphKey& key) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const int64_t B = key.batch, Hq = key.q_heads, Hkv = key.kv_heads, d = key.head_dim;
  const TensorAttr q_offset = index_tensor(*g, "q_offset", kQOffset, B + 1, fe::DataType_t::INT64);
  const TensorAttr k_offset = index_tensor(*g, "k_offset", kKOffset, B + 1, fe::DataType_t::INT64);
  const TensorAttr v_offset = index_tensor(*g, "v_offset", kVOffset, B + 1, fe::DataType_t::INT64);
  const TensorAttr o_offset = index_tensor(*g, "o_offset", kOOffset, B + 1, fe::DataType_t::INT64);
  const TensorAttr stats_offset = index_tensor(*g, "stats_offset", kStatsOffset, B + 1, fe::DataType_t::INT64);
  const TensorAttr length_q = index_tensor(*g, "length_q", kLengthQ, B, fe::DataType_t::INT32);
  const TensorAttr length_kv = index_tensor(*g, "length_kv", kLengthKV, B, fe::DataType_t::INT32);
  const TensorAttr q = packed_tensor(*g, "q", kQ, key, Hq, d, q_offset);
  const TensorAttr k = packed_tensor(*g, "k", kK, key, Hkv, d, k_offset);
  const TensorAttr v = packed_tensor(*g, "v", kV, key, Hkv, d, v_offset);
  // The statistics [T, Hq] fp32, as B packed sequences of at most T rows of Hq values.
  const auto set_stats = [&](fe::graph::Tensor_attributes& t) {
    t.set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim({B, Hq, key.tokens, 1})
        .set_stride({key.tokens * Hq, 1, Hq, 1}).set_ragged_offset(stats_offset);
  };
  if (!key.backward) {
    auto options = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(true);
    set_attention(options, key, length_q, length_kv);
    auto [o, stats] = g->sdpa(q, k, v, options);
    set_packed(o->set_output(true).set_uid(kO), key, Hq, d, o_offset);
    set_stats(stats->set_output(true));
    return g;
  }
  const TensorAttr o = packed_tensor(*g, "o", kO, key, Hq, d, o_offset);
  const TensorAttr dout = packed_tensor(*g, "dout", kDO, key, Hq, d, o_offset);
  const TensorAttr stats = g->tensor(fe::graph::Tensor_attributes().set_name("stats"));
  set_stats(*stats);
  auto options = fe::graph::SDPA_backward_attributes().set_name("attention_backward");
  set_attention(options, key, length_q, length_kv);
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, options);
  set_packed(dq->set_output(true).set_uid(kDQ), key, Hq, d, q_offset);
  set_packed(dk->set_output(true).set_uid(kDK), key, Hkv, d, k_offset);
  set_packed(dv->set_output(true).set_uid(kDV), key, Hkv, d, v_offset);
  return g;
}

// Builds the graph's execution plan (cuDNN's heuristics' first choice); the
// frontend's message when cuDNN refuses it, empty when built.
std::string build_plan(fe::graph::Graph& g, int64_t* workspace) {
  for (auto step : {+[](fe::graph::Graph& x) { return x.validate(); },
                    +[](fe::graph::Graph& x) { return x.build_operation_graph(handle()); },
                    +[](fe::graph::Graph& x) { return x.create_execution_plans({fe::HeurMode_t::A}); },
                    +[](fe::graph::Graph& x) { return x.check_support(); },
                    +[](fe::graph::Graph& x) { return x.build_plans(); }}) {
    fe::error_t status = step(g);
    if (!status.is_good()) return status.get_message();
  }
  fe::error_t status = g.get_workspace_size(*workspace);
  return status.is_good() ? std::string() : status.get_message();
}

// The cached graph of `key`, built now if it is new (g_mutex held).
const CachedGraph& graph_for(const GraphKey& key) {
  if (auto it = g_graphs.find(key); it != g_graphs.end()) return it->second;
  CachedGraph c;
  try {
    c.graph = build_graph(key);
    c.refused = build_plan(*c.graph, &c.workspace);
  } catch (const std::exception& e) {  // the frontend throws where its backend calls fail
    c.refused = e.what();
  }
  if (!c.refused.empty()) {
    c.refused = "cuDNN refused the graph (" + cudnn_plan::describe(key) + "): " + c.refused;
    c.graph.reset();
  }
  return g_graphs.emplace(key, std::move(c)).first->second;
}

// One op on cuDNN, holding g_mutex from its start to its end: the graph of its
// shape (built on first use) and, when cuDNN took that graph, the call's ragged
// tables and statistics buffer.
class Call {
 public:
  Call(bool backward, const Tensor& q, const Tensor& k, const IndexTensor& cu_seqlens, int64_t window)
      : tokens(q.dim(0)),
        q_heads(q.dim(1)),
        docs(cu_seqlens.numel() - 1),
        key_(cudnn_plan::graph_key(backward, tokens, docs, q_heads, k.dim(1), q.dim(2), window,
                                   cudnn_runtime().version)),
        lock_(g_mutex),
        graph_(graph_for(key_)) {
    if (!graph_.refused.empty()) return;
    tables_ = cudnn_ragged_tables(cu_seqlens.data, docs, key_.batch, q_heads, key_.kv_heads, key_.head_dim);
    // For the graph's rows, not T: the graph declares its statistics for that many
    // (rows past T are never read back).
    stats = cudnn_stats_buffer(key_.tokens, q_heads);
  }

  // Whether cuDNN refused the graph; then `why` says how.
  bool refused(std::string* why) const {
    if (graph_.refused.empty()) return false;
    if (why) *why = graph_.refused;
    return true;
  }

  // Runs the graph on the compute stream with the op's tensors.
  void execute(std::unordered_map<int64_t, void*> pack) const {
    pack.insert({{kStats, stats}, {kLengthQ, tables_.length}, {kLengthKV, tables_.length},
                 {kQOffset, tables_.q_offset}, {kOOffset, tables_.q_offset}, {kKOffset, tables_.kv_offset},
                 {kVOffset, tables_.kv_offset}, {kStatsOffset, tables_.stats_offset}});
    fe::error_t status = graph_.graph->execute(handle(), pack, cudnn_workspace(graph_.workspace));
    if (!status.is_good())
      throw std::runtime_error("cuDNN attention (" + cudnn_plan::describe(key_) + "): " + status.get_message());
  }

  const int64_t tokens, q_heads, docs;
  float* stats = nullptr;  // cuDNN's statistics [graph rows >= T, Hq]; the first T rows are the op's

 private:
  const GraphKey key_;
  const std::lock_guard<std::mutex> lock_;
  const CachedGraph& graph_;
  CudnnRaggedTables tables_{};
};

}  // namespace

const CudnnRuntime& cudnn_runtime() {
  static const CudnnRuntime runtime = probe_runtime();
  return runtime;
}

bool cudnn_attention_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v,
                             const IndexTensor& cu_seqlens, int64_t window, std::string* why) {
  if (cu_seqlens.numel() < 2) return true;  // no document: nothing to compute, as our kernels
  const Call call(false, q, k, cu_seqlens, window);
  if (call.refused(why)) return false;
  call.execute({{kQ, q.raw()}, {kK, k.raw()}, {kV, v.raw()}, {kO, out.raw()}});
  cudnn_stats_to_lse(call.stats, lse.f32(), cu_seqlens.data, call.docs, call.tokens, call.q_heads);
  return true;
}

bool cudnn_attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& out, const Tensor& lse, const IndexTensor& cu_seqlens,
                              int64_t window, std::string* why) {
  if (cu_seqlens.numel() < 2) return true;
  const Call call(true, q, k, cu_seqlens, window);
  if (call.refused(why)) return false;
  cudnn_lse_to_stats(lse.f32(), call.stats, call.tokens, call.q_heads);
  call.execute({{kQ, q.raw()}, {kK, k.raw()}, {kV, v.raw()}, {kO, out.raw()}, {kDO, dout.raw()}, {kDQ, dq.raw()},
                {kDK, dk.raw()}, {kDV, dv.raw()}});
  return true;
}

}  // namespace hdp::cuda

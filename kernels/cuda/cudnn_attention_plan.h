#pragma once
// How one packed-document attention call (kernels/ops.h: attention_forward and
// attention_backward over cu_seqlens) maps onto cuDNN's fused scaled-dot-product
// attention (kernels/cuda/cudnn_attention.cpp): the graph's shape key, the ragged
// offsets of its packed layout, and the layout of its statistics against ours.
// Plain C++ (HDP_HD functions also run in the CUDA kernels of
// kernels/cuda/cudnn_attention_layout.cu), checked on the CPU by
// tests/kernels_cudnn_plan_test.cpp.
//
// cuDNN's packed layout ("THD", with ragged offsets): a tensor of B sequences of at
// most S rows is described as dims (B, H, S, D) with strides (-, D, H D, 1), i.e.
// token-major rows of H heads of D values, exactly our [T, H, d]; sequence b
// starts at element offset[b] (a device array of B + 1 int64) and holds len[b]
// rows (a device array of B int32, the padding mask). So q, k, v, out and their
// gradients are passed in place, with
//   offset[b] = first token of document b x H x d,   len[b] = its length.
// The graph is fixed at build time and the offsets are data, so one graph serves
// every micro-batch of the same shape:
//   B = the documents, rounded up to a power of two where cuDNN takes zero-length
//       sequences (9.25 and newer: graph_batch): the sequences past the real
//       documents are empty (length 0, starting where the documents end), so
//       micro-batches with 5..8 documents share the graph of 8. Older cuDNN gets
//       a graph per number of documents, and an empty document in cu_seqlens
//       reaches it as a zero-length sequence (the trainer's sampler packs none);
//   S = graph_tokens(T), T rounded up to a power of two: no document is longer
//       than the micro-batch, and the longest one is on the device only (cu_seqlens
//       is never copied to the host); tiles of a document past its length cost an
//       early exit in cuDNN's kernels. A bound, not T itself, so that micro-batches
//       of varying packed lengths share graphs. Whether cuDNN loads rows past a
//       document up to S (masked, but NaN x 0 is NaN) is what the selftest's
//       "NaN past T" attention rows check on a GPU (kernels/backend_check.cpp).
// Rows past the documents (ring attention's rows, kernels/ops.h: cu_seqlens may end
// before T) belong to no sequence: cuDNN neither reads nor writes them, and their
// lse is left as it is.
//
// Statistics: cuDNN's "Stats" are each query row's natural-log log-sum-exp of the
// scaled scores, max + ln(sum exp(s - max)) - the quantity and base of our lse, so
// nothing is converted but the layout: cuDNN keeps them packed token-major
// ([T, Hq], ragged offset first token x Hq), ours are head-major ([Hq, T], the
// layout ring attention merges on, kernels/ops.h). Two transposes move them
// (stats_to_lse_source, lse_to_stats_source).

#include <cstdint>
#include <cstddef>
#include <string>

#include "kernels/cuda/host_device.h"

namespace hdp::cudnn_plan {

// The oldest cuDNN whose SDPA takes zero-length sequences (cudnnGetVersion()).
inline constexpr int64_t kZeroLengthSequencesMinVersion = 92500;

// The batch of a graph for `docs` documents on cuDNN `cudnn_version`: the next
// power of two (at least 1) where zero-length sequences may pad it, else docs.
inline int64_t graph_batch(int64_t docs, int64_t cudnn_version) {
  if (cudnn_version < kZeroLengthSequencesMinVersion) return docs;
  int64_t batch = 1;
  while (batch < docs) batch *= 2;
  return batch;
}

// The rows of a graph for a micro-batch of `tokens` packed rows: the next power of
// two (at least 1). A graph is built for an upper bound of the rows (its S, the
// longest a document may be, and the total of the ragged sequences; the offsets
// place the real rows), and a micro-batch's T varies with the documents packed into
// it: with T itself in the key nearly every micro-batch would build a graph (each
// build validates, queries heuristics and compiles plans), and the cache would grow
// without bound.
inline int64_t graph_tokens(int64_t tokens) {
  int64_t rows = 1;
  while (rows < tokens) rows *= 2;
  return rows;
}

// The window a graph of `rows` rows applies (kernels/ops.h: a query sees the keys
// less than W positions back): none (kNoWindow, 0) also for W >= rows, which no pair
// of rows of the micro-batch is apart, so such calls share the graph of full causal
// attention. (A window between T and the graph's rows changes no result either.)
inline int64_t graph_window(int64_t window, int64_t rows) { return window >= rows ? 0 : window; }

// Everything a built graph depends on. The dtype is not here: cuDNN runs bf16
// only (kernels/attention_impl.h), and the scale is d^-0.5, fixed by head_dim.
struct GraphKey {
  bool backward = false;
  int64_t batch = 0;     // graph_batch(documents, cuDNN's version)
  int64_t tokens = 0;    // graph_tokens(T) for T packed rows: S and the ragged total, upper bounds
  int64_t q_heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t window = 0;    // graph_window(window, tokens); 0: full causal attention
  bool operator==(const GraphKey&) const = default;
};

inline GraphKey graph_key(bool backward, int64_t tokens, int64_t docs, int64_t q_heads, int64_t kv_heads,
                          int64_t head_dim, int64_t window, int64_t cudnn_version) {
  const int64_t rows = graph_tokens(tokens);
  return {backward, graph_batch(docs, cudnn_version), rows, q_heads, kv_heads, head_dim, graph_window(window, rows)};
}

struct GraphKeyHash {
  size_t operator()(const GraphKey& k) const {
    uint64_t h = k.backward ? 1 : 0;
    for (int64_t v : {k.batch, k.tokens, k.q_heads, k.kv_heads, k.head_dim, k.window})
      h = (h ^ static_cast<uint64_t>(v)) * 0x100000001b3ULL;  // FNV-1a over the fields
    return static_cast<size_t>(h);
  }
};

// "forward B=8 T=4096 Hq=32 Hkv=8 d=128 W=4096" for messages.
inline std::string describe(const GraphKey& k) {
  std::string s = std::string(k.backward ? "backward" : "forward") + " B=" + std::to_string(k.batch) +
                  " T=" + std::to_string(k.tokens) + " Hq=" + std::to_string(k.q_heads) +
                  " Hkv=" + std::to_string(k.kv_heads) + " d=" + std::to_string(k.head_dim);
  return k.window ? s + " W=" + std::to_string(k.window) : s;
}

// Sequence b of the padded batch, from cu_seqlens [docs + 1]: its ragged offsets
// (in elements) into q/out/dq/dout ([T, Hq, d]), k/v/dk/dv ([T, Hkv, d]) and the
// statistics ([T, Hq]), and its length. Entries b = 0..batch hold offsets (the one
// at batch closes the last sequence); lengths exist for b < batch. Past the real
// documents, sequences are empty and start at cu_seqlens[docs] (= T).
struct RaggedEntry {
  int64_t q_offset, kv_offset, stats_offset;
  int32_t length;
};
HDP_HD inline RaggedEntry ragged_entry(const int32_t* cu_seqlens, int64_t docs, int64_t b, int64_t q_heads,
                                       int64_t kv_heads, int64_t head_dim) {
  const int64_t start = cu_seqlens[b < docs ? b : docs];
  const int32_t length = b < docs ? cu_seqlens[b + 1] - cu_seqlens[b] : 0;
  return {start * q_heads * head_dim, start * kv_heads * head_dim, start * q_heads, length};
}

// Where the four ragged tables of a call sit in one buffer, in bytes from its start:
// the three int64 offset tables of batch + 1 entries, then the int32 lengths of
// batch. cuDNN's frontend declares every tensor 16-byte aligned and its kernels do
// not check it (a misaligned operand reads wrong values on sm90), so each table
// starts on a 16-byte boundary of a buffer that does (cudaMalloc's).
struct RaggedTablesLayout {
  size_t q_offset = 0, kv_offset = 0, stats_offset = 0, length = 0, bytes = 0;
};
inline RaggedTablesLayout ragged_tables_layout(int64_t batch) {
  auto aligned = [](size_t bytes) { return (bytes + 15) / 16 * 16; };
  const size_t offsets = aligned(static_cast<size_t>(batch + 1) * sizeof(int64_t));
  RaggedTablesLayout l;
  l.kv_offset = offsets;
  l.stats_offset = 2 * offsets;
  l.length = 3 * offsets;
  l.bytes = l.length + static_cast<size_t>(batch) * sizeof(int32_t);
  return l;
}

// The transposes between cuDNN's statistics stats [T, Hq] and our lse [Hq, T]:
// the index each element is read from, for the element i it writes. Into lse only
// the rows of documents are written (in_documents).
HDP_HD inline int64_t stats_to_lse_source(int64_t i, int64_t tokens, int64_t q_heads) {
  return (i % tokens) * q_heads + i / tokens;  // lse[h, t] = stats[t, h]
}
HDP_HD inline bool in_documents(int64_t row, const int32_t* cu_seqlens, int64_t docs) {
  return row >= cu_seqlens[0] && row < cu_seqlens[docs];
}
HDP_HD inline int64_t lse_to_stats_source(int64_t i, int64_t tokens, int64_t q_heads) {
  return (i % q_heads) * tokens + i / q_heads;  // stats[t, h] = lse[h, t]
}

}  // namespace hdp::cudnn_plan

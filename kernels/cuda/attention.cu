// Causal attention on the GPU, optionally within a sliding window, FlashAttention-2
// style (Dao, 2023, "FlashAttention-2: Faster Attention with Better Parallelism and
// Work Partitioning"), in exact fp32 on the CUDA cores: over packed documents
// (cu_seqlens) and over rectangles of query rows x key rows masked by true positions
// (AttentionBlock, ring attention).
//
// One mask for both variants: query row i sees the contiguous key interval
// [lo(i), hi(i)], and key row j is seen by the contiguous query interval
// [qlo(j), qhi(j)] (the same relation, read from the other side). W is the sliding
// window (Mistral 7B: Jiang et al. 2023; a query sees the keys less than W positions
// back, itself included: semantics in kernels/ops.h), or a window no position
// difference reaches when there is none, so full causal attention computes exactly
// the intervals it did before windows existed:
//   documents:  lo(i) = max(start of i's document, i - W + 1), hi(i) = i;
//               qlo(j) = j, qhi(j) = min(end of j's document - 1, j + W - 1).
//               A row's document is found on the device by binary search in
//               cu_seqlens (never copied to the host); rows outside
//               [cu[0], cu[docs]) belong to no document and are left untouched.
//   a block:    key j (in [k_begin, k_end)) is visible to query i (in [q_begin, q_end))
//               iff its position k_position + (j - k_begin) is in
//               (q_position + (i - q_begin) - W, q_position + (i - q_begin)], i.e.
//               i + off - W < j <= i + off, off = (q_position - q_begin) - (k_position - k_begin):
//               lo(i) = max(k_begin, i + off - W + 1), hi(i) = min(k_end - 1, i + off);
//               qlo(j) = max(q_begin, j - off), qhi(j) = min(q_end - 1, j - off + W - 1).
//               Blocks are first trimmed on the host to their visible part (the
//               rectangle shrunk to the projections of its visible pairs; blocks with
//               no visible pair skipped), as on the CPU.
// Every CTA walks only the tiles between the smallest lo and the largest hi of its
// rows (or qlo, qhi), so tiles wholly outside the window are never loaded and a
// document of length L costs O(L W); partially covered tiles are masked per element.
// Rows outside a tile's valid range are loaded as zeros and every masked score is
// forced to p = 0 / dS = 0 by selection (never by multiplying), so rows of the
// tensors that no block covers are never read and cannot leak NaN into results.
//
//   forward, one CTA per (tile of BQ query rows, query head):
//     Q tile -> shared memory once; running state per row: m = -inf, l = 1, O = 0
//     (fresh) or m = lse, l = 1, O = out (merging into earlier calls);
//     for each key tile of BK keys in [min lo, max hi] of the tile's rows:
//       K, V tiles -> shared;  S = Q K^T * scale (masked to -inf);
//       m' = max(m, rowmax S); alpha = exp(m - m'); P = exp(S - m');
//       l = l * alpha + rowsum P;  O = O * alpha + P V   (P through shared memory)
//     A row whose running max is still -inf keeps alpha = 1 and P = 0, so a row that
//     sees no key is written back unchanged (out = O / 1, lse = m + log 1).
//     out = O / l, lse = m + log l.
//
//   backward, without atomics (deterministic), after a pre-kernel D = rowsum(dO * O)
//   into a persistent [Hq, T] buffer:
//     dK/dV: one CTA per (tile of BK key rows, kv head), accumulating in registers
//       over the group's query heads and the query tiles of [min qlo, max qhi]:
//         S^T = K Q^T, P^T = exp(S^T * scale - lse)  (masked: 0)
//         dV += P^T dO;  dP^T = V dO^T;  dS^T = P^T (dP^T - D) * scale (masked: 0)
//         dK += dS^T Q
//     dQ: one CTA per (tile of BQ query rows, query head), over the key tiles the
//       rows see: S, P as above, dP = dO V^T, dS = P (dP - D) * scale, dQ += dS K.
//   The document variant overwrites dq, dk, dv (rows inside documents); the block
//   variant adds into them.
//
// Blocks of one call may share query rows (forward merges) or key rows (backward
// sums): they are processed one after another, one launch (forward) or one pair of
// launches (backward) per block in the caller's order, so nothing races; the block's
// geometry travels as kernel arguments, so no host-to-device copy is needed.
//
// Tiles: 256 threads as a 16 x 16 grid; thread (ty, tx) owns rows ty + 16a and
// columns tx + 16b of every tile product, so shared-memory reads are broadcasts or
// conflict-free (row strides are padded to odd lengths). The head dimension is
// bucketed to D = 32, 64, 128 or 256 (zero-padded in shared memory); any d <= 256.
// Shared memory per CTA (dynamic), floats:
//   forward  (BQ + 2 BK)(D + 1) + BQ (BK + 1)
//   dQ       (2 BQ + 2 BK)(D + 1) + BQ (BK + 1)
//   dK/dV    (2 BQ + 2 BK)(D + 1) + 2 BK (BQ + 1)
// with BQ = BK = 64 for D <= 128 and 32 for D = 256 (at most ~162 KB, D = 128 dK/dV).
//
// TF32 tensor cores (train.tf32, hdp::cuda::tf32()): for fp32 operands with d = 64 and
// d = 128 every tile
// product (forward S = Q K^T and O += P V; backward S, dP = dO V^T, dV += P^T dO,
// dK += dS^T Q, dQ += dS K, and S^T, dP^T in dK/dV) runs as mma.sync m16n8k8 TF32
// (operands rounded with cvt.rna.tf32.f32 when staged into shared memory, P and dS
// when written to a warp's strip), while masks, softmax statistics, lse, D and all
// accumulators stay fp32 exactly as above (results ~1e-3 relative, like the TF32
// GEMMs). Same CTA decomposition and masking; 128 threads (4 warps), each warp owns
// 16 rows of the CTA's 64-row tile and skips a tile none of its rows sees. Tiles:
// forward/dQ key tiles BK = 64 (d = 64) or 32 (d = 128); dK/dV query tiles likewise.
// Shared memory: ~78 KB forward, ~111 KB dQ and dK/dV at d = 128 (2 CTAs per H100 SM).
// With TF32 off, or any other d, the exact kernels above run unchanged.
//
// BF16 (mixed precision): every kernel is instantiated on the element type E of q, k,
// v, dO and out and the type O of what it writes (common.cuh). The document
// variant writes out, dq, dk, dv in bf16 directly (O = E). The block variant merges
// or sums the blocks of one call into fp32 images of out, dq, dk, dv (O = float)
// and rounds them once when the call ends, as the twin does, so blocks sharing
// rows are not rounded once per block. With d = 64 or 128 (whatever train.tf32 says)
// bf16 operands run on bf16 tensor cores (mma.sync m16n8k16, fp32 accumulation): the
// TF32 kernels' code, instantiated on the other kind of product (the section "tensor
// cores" below), with P and dS rounded to bf16 as operands. Any other d runs the exact
// kernels above: bf16 operands read exactly (widened to fp32 when staged into shared
// memory), every product, the softmax statistics, lse, D and the accumulators fp32,
// a bf16 result rounded once on store - the CPU twin's rule (kernels/cpu/bf16.cpp).
// Compiled only: the bf16 tensor-core kernels have not run on a GPU yet.

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/mma_fragments.h"

namespace hdp::cuda {
namespace {

constexpr int kThreads = 256;  // a 16 x 16 grid of threads

// Without a window: one no position difference reaches (positions are 32-bit).
constexpr long long kUnbounded = 1LL << 62;
long long band_of(int64_t window) { return window == kNoWindow ? kUnbounded : std::min<long long>(window, kUnbounded); }

// Which rows a launch works on and the mask between them (see the top of the file).
struct Geom {
  const int32_t* cu;  // documents mode when non-null: cu_seqlens [ndocs + 1] on the device
  int ndocs;
  int q_begin, q_end;  // query rows of this launch
  int k_begin, k_end;  // key rows of this launch
  long long off;       // block mode: key j is visible to query i iff i + off - window < j <= i + off
  long long window;    // W, or kUnbounded
};

// Index of the document holding row r (cu[idx] <= r < cu[idx + 1]), or -1.
__device__ __forceinline__ int find_doc(const int32_t* __restrict__ cu, int ndocs, int r) {
  if (r < cu[0] || r >= cu[ndocs]) return -1;
  int lo = 0, hi = ndocs;  // cu[lo] <= r < cu[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (cu[mid] <= r)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

// Keys [lo, hi] seen by query row i (empty: lo > hi).
__device__ __forceinline__ void query_keys(const Geom& g, int i, int& lo, int& hi) {
  lo = 0;
  hi = -1;
  if (i < g.q_begin || i >= g.q_end) return;
  if (g.cu) {
    const int doc = find_doc(g.cu, g.ndocs, i);
    if (doc < 0) return;
    const long long l = static_cast<long long>(i) - g.window + 1;
    lo = static_cast<int>(l > g.cu[doc] ? l : static_cast<long long>(g.cu[doc]));
    hi = i;
  } else {
    const long long h = static_cast<long long>(i) + g.off, l = h - g.window + 1;
    lo = static_cast<int>(l > g.k_begin ? l : static_cast<long long>(g.k_begin));
    hi = static_cast<int>(h < g.k_end - 1 ? h : static_cast<long long>(g.k_end - 1));
  }
}

// Queries [lo, hi] that see key row j (empty: lo > hi).
__device__ __forceinline__ void key_queries(const Geom& g, int j, int& lo, int& hi) {
  lo = 0;
  hi = -1;
  if (j < g.k_begin || j >= g.k_end) return;
  if (g.cu) {
    const int doc = find_doc(g.cu, g.ndocs, j);
    if (doc < 0) return;
    const long long h = static_cast<long long>(j) + g.window - 1;
    lo = j;
    hi = static_cast<int>(min(static_cast<long long>(min(g.cu[doc + 1] - 1, g.q_end - 1)), h));
  } else {
    const long long l = static_cast<long long>(j) - g.off, h = l + g.window - 1;
    lo = static_cast<int>(l > g.q_begin ? l : static_cast<long long>(g.q_begin));
    hi = static_cast<int>(h < g.q_end - 1 ? h : static_cast<long long>(g.q_end - 1));
  }
}

// Per-row intervals of the ROWS rows from row0 into slo/shi, and in range[0..3]:
// min lo, max hi, first and last row with a non-empty interval (range[2] > range[3]
// when none). Starts and ends with __syncthreads.
template <int ROWS, bool KEY_SIDE>
__device__ __forceinline__ void tile_intervals(const Geom& g, int row0, int* slo, int* shi, int* range) {
  static_assert(ROWS <= kThreads, "one thread per row");
  __syncthreads();
  if (threadIdx.x == 0) {
    range[0] = INT_MAX;
    range[1] = INT_MIN;
    range[2] = INT_MAX;
    range[3] = INT_MIN;
  }
  __syncthreads();
  if (threadIdx.x < ROWS) {
    const int r = row0 + static_cast<int>(threadIdx.x);
    int lo, hi;
    if (KEY_SIDE)
      key_queries(g, r, lo, hi);
    else
      query_keys(g, r, lo, hi);
    slo[threadIdx.x] = lo;
    shi[threadIdx.x] = hi;
    if (lo <= hi) {
      atomicMin(&range[0], lo);
      atomicMax(&range[1], hi);
      atomicMin(&range[2], r);
      atomicMax(&range[3], r);
    }
  }
  __syncthreads();
}

// dst[r][c] (row stride D + 1) = base[(row0 + r) * ld + c] for rows in [lo, hi] and
// c < d, zero elsewhere. base points at column 0 of the head.
template <int ROWS, int D, class E>
__device__ __forceinline__ void load_tile(float* __restrict__ dst, const E* __restrict__ base, long long ld, int row0,
                                          int lo, int hi, int d) {
  constexpr int LD = D + 1;
  for (int idx = threadIdx.x; idx < ROWS * D; idx += kThreads) {
    const int r = idx / D, c = idx % D;
    const int i = row0 + r;
    float x = 0.0f;
    if (c < d && i >= lo && i <= hi) x = to_f32(base[static_cast<long long>(i) * ld + c]);
    dst[r * LD + c] = x;
  }
}

// Sum / max over the 16 lanes of a half warp (those sharing ty).
__device__ __forceinline__ float half_warp_sum(float x) {
  for (int o = 8; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float half_warp_max(float x) {
  for (int o = 8; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

template <int D, int BQ, int BK>
constexpr size_t fwd_smem_bytes() {
  return sizeof(float) * ((BQ + 2 * BK) * (D + 1) + BQ * (BK + 1)) + sizeof(int) * (2 * BQ + 4);
}
template <int D, int BQ, int BK>
constexpr size_t dq_smem_bytes() {
  return sizeof(float) * ((2 * BQ + 2 * BK) * (D + 1) + BQ * (BK + 1)) + sizeof(int) * (2 * BQ + 4);
}
template <int D, int BQ, int BK>
constexpr size_t dkdv_smem_bytes() {
  return sizeof(float) * ((2 * BQ + 2 * BK) * (D + 1) + 2 * BK * (BQ + 1) + 2 * BQ) + sizeof(int) * (2 * BK + 4);
}

// ---------------------------------------------------------------- forward

template <int D, int BQ, int BK, class E, class O>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(O* __restrict__ out, float* __restrict__ lse, const E* __restrict__ q,
                             const E* __restrict__ k, const E* __restrict__ v, Geom g, int T, int Hq, int Hkv, int d,
                             float scale, bool merge) {
  constexpr int LD = D + 1, LP = BK + 1, RA = BQ / 16, SB = BK / 16, OB = D / 16;
  extern __shared__ float smem[];
  float* Qs = smem;
  float* Ks = Qs + BQ * LD;
  float* Vs = Ks + BK * LD;
  float* Ps = Vs + BK * LD;
  int* rlo = reinterpret_cast<int*>(Ps + BQ * LP);
  int* rhi = rlo + BQ;
  int* range = rhi + BQ;

  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  const int h = blockIdx.y, kvh = h / (Hq / Hkv);
  const int i0 = g.q_begin + static_cast<int>(blockIdx.x) * BQ;
  tile_intervals<BQ, false>(g, i0, rlo, rhi, range);
  const int klo = range[0], khi = range[1], qfirst = range[2], qlast = range[3];
  if (qfirst > qlast) return;  // uniform over the CTA

  const long long ldq = static_cast<long long>(Hq) * d, ldk = static_cast<long long>(Hkv) * d;
  load_tile<BQ, D>(Qs, q + static_cast<long long>(h) * d, ldq, i0, qfirst, qlast, d);

  int lo[RA], hi[RA];
  float m[RA], l[RA], acc[RA][OB];
#pragma unroll
  for (int a = 0; a < RA; ++a) {
    const int r = ty + 16 * a, i = i0 + r;
    lo[a] = rlo[r];
    hi[a] = rhi[r];
    m[a] = -INFINITY;
    l[a] = 1.0f;
    const bool live = lo[a] <= hi[a];
    const O* orow = out + (static_cast<long long>(i) * Hq + h) * d;
    if (merge && live) m[a] = lse[static_cast<long long>(h) * T + i];
#pragma unroll
    for (int b = 0; b < OB; ++b) {
      const int c = tx + 16 * b;
      acc[a][b] = (merge && live && c < d) ? to_f32(orow[c]) : 0.0f;
    }
  }

  for (int k0 = klo; k0 <= khi; k0 += BK) {
    __syncthreads();  // the previous tile's readers of Ks, Vs, Ps are done
    load_tile<BK, D>(Ks, k + static_cast<long long>(kvh) * d, ldk, k0, klo, khi, d);
    load_tile<BK, D>(Vs, v + static_cast<long long>(kvh) * d, ldk, k0, klo, khi, d);
    __syncthreads();

    float s[RA][SB];
#pragma unroll
    for (int a = 0; a < RA; ++a)
#pragma unroll
      for (int b = 0; b < SB; ++b) s[a][b] = 0.0f;
#pragma unroll 8
    for (int c = 0; c < D; ++c) {
      float qa[RA], kb[SB];
#pragma unroll
      for (int a = 0; a < RA; ++a) qa[a] = Qs[(ty + 16 * a) * LD + c];
#pragma unroll
      for (int b = 0; b < SB; ++b) kb[b] = Ks[(tx + 16 * b) * LD + c];
#pragma unroll
      for (int a = 0; a < RA; ++a)
#pragma unroll
        for (int b = 0; b < SB; ++b) s[a][b] = fmaf(qa[a], kb[b], s[a][b]);
    }

#pragma unroll
    for (int a = 0; a < RA; ++a) {
      float mx = -INFINITY;
#pragma unroll
      for (int b = 0; b < SB; ++b) {
        const int j = k0 + tx + 16 * b;
        const bool vis = j >= lo[a] && j <= hi[a];
        s[a][b] = vis ? s[a][b] * scale : -INFINITY;
        mx = fmaxf(mx, s[a][b]);
      }
      mx = half_warp_max(mx);
      const float mnew = fmaxf(m[a], mx);
      float alpha = 1.0f, sum = 0.0f;
      if (mnew == -INFINITY) {
#pragma unroll
        for (int b = 0; b < SB; ++b) s[a][b] = 0.0f;
      } else {
        alpha = expf(m[a] - mnew);
#pragma unroll
        for (int b = 0; b < SB; ++b) {
          s[a][b] = expf(s[a][b] - mnew);  // masked: exp(-inf) = 0
          sum += s[a][b];
        }
      }
      sum = half_warp_sum(sum);
      l[a] = l[a] * alpha + sum;
      m[a] = mnew;
#pragma unroll
      for (int b = 0; b < OB; ++b) acc[a][b] *= alpha;
#pragma unroll
      for (int b = 0; b < SB; ++b) Ps[(ty + 16 * a) * LP + tx + 16 * b] = s[a][b];
    }
    __syncthreads();

#pragma unroll 4
    for (int j = 0; j < BK; ++j) {
      float pa[RA], vb[OB];
#pragma unroll
      for (int a = 0; a < RA; ++a) pa[a] = Ps[(ty + 16 * a) * LP + j];
#pragma unroll
      for (int b = 0; b < OB; ++b) vb[b] = Vs[j * LD + tx + 16 * b];
#pragma unroll
      for (int a = 0; a < RA; ++a)
#pragma unroll
        for (int b = 0; b < OB; ++b) acc[a][b] = fmaf(pa[a], vb[b], acc[a][b]);
    }
  }

#pragma unroll
  for (int a = 0; a < RA; ++a) {
    if (lo[a] > hi[a]) continue;
    const int i = i0 + ty + 16 * a;
    const float inv = 1.0f / l[a];
    O* orow = out + (static_cast<long long>(i) * Hq + h) * d;
#pragma unroll
    for (int b = 0; b < OB; ++b) {
      const int c = tx + 16 * b;
      if (c < d) orow[c] = from_f32<O>(acc[a][b] * inv);
    }
    if (tx == 0) lse[static_cast<long long>(h) * T + i] = m[a] + logf(l[a]);
  }
}

// ---------------------------------------------------------------- backward

// dvec[h * T + i] = sum_c dout[i, h, c] * out[i, h, c]; one thread per (row, head),
// summing in the same order (fmaf over ascending c) as the kernels below form
// dP = dO . V, so a row that sees a single key (P = 1, out = V exactly) gets
// dP - D = 0 exactly, as in exact arithmetic.
template <class E>
__global__ void attention_rowdot_kernel(float* __restrict__ dvec, const E* __restrict__ dout, const E* __restrict__ out,
                                        long long T, int Hq, int d) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long w = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; w < T * Hq; w += stride) {
    const long long i = w / Hq;
    const int h = static_cast<int>(w % Hq);
    const E* a = dout + w * d;
    const E* b = out + w * d;
    float s = 0.0f;
    for (int c = 0; c < d; ++c) s = fmaf(to_f32(a[c]), to_f32(b[c]), s);
    dvec[static_cast<long long>(h) * T + i] = s;
  }
}

template <int D, int BQ, int BK, class E, class O>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dq_kernel(O* __restrict__ dq, const E* __restrict__ dout, const E* __restrict__ q,
                                 const E* __restrict__ k, const E* __restrict__ v, const float* __restrict__ lse,
                                 const float* __restrict__ dvec, Geom g, int T, int Hq, int Hkv, int d, float scale,
                                 bool accumulate) {
  constexpr int LD = D + 1, LP = BK + 1, RA = BQ / 16, SB = BK / 16, OB = D / 16;
  extern __shared__ float smem[];
  float* Qs = smem;
  float* Os = Qs + BQ * LD;  // dO
  float* Ks = Os + BQ * LD;
  float* Vs = Ks + BK * LD;
  float* Ss = Vs + BK * LD;  // dS
  int* rlo = reinterpret_cast<int*>(Ss + BQ * LP);
  int* rhi = rlo + BQ;
  int* range = rhi + BQ;

  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  const int h = blockIdx.y, kvh = h / (Hq / Hkv);
  const int i0 = g.q_begin + static_cast<int>(blockIdx.x) * BQ;
  tile_intervals<BQ, false>(g, i0, rlo, rhi, range);
  const int klo = range[0], khi = range[1], qfirst = range[2], qlast = range[3];
  if (qfirst > qlast) return;

  const long long ldq = static_cast<long long>(Hq) * d, ldk = static_cast<long long>(Hkv) * d;
  load_tile<BQ, D>(Qs, q + static_cast<long long>(h) * d, ldq, i0, qfirst, qlast, d);
  load_tile<BQ, D>(Os, dout + static_cast<long long>(h) * d, ldq, i0, qfirst, qlast, d);

  int lo[RA], hi[RA];
  float lse_r[RA], dv_r[RA], acc[RA][OB];
#pragma unroll
  for (int a = 0; a < RA; ++a) {
    const int r = ty + 16 * a, i = i0 + r;
    lo[a] = rlo[r];
    hi[a] = rhi[r];
    const bool live = lo[a] <= hi[a];
    lse_r[a] = live ? lse[static_cast<long long>(h) * T + i] : 0.0f;
    dv_r[a] = live ? dvec[static_cast<long long>(h) * T + i] : 0.0f;
#pragma unroll
    for (int b = 0; b < OB; ++b) acc[a][b] = 0.0f;
  }

  for (int k0 = klo; k0 <= khi; k0 += BK) {
    __syncthreads();
    load_tile<BK, D>(Ks, k + static_cast<long long>(kvh) * d, ldk, k0, klo, khi, d);
    load_tile<BK, D>(Vs, v + static_cast<long long>(kvh) * d, ldk, k0, klo, khi, d);
    __syncthreads();

    float s[RA][SB], dp[RA][SB];
#pragma unroll
    for (int a = 0; a < RA; ++a)
#pragma unroll
      for (int b = 0; b < SB; ++b) s[a][b] = dp[a][b] = 0.0f;
#pragma unroll 4
    for (int c = 0; c < D; ++c) {
      float qa[RA], oa[RA], kb[SB], vb[SB];
#pragma unroll
      for (int a = 0; a < RA; ++a) {
        qa[a] = Qs[(ty + 16 * a) * LD + c];
        oa[a] = Os[(ty + 16 * a) * LD + c];
      }
#pragma unroll
      for (int b = 0; b < SB; ++b) {
        kb[b] = Ks[(tx + 16 * b) * LD + c];
        vb[b] = Vs[(tx + 16 * b) * LD + c];
      }
#pragma unroll
      for (int a = 0; a < RA; ++a)
#pragma unroll
        for (int b = 0; b < SB; ++b) {
          s[a][b] = fmaf(qa[a], kb[b], s[a][b]);
          dp[a][b] = fmaf(oa[a], vb[b], dp[a][b]);
        }
    }
#pragma unroll
    for (int a = 0; a < RA; ++a)
#pragma unroll
      for (int b = 0; b < SB; ++b) {
        const int j = k0 + tx + 16 * b;
        const bool vis = j >= lo[a] && j <= hi[a];
        const float p = expf(s[a][b] * scale - lse_r[a]);
        Ss[(ty + 16 * a) * LP + tx + 16 * b] = vis ? p * (dp[a][b] - dv_r[a]) * scale : 0.0f;
      }
    __syncthreads();

#pragma unroll 4
    for (int j = 0; j < BK; ++j) {
      float sa[RA], kb[OB];
#pragma unroll
      for (int a = 0; a < RA; ++a) sa[a] = Ss[(ty + 16 * a) * LP + j];
#pragma unroll
      for (int b = 0; b < OB; ++b) kb[b] = Ks[j * LD + tx + 16 * b];
#pragma unroll
      for (int a = 0; a < RA; ++a)
#pragma unroll
        for (int b = 0; b < OB; ++b) acc[a][b] = fmaf(sa[a], kb[b], acc[a][b]);
    }
  }

#pragma unroll
  for (int a = 0; a < RA; ++a) {
    if (lo[a] > hi[a]) continue;
    const int i = i0 + ty + 16 * a;
    O* row = dq + (static_cast<long long>(i) * Hq + h) * d;
#pragma unroll
    for (int b = 0; b < OB; ++b) {
      const int c = tx + 16 * b;
      if (c < d) row[c] = from_f32<O>(accumulate ? to_f32(row[c]) + acc[a][b] : acc[a][b]);
    }
  }
}

template <int D, int BQ, int BK, class E, class O>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dkdv_kernel(O* __restrict__ dk, O* __restrict__ dv, const E* __restrict__ dout,
                                   const E* __restrict__ q, const E* __restrict__ k, const E* __restrict__ v,
                                   const float* __restrict__ lse,
                                   const float* __restrict__ dvec, Geom g, int T, int Hq, int Hkv, int d, float scale,
                                   bool accumulate) {
  // Thread (ty, tx) owns key rows ty + 16a and query columns / head-dim columns tx + 16b.
  constexpr int LD = D + 1, LP = BQ + 1, RA = BK / 16, SB = BQ / 16, OB = D / 16;
  extern __shared__ float smem[];
  float* Ks = smem;
  float* Vs = Ks + BK * LD;
  float* Qs = Vs + BK * LD;
  float* Os = Qs + BQ * LD;  // dO
  float* Ps = Os + BQ * LD;
  float* Ss = Ps + BK * LP;  // dS
  float* lse_s = Ss + BK * LP;
  float* dv_s = lse_s + BQ;
  int* klo_s = reinterpret_cast<int*>(dv_s + BQ);
  int* khi_s = klo_s + BK;
  int* range = khi_s + BK;

  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  const int kvh = blockIdx.y, group = Hq / Hkv;
  const int j0 = g.k_begin + static_cast<int>(blockIdx.x) * BK;
  tile_intervals<BK, true>(g, j0, klo_s, khi_s, range);
  const int qmin = range[0], qmax = range[1], kfirst = range[2], klast = range[3];
  if (kfirst > klast) return;

  const long long ldq = static_cast<long long>(Hq) * d, ldk = static_cast<long long>(Hkv) * d;
  load_tile<BK, D>(Ks, k + static_cast<long long>(kvh) * d, ldk, j0, kfirst, klast, d);
  load_tile<BK, D>(Vs, v + static_cast<long long>(kvh) * d, ldk, j0, kfirst, klast, d);

  int lo[RA], hi[RA];
  float dka[RA][OB], dva[RA][OB];
#pragma unroll
  for (int a = 0; a < RA; ++a) {
    lo[a] = klo_s[ty + 16 * a];
    hi[a] = khi_s[ty + 16 * a];
#pragma unroll
    for (int b = 0; b < OB; ++b) dka[a][b] = dva[a][b] = 0.0f;
  }

  for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
    for (int q0 = qmin; q0 <= qmax; q0 += BQ) {
      __syncthreads();  // the previous tile's readers of Qs, Os, Ps, Ss, lse_s, dv_s are done
      load_tile<BQ, D>(Qs, q + static_cast<long long>(h) * d, ldq, q0, qmin, qmax, d);
      load_tile<BQ, D>(Os, dout + static_cast<long long>(h) * d, ldq, q0, qmin, qmax, d);
      if (threadIdx.x < BQ) {
        const int i = q0 + static_cast<int>(threadIdx.x);
        const bool ok = i <= qmax;
        lse_s[threadIdx.x] = ok ? lse[static_cast<long long>(h) * T + i] : 0.0f;
        dv_s[threadIdx.x] = ok ? dvec[static_cast<long long>(h) * T + i] : 0.0f;
      }
      __syncthreads();

      float st[RA][SB], dpt[RA][SB];
#pragma unroll
      for (int a = 0; a < RA; ++a)
#pragma unroll
        for (int b = 0; b < SB; ++b) st[a][b] = dpt[a][b] = 0.0f;
#pragma unroll 4
      for (int c = 0; c < D; ++c) {
        float ka[RA], va[RA], qb[SB], ob[SB];
#pragma unroll
        for (int a = 0; a < RA; ++a) {
          ka[a] = Ks[(ty + 16 * a) * LD + c];
          va[a] = Vs[(ty + 16 * a) * LD + c];
        }
#pragma unroll
        for (int b = 0; b < SB; ++b) {
          qb[b] = Qs[(tx + 16 * b) * LD + c];
          ob[b] = Os[(tx + 16 * b) * LD + c];
        }
#pragma unroll
        for (int a = 0; a < RA; ++a)
#pragma unroll
          for (int b = 0; b < SB; ++b) {
            st[a][b] = fmaf(ka[a], qb[b], st[a][b]);
            dpt[a][b] = fmaf(va[a], ob[b], dpt[a][b]);
          }
      }
#pragma unroll
      for (int a = 0; a < RA; ++a)
#pragma unroll
        for (int b = 0; b < SB; ++b) {
          const int col = tx + 16 * b, i = q0 + col;
          const bool vis = i >= lo[a] && i <= hi[a];
          const float p = expf(st[a][b] * scale - lse_s[col]);
          Ps[(ty + 16 * a) * LP + col] = vis ? p : 0.0f;
          Ss[(ty + 16 * a) * LP + col] = vis ? p * (dpt[a][b] - dv_s[col]) * scale : 0.0f;
        }
      __syncthreads();

#pragma unroll 2
      for (int i = 0; i < BQ; ++i) {
        float pa[RA], sa[RA], ob[OB], qb[OB];
#pragma unroll
        for (int a = 0; a < RA; ++a) {
          pa[a] = Ps[(ty + 16 * a) * LP + i];
          sa[a] = Ss[(ty + 16 * a) * LP + i];
        }
#pragma unroll
        for (int b = 0; b < OB; ++b) {
          ob[b] = Os[i * LD + tx + 16 * b];
          qb[b] = Qs[i * LD + tx + 16 * b];
        }
#pragma unroll
        for (int a = 0; a < RA; ++a)
#pragma unroll
          for (int b = 0; b < OB; ++b) {
            dva[a][b] = fmaf(pa[a], ob[b], dva[a][b]);
            dka[a][b] = fmaf(sa[a], qb[b], dka[a][b]);
          }
      }
    }
  }

#pragma unroll
  for (int a = 0; a < RA; ++a) {
    if (lo[a] > hi[a]) continue;
    const int j = j0 + ty + 16 * a;
    const long long row = (static_cast<long long>(j) * Hkv + kvh) * d;
#pragma unroll
    for (int b = 0; b < OB; ++b) {
      const int c = tx + 16 * b;
      if (c < d) {
        dk[row + c] = from_f32<O>(accumulate ? to_f32(dk[row + c]) + dka[a][b] : dka[a][b]);
        dv[row + c] = from_f32<O>(accumulate ? to_f32(dv[row + c]) + dva[a][b] : dva[a][b]);
      }
    }
  }
}

__global__ void attention_fill_lse_kernel(float* __restrict__ lse, long long T, long long begin, long long n,
                                          long long heads) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long t = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; t < heads * n; t += stride)
    lse[(t / n) * T + begin + t % n] = -INFINITY;
}

// ---------------------------------------------------------------- tensor cores

// The fast path for d = 64 and 128: fp32 operands when TF32 is on (tf32()) run their
// tile products as mma.sync m16n8k8 TF32, bf16 operands (whatever train.tf32 says) as
// mma.sync m16n8k16 bf16 (twice TF32's rate), both with fp32 accumulation. The same
// tiles, masks and on-line softmax as above; each direction is one kernel over the kind
// of product, whose traits (Tf32Mma, Bf16Mma below) hold what differs. 128 threads =
// 4 warps; warp w owns the 16 rows [16w, 16w + 16) of the CTA's 64-row tile (query rows
// in forward / dQ, key rows in dK/dV). Fragment layouts of both in
// kernels/cuda/mma_fragments.h, checked on the CPU by
// tests/kernels_mma_fragments_test.cpp. Softmax statistics, lse, D and every
// accumulator stay fp32. A warp whose rows see nothing of the current tile skips it
// (exactly what the full computation would give: alpha = 1, P = 0).
//
// Shared memory holds the operands as the kind reads them:
//   TF32: rounded with cvt.rna when staged, rows padded to D + 4 floats (conflict-free
//     A and B^T fragment reads). A B operand whose k runs along its rows (V in P V, K in
//     dS K, dO in P^T dO, Q in dS^T Q) is read in place; the forward's V, read only so,
//     has rows of D + 8 floats (conflict-free for that read).
//   bf16: as stored (bf16 bits, no rounding), rows padded by 8 halves so a warp's
//     32-bit fragment loads hit 32 different banks. Such a B operand is also staged
//     transposed, so every fragment register is one 32-bit load.
// P and dS, the results that are the next products' A operands: TF32's A fragment is
// not its C fragment, so a warp's P / dS goes through a private shared strip (16 rows),
// rounded to TF32, with __syncwarp between writing and reading; bf16's A fragment is
// two neighbouring C fragments, so P and dS stay in registers, rounded to bf16
// (FlashAttention-2's register reuse: Dao, 2023).
//
// Rounding points of bf16, FlashAttention-2's: P and dS are rounded to bf16 (to nearest
// even) exactly where they become A operands -
//   forward:  P = exp(S - m') with m' the running row max (values in [0, 1]) before
//             O += P V; the row sum l is taken from the fp32 P;
//   dQ:       dS = P (dP - D) * scale before dQ += dS K;
//   dK/dV:    P^T before dV += P^T dO, dS^T before dK += dS^T Q -
// and nowhere else: S, dP, the softmax statistics, lse, D and every accumulator are
// fp32 (a product of two bf16 values is exact in fp32). So a result differs from the
// CPU twin (fp32 throughout, one rounding on store) by more than the store's
// rounding; the selftest's tolerance for these rows is derived in
// tests/kernels_mma_fragments_test.cpp by emulating the same rounding on the CPU.
//
// The kernel bodies keep the forms the separate TF32 and bf16 kernels had (the index
// arithmetic as written, which column pairs are a loop and which two statements, P
// handed over row by row, TF32's two dK/dV sweeps), so nvcc compiles the GPU-verified
// TF32 instances, and the bf16 ones but dQ's at d = 128 (whose column-pair epilogue is
// now TF32's two statements: other branch layout and registers, the same arithmetic),
// to the SASS their own kernels had (sm_80, sm_90).

constexpr int kTcThreads = 128;  // 4 warps
constexpr int kTcRows = 64;      // rows of the CTA's own tile (16 per warp)

__device__ __forceinline__ float tf32_round(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return __uint_as_float(r);
}

// dst[r][c] (row stride LDS) = tf32(base[(row0 + r) * ld + c]) for rows in [lo, hi],
// zero elsewhere; c < D (= d on this path). 128 threads.
template <int ROWS, int D, int LDS>
__device__ __forceinline__ void stage_tf32(float* __restrict__ dst, const float* __restrict__ base, long long ld,
                                           int row0, int lo, int hi) {
  static_assert(D % 4 == 0 && LDS % 4 == 0, "float4 rows");
  if ((reinterpret_cast<uintptr_t>(base) & 15u) == 0 && (ld & 3) == 0) {
    constexpr int C4 = D / 4;
    for (int idx = threadIdx.x; idx < ROWS * C4; idx += kTcThreads) {
      const int r = idx / C4, c = (idx % C4) * 4, i = row0 + r;
      float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (i >= lo && i <= hi) x = *reinterpret_cast<const float4*>(base + static_cast<long long>(i) * ld + c);
      x.x = tf32_round(x.x);
      x.y = tf32_round(x.y);
      x.z = tf32_round(x.z);
      x.w = tf32_round(x.w);
      *reinterpret_cast<float4*>(dst + r * LDS + c) = x;
    }
    return;
  }
  // Rows not aligned for float4.
  for (int idx = threadIdx.x; idx < ROWS * D; idx += kTcThreads) {
    const int r = idx / D, c = idx % D, i = row0 + r;
    float x = 0.0f;
    if (i >= lo && i <= hi) x = base[static_cast<long long>(i) * ld + c];
    dst[r * LDS + c] = tf32_round(x);
  }
}

// Rows [lo, hi] of a bf16 tile from global memory (row i at base + i * ld, columns
// [0, D)), zero elsewhere, into shared memory: row-major into dst (row stride LDS)
// when dst is given, transposed into dst_t (dst_t[c * LDT + r]) when it is given.
// 8 halves per thread and step (16-byte loads when aligned). 128 threads.
template <int ROWS, int D, int LDS, int LDT>
__device__ __forceinline__ void stage_bf16(uint16_t* __restrict__ dst, uint16_t* __restrict__ dst_t,
                                           const __nv_bfloat16* __restrict__ base, long long ld, int row0, int lo,
                                           int hi) {
  static_assert(D % 8 == 0 && LDS % 8 == 0 && LDT % 2 == 0, "16-byte rows");
  constexpr int C8 = D / 8;
  const uint16_t* src = reinterpret_cast<const uint16_t*>(base);
  const bool vec = (reinterpret_cast<uintptr_t>(src) & 15u) == 0 && (ld & 7) == 0;
  for (int idx = threadIdx.x; idx < ROWS * C8; idx += kTcThreads) {
    const int r = idx / C8, c = (idx % C8) * 8, i = row0 + r;
    uint4 x = make_uint4(0u, 0u, 0u, 0u);
    if (i >= lo && i <= hi) {
      const uint16_t* row = src + static_cast<long long>(i) * ld + c;
      if (vec) {
        x = *reinterpret_cast<const uint4*>(row);
      } else {
        x.x = row[0] | (static_cast<uint32_t>(row[1]) << 16);
        x.y = row[2] | (static_cast<uint32_t>(row[3]) << 16);
        x.z = row[4] | (static_cast<uint32_t>(row[5]) << 16);
        x.w = row[6] | (static_cast<uint32_t>(row[7]) << 16);
      }
    }
    if (dst) *reinterpret_cast<uint4*>(dst + r * LDS + c) = x;
    if (dst_t) {
      const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        dst_t[(c + 2 * e) * LDT + r] = static_cast<uint16_t>(w[e] & 0xffffu);
        dst_t[(c + 2 * e + 1) * LDT + r] = static_cast<uint16_t>(w[e] >> 16);
      }
    }
  }
}

// What differs between the two kinds of product, as traits the kernels are written
// against:
//   Operand, Smem         q, k, v, dO in global memory; a staged tile's element;
//   kK, mma               the k of one product, and the product (c += A B);
//   kPad, stage           a tile staged row-major, rows of D + kPad (A, and B stored as
//                         B^T), read by frag_a and frag_b;
//   kTransposed,          whether a B operand whose k runs along its rows (K in dS K,
//   t_stride, t_elems     dO in P^T dO, Q in dS^T Q) is read from a transposed copy that
//                         stage writes beside the tile (rows of t_stride), or in place;
//   kn_stride, kn_elems,  the forward's V, read only as such an operand: its rows and
//   stage_kn, frag_b_kn   size, its staging, and that B fragment (of either);
//   kInRegisters,         where P and dS wait between the product that makes them and
//   strip_stride,         the one that reads them: registers, or the warp's strip of 16
//   hand_over(_sync),     rows of strip_stride elements (hand_over stores a value,
//   frag_a_handed         hand_over_sync orders the strip, frag_a_handed reads the A
//                         fragment, rounded to the operand type);
//   kUnrollQK, kUnroll    unroll counts of the forward's S = Q K^T k loop and of the
//                         others.

// mma.sync m16n8k8 TF32, for fp32 operands (fragment layouts in mma_fragments.h,
// mma::m16n8k8). Its C fragment is not its A fragment, so P and dS go through the
// strip: stored at their C positions, rounded to TF32, and read back as A fragments
// after a __syncwarp. The registers are loaded one statement each (a loop over them
// compiles to other SASS).
struct Tf32Mma {
  using Operand = float;
  using Smem = float;  // TF32 bit patterns
  static constexpr int kK = mma::m16n8k8::kK, kPad = 4;
  static constexpr bool kTransposed = false, kInRegisters = false;
  static constexpr int kUnrollQK = 4, kUnroll = 2;  // as the kernels were tuned
  // The forward's V with rows of D + 8 floats: conflict-free B reads along k.
  static constexpr int kn_stride(int /*rows*/, int d) { return d + 8; }
  static constexpr int kn_elems(int rows, int d) { return rows * (d + 8); }
  static constexpr int t_stride(int /*rows*/) { return 0; }
  static constexpr int t_elems(int /*rows*/, int /*d*/) { return 0; }
  static constexpr int strip_stride(int cols) { return cols + 4; }

  // Rows [lo, hi] of a tile into dst (row stride LDS), rounded to TF32.
  template <int ROWS, int D, int LDS, int LDT>
  static __device__ __forceinline__ void stage(float* dst, float* /*dst_t*/, const float* base, long long ld,
                                               int row0, int lo, int hi) {
    static_assert(LDT == 0, "TF32 reads B operands in place: no transposed copy");
    stage_tf32<ROWS, D, LDS>(dst, base, ld, row0, lo, hi);
  }
  template <int ROWS, int D, int LD>
  static __device__ __forceinline__ void stage_kn(float* dst, const float* base, long long ld, int row0, int lo,
                                                  int hi) {
    stage_tf32<ROWS, D, LD>(dst, base, ld, row0, lo, hi);
  }

  // c += A B (operands TF32 bit patterns).
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
  // A fragment of the 16 x 8 block at s (row-major, row stride ld).
  static __device__ __forceinline__ void frag_a(uint32_t (&a)[4], const float* s, int ld, int lane) {
    a[0] = __float_as_uint(s[mma::a_row(lane, 0) * ld + mma::m16n8k8::a_col(lane, 0)]);
    a[1] = __float_as_uint(s[mma::a_row(lane, 1) * ld + mma::m16n8k8::a_col(lane, 1)]);
    a[2] = __float_as_uint(s[mma::a_row(lane, 2) * ld + mma::m16n8k8::a_col(lane, 2)]);
    a[3] = __float_as_uint(s[mma::a_row(lane, 3) * ld + mma::m16n8k8::a_col(lane, 3)]);
  }
  // B fragment (8 x 8, k x n) stored transposed at s: B[k][n] = s[n * ld + k].
  static __device__ __forceinline__ void frag_b(uint32_t (&b)[2], const float* s, int ld, int lane) {
    b[0] = __float_as_uint(s[mma::b_n(lane) * ld + mma::m16n8k8::b_k(lane, 0)]);
    b[1] = __float_as_uint(s[mma::b_n(lane) * ld + mma::m16n8k8::b_k(lane, 1)]);
  }
  // B fragment of k-block kk and n-block nb of the row-major x (row stride ld): B = x.
  static __device__ __forceinline__ void frag_b_kn(uint32_t (&b)[2], const float* x, int ld, int kk, int nb,
                                                   int lane) {
    const float* s = x + 8 * kk * ld + 8 * nb;
    b[0] = __float_as_uint(s[mma::m16n8k8::b_k(lane, 0) * ld + mma::b_n(lane)]);
    b[1] = __float_as_uint(s[mma::m16n8k8::b_k(lane, 1) * ld + mma::b_n(lane)]);
  }
  // A value of P or dS, rounded to TF32, into the warp's strip at idx (its C position).
  static __device__ __forceinline__ void hand_over(float* strip, int idx, float x) { strip[idx] = tf32_round(x); }
  static __device__ __forceinline__ void hand_over_sync() { __syncwarp(); }
  // A fragment of columns [8 kk, 8 kk + 8) of the strip (row stride ld).
  template <int N>
  static __device__ __forceinline__ void frag_a_handed(uint32_t (&a)[4], const float (&)[N][4], const float* strip,
                                                       int ld, int kk, int lane) {
    frag_a(a, strip + 8 * kk, ld, lane);
  }
};

// mma.sync m16n8k16 bf16, for bf16 operands (fragment layouts in mma_fragments.h).
// Tiles hold bf16 bits as stored; P and dS stay in registers: the A fragment of a
// 16-column block is its two C fragments, rounded to bf16.
struct Bf16Mma {
  using Operand = __nv_bfloat16;
  using Smem = uint16_t;  // bf16 bits
  static constexpr int kK = mma::kK, kPad = 8;
  static constexpr bool kTransposed = true, kInRegisters = true;
  // Every k loop unrolled fully: a count no loop reaches compiles as #pragma unroll
  // without one.
  static constexpr int kUnrollQK = INT_MAX, kUnroll = INT_MAX;
  static constexpr int kn_stride(int rows, int /*d*/) { return rows + 8; }
  static constexpr int kn_elems(int rows, int d) { return d * (rows + 8); }
  static constexpr int t_stride(int rows) { return rows + 8; }
  static constexpr int t_elems(int rows, int d) { return d * (rows + 8); }
  static constexpr int strip_stride(int /*cols*/) { return 0; }

  // Rows [lo, hi] of a tile into dst (row stride LDS) and / or transposed into dst_t.
  template <int ROWS, int D, int LDS, int LDT>
  static __device__ __forceinline__ void stage(uint16_t* dst, uint16_t* dst_t, const __nv_bfloat16* base,
                                               long long ld, int row0, int lo, int hi) {
    stage_bf16<ROWS, D, LDS, LDT>(dst, dst_t, base, ld, row0, lo, hi);
  }
  template <int ROWS, int D, int LD>
  static __device__ __forceinline__ void stage_kn(uint16_t* dst, const __nv_bfloat16* base, long long ld, int row0,
                                                  int lo, int hi) {
    stage_bf16<ROWS, D, 0, LD>(nullptr, dst, base, ld, row0, lo, hi);
  }

  // c += A B (two bf16 per operand register, low half first).
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
  // A fragment of the 16 x 16 block at s (row-major, row stride ld halves).
  static __device__ __forceinline__ void frag_a(uint32_t (&a)[4], const uint16_t* s, int ld, int lane) {
#pragma unroll
    for (int r = 0; r < mma::kARegs; ++r)
      a[r] = *reinterpret_cast<const uint32_t*>(s + mma::a_row(lane, r) * ld + mma::a_col(lane, r, 0));
  }
  // B fragment (16 x 8, k x n) stored transposed at s: B[k][n] = s[n * ld + k].
  static __device__ __forceinline__ void frag_b(uint32_t (&b)[2], const uint16_t* s, int ld, int lane) {
#pragma unroll
    for (int r = 0; r < mma::kBRegs; ++r)
      b[r] = *reinterpret_cast<const uint32_t*>(s + mma::b_n(lane) * ld + mma::b_k(lane, r, 0));
  }
  // B fragment of k-block kk and n-block nb of x, given as its transposed copy xt
  // (row stride ld).
  static __device__ __forceinline__ void frag_b_kn(uint32_t (&b)[2], const uint16_t* xt, int ld, int kk, int nb,
                                                   int lane) {
    frag_b(b, xt + 8 * nb * ld + 16 * kk, ld, lane);
  }
  // P and dS stay in their C fragments; frag_a_handed rounds them.
  static __device__ __forceinline__ void hand_over(uint16_t*, int, float) {}
  static __device__ __forceinline__ void hand_over_sync() {}
  // A fragment of columns [16 kk, 16 kk + 16) of a strip of C fragments c (n-blocks of
  // 8 columns), rounded to bf16 (to nearest even): the rounding point of P and dS.
  template <int N>
  static __device__ __forceinline__ void frag_a_handed(uint32_t (&a)[4], const float (&c)[N][4], const uint16_t*,
                                                       int, int kk, int) {
#pragma unroll
    for (int r = 0; r < mma::kARegs; ++r) {
      const float* cb = c[2 * kk + mma::c_block_of_a(r)];
      const __nv_bfloat162 p = __floats2bfloat162_rn(cb[mma::c_value_of_a(r)],
                                                     cb[mma::c_value_of_a(r) + 1]);  // .x: low half
      a[r] = *reinterpret_cast<const uint32_t*>(&p);
    }
  }
};

// Union [wlo, whi] of the intervals of a warp's rows (empty: wlo > whi).
__device__ __forceinline__ void warp_interval(const int (&lo)[2], const int (&hi)[2], int& wlo, int& whi) {
  wlo = INT_MAX;
  whi = INT_MIN;
#pragma unroll
  for (int e = 0; e < 2; ++e)
    if (lo[e] <= hi[e]) {
      wlo = min(wlo, lo[e]);
      whi = max(whi, hi[e]);
    }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    wlo = min(wlo, __shfl_xor_sync(0xffffffffu, wlo, o));
    whi = max(whi, __shfl_xor_sync(0xffffffffu, whi, o));
  }
}

// Sum / max over the 4 lanes of a quad (those holding one row of a C fragment).
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// One key tile of the forward's on-line softmax on a warp's C fragments (the m16n8
// accumulator layout of both kinds: this lane holds columns 8 nb + c_col(lane, x) of
// its rows e = 0, 1): masks and scales S, takes the new row max m', rescales l and the
// accumulators by alpha = exp(m - m'), adds the row sums of P to l, and leaves
// P = exp(S - m') in s (fp32; 0 where masked). A row whose max is still -inf keeps
// alpha = 1 and P = 0. Each row's P is handed over as soon as the row is done (TF32:
// into the warp's strip Pw of row stride LP, in the order the GPU-verified TF32 kernel
// always had; bf16: nothing to do).
template <class Mma, int NS, int NO, int LP>
__device__ __forceinline__ void online_softmax_tile(float (&s)[NS][4], float (&acc)[NO][4], float (&m)[2],
                                                    float (&l)[2], const int (&lo)[2], const int (&hi)[2], int k0,
                                                    int lane, float scale, typename Mma::Smem* Pw, int gq, int tq) {
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    float mx = -INFINITY;
#pragma unroll
    for (int nb = 0; nb < NS; ++nb)
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const int j = k0 + 8 * nb + mma::c_col(lane, x);
        const bool vis = j >= lo[e] && j <= hi[e];
        float& sv = s[nb][2 * e + x];
        sv = vis ? sv * scale : -INFINITY;
        mx = fmaxf(mx, sv);
      }
    mx = quad_max(mx);
    const float mnew = fmaxf(m[e], mx);
    float alpha = 1.0f, sum = 0.0f;
    if (mnew == -INFINITY) {
#pragma unroll
      for (int nb = 0; nb < NS; ++nb) s[nb][2 * e] = s[nb][2 * e + 1] = 0.0f;
    } else {
      alpha = expf(m[e] - mnew);
#pragma unroll
      for (int nb = 0; nb < NS; ++nb)
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          float& sv = s[nb][2 * e + x];
          sv = expf(sv - mnew);  // masked: exp(-inf) = 0
          sum += sv;
        }
    }
    sum = quad_sum(sum);
    l[e] = l[e] * alpha + sum;
    m[e] = mnew;
#pragma unroll
    for (int nb = 0; nb < NO; ++nb) {
      acc[nb][2 * e] *= alpha;
      acc[nb][2 * e + 1] *= alpha;
    }
#pragma unroll
    for (int nb = 0; nb < NS; ++nb) {
      Mma::hand_over(Pw, (gq + 8 * e) * LP + 8 * nb + 2 * tq, s[nb][2 * e]);
      Mma::hand_over(Pw, (gq + 8 * e) * LP + 8 * nb + 2 * tq + 1, s[nb][2 * e + 1]);
    }
  }
}

// Shared memory (bytes): the staged tiles (rows of D + kPad; the forward's V, the
// transposed copies), the strips, then the per-row intervals.
template <class Mma, int D, int BK>
constexpr size_t fwd_tc_smem_bytes() {
  constexpr int L = D + Mma::kPad;
  return sizeof(typename Mma::Smem) *
             (kTcRows * L + BK * L + Mma::kn_elems(BK, D) + kTcRows * Mma::strip_stride(BK)) +
         sizeof(int) * (2 * kTcRows + 4);
}
template <class Mma, int D, int BK>
constexpr size_t dq_tc_smem_bytes() {
  constexpr int L = D + Mma::kPad;
  return sizeof(typename Mma::Smem) *
             (2 * kTcRows * L + 2 * BK * L + Mma::t_elems(BK, D) + kTcRows * Mma::strip_stride(BK)) +
         sizeof(int) * (2 * kTcRows + 4);
}
template <class Mma, int D, int BQ>
constexpr size_t dkdv_tc_smem_bytes() {
  constexpr int L = D + Mma::kPad;
  return sizeof(typename Mma::Smem) *
             (2 * kTcRows * L + 2 * BQ * L + 2 * Mma::t_elems(BQ, D) + kTcRows * Mma::strip_stride(BQ)) +
         sizeof(float) * 2 * BQ + sizeof(int) * (2 * kTcRows + 4);
}

// Forward: one CTA per (64 query rows, query head); key tiles of BK rows.
template <class Mma, int D, int BK, class O>
__global__ void __launch_bounds__(kTcThreads)
    attention_forward_tc_kernel(O* __restrict__ out, float* __restrict__ lse,
                                const typename Mma::Operand* __restrict__ q,
                                const typename Mma::Operand* __restrict__ k,
                                const typename Mma::Operand* __restrict__ v, Geom g, int T, int Hq, int Hkv, int d,
                                float scale, bool merge) {
  using S = typename Mma::Smem;
  constexpr int BQ = kTcRows, L = D + Mma::kPad, LV = Mma::kn_stride(BK, D), LP = Mma::strip_stride(BK),
                NS = BK / 8, NO = D / 8;
  extern __shared__ uint4 tc_smem[];
  S* Qs = reinterpret_cast<S*>(tc_smem);
  S* Ks = Qs + BQ * L;
  S* Vs = Ks + BK * L;                // V, read only as the B of P V
  S* Ps = Vs + Mma::kn_elems(BK, D);  // P: a strip of 16 rows per warp (TF32; bf16: none)
  int* rlo = reinterpret_cast<int*>(Ps + BQ * LP);
  int* rhi = rlo + BQ;
  int* range = rhi + BQ;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3, r0 = warp * 16;
  const int h = blockIdx.y, kvh = h / (Hq / Hkv);
  const int i0 = g.q_begin + static_cast<int>(gridDim.x - 1 - blockIdx.x) * BQ;  // longest rows first
  tile_intervals<BQ, false>(g, i0, rlo, rhi, range);
  const int klo = range[0], khi = range[1], qfirst = range[2], qlast = range[3];
  if (qfirst > qlast) return;  // uniform over the CTA

  const long long ldq = static_cast<long long>(Hq) * d, ldk = static_cast<long long>(Hkv) * d;
  Mma::template stage<BQ, D, L, 0>(Qs, nullptr, q + static_cast<long long>(h) * d, ldq, i0, qfirst, qlast);

  // This lane's rows of every C fragment: r0 + gq + 8e (e = 0, 1; c_row), its columns
  // of n-block nb: 8 nb + 2 tq + x (x = 0, 1; c_col).
  int lo[2], hi[2];
  float m[2], l[2], acc[NO][4];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int r = r0 + gq + 8 * e, i = i0 + r;
    lo[e] = rlo[r];
    hi[e] = rhi[r];
    m[e] = -INFINITY;
    l[e] = 1.0f;
    const bool live = lo[e] <= hi[e];
    const O* orow = out + (static_cast<long long>(i) * Hq + h) * d;
    if (merge && live) m[e] = lse[static_cast<long long>(h) * T + i];
#pragma unroll
    for (int nb = 0; nb < NO; ++nb)
#pragma unroll
      for (int x = 0; x < 2; ++x) acc[nb][2 * e + x] = (merge && live) ? to_f32(orow[8 * nb + 2 * tq + x]) : 0.0f;
  }
  int wlo, whi;
  warp_interval(lo, hi, wlo, whi);
  S* Pw = Ps + r0 * LP;

  for (int k0 = klo; k0 <= khi; k0 += BK) {
    __syncthreads();  // the previous tile's readers of Ks, Vs are done
    Mma::template stage<BK, D, L, 0>(Ks, nullptr, k + static_cast<long long>(kvh) * d, ldk, k0, klo, khi);
    Mma::template stage_kn<BK, D, LV>(Vs, v + static_cast<long long>(kvh) * d, ldk, k0, klo, khi);
    __syncthreads();
    if (k0 > whi || k0 + (BK - 1) < wlo) continue;  // warp-uniform: no row of this warp sees the tile

    float s[NS][4];
#pragma unroll
    for (int nb = 0; nb < NS; ++nb) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
#pragma unroll(Mma::kUnrollQK)
    for (int kk = 0; kk < D / Mma::kK; ++kk) {
      uint32_t a[4];
      Mma::frag_a(a, Qs + r0 * L + Mma::kK * kk, L, lane);
#pragma unroll
      for (int nb = 0; nb < NS; ++nb) {
        uint32_t b[2];
        Mma::frag_b(b, Ks + 8 * nb * L + Mma::kK * kk, L, lane);
        Mma::mma(s[nb], a, b);
      }
    }

    online_softmax_tile<Mma, NS, NO, LP>(s, acc, m, l, lo, hi, k0, lane, scale, Pw, gq, tq);  // s becomes P (fp32)
    Mma::hand_over_sync();

#pragma unroll(Mma::kUnroll)
    for (int kk = 0; kk < BK / Mma::kK; ++kk) {
      uint32_t a[4];
      Mma::frag_a_handed(a, s, Pw, LP, kk, lane);  // P, rounded to the operand type
#pragma unroll
      for (int nb = 0; nb < NO; ++nb) {
        uint32_t b[2];
        Mma::frag_b_kn(b, Vs, LV, kk, nb, lane);
        Mma::mma(acc[nb], a, b);
      }
    }
    Mma::hand_over_sync();  // the strip is rewritten by the next tile
  }

#pragma unroll
  for (int e = 0; e < 2; ++e) {
    if (lo[e] > hi[e]) continue;
    const int i = i0 + r0 + gq + 8 * e;
    const float inv = 1.0f / l[e];
    O* orow = out + (static_cast<long long>(i) * Hq + h) * d;
#pragma unroll
    for (int nb = 0; nb < NO; ++nb)
#pragma unroll
      for (int x = 0; x < 2; ++x) orow[8 * nb + 2 * tq + x] = from_f32<O>(acc[nb][2 * e + x] * inv);
    if (tq == 0) lse[static_cast<long long>(h) * T + i] = m[e] + logf(l[e]);
  }
}

// dQ: one CTA per (64 query rows, query head); key tiles of BK rows.
template <class Mma, int D, int BK, class O>
__global__ void __launch_bounds__(kTcThreads)
    attention_backward_dq_tc_kernel(O* __restrict__ dq, const typename Mma::Operand* __restrict__ dout,
                                    const typename Mma::Operand* __restrict__ q,
                                    const typename Mma::Operand* __restrict__ k,
                                    const typename Mma::Operand* __restrict__ v, const float* __restrict__ lse,
                                    const float* __restrict__ dvec, Geom g, int T, int Hq, int Hkv, int d,
                                    float scale, bool accumulate) {
  using S = typename Mma::Smem;
  constexpr int BQ = kTcRows, L = D + Mma::kPad, LT = Mma::t_stride(BK), LP = Mma::strip_stride(BK), NS = BK / 8,
                NO = D / 8;
  extern __shared__ uint4 tc_smem[];
  S* Qs = reinterpret_cast<S*>(tc_smem);
  S* Os = Qs + BQ * L;  // dO
  S* Ks = Os + BQ * L;
  S* Vs = Ks + BK * L;
  S* Kt = Vs + BK * L;               // K^T: Kt[c * LT + j] (bf16; TF32: none)
  S* Ss = Kt + Mma::t_elems(BK, D);  // dS: a strip of 16 rows per warp (TF32; bf16: none)
  int* rlo = reinterpret_cast<int*>(Ss + BQ * LP);
  int* rhi = rlo + BQ;
  int* range = rhi + BQ;
  // K as the B of dS K (k along its rows).
  const S* Kn = Mma::kTransposed ? Kt : Ks;
  constexpr int LN = Mma::kTransposed ? LT : L;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, r0 = warp * 16, gq = lane >> 2, tq = lane & 3;
  const int h = blockIdx.y, kvh = h / (Hq / Hkv);
  const int i0 = g.q_begin + static_cast<int>(gridDim.x - 1 - blockIdx.x) * BQ;  // longest rows first
  tile_intervals<BQ, false>(g, i0, rlo, rhi, range);
  const int klo = range[0], khi = range[1], qfirst = range[2], qlast = range[3];
  if (qfirst > qlast) return;

  const long long ldq = static_cast<long long>(Hq) * d, ldk = static_cast<long long>(Hkv) * d;
  Mma::template stage<BQ, D, L, 0>(Qs, nullptr, q + static_cast<long long>(h) * d, ldq, i0, qfirst, qlast);
  Mma::template stage<BQ, D, L, 0>(Os, nullptr, dout + static_cast<long long>(h) * d, ldq, i0, qfirst, qlast);

  int lo[2], hi[2];
  float lse_r[2], dv_r[2], acc[NO][4];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int r = r0 + gq + 8 * e, i = i0 + r;
    lo[e] = rlo[r];
    hi[e] = rhi[r];
    const bool live = lo[e] <= hi[e];
    lse_r[e] = live ? lse[static_cast<long long>(h) * T + i] : 0.0f;
    dv_r[e] = live ? dvec[static_cast<long long>(h) * T + i] : 0.0f;
  }
#pragma unroll
  for (int nb = 0; nb < NO; ++nb) acc[nb][0] = acc[nb][1] = acc[nb][2] = acc[nb][3] = 0.0f;
  int wlo, whi;
  warp_interval(lo, hi, wlo, whi);
  S* Sw = Ss + r0 * LP;

  for (int k0 = klo; k0 <= khi; k0 += BK) {
    __syncthreads();
    Mma::template stage<BK, D, L, LT>(Ks, Kt, k + static_cast<long long>(kvh) * d, ldk, k0, klo, khi);
    Mma::template stage<BK, D, L, 0>(Vs, nullptr, v + static_cast<long long>(kvh) * d, ldk, k0, klo, khi);
    __syncthreads();
    if (k0 > whi || k0 + (BK - 1) < wlo) continue;  // warp-uniform

    float s[NS][4], dp[NS][4];
#pragma unroll
    for (int nb = 0; nb < NS; ++nb)
#pragma unroll
      for (int x = 0; x < 4; ++x) s[nb][x] = dp[nb][x] = 0.0f;
#pragma unroll(Mma::kUnroll)
    for (int kk = 0; kk < D / Mma::kK; ++kk) {
      uint32_t aq[4], ao[4];
      Mma::frag_a(aq, Qs + r0 * L + Mma::kK * kk, L, lane);
      Mma::frag_a(ao, Os + r0 * L + Mma::kK * kk, L, lane);
#pragma unroll
      for (int nb = 0; nb < NS; ++nb) {
        uint32_t b[2];
        Mma::frag_b(b, Ks + 8 * nb * L + Mma::kK * kk, L, lane);
        Mma::mma(s[nb], aq, b);
        Mma::frag_b(b, Vs + 8 * nb * L + Mma::kK * kk, L, lane);
        Mma::mma(dp[nb], ao, b);
      }
    }
    // dS (fp32) into s, handed over to dQ's product.
#pragma unroll
    for (int nb = 0; nb < NS; ++nb)
#pragma unroll
      for (int e = 0; e < 2; ++e)
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          const int col = 8 * nb + 2 * tq + x, j = k0 + col;
          const bool vis = j >= lo[e] && j <= hi[e];
          const float p = expf(s[nb][2 * e + x] * scale - lse_r[e]);
          s[nb][2 * e + x] = vis ? p * (dp[nb][2 * e + x] - dv_r[e]) * scale : 0.0f;
          Mma::hand_over(Sw, (gq + 8 * e) * LP + col, s[nb][2 * e + x]);
        }
    Mma::hand_over_sync();

#pragma unroll(Mma::kUnroll)
    for (int kk = 0; kk < BK / Mma::kK; ++kk) {
      uint32_t a[4];
      Mma::frag_a_handed(a, s, Sw, LP, kk, lane);  // dS, rounded to the operand type
#pragma unroll
      for (int nb = 0; nb < NO; ++nb) {
        uint32_t b[2];
        Mma::frag_b_kn(b, Kn, LN, kk, nb, lane);
        Mma::mma(acc[nb], a, b);
      }
    }
    Mma::hand_over_sync();  // the strip is rewritten by the next tile
  }

#pragma unroll
  for (int e = 0; e < 2; ++e) {
    if (lo[e] > hi[e]) continue;
    const int i = i0 + r0 + gq + 8 * e;
    O* row = dq + (static_cast<long long>(i) * Hq + h) * d;
#pragma unroll
    for (int nb = 0; nb < NO; ++nb) {
      const int c = 8 * nb + 2 * tq;
      row[c] = from_f32<O>(accumulate ? to_f32(row[c]) + acc[nb][2 * e] : acc[nb][2 * e]);
      row[c + 1] = from_f32<O>(accumulate ? to_f32(row[c + 1]) + acc[nb][2 * e + 1] : acc[nb][2 * e + 1]);
    }
  }
}

// dK/dV: one CTA per (64 key rows, kv head), over the group's query heads and query
// tiles of BQ rows.
template <class Mma, int D, int BQ, class O>
__global__ void __launch_bounds__(kTcThreads)
    attention_backward_dkdv_tc_kernel(O* __restrict__ dk, O* __restrict__ dv,
                                      const typename Mma::Operand* __restrict__ dout,
                                      const typename Mma::Operand* __restrict__ q,
                                      const typename Mma::Operand* __restrict__ k,
                                      const typename Mma::Operand* __restrict__ v, const float* __restrict__ lse,
                                      const float* __restrict__ dvec, Geom g, int T, int Hq, int Hkv, int d,
                                      float scale, bool accumulate) {
  using S = typename Mma::Smem;
  constexpr int BK = kTcRows, L = D + Mma::kPad, LT = Mma::t_stride(BQ), LP = Mma::strip_stride(BQ), NS = BQ / 8,
                NO = D / 8;
  extern __shared__ uint4 tc_smem[];
  S* Ks = reinterpret_cast<S*>(tc_smem);
  S* Vs = Ks + BK * L;
  S* Qs = Vs + BK * L;
  S* Os = Qs + BQ * L;               // dO
  S* Qt = Os + BQ * L;               // Q^T: Qt[c * LT + i] (bf16; TF32: none)
  S* Ot = Qt + Mma::t_elems(BQ, D);  // dO^T
  S* Ps = Ot + Mma::t_elems(BQ, D);  // P^T, then dS^T: a strip of 16 rows per warp (TF32)
  float* lse_s = reinterpret_cast<float*>(Ps + BK * LP);
  float* dv_s = lse_s + BQ;
  int* klo_s = reinterpret_cast<int*>(dv_s + BQ);
  int* khi_s = klo_s + BK;
  int* range = khi_s + BK;
  // Q and dO as the B of dS^T Q and P^T dO (k along their rows).
  const S* Qn = Mma::kTransposed ? Qt : Qs;
  const S* On = Mma::kTransposed ? Ot : Os;
  constexpr int LN = Mma::kTransposed ? LT : L;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, r0 = warp * 16, gq = lane >> 2, tq = lane & 3;
  const int kvh = blockIdx.y, group = Hq / Hkv;
  const int j0 = g.k_begin + static_cast<int>(blockIdx.x) * BK;
  tile_intervals<BK, true>(g, j0, klo_s, khi_s, range);
  const int qmin = range[0], qmax = range[1], kfirst = range[2], klast = range[3];
  if (kfirst > klast) return;

  const long long ldq = static_cast<long long>(Hq) * d, ldk = static_cast<long long>(Hkv) * d;
  Mma::template stage<BK, D, L, 0>(Ks, nullptr, k + static_cast<long long>(kvh) * d, ldk, j0, kfirst, klast);
  Mma::template stage<BK, D, L, 0>(Vs, nullptr, v + static_cast<long long>(kvh) * d, ldk, j0, kfirst, klast);

  int lo[2], hi[2];
  float dka[NO][4], dva[NO][4];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    lo[e] = klo_s[r0 + gq + 8 * e];
    hi[e] = khi_s[r0 + gq + 8 * e];
  }
#pragma unroll
  for (int nb = 0; nb < NO; ++nb)
#pragma unroll
    for (int x = 0; x < 4; ++x) dka[nb][x] = dva[nb][x] = 0.0f;
  int wlo, whi;
  warp_interval(lo, hi, wlo, whi);
  S* Pw = Ps + r0 * LP;

  for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
    for (int q0 = qmin; q0 <= qmax; q0 += BQ) {
      __syncthreads();  // the previous tile's readers of Qs, Os, Qt, Ot, lse_s, dv_s are done
      Mma::template stage<BQ, D, L, LT>(Qs, Qt, q + static_cast<long long>(h) * d, ldq, q0, qmin, qmax);
      Mma::template stage<BQ, D, L, LT>(Os, Ot, dout + static_cast<long long>(h) * d, ldq, q0, qmin, qmax);
      if (threadIdx.x < BQ) {
        const int i = q0 + static_cast<int>(threadIdx.x);
        const bool ok = i <= qmax;
        lse_s[threadIdx.x] = ok ? lse[static_cast<long long>(h) * T + i] : 0.0f;
        dv_s[threadIdx.x] = ok ? dvec[static_cast<long long>(h) * T + i] : 0.0f;
      }
      __syncthreads();
      if (q0 > whi || q0 + (BQ - 1) < wlo) continue;  // warp-uniform

      float st[NS][4], dpt[NS][4];
#pragma unroll
      for (int nb = 0; nb < NS; ++nb)
#pragma unroll
        for (int x = 0; x < 4; ++x) st[nb][x] = dpt[nb][x] = 0.0f;
#pragma unroll(Mma::kUnroll)
      for (int kk = 0; kk < D / Mma::kK; ++kk) {
        uint32_t ak[4], av[4];
        Mma::frag_a(ak, Ks + r0 * L + Mma::kK * kk, L, lane);
        Mma::frag_a(av, Vs + r0 * L + Mma::kK * kk, L, lane);
#pragma unroll
        for (int nb = 0; nb < NS; ++nb) {
          uint32_t b[2];
          Mma::frag_b(b, Qs + 8 * nb * L + Mma::kK * kk, L, lane);
          Mma::mma(st[nb], ak, b);
          Mma::frag_b(b, Os + 8 * nb * L + Mma::kK * kk, L, lane);
          Mma::mma(dpt[nb], av, b);
        }
      }
      // P^T into st (handed over to dV's product), dS^T into dpt (fp32).
#pragma unroll
      for (int nb = 0; nb < NS; ++nb)
#pragma unroll
        for (int e = 0; e < 2; ++e)
#pragma unroll
          for (int x = 0; x < 2; ++x) {
            const int col = 8 * nb + 2 * tq + x, i = q0 + col;
            const bool vis = i >= lo[e] && i <= hi[e];
            const float p = expf(st[nb][2 * e + x] * scale - lse_s[col]);
            st[nb][2 * e + x] = vis ? p : 0.0f;
            Mma::hand_over(Pw, (gq + 8 * e) * LP + col, st[nb][2 * e + x]);
            dpt[nb][2 * e + x] = vis ? p * (dpt[nb][2 * e + x] - dv_s[col]) * scale : 0.0f;
          }
      // dV += P^T dO, and dK += dS^T Q in the same sweep where P^T and dS^T both stay in
      // registers (bf16); TF32's strip holds one of them at a time, so dK's product
      // follows in a second sweep.
      Mma::hand_over_sync();
#pragma unroll(Mma::kUnroll)
      for (int kk = 0; kk < BQ / Mma::kK; ++kk) {
        uint32_t ap[4], as[4];
        Mma::frag_a_handed(ap, st, Pw, LP, kk, lane);  // P^T, rounded to the operand type
        if constexpr (Mma::kInRegisters) Mma::frag_a_handed(as, dpt, Pw, LP, kk, lane);  // dS^T, likewise
#pragma unroll
        for (int nb = 0; nb < NO; ++nb) {
          uint32_t b[2];
          Mma::frag_b_kn(b, On, LN, kk, nb, lane);
          Mma::mma(dva[nb], ap, b);
          if constexpr (Mma::kInRegisters) {
            Mma::frag_b_kn(b, Qn, LN, kk, nb, lane);
            Mma::mma(dka[nb], as, b);
          }
        }
      }
      if constexpr (!Mma::kInRegisters) {
        Mma::hand_over_sync();  // P^T read; the strip now takes dS^T
#pragma unroll
        for (int nb = 0; nb < NS; ++nb)
#pragma unroll
          for (int e = 0; e < 2; ++e)
#pragma unroll
            for (int x = 0; x < 2; ++x)
              Mma::hand_over(Pw, (gq + 8 * e) * LP + 8 * nb + 2 * tq + x, dpt[nb][2 * e + x]);
        Mma::hand_over_sync();
#pragma unroll(Mma::kUnroll)
        for (int kk = 0; kk < BQ / Mma::kK; ++kk) {
          uint32_t a[4];
          Mma::frag_a_handed(a, dpt, Pw, LP, kk, lane);  // dS^T, rounded to TF32
#pragma unroll
          for (int nb = 0; nb < NO; ++nb) {
            uint32_t b[2];
            Mma::frag_b_kn(b, Qn, LN, kk, nb, lane);
            Mma::mma(dka[nb], a, b);
          }
        }
      }
      Mma::hand_over_sync();  // the strip is rewritten by the next tile
    }
  }

#pragma unroll
  for (int e = 0; e < 2; ++e) {
    if (lo[e] > hi[e]) continue;
    const int j = j0 + r0 + gq + 8 * e;
    const long long row = (static_cast<long long>(j) * Hkv + kvh) * d;
#pragma unroll
    for (int nb = 0; nb < NO; ++nb)
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const int c = 8 * nb + 2 * tq + x;
        dk[row + c] = from_f32<O>(accumulate ? to_f32(dk[row + c]) + dka[nb][2 * e + x] : dka[nb][2 * e + x]);
        dv[row + c] = from_f32<O>(accumulate ? to_f32(dv[row + c]) + dva[nb][2 * e + x] : dva[nb][2 * e + x]);
      }
  }
}

// ---------------------------------------------------------------- host side

struct Shape {
  int T, Hq, Hkv, d;  // T: query rows (the row stride of lse)
  float scale;
};

Shape shape_of(const Tensor& q, const Tensor& k) {
  Shape s;
  s.T = static_cast<int>(q.dim(0));
  s.Hq = static_cast<int>(q.dim(1));
  s.Hkv = static_cast<int>(k.dim(1));
  s.d = static_cast<int>(q.dim(2));
  s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.d)));
  return s;
}

// Head-dim bucket: the compile-time D of the kernels.
int bucket(int d, const char* op) {
  if (d <= 32) return 32;
  if (d <= 64) return 64;
  if (d <= 128) return 128;
  if (d <= 256) return 256;
  throw std::invalid_argument(std::string(op) + ": head dim " + std::to_string(d) +
                              " > 256 is not supported by the CUDA backend");
}

unsigned tiles(long long rows, int tile) { return static_cast<unsigned>((rows + tile - 1) / tile); }

template <int D, int BQ, int BK, class E, class O>
void launch_forward(const char* op, O* out, float* lse, const E* q, const E* k, const E* v, const Geom& g,
                    const Shape& s, bool merge) {
  constexpr size_t smem = fwd_smem_bytes<D, BQ, BK>();
  constexpr auto kernel = attention_forward_kernel<D, BQ, BK, E, O>;
  allow_max_shared_memory<kernel>();
  const dim3 grid(tiles(static_cast<long long>(g.q_end) - g.q_begin, BQ), static_cast<unsigned>(s.Hq));
  kernel<<<grid, kThreads, smem, compute_stream()>>>(out, lse, q, k, v, g, s.T, s.Hq, s.Hkv, s.d, s.scale, merge);
  HDP_CUDA_CHECK_LAUNCH(op);
}

template <int D, int BQ, int BK, class E, class O>
void launch_backward(const char* op, O* dq, O* dk, O* dv, const E* dout, const E* q, const E* k, const E* v,
                     const float* lse, const float* dvec, const Geom& g, const Shape& s, bool accumulate) {
  {
    constexpr size_t smem = dkdv_smem_bytes<D, BQ, BK>();
    constexpr auto kernel = attention_backward_dkdv_kernel<D, BQ, BK, E, O>;
    allow_max_shared_memory<kernel>();
    const dim3 grid(tiles(static_cast<long long>(g.k_end) - g.k_begin, BK), static_cast<unsigned>(s.Hkv));
    kernel<<<grid, kThreads, smem, compute_stream()>>>(dk, dv, dout, q, k, v, lse, dvec, g, s.T, s.Hq, s.Hkv, s.d,
                                                       s.scale, accumulate);
    HDP_CUDA_CHECK_LAUNCH(op);
  }
  {
    constexpr size_t smem = dq_smem_bytes<D, BQ, BK>();
    constexpr auto kernel = attention_backward_dq_kernel<D, BQ, BK, E, O>;
    allow_max_shared_memory<kernel>();
    const dim3 grid(tiles(static_cast<long long>(g.q_end) - g.q_begin, BQ), static_cast<unsigned>(s.Hq));
    kernel<<<grid, kThreads, smem, compute_stream()>>>(dq, dout, q, k, v, lse, dvec, g, s.T, s.Hq, s.Hkv, s.d,
                                                       s.scale, accumulate);
    HDP_CUDA_CHECK_LAUNCH(op);
  }
}

template <class Mma, int D, int BK, class O>
void launch_forward_tc(const char* op, O* out, float* lse, const typename Mma::Operand* q,
                       const typename Mma::Operand* k, const typename Mma::Operand* v, const Geom& g, const Shape& s,
                       bool merge) {
  constexpr size_t smem = fwd_tc_smem_bytes<Mma, D, BK>();
  constexpr auto kernel = attention_forward_tc_kernel<Mma, D, BK, O>;
  allow_max_shared_memory<kernel>();
  const dim3 grid(tiles(static_cast<long long>(g.q_end) - g.q_begin, kTcRows), static_cast<unsigned>(s.Hq));
  kernel<<<grid, kTcThreads, smem, compute_stream()>>>(out, lse, q, k, v, g, s.T, s.Hq, s.Hkv, s.d, s.scale, merge);
  HDP_CUDA_CHECK_LAUNCH(op);
}

template <class Mma, int D, int BK, int BQ, class O>
void launch_backward_tc(const char* op, O* dq, O* dk, O* dv, const typename Mma::Operand* dout,
                        const typename Mma::Operand* q, const typename Mma::Operand* k, const typename Mma::Operand* v,
                        const float* lse, const float* dvec, const Geom& g, const Shape& s, bool accumulate) {
  {
    constexpr size_t smem = dkdv_tc_smem_bytes<Mma, D, BQ>();
    constexpr auto kernel = attention_backward_dkdv_tc_kernel<Mma, D, BQ, O>;
    allow_max_shared_memory<kernel>();
    const dim3 grid(tiles(static_cast<long long>(g.k_end) - g.k_begin, kTcRows), static_cast<unsigned>(s.Hkv));
    kernel<<<grid, kTcThreads, smem, compute_stream()>>>(dk, dv, dout, q, k, v, lse, dvec, g, s.T, s.Hq, s.Hkv, s.d,
                                                         s.scale, accumulate);
    HDP_CUDA_CHECK_LAUNCH(op);
  }
  {
    constexpr size_t smem = dq_tc_smem_bytes<Mma, D, BK>();
    constexpr auto kernel = attention_backward_dq_tc_kernel<Mma, D, BK, O>;
    allow_max_shared_memory<kernel>();
    const dim3 grid(tiles(static_cast<long long>(g.q_end) - g.q_begin, kTcRows), static_cast<unsigned>(s.Hq));
    kernel<<<grid, kTcThreads, smem, compute_stream()>>>(dq, dout, q, k, v, lse, dvec, g, s.T, s.Hq, s.Hkv, s.d,
                                                         s.scale, accumulate);
    HDP_CUDA_CHECK_LAUNCH(op);
  }
}

// Tensor-core paths for d = 64 and 128: bf16 operands always take the bf16 kernels
// (m16n8k16); fp32 operands take the TF32 kernels when TF32 is on (tf32()). Every
// other case runs the exact fp32 kernels (bf16 widened on staging).
bool tensor_core_head_dim(const Shape& s) { return s.d == 64 || s.d == 128; }

template <class E, class O>
void forward(const char* op, O* out, float* lse, const E* q, const E* k, const E* v, const Geom& g, const Shape& s,
             bool merge) {
  if constexpr (std::is_same_v<E, __nv_bfloat16>) {
    if (tensor_core_head_dim(s)) {
      if (s.d == 64)
        launch_forward_tc<Bf16Mma, 64, 64>(op, out, lse, q, k, v, g, s, merge);
      else
        launch_forward_tc<Bf16Mma, 128, 64>(op, out, lse, q, k, v, g, s, merge);
      return;
    }
  } else if (tf32() && tensor_core_head_dim(s)) {
    if (s.d == 64)
      launch_forward_tc<Tf32Mma, 64, 64>(op, out, lse, q, k, v, g, s, merge);
    else
      launch_forward_tc<Tf32Mma, 128, 32>(op, out, lse, q, k, v, g, s, merge);
    return;
  }
  switch (bucket(s.d, op)) {
    case 32: launch_forward<32, 64, 64>(op, out, lse, q, k, v, g, s, merge); break;
    case 64: launch_forward<64, 64, 64>(op, out, lse, q, k, v, g, s, merge); break;
    case 128: launch_forward<128, 64, 64>(op, out, lse, q, k, v, g, s, merge); break;
    default: launch_forward<256, 32, 32>(op, out, lse, q, k, v, g, s, merge); break;
  }
}

template <class E, class O>
void backward(const char* op, O* dq, O* dk, O* dv, const E* dout, const E* q, const E* k, const E* v,
              const float* lse, const float* dvec, const Geom& g, const Shape& s, bool accumulate) {
  // <D, dQ key tile, dK/dV query tile>
  if constexpr (std::is_same_v<E, __nv_bfloat16>) {
    if (tensor_core_head_dim(s)) {
      if (s.d == 64)
        launch_backward_tc<Bf16Mma, 64, 64, 64>(op, dq, dk, dv, dout, q, k, v, lse, dvec, g, s, accumulate);
      else
        launch_backward_tc<Bf16Mma, 128, 64, 32>(op, dq, dk, dv, dout, q, k, v, lse, dvec, g, s, accumulate);
      return;
    }
  } else if (tf32() && tensor_core_head_dim(s)) {
    if (s.d == 64)
      launch_backward_tc<Tf32Mma, 64, 64, 64>(op, dq, dk, dv, dout, q, k, v, lse, dvec, g, s, accumulate);
    else
      launch_backward_tc<Tf32Mma, 128, 32, 32>(op, dq, dk, dv, dout, q, k, v, lse, dvec, g, s, accumulate);
    return;
  }
  switch (bucket(s.d, op)) {
    case 32: launch_backward<32, 64, 64>(op, dq, dk, dv, dout, q, k, v, lse, dvec, g, s, accumulate); break;
    case 64: launch_backward<64, 64, 64>(op, dq, dk, dv, dout, q, k, v, lse, dvec, g, s, accumulate); break;
    case 128: launch_backward<128, 64, 64>(op, dq, dk, dv, dout, q, k, v, lse, dvec, g, s, accumulate); break;
    default: launch_backward<256, 32, 32>(op, dq, dk, dv, dout, q, k, v, lse, dvec, g, s, accumulate); break;
  }
}

// D = rowsum(dO * O) for every query row and head, in a persistent buffer.
float* rowdot(const char* op, const Tensor& dout, const Tensor& out, const Shape& s) {
  static DeviceScratch scratch;
  const size_t need = static_cast<size_t>(s.T) * static_cast<size_t>(s.Hq);
  float* dvec = static_cast<float*>(scratch.get(need * sizeof(float)));
  with_element_type(out.dtype, [&](auto e) {
    using E = decltype(e);
    attention_rowdot_kernel<<<blocks_for(static_cast<long long>(need), 256), 256, 0, compute_stream()>>>(
        dvec, elements<E>(dout), elements<E>(out), s.T, s.Hq, s.d);
  });
  HDP_CUDA_CHECK_LAUNCH(op);
  return dvec;
}

// The fp32 image of a bf16 result the block variant adds into (out, dq, dk, dv):
// the blocks of one call are merged or summed into it in fp32 and it is rounded
// back once when the call ends, exactly as the CPU twin does (a launch per block
// rounding into bf16 each time would round once per block). In a persistent
// buffer per role; widened from `t` on the device.
Tensor fp32_image(DeviceScratch& scratch, const Tensor& t) {
  Tensor image = t;
  image.data = static_cast<float*>(scratch.get(static_cast<size_t>(t.numel()) * sizeof(float)));
  image.dtype = DType::F32;
  cuda::copy(image, t);
  return image;
}

Geom document_geom(const IndexTensor& cu, int T, int64_t window) {
  Geom g{};
  g.cu = cu.data;
  g.ndocs = static_cast<int>(cu.numel() - 1);
  g.q_begin = 0;
  g.q_end = T;
  g.k_begin = 0;
  g.k_end = T;
  g.off = 0;
  g.window = band_of(window);
  return g;
}

// The visible part of a caller's block (as on the CPU); false if it has no visible
// pair. Query position qp sees some key iff k_first <= qp <= k_last + W - 1; key
// position kp is seen iff q_first - W + 1 <= kp <= q_last.
bool block_geom(const AttentionBlock& a, int64_t window, Geom& g) {
  const long long qlen = static_cast<long long>(a.q_end) - a.q_begin;
  const long long klen = static_cast<long long>(a.k_end) - a.k_begin;
  if (qlen <= 0 || klen <= 0) return false;
  const long long w = band_of(window), q_first = a.q_position, k_first = a.k_position;
  const long long q_skip = std::max<long long>(0, k_first - q_first);
  const long long q_keep = std::min(qlen, k_first + klen - 1 + w - q_first);
  if (q_skip >= q_keep) return false;
  const long long k_skip = std::max<long long>(0, q_first - w + 1 - k_first);
  const long long k_keep = std::min(klen, q_first + qlen - k_first);
  g = Geom{};
  g.cu = nullptr;
  g.ndocs = 0;
  g.q_begin = static_cast<int>(a.q_begin + q_skip);
  g.q_end = static_cast<int>(a.q_begin + q_keep);
  g.k_begin = static_cast<int>(a.k_begin + k_skip);
  g.k_end = static_cast<int>(a.k_begin + k_keep);
  g.off = (q_first - a.q_begin) - (k_first - a.k_begin);
  g.window = w;
  return true;
}

}  // namespace

void attention_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       const IndexTensor& cu_seqlens, int64_t window) {
  const Shape s = shape_of(q, k);
  if (s.T == 0 || s.Hq == 0 || s.d == 0 || cu_seqlens.numel() < 2) return;
  const Geom g = document_geom(cu_seqlens, s.T, window);
  with_element_type(q.dtype, [&](auto e) {
    using E = decltype(e);
    forward("attention_forward", elements<E>(out), lse.f32(), elements<E>(q), elements<E>(k), elements<E>(v), g, s,
            /*merge=*/false);
  });
}

void attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse, const IndexTensor& cu_seqlens,
                        int64_t window) {
  const char* op = "attention_backward";
  const Shape s = shape_of(q, k);
  if (s.T == 0 || s.Hq == 0 || s.d == 0 || cu_seqlens.numel() < 2) return;
  bucket(s.d, op);  // throws before anything is enqueued
  const float* dvec = rowdot(op, dout, out, s);
  const Geom g = document_geom(cu_seqlens, s.T, window);
  with_element_type(q.dtype, [&](auto e) {
    using E = decltype(e);
    backward(op, elements<E>(dq), elements<E>(dk), elements<E>(dv), elements<E>(dout), elements<E>(q),
             elements<E>(k), elements<E>(v), lse.f32(), dvec, g, s, /*accumulate=*/false);
  });
}

void attention_forward_blocks(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v,
                              std::span<const AttentionBlock> blocks, int64_t window) {
  const char* op = "attention_forward_blocks";
  const Shape s = shape_of(q, k);
  if (s.T == 0 || s.Hq == 0 || s.d == 0) return;
  static DeviceScratch out_image;
  const Tensor acc = out.dtype == DType::BF16 ? fp32_image(out_image, out) : out;  // merged into in fp32
  with_element_type(q.dtype, [&](auto e) {
    using E = decltype(e);
    for (const AttentionBlock& b : blocks) {
      Geom g;
      if (!block_geom(b, window, g)) continue;
      forward(op, acc.f32(), lse.f32(), elements<E>(q), elements<E>(k), elements<E>(v), g, s, /*merge=*/true);
    }
  });
  if (acc.data != out.data) cuda::copy(out, acc);  // one rounding per call
}

void attention_reset_rows(Tensor out, Tensor lse, int64_t begin, int64_t end) {
  if (end <= begin) return;
  const int64_t T = lse.dim(1), row = out.row_numel(), heads = lse.dim(0), n = end - begin;
  if (row > 0)  // zero is all-zero bytes in fp32 and bf16 alike
    HDP_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(out.raw()) + begin * row * out.element_size(), 0,
                                   static_cast<size_t>(n * row) * out.element_size(), compute_stream()));
  if (heads > 0) {
    attention_fill_lse_kernel<<<blocks_for(heads * n, 256), 256, 0, compute_stream()>>>(lse.f32(), T, begin, n,
                                                                                        heads);
    HDP_CUDA_CHECK_LAUNCH("attention_reset_rows");
  }
}

void attention_backward_blocks(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& out, const Tensor& lse,
                               std::span<const AttentionBlock> blocks, int64_t window) {
  const char* op = "attention_backward_blocks";
  const Shape s = shape_of(q, k);
  if (s.T == 0 || s.Hq == 0 || s.d == 0) return;
  bool any = false;
  for (const AttentionBlock& b : blocks) {
    Geom g;
    any = any || block_geom(b, window, g);
  }
  if (!any) return;
  bucket(s.d, op);
  const float* dvec = rowdot(op, dout, out, s);
  static DeviceScratch dq_image, dk_image, dv_image;
  const bool bf16 = dq.dtype == DType::BF16;  // gradients summed over the blocks in fp32
  const Tensor dq_acc = bf16 ? fp32_image(dq_image, dq) : dq, dk_acc = bf16 ? fp32_image(dk_image, dk) : dk,
               dv_acc = bf16 ? fp32_image(dv_image, dv) : dv;
  with_element_type(q.dtype, [&](auto e) {
    using E = decltype(e);
    for (const AttentionBlock& b : blocks) {
      Geom g;
      if (!block_geom(b, window, g)) continue;
      backward(op, dq_acc.f32(), dk_acc.f32(), dv_acc.f32(), elements<E>(dout), elements<E>(q), elements<E>(k),
               elements<E>(v), lse.f32(), dvec, g, s, /*accumulate=*/true);
    }
  });
  if (bf16) {  // one rounding per call
    cuda::copy(dq, dq_acc);
    cuda::copy(dk, dk_acc);
    cuda::copy(dv, dv_acc);
  }
}

}  // namespace hdp::cuda

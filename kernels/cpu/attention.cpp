// Causal attention over packed documents, FlashAttention-2 style, on the CPU.
//
// Layout trick: every score tile is computed transposed, S^T[key][query] = K Q^T,
// with the queries along the SIMD lanes. The on-line softmax then needs only
// vertical (lane-wise) max/sum over the key rows, never a horizontal reduction,
// and every product below is one tile_gemm call on operands that are either the
// caller's strided rows (read in place) or small packed copies:
//
//   forward, per (document, query head, query tile of kBq rows):
//     Qt = Q_i^T packed [d x kBq]                       (once per task)
//     for each key tile j at or before the diagonal:
//       S^T = K_j Qt                                    [kn x kBq]
//       mask the diagonal tile, running max m, P^T = exp(S^T*scale - m), l
//       O = O*alpha + P V_j                             [qn x d]
//     out = O / l, lse = m + log l
//
//   backward, per (document, kv head): dK, dV of that kv head and dQ of its group
//   of query heads are written by this task alone, so nothing races. For each
//   query head of the group, for each key tile j, for each query tile i that sees j:
//     S^T = K_j Q_i^T,  P^T = exp(S^T*scale - lse_i)
//     dV_j += P^T dO_i
//     dP^T = V_j dO_i^T
//     dS^T = P^T (dP^T - D_i) * scale,   D = rowsum(dO * O)
//     dQ_i += dS K_j,   dK_j += dS^T Q_i
//
// Fully masked tiles are skipped; only tiles crossing the diagonal are masked.
// Memory: the forward uses a few tiles per thread; the backward keeps per-thread
// copies of one document's Q, dO (row-major and transposed), K and the dQ, dK, dV
// accumulators: linear in the longest document. No T x T buffer anywhere.
// Every task runs sequentially in a fixed order, so results are bit-identical for
// any thread count.

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/tile_gemm.h"

namespace hdp::cpu {
namespace {

using namespace simd;

constexpr int64_t kBq = 64;  // queries per tile: the lane dimension of score tiles (a multiple of kW)
constexpr int64_t kBk = 64;  // keys per tile
constexpr int kQV = static_cast<int>(kBq / kW);
static_assert(kBq % kW == 0, "query tile must be whole vectors");

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

struct Doc {
  int64_t begin = 0;
  int64_t len = 0;
};

std::vector<Doc> documents(const IndexTensor& cu) {
  std::vector<Doc> docs;
  for (int64_t i = 0; i + 1 < cu.numel(); ++i) {
    const int64_t b = cu.data[i], e = cu.data[i + 1];
    if (e > b) docs.push_back({b, e - b});
  }
  return docs;
}

struct Dims {
  int64_t T, Hq, Hkv, d, group, dp, ldq, ldk;
  float scale;
};

Dims dims_of(const Tensor& q, const Tensor& k) {
  Dims s;
  s.T = q.dim(0);
  s.Hq = q.dim(1);
  s.Hkv = k.dim(1);
  s.d = q.dim(2);
  s.group = s.Hq / s.Hkv;
  s.dp = round_up(s.d, kW);
  s.ldq = s.Hq * s.d;
  s.ldk = s.Hkv * s.d;
  s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.d)));
  return s;
}

// Scratch for all threads of a parallel region: one uninitialised block (a
// std::vector would zero-fill it on every call), allocated once per call before
// the region so that an allocation failure is an ordinary exception rather than
// an exception escaping OpenMP. Thread i uses floats [i * stride, (i + 1) * stride).
struct ThreadScratch {
  int64_t stride;
  std::unique_ptr<float[]> block;
  ThreadScratch(int64_t per_thread, int threads)
      : stride((per_thread + 15) / 16 * 16), block(new float[stride * std::max(threads, 1)]) {}
  float* for_thread(int i) const { return block.get() + i * stride; }
};

// Carves consecutive slices (rounded to 16 floats) out of a thread's scratch; with
// a null base it only counts, to size the block.
class Carver {
 public:
  explicit Carver(float* base) : base_(base) {}
  float* take(int64_t n) {
    float* r = base_ ? base_ + used_ : nullptr;
    used_ += (std::max<int64_t>(n, 1) + 15) / 16 * 16;
    return r;
  }
  int64_t used() const { return used_; }

 private:
  float* base_;
  int64_t used_ = 0;
};

// Columns r < first_visible(jj) of row jj of a transposed score tile are above
// the causal diagonal: key k0 + jj is visible to query q0 + r iff k0 + jj <= q0 + r.
inline int64_t masked_columns(int64_t k0, int64_t jj, int64_t q0, int64_t qn) {
  return std::clamp<int64_t>(k0 + jj - q0, 0, qn);
}

// ---------------------------------------------------------------- forward

struct FwdTask {
  int32_t doc;
  int32_t head;
  int64_t q0;
};

struct FwdScratch {
  float *qt, *st, *o, *vp, *m, *l, *alpha;
  FwdScratch(const Dims& s, float* base) {
    Carver c(base);
    qt = c.take(s.d * kBq);
    st = c.take(kBk * kBq);
    o = c.take(kBq * s.dp);
    vp = c.take(kBk * s.dp);
    m = c.take(kBq);
    l = c.take(kBq);
    alpha = c.take(kBq);
    size = c.used();
  }
  int64_t size;
};

void forward_task(const Dims& s, const Doc& doc, int64_t h, int64_t q0, const float* q, const float* k,
                  const float* v, float* out, float* lse, FwdScratch& w) {
  const int64_t g = h / s.group, d = s.d, dp = s.dp;
  const int64_t qn = std::min(kBq, doc.len - q0);
  float* qt = w.qt;
  float* st = w.st;
  float* o = w.o;

  // Qt[c][r] = q[query q0 + r][head h][c], zero columns beyond qn.
  const float* qrow0 = q + ((doc.begin + q0) * s.Hq + h) * d;
  for (int64_t r = 0; r < qn; ++r) {
    const float* src = qrow0 + r * s.ldq;
    for (int64_t c = 0; c < d; ++c) qt[c * kBq + r] = src[c];
  }
  if (qn < kBq)
    for (int64_t c = 0; c < d; ++c) std::fill(qt + c * kBq + qn, qt + (c + 1) * kBq, 0.0f);
  std::fill(w.m, w.m + kBq, kNegInf);
  std::fill(w.l, w.l + kBq, 0.0f);
  std::fill(o, o + qn * dp, 0.0f);

  const vf vscale = set1(s.scale);
  const float* kbase = k + (doc.begin * s.Hkv + g) * d;
  const float* vbase = v + (doc.begin * s.Hkv + g) * d;
  const int64_t kv_end = q0 + qn;  // causal: no key after the tile's last query
  for (int64_t k0 = 0; k0 < kv_end; k0 += kBk) {
    const int64_t kn = std::min(kBk, kv_end - k0);
    tile_gemm(kn, kBq, d, kbase + k0 * s.ldk, s.ldk, 1, qt, kBq, st, kBq, false);
    if (k0 + kn - 1 > q0) {  // crosses the diagonal
      for (int64_t jj = 0; jj < kn; ++jj) {
        const int64_t nm = masked_columns(k0, jj, q0, qn);
        std::fill(st + jj * kBq, st + jj * kBq + nm, kNegInf);
      }
    }
    // Column max of the raw scores (scale > 0 commutes with max), new running max.
    vf mneg[kQV];
    for (int iv = 0; iv < kQV; ++iv) {
      vf mx = load(st + iv * kW);
      for (int64_t jj = 1; jj < kn; ++jj) mx = max(mx, load(st + jj * kBq + iv * kW));
      const vf mold = load(w.m + iv * kW);
      // Every query sees key 0 of its document in the first key tile, so m is finite from then on.
      const vf mnew = max(mold, mul(mx, vscale));
      store(w.alpha + iv * kW, exp_softmax(sub(mold, mnew)));
      store(w.m + iv * kW, mnew);
      mneg[iv] = sub(zero(), mnew);
    }
    // P^T = exp(S^T * scale - m) in place; column sums.
    vf sum[kQV];
    for (int iv = 0; iv < kQV; ++iv) sum[iv] = zero();
    for (int64_t jj = 0; jj < kn; ++jj) {
      float* row = st + jj * kBq;
      for (int iv = 0; iv < kQV; ++iv) {
        const vf p = exp_softmax(fmadd(load(row + iv * kW), vscale, mneg[iv]));
        store(row + iv * kW, p);
        sum[iv] = add(sum[iv], p);
      }
    }
    for (int iv = 0; iv < kQV; ++iv)
      store(w.l + iv * kW, fmadd(load(w.l + iv * kW), load(w.alpha + iv * kW), sum[iv]));
    // O = O * alpha + P V_j
    if (k0 > 0) {
      for (int64_t r = 0; r < qn; ++r) {
        const vf a = set1(w.alpha[r]);
        float* orow = o + r * dp;
        for (int64_t c = 0; c < dp; c += kW) store(orow + c, mul(load(orow + c), a));
      }
    }
    // V_j packed contiguous (zero-padded to dp): read in place, its rows (kv-head
    // stride apart) would conflict in L1 while every row block of O re-reads them.
    float* vp = w.vp;
    const float* vrows = vbase + k0 * s.ldk;
    for (int64_t jj = 0; jj < kn; ++jj) {
      std::memcpy(vp + jj * dp, vrows + jj * s.ldk, d * sizeof(float));
      std::fill(vp + jj * dp + d, vp + (jj + 1) * dp, 0.0f);
    }
    tile_gemm(qn, dp, kn, st, 1, kBq, vp, dp, o, dp, true);
  }

  float* orow0 = out + ((doc.begin + q0) * s.Hq + h) * d;
  float* lse_row = lse + h * s.T + doc.begin + q0;
  for (int64_t r = 0; r < qn; ++r) {
    const float inv = 1.0f / w.l[r];
    float* dst = orow0 + r * s.ldq;
    const float* src = o + r * dp;
    for (int64_t c = 0; c < d; ++c) dst[c] = src[c] * inv;
    lse_row[r] = w.m[r] + std::log(w.l[r]);
  }
}

// ---------------------------------------------------------------- backward

struct BwdScratch {
  // Columns of the transposed copies: the longest document rounded up to kBq, plus
  // one vector so that the row stride is not a multiple of 4 KiB (rows of a B
  // operand would otherwise share L1 sets and evict each other).
  int64_t lq;
  float *qt, *dot, *qp, *dop, *kp, *dqa, *dka, *dva, *dvec, *lsev, *st, *dpt;
  int64_t size;
  BwdScratch(const Dims& s, int64_t max_len, float* base) : lq(round_up(max_len, kBq) + kW) {
    Carver c(base);
    qt = c.take(s.d * lq);
    dot = c.take(s.d * lq);
    qp = c.take(lq * s.dp);
    dop = c.take(lq * s.dp);
    kp = c.take(max_len * s.dp);
    dqa = c.take(lq * s.dp);
    dka = c.take(max_len * s.dp);
    dva = c.take(max_len * s.dp);
    dvec = c.take(lq);
    lsev = c.take(lq);
    st = c.take(kBk * kBq);
    dpt = c.take(kBk * kBq);
    size = c.used();
  }
};

void backward_task(const Dims& s, const Doc& doc, int64_t g, const float* dout, const float* q, const float* k,
                   const float* v, const float* out, const float* lse, float* dq, float* dk, float* dv,
                   BwdScratch& w) {
  const int64_t L = doc.len, d = s.d, dp = s.dp, lq = w.lq;
  float *qt = w.qt, *dot = w.dot, *qp = w.qp, *dop = w.dop, *kp = w.kp;
  float *dqa = w.dqa, *dka = w.dka, *dva = w.dva, *dvec = w.dvec, *lsev = w.lsev;
  float *st = w.st, *dpt = w.dpt;

  std::fill(dka, dka + L * dp, 0.0f);
  std::fill(dva, dva + L * dp, 0.0f);
  const float* kbase = k + (doc.begin * s.Hkv + g) * d;
  const float* vbase = v + (doc.begin * s.Hkv + g) * d;
  for (int64_t j = 0; j < L; ++j) {
    std::memcpy(kp + j * dp, kbase + j * s.ldk, d * sizeof(float));
    std::fill(kp + j * dp + d, kp + (j + 1) * dp, 0.0f);
  }
  const vf vscale = set1(s.scale);

  for (int64_t h = g * s.group; h < (g + 1) * s.group; ++h) {
    // This head's Q and dO, row-major (padded to dp) and transposed (padded to lq), D and lse.
    const int64_t row0 = (doc.begin * s.Hq + h) * d;
    for (int64_t r = 0; r < L; ++r) {
      const float* qr = q + row0 + r * s.ldq;
      const float* dor = dout + row0 + r * s.ldq;
      const float* orr = out + row0 + r * s.ldq;
      float dsum = 0;
      for (int64_t c = 0; c < d; ++c) {
        qt[c * lq + r] = qr[c];
        dot[c * lq + r] = dor[c];
        dsum += dor[c] * orr[c];
      }
      std::memcpy(qp + r * dp, qr, d * sizeof(float));
      std::memcpy(dop + r * dp, dor, d * sizeof(float));
      std::fill(qp + r * dp + d, qp + (r + 1) * dp, 0.0f);
      std::fill(dop + r * dp + d, dop + (r + 1) * dp, 0.0f);
      dvec[r] = dsum;
      lsev[r] = lse[h * s.T + doc.begin + r];
    }
    for (int64_t c = 0; c < d; ++c) {
      std::fill(qt + c * lq + L, qt + (c + 1) * lq, 0.0f);
      std::fill(dot + c * lq + L, dot + (c + 1) * lq, 0.0f);
    }
    std::fill(dvec + L, dvec + lq, 0.0f);
    std::fill(lsev + L, lsev + lq, 0.0f);
    std::fill(dqa, dqa + L * dp, 0.0f);

    for (int64_t k0 = 0; k0 < L; k0 += kBk) {
      const int64_t kn = std::min(kBk, L - k0);
      const float* ka = kbase + k0 * s.ldk;
      const float* va = vbase + k0 * s.ldk;
      for (int64_t q0 = k0 / kBq * kBq; q0 < L; q0 += kBq) {
        const int64_t qn = std::min(kBq, L - q0);
        // P^T = exp(K_j Q_i^T * scale - lse)
        tile_gemm(kn, kBq, d, ka, s.ldk, 1, qt + q0, lq, st, kBq, false);
        vf nl[kQV], dd[kQV];
        for (int iv = 0; iv < kQV; ++iv) {
          nl[iv] = sub(zero(), load(lsev + q0 + iv * kW));
          dd[iv] = load(dvec + q0 + iv * kW);
        }
        for (int64_t jj = 0; jj < kn; ++jj) {
          float* row = st + jj * kBq;
          for (int iv = 0; iv < kQV; ++iv) store(row + iv * kW, exp_softmax(fmadd(load(row + iv * kW), vscale, nl[iv])));
        }
        if (k0 + kn - 1 > q0) {
          for (int64_t jj = 0; jj < kn; ++jj) std::fill(st + jj * kBq, st + jj * kBq + masked_columns(k0, jj, q0, qn), 0.0f);
        }
        // dV_j += P^T dO_i
        tile_gemm(kn, dp, qn, st, kBq, 1, dop + q0 * dp, dp, dva + k0 * dp, dp, true);
        // dP^T = V_j dO_i^T;  dS^T = P^T (dP^T - D) * scale
        tile_gemm(kn, kBq, d, va, s.ldk, 1, dot + q0, lq, dpt, kBq, false);
        for (int64_t jj = 0; jj < kn; ++jj) {
          const float* prow = st + jj * kBq;
          float* row = dpt + jj * kBq;
          for (int iv = 0; iv < kQV; ++iv)
            store(row + iv * kW, mul(mul(load(prow + iv * kW), sub(load(row + iv * kW), dd[iv])), vscale));
        }
        // dQ_i += dS K_j;  dK_j += dS^T Q_i
        tile_gemm(qn, dp, kn, dpt, 1, kBq, kp + k0 * dp, dp, dqa + q0 * dp, dp, true);
        tile_gemm(kn, dp, qn, dpt, kBq, 1, qp + q0 * dp, dp, dka + k0 * dp, dp, true);
      }
    }
    for (int64_t r = 0; r < L; ++r) std::memcpy(dq + row0 + r * s.ldq, dqa + r * dp, d * sizeof(float));
  }
  const int64_t kvrow0 = (doc.begin * s.Hkv + g) * d;
  for (int64_t j = 0; j < L; ++j) {
    std::memcpy(dk + kvrow0 + j * s.ldk, dka + j * dp, d * sizeof(float));
    std::memcpy(dv + kvrow0 + j * s.ldk, dva + j * dp, d * sizeof(float));
  }
}

}  // namespace

int attention_query_tile() { return static_cast<int>(kBq); }
int attention_key_tile() { return static_cast<int>(kBk); }

void attention_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       const IndexTensor& cu_seqlens) {
  const Dims s = dims_of(q, k);
  const std::vector<Doc> docs = documents(cu_seqlens);
  std::vector<FwdTask> tasks;
  for (size_t i = 0; i < docs.size(); ++i)
    for (int64_t h = 0; h < s.Hq; ++h)
      for (int64_t q0 = 0; q0 < docs[i].len; q0 += kBq) tasks.push_back({static_cast<int32_t>(i), static_cast<int32_t>(h), q0});
  // Most expensive first (the cost of a query tile grows with its position) for a
  // better dynamic schedule; the order does not affect results.
  std::stable_sort(tasks.begin(), tasks.end(), [](const FwdTask& a, const FwdTask& b) { return a.q0 > b.q0; });
  const int64_t n = static_cast<int64_t>(tasks.size());
  const int threads = n > 1 ? omp_get_max_threads() : 1;
  const ThreadScratch scratch(FwdScratch(s, nullptr).size, threads);
#pragma omp parallel num_threads(threads)
  {
    FwdScratch w(s, scratch.for_thread(omp_get_thread_num()));
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < n; ++t)
      forward_task(s, docs[tasks[t].doc], tasks[t].head, tasks[t].q0, q.data, k.data, v.data, out.data, lse.data, w);
  }
}

void attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse, const IndexTensor& cu_seqlens) {
  const Dims s = dims_of(q, k);
  std::vector<Doc> docs = documents(cu_seqlens);
  int64_t max_len = 0;
  for (const Doc& doc : docs) max_len = std::max(max_len, doc.len);
  struct BwdTask {
    int32_t doc;
    int32_t kv_head;
  };
  std::vector<BwdTask> tasks;
  for (size_t i = 0; i < docs.size(); ++i)
    for (int64_t g = 0; g < s.Hkv; ++g) tasks.push_back({static_cast<int32_t>(i), static_cast<int32_t>(g)});
  std::stable_sort(tasks.begin(), tasks.end(),
                   [&](const BwdTask& a, const BwdTask& b) { return docs[a.doc].len > docs[b.doc].len; });
  const int64_t n = static_cast<int64_t>(tasks.size());
  const int threads = static_cast<int>(std::min<int64_t>(std::max<int64_t>(n, 1), omp_get_max_threads()));
  const ThreadScratch scratch(BwdScratch(s, max_len, nullptr).size, threads);
#pragma omp parallel num_threads(threads)
  {
    BwdScratch w(s, max_len, scratch.for_thread(omp_get_thread_num()));
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < n; ++t)
      backward_task(s, docs[tasks[t].doc], tasks[t].kv_head, dout.data, q.data, k.data, v.data, out.data, lse.data,
                    dq.data, dk.data, dv.data, w);
  }
}

}  // namespace hdp::cpu

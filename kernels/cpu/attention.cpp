// Causal attention on the CPU, optionally within a sliding window, FlashAttention-2
// style (Dao 2023, "FlashAttention-2: Faster Attention with Better Parallelism and
// Work Partitioning"): over packed documents (cu_seqlens) and over arbitrary
// rectangles of query rows x key rows masked by true positions (AttentionBlock, for
// ring attention). Both share one core: a document is the block
// {rows [b, e) x rows [b, e), positions 0}.
//
// Layout trick: every score tile is computed transposed, S^T[key][query] = K Q^T,
// with the queries along the SIMD lanes. The on-line softmax then needs only
// vertical (lane-wise) max/sum over the key rows, never a horizontal reduction,
// and every product below is one tile_gemm call on operands that are either the
// caller's strided rows (read in place) or small packed copies.
//
// Masking: query row i of a block has position qp(i), key row j position kp(j),
// both rising by one per row; j is visible to i iff qp(i) - W < kp(j) <= qp(i), with
// W the sliding window (Mistral 7B: Jiang et al. 2023; semantics in kernels/ops.h)
// or unbounded without one, so each query row sees one contiguous run of keys (a
// diagonal band). Blocks are first trimmed to their visible part (the rectangle
// shrunk to the projections of its visible pairs on either axis; a block with none
// is dropped), so every query row left sees at least one key of its block and every
// key left is seen. Key tiles wholly outside a query tile's band (after its last
// query, or W or more positions before its first) are skipped, in the forward and
// the backward, so a document of length L costs O(L W) rather than O(L^2); only
// tiles crossing an edge of the band are masked.
//
//   forward, per (query segment tile of kBq rows, query head): a segment is a
//   maximal run of query rows covered by the same set of blocks, so every query
//   row belongs to exactly one task, which streams the key tiles of all blocks
//   covering it in the order the caller gave them:
//     Qt = Q_i^T packed [d x kBq]                       (once per task)
//     running state: m = -inf, l = 1, O = 0 (fresh), or
//                    m = lse, l = 1, O = out (merging into earlier calls)
//     for each covering block, each key tile j the tile can see:
//       S^T = K_j Qt                                    [kn x kBq]
//       mask if it crosses an edge of the band, running max m, P^T = exp(S^T*scale - m), l
//       O = O*alpha + P V_j                             [qn x d]
//     out = O / l, lse = m + log l
//   A row whose running max is still -inf keeps alpha = 1 and its P = 0, so a row
//   that sees no key is left bit-for-bit unchanged (out = O/1, lse = m + log 1).
//
//   backward, per (component, kv head): a component is a connected set of blocks
//   linked by shared query rows or shared key rows (union-find), so dK, dV of that
//   kv head for the component's key rows and dQ of its group of query heads for
//   its query rows are written by this task alone, and nothing races. The
//   component's query rows and key rows are gathered into compact local copies.
//   For each query head of the group, each block, each key tile j, each query tile
//   i of the block that sees j:
//     S^T = K_j Q_i^T,  P^T = exp(S^T*scale - lse_i)   (lse: the final one)
//     dV_j += P^T dO_i
//     dP^T = V_j dO_i^T
//     dS^T = P^T (dP^T - D_i) * scale,   D = rowsum(dO * O)
//     dQ_i += dS K_j,   dK_j += dS^T Q_i
//   then dq, dk, dv are overwritten (cu_seqlens) or added into (blocks).
//
// Memory: the forward uses a few tiles per thread; the backward keeps per-thread
// copies of one component's Q, dO (row-major and transposed), K and the dQ, dK, dV
// accumulators: linear in the largest component. No T x T buffer anywhere.
// Every task runs sequentially in a fixed order and writes rows no other task
// touches, so results are bit-identical for any thread count.

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
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

// The window inside this file: without one, a window no position difference
// reaches (positions are 32-bit, so nothing overflows), so that one code path serves
// both and full causal attention visits exactly the tiles and masks of before.
constexpr int64_t kUnbounded = int64_t{1} << 62;
int64_t band_of(int64_t window) { return window == kNoWindow ? kUnbounded : std::min(window, kUnbounded); }

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// A block trimmed to its visible part (see the top of the file), in 64-bit.
struct Blk {
  int64_t q_begin, q_end, k_begin, k_end, q_pos, k_pos;
  int64_t window;  // key position kp is visible to query position qp iff qp - window < kp <= qp
  int64_t qlen() const { return q_end - q_begin; }
  int64_t klen() const { return k_end - k_begin; }
  // Keys [keys_begin(i0), keys_end(i0, qn)) of this block (offsets from k_begin) are
  // those visible to some query of rows [i0, i0 + qn) (all inside the block): none
  // after the last query's position, none `window` or more before the first query's.
  int64_t keys_begin(int64_t i0) const { return std::max<int64_t>(0, q_pos + (i0 - q_begin) - window + 1 - k_pos); }
  int64_t keys_end(int64_t i0, int64_t qn) const { return std::min(klen(), q_pos + (i0 - q_begin) + qn - k_pos); }
  // Query rows (offsets from q_begin) below this end are the only ones that can see a
  // key of [k0, k0 + kn): later ones are `window` or more after its last key.
  int64_t queries_end(int64_t k0, int64_t kn) const { return std::min(qlen(), k_pos + k0 + kn - 1 + window - q_pos); }
};

// Visible part of a caller's block; false if it has no visible pair. Query position
// qp sees some key iff [qp - W + 1, qp] meets the keys' positions [k_first, k_last],
// i.e. k_first <= qp <= k_last + W - 1; key position kp is seen iff
// q_first - W + 1 <= kp <= q_last. Both from the caller's rectangle, and a query
// left sees at least one key left.
bool trim(const AttentionBlock& a, int64_t window, Blk& b) {
  const int64_t qlen = int64_t{a.q_end} - a.q_begin, klen = int64_t{a.k_end} - a.k_begin;
  if (qlen <= 0 || klen <= 0) return false;
  const int64_t q_first = a.q_position, k_first = a.k_position;
  const int64_t q_skip = std::max<int64_t>(0, k_first - q_first);
  const int64_t q_keep = std::min(qlen, k_first + klen - 1 + window - q_first);
  if (q_skip >= q_keep) return false;
  const int64_t k_skip = std::max<int64_t>(0, q_first - window + 1 - k_first);
  const int64_t k_keep = std::min(klen, q_first + qlen - k_first);
  b.q_begin = a.q_begin + q_skip;
  b.q_end = a.q_begin + q_keep;
  b.q_pos = q_first + q_skip;
  b.k_begin = a.k_begin + k_skip;
  b.k_end = a.k_begin + k_keep;
  b.k_pos = k_first + k_skip;
  b.window = window;
  return true;
}

// One block per non-empty document: rows [b, e) against themselves, positions 0.
std::vector<Blk> document_blocks(const IndexTensor& cu, int64_t window) {
  std::vector<Blk> blocks;
  for (int64_t i = 0; i + 1 < cu.numel(); ++i) {
    const int64_t b = cu.data[i], e = cu.data[i + 1];
    if (e > b) blocks.push_back({b, e, b, e, 0, 0, window});
  }
  return blocks;
}

std::vector<Blk> visible_blocks(std::span<const AttentionBlock> blocks, int64_t window) {
  std::vector<Blk> out;
  out.reserve(blocks.size());
  for (const AttentionBlock& a : blocks) {
    Blk b;
    if (trim(a, window, b)) out.push_back(b);
  }
  return out;
}

// Visible (query row, key row) pairs of a trimmed block, for scheduling: query row
// r (position q_pos + r) sees clamp(q_pos + r - k_pos + 1, 0, klen) keys causally,
// of which clamp(q_pos + r - window - k_pos + 1, 0, klen) are out of its window.
double visible_pairs(const Blk& b) {
  const double m = static_cast<double>(b.klen()), n = static_cast<double>(b.qlen());
  // sum over integers t < x of clamp(t, 0, m)
  auto prefix = [m](double x) {
    if (x <= 0) return 0.0;
    if (x <= m + 1) return x * (x - 1) / 2;
    return m * (m + 1) / 2 + (x - m - 1) * m;
  };
  auto pairs_back = [&](int64_t shift) {  // pairs with kp <= qp - shift
    const double a = static_cast<double>(b.q_pos - shift - b.k_pos + 1);
    return prefix(a + n) - prefix(a);
  };
  return pairs_back(0) - pairs_back(b.window);
}

struct Dims {
  int64_t T, Hq, Hkv, d, group, dp, ldq, ldk;  // T: query rows (the row stride of lse)
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

// Writes `value` over the hidden entries of a transposed score tile: row jj is the
// key at position kpos0 + jj, column r < qn the query at position qpos0 + r, and the
// key is visible to the query iff qpos0 + r - window < kpos0 + jj <= qpos0 + r, so
// row jj keeps columns [rel, rel + window) with rel = kpos0 + jj - qpos0. A tile
// inside the band is left alone.
inline void mask_tile(float* st, int64_t kpos0, int64_t kn, int64_t qpos0, int64_t qn, int64_t window, float value) {
  const bool causal_edge = kpos0 + kn - 1 > qpos0;            // its last key is after its first query
  const bool window_edge = kpos0 + window <= qpos0 + qn - 1;  // its first key is out of its last query's window
  if (!causal_edge && !window_edge) return;
  for (int64_t jj = 0; jj < kn; ++jj) {
    const int64_t rel = kpos0 + jj - qpos0;
    float* row = st + jj * kBq;
    if (causal_edge) std::fill(row, row + std::clamp<int64_t>(rel, 0, qn), value);
    if (window_edge) std::fill(row + std::clamp<int64_t>(rel + window, 0, qn), row + qn, value);
  }
}

// ---------------------------------------------------------------- forward

// Query rows [q_begin, q_end) partitioned into segments, each covered by one set
// of blocks (ids[off[e] .. off[e + 1]), in the caller's order), and the tasks.
struct FwdPlan {
  struct Task {
    int64_t i0, qn, cost;
    int32_t seg, head;
  };
  std::vector<int32_t> off, ids;
  std::vector<Task> tasks;
};

FwdPlan plan_forward(const std::vector<Blk>& blocks, int64_t Hq) {
  FwdPlan p;
  std::vector<int64_t> bd;
  bd.reserve(2 * blocks.size());
  for (const Blk& b : blocks) {
    bd.push_back(b.q_begin);
    bd.push_back(b.q_end);
  }
  std::sort(bd.begin(), bd.end());
  bd.erase(std::unique(bd.begin(), bd.end()), bd.end());
  const int64_t nseg = std::max<int64_t>(static_cast<int64_t>(bd.size()) - 1, 0);
  auto seg_range = [&](const Blk& b) {
    const int64_t e0 = std::lower_bound(bd.begin(), bd.end(), b.q_begin) - bd.begin();
    const int64_t e1 = std::lower_bound(bd.begin(), bd.end(), b.q_end) - bd.begin();
    return std::pair<int64_t, int64_t>(e0, e1);
  };
  p.off.assign(nseg + 1, 0);
  for (const Blk& b : blocks) {
    const auto [e0, e1] = seg_range(b);
    for (int64_t e = e0; e < e1; ++e) ++p.off[e + 1];
  }
  for (int64_t e = 0; e < nseg; ++e) p.off[e + 1] += p.off[e];
  p.ids.resize(p.off[nseg]);
  std::vector<int32_t> fill(p.off);
  for (size_t i = 0; i < blocks.size(); ++i) {
    const auto [e0, e1] = seg_range(blocks[i]);
    for (int64_t e = e0; e < e1; ++e) p.ids[fill[e]++] = static_cast<int32_t>(i);
  }
  for (int64_t e = 0; e < nseg; ++e) {
    if (p.off[e] == p.off[e + 1]) continue;
    for (int64_t i0 = bd[e]; i0 < bd[e + 1]; i0 += kBq) {
      const int64_t qn = std::min(kBq, bd[e + 1] - i0);
      int64_t cost = 0;
      for (int32_t t = p.off[e]; t < p.off[e + 1]; ++t) {
        const Blk& b = blocks[p.ids[t]];
        cost += b.keys_end(i0, qn) - b.keys_begin(i0);
      }
      for (int64_t h = 0; h < Hq; ++h)
        p.tasks.push_back({i0, qn, cost, static_cast<int32_t>(e), static_cast<int32_t>(h)});
    }
  }
  // Most expensive first (the cost of a query tile grows with the keys it sees) for
  // a better dynamic schedule; the order does not affect results.
  std::stable_sort(p.tasks.begin(), p.tasks.end(),
                   [](const FwdPlan::Task& a, const FwdPlan::Task& b) { return a.cost > b.cost; });
  return p;
}

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

// Query rows [i0, i0 + qn) of head h against the key tiles of blocks ids[0, nb).
// merge: start from the stored (out, lse) of the rows; otherwise from nothing
// (out and lse are then only written).
void forward_task(const Dims& s, int64_t i0, int64_t qn, int64_t h, const Blk* blocks, const int32_t* ids,
                  int64_t nb, bool merge, const float* q, const float* k, const float* v, float* out, float* lse,
                  FwdScratch& w) {
  const int64_t g = h / s.group, d = s.d, dp = s.dp;
  float* qt = w.qt;
  float* st = w.st;
  float* o = w.o;
  float* orow0 = out + (i0 * s.Hq + h) * d;
  float* lse_row = lse + h * s.T + i0;

  // Qt[c][r] = q[query i0 + r][head h][c], zero columns beyond qn.
  const float* qrow0 = q + (i0 * s.Hq + h) * d;
  for (int64_t r = 0; r < qn; ++r) {
    const float* src = qrow0 + r * s.ldq;
    for (int64_t c = 0; c < d; ++c) qt[c * kBq + r] = src[c];
  }
  if (qn < kBq)
    for (int64_t c = 0; c < d; ++c) std::fill(qt + c * kBq + qn, qt + (c + 1) * kBq, 0.0f);
  // Running state. l = 1 in both cases: with m = -inf the first visible key sets
  // l = 1 * 0 + sum, and a row that never sees a key keeps O / 1 and m + log 1.
  std::fill(w.m, w.m + kBq, kNegInf);
  std::fill(w.l, w.l + kBq, 1.0f);
  if (merge) {
    for (int64_t r = 0; r < qn; ++r) {
      std::memcpy(o + r * dp, orow0 + r * s.ldq, d * sizeof(float));
      std::fill(o + r * dp + d, o + (r + 1) * dp, 0.0f);
      w.m[r] = lse_row[r];
    }
  } else {
    std::fill(o, o + qn * dp, 0.0f);
  }
  bool o_live = merge;  // O holds something that must be rescaled by alpha

  const vf vscale = set1(s.scale);
  const vf vlowest = set1(std::numeric_limits<float>::lowest());
  for (int64_t t = 0; t < nb; ++t) {
    const Blk& b = blocks[ids[t]];
    const int64_t qpos0 = b.q_pos + (i0 - b.q_begin);
    const int64_t kb = b.keys_begin(i0), ke = b.keys_end(i0, qn);  // the keys the tile's band covers
    const float* kbase = k + (b.k_begin * s.Hkv + g) * d;
    const float* vbase = v + (b.k_begin * s.Hkv + g) * d;
    for (int64_t k0 = kb; k0 < ke; k0 += kBk) {
      const int64_t kn = std::min(kBk, ke - k0);
      const int64_t kpos0 = b.k_pos + k0;
      tile_gemm(kn, kBq, d, kbase + k0 * s.ldk, s.ldk, 1, qt, kBq, st, kBq, false);
      mask_tile(st, kpos0, kn, qpos0, qn, b.window, kNegInf);
      // Column max of the raw scores (scale > 0 commutes with max), new running max.
      // A column that has seen no key (m still -inf) keeps alpha = 1 and gets P = 0.
      vf mneg[kQV];
      for (int iv = 0; iv < kQV; ++iv) {
        vf mx = load(st + iv * kW);
        for (int64_t jj = 1; jj < kn; ++jj) mx = max(mx, load(st + jj * kBq + iv * kW));
        const vf mold = load(w.m + iv * kW);
        const vf mnew = max(mold, mul(mx, vscale));
        const vmask none = lt(mnew, vlowest);
        store(w.alpha + iv * kW, select(none, set1(1.0f), exp_softmax(sub(mold, mnew))));
        store(w.m + iv * kW, mnew);
        mneg[iv] = select(none, zero(), sub(zero(), mnew));
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
      if (o_live) {
        for (int64_t r = 0; r < qn; ++r) {
          const vf a = set1(w.alpha[r]);
          float* orow = o + r * dp;
          for (int64_t c = 0; c < dp; c += kW) store(orow + c, mul(load(orow + c), a));
        }
      }
      o_live = true;
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
  }
  if (!o_live) return;  // saw nothing (cannot happen for trimmed blocks): leave the rows alone

  for (int64_t r = 0; r < qn; ++r) {
    const float inv = 1.0f / w.l[r];
    float* dst = orow0 + r * s.ldq;
    const float* src = o + r * dp;
    for (int64_t c = 0; c < d; ++c) dst[c] = src[c] * inv;
    lse_row[r] = w.m[r] + std::log(w.l[r]);
  }
}

void forward_core(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                  const std::vector<Blk>& blocks, bool merge) {
  const Dims s = dims_of(q, k);
  const FwdPlan plan = plan_forward(blocks, s.Hq);
  const int64_t n = static_cast<int64_t>(plan.tasks.size());
  if (n == 0) return;
  const int threads = n > 1 ? omp_get_max_threads() : 1;
  const ThreadScratch scratch(FwdScratch(s, nullptr).size, threads);
#pragma omp parallel num_threads(threads)
  {
    FwdScratch w(s, scratch.for_thread(omp_get_thread_num()));
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < n; ++t) {
      const FwdPlan::Task& task = plan.tasks[t];
      const int32_t* ids = plan.ids.data() + plan.off[task.seg];
      const int64_t nb = plan.off[task.seg + 1] - plan.off[task.seg];
      forward_task(s, task.i0, task.qn, task.head, blocks.data(), ids, nb, merge, q.data, k.data, v.data, out.data,
                   lse.data, w);
    }
  }
}

// ---------------------------------------------------------------- backward

// Rows [begin, end) of a tensor held at local rows [local, local + end - begin).
struct RowRun {
  int64_t begin, end, local;
};

// A connected set of blocks (shared query rows or shared key rows), with the
// compact local row layout of its query rows and key rows.
struct Component {
  std::vector<int32_t> ids;         // blocks, in the caller's order
  std::vector<int64_t> qloc, kloc;  // per id: local row of the block's first query / key row
  std::vector<RowRun> qruns, kruns;
  int64_t Lq = 0, Lk = 0;
  int64_t lq = 0;  // columns of the transposed local copies (>= every query tile's reach)
  double cost = 0;
};

struct UnionFind {
  std::vector<int32_t> parent;
  explicit UnionFind(size_t n) : parent(n) { std::iota(parent.begin(), parent.end(), 0); }
  int32_t find(int32_t x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  }
  void unite(int32_t a, int32_t b) {
    a = find(a);
    b = find(b);
    if (a != b) parent[std::max(a, b)] = std::min(a, b);
  }
};

// Sorted by begin, intervals overlapping the union of those before them form one run.
template <class Begin, class End>
void unite_overlapping(const std::vector<Blk>& blocks, UnionFind& uf, Begin begin, End end) {
  std::vector<int32_t> order(blocks.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return begin(blocks[a]) < begin(blocks[b]); });
  int64_t run_end = std::numeric_limits<int64_t>::min();
  int32_t rep = -1;
  for (int32_t i : order) {
    if (rep >= 0 && begin(blocks[i]) < run_end) {
      uf.unite(rep, i);
      run_end = std::max(run_end, end(blocks[i]));
    } else {
      rep = i;
      run_end = end(blocks[i]);
    }
  }
}

// Merged runs of the intervals [begin(b), end(b)) of the given blocks, with local
// offsets, and each block's local start.
template <class Begin, class End>
int64_t local_layout(const std::vector<Blk>& blocks, const std::vector<int32_t>& ids, Begin begin, End end,
                     std::vector<RowRun>& runs, std::vector<int64_t>& loc) {
  std::vector<int32_t> order(ids.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return begin(blocks[ids[a]]) < begin(blocks[ids[b]]); });
  runs.clear();
  loc.assign(ids.size(), 0);
  int64_t total = 0;
  for (int32_t o : order) {
    const Blk& b = blocks[ids[o]];
    if (runs.empty() || begin(b) > runs.back().end) {
      if (!runs.empty()) total += runs.back().end - runs.back().begin;
      runs.push_back({begin(b), end(b), total});
    } else {
      runs.back().end = std::max(runs.back().end, end(b));
    }
    loc[o] = runs.back().local + (begin(b) - runs.back().begin);
  }
  if (!runs.empty()) total += runs.back().end - runs.back().begin;
  return total;
}

std::vector<Component> plan_backward(const std::vector<Blk>& blocks) {
  UnionFind uf(blocks.size());
  unite_overlapping(blocks, uf, [](const Blk& b) { return b.q_begin; }, [](const Blk& b) { return b.q_end; });
  unite_overlapping(blocks, uf, [](const Blk& b) { return b.k_begin; }, [](const Blk& b) { return b.k_end; });
  std::vector<Component> comps;
  std::vector<int32_t> comp_of(blocks.size(), -1);
  for (size_t i = 0; i < blocks.size(); ++i) {  // components in order of their first block
    const int32_t root = uf.find(static_cast<int32_t>(i));
    if (comp_of[root] < 0) {
      comp_of[root] = static_cast<int32_t>(comps.size());
      comps.emplace_back();
    }
    comps[comp_of[root]].ids.push_back(static_cast<int32_t>(i));
  }
  for (Component& c : comps) {
    c.Lq = local_layout(blocks, c.ids, [](const Blk& b) { return b.q_begin; }, [](const Blk& b) { return b.q_end; },
                        c.qruns, c.qloc);
    c.Lk = local_layout(blocks, c.ids, [](const Blk& b) { return b.k_begin; }, [](const Blk& b) { return b.k_end; },
                        c.kruns, c.kloc);
    // Query tiles start at multiples of kBq from a block's first row and read kBq
    // columns; one extra vector keeps the row stride off multiples of 4 KiB (rows of
    // a B operand would otherwise share L1 sets and evict each other).
    int64_t reach = 0;
    for (size_t t = 0; t < c.ids.size(); ++t) {
      const Blk& b = blocks[c.ids[t]];
      reach = std::max(reach, c.qloc[t] + round_up(b.qlen(), kBq));
      c.cost += visible_pairs(b);
    }
    c.lq = round_up(reach, kBq) + kW;
  }
  return comps;
}

struct BwdScratch {
  float *qt, *dot, *qp, *dop, *kp, *dqa, *dka, *dva, *dvec, *lsev, *st, *dpt;
  int64_t size;
  BwdScratch(const Dims& s, int64_t lq, int64_t lk, float* base) {
    Carver c(base);
    qt = c.take(s.d * lq);
    dot = c.take(s.d * lq);
    qp = c.take(lq * s.dp);
    dop = c.take(lq * s.dp);
    kp = c.take(lk * s.dp);
    dqa = c.take(lq * s.dp);
    dka = c.take(lk * s.dp);
    dva = c.take(lk * s.dp);
    dvec = c.take(lq);
    lsev = c.take(lq);
    st = c.take(kBk * kBq);
    dpt = c.take(kBk * kBq);
    size = c.used();
  }
};

// dst (+)= src for d floats.
inline void put_row(float* dst, const float* src, int64_t d, bool accumulate) {
  if (accumulate)
    for (int64_t c = 0; c < d; ++c) dst[c] += src[c];
  else
    std::memcpy(dst, src, d * sizeof(float));
}

void backward_task(const Dims& s, const Component& comp, const std::vector<Blk>& blocks, int64_t g, bool accumulate,
                   const float* dout, const float* q, const float* k, const float* v, const float* out,
                   const float* lse, float* dq, float* dk, float* dv, float* base) {
  const int64_t d = s.d, dp = s.dp, lq = comp.lq, Lq = comp.Lq, Lk = comp.Lk;
  BwdScratch w(s, lq, Lk, base);
  float *qt = w.qt, *dot = w.dot, *qp = w.qp, *dop = w.dop, *kp = w.kp;
  float *dqa = w.dqa, *dka = w.dka, *dva = w.dva, *dvec = w.dvec, *lsev = w.lsev;
  float *st = w.st, *dpt = w.dpt;

  std::fill(dka, dka + Lk * dp, 0.0f);
  std::fill(dva, dva + Lk * dp, 0.0f);
  for (const RowRun& run : comp.kruns) {
    const float* kr = k + (run.begin * s.Hkv + g) * d;
    for (int64_t j = 0; j < run.end - run.begin; ++j) {
      float* dst = kp + (run.local + j) * dp;
      std::memcpy(dst, kr + j * s.ldk, d * sizeof(float));
      std::fill(dst + d, dst + dp, 0.0f);
    }
  }
  const vf vscale = set1(s.scale);

  for (int64_t h = g * s.group; h < (g + 1) * s.group; ++h) {
    // This head's Q and dO, row-major (padded to dp) and transposed (padded to lq), D and lse.
    for (const RowRun& run : comp.qruns) {
      const int64_t row0 = (run.begin * s.Hq + h) * d;
      for (int64_t i = 0; i < run.end - run.begin; ++i) {
        const int64_t r = run.local + i;
        const float* qr = q + row0 + i * s.ldq;
        const float* dor = dout + row0 + i * s.ldq;
        const float* orr = out + row0 + i * s.ldq;
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
        lsev[r] = lse[h * s.T + run.begin + i];
      }
    }
    for (int64_t c = 0; c < d; ++c) {
      std::fill(qt + c * lq + Lq, qt + (c + 1) * lq, 0.0f);
      std::fill(dot + c * lq + Lq, dot + (c + 1) * lq, 0.0f);
    }
    std::fill(dvec + Lq, dvec + lq, 0.0f);
    std::fill(lsev + Lq, lsev + lq, 0.0f);
    std::fill(dqa, dqa + Lq * dp, 0.0f);

    for (size_t bi = 0; bi < comp.ids.size(); ++bi) {
      const Blk& b = blocks[comp.ids[bi]];
      const int64_t qlen = b.qlen(), nk = b.klen(), ql = comp.qloc[bi], kl = comp.kloc[bi];
      const float* kbase = k + (b.k_begin * s.Hkv + g) * d;
      const float* vbase = v + (b.k_begin * s.Hkv + g) * d;
      for (int64_t k0 = 0; k0 < nk; k0 += kBk) {
        const int64_t kn = std::min(kBk, nk - k0);
        const int64_t kpos0 = b.k_pos + k0;
        const float* ka = kbase + k0 * s.ldk;
        const float* va = vbase + k0 * s.ldk;
        // Query tiles (from the block's first row) in the key tile's band: from the
        // one whose last query sees key k0 to the last query within the window of the
        // tile's last key.
        const int64_t first_q = std::max<int64_t>(0, kpos0 - b.q_pos) / kBq * kBq;
        const int64_t q_stop = b.queries_end(k0, kn);
        for (int64_t q0 = first_q; q0 < q_stop; q0 += kBq) {
          const int64_t qn = std::min(kBq, qlen - q0);
          const int64_t qpos0 = b.q_pos + q0;
          const int64_t c0 = ql + q0;  // local column of the tile's first query
          // P^T = exp(K_j Q_i^T * scale - lse)
          tile_gemm(kn, kBq, d, ka, s.ldk, 1, qt + c0, lq, st, kBq, false);
          vf nl[kQV], dd[kQV];
          for (int iv = 0; iv < kQV; ++iv) {
            nl[iv] = sub(zero(), load(lsev + c0 + iv * kW));
            dd[iv] = load(dvec + c0 + iv * kW);
          }
          for (int64_t jj = 0; jj < kn; ++jj) {
            float* row = st + jj * kBq;
            for (int iv = 0; iv < kQV; ++iv)
              store(row + iv * kW, exp_softmax(fmadd(load(row + iv * kW), vscale, nl[iv])));
          }
          mask_tile(st, kpos0, kn, qpos0, qn, b.window, 0.0f);
          // dV_j += P^T dO_i  (only the tile's qn real columns enter any product)
          tile_gemm(kn, dp, qn, st, kBq, 1, dop + c0 * dp, dp, dva + (kl + k0) * dp, dp, true);
          // dP^T = V_j dO_i^T;  dS^T = P^T (dP^T - D) * scale
          tile_gemm(kn, kBq, d, va, s.ldk, 1, dot + c0, lq, dpt, kBq, false);
          for (int64_t jj = 0; jj < kn; ++jj) {
            const float* prow = st + jj * kBq;
            float* row = dpt + jj * kBq;
            for (int iv = 0; iv < kQV; ++iv)
              store(row + iv * kW, mul(mul(load(prow + iv * kW), sub(load(row + iv * kW), dd[iv])), vscale));
          }
          // dQ_i += dS K_j;  dK_j += dS^T Q_i
          tile_gemm(qn, dp, kn, dpt, 1, kBq, kp + (kl + k0) * dp, dp, dqa + c0 * dp, dp, true);
          tile_gemm(kn, dp, qn, dpt, kBq, 1, qp + c0 * dp, dp, dka + (kl + k0) * dp, dp, true);
        }
      }
    }
    for (const RowRun& run : comp.qruns) {
      float* dst = dq + (run.begin * s.Hq + h) * d;
      for (int64_t i = 0; i < run.end - run.begin; ++i)
        put_row(dst + i * s.ldq, dqa + (run.local + i) * dp, d, accumulate);
    }
  }
  for (const RowRun& run : comp.kruns) {
    const int64_t row0 = (run.begin * s.Hkv + g) * d;
    for (int64_t j = 0; j < run.end - run.begin; ++j) {
      put_row(dk + row0 + j * s.ldk, dka + (run.local + j) * dp, d, accumulate);
      put_row(dv + row0 + j * s.ldk, dva + (run.local + j) * dp, d, accumulate);
    }
  }
}

void backward_core(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                   const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                   const std::vector<Blk>& blocks, bool accumulate) {
  const Dims s = dims_of(q, k);
  const std::vector<Component> comps = plan_backward(blocks);
  struct BwdTask {
    int32_t comp;
    int32_t kv_head;
  };
  std::vector<BwdTask> tasks;
  int64_t scratch_size = 0;
  for (size_t i = 0; i < comps.size(); ++i) {
    scratch_size = std::max(scratch_size, BwdScratch(s, comps[i].lq, comps[i].Lk, nullptr).size);
    for (int64_t g = 0; g < s.Hkv; ++g) tasks.push_back({static_cast<int32_t>(i), static_cast<int32_t>(g)});
  }
  std::stable_sort(tasks.begin(), tasks.end(),
                   [&](const BwdTask& a, const BwdTask& b) { return comps[a.comp].cost > comps[b.comp].cost; });
  const int64_t n = static_cast<int64_t>(tasks.size());
  if (n == 0) return;
  const int threads = static_cast<int>(std::min<int64_t>(n, omp_get_max_threads()));
  const ThreadScratch scratch(scratch_size, threads);
#pragma omp parallel num_threads(threads)
  {
    float* base = scratch.for_thread(omp_get_thread_num());
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < n; ++t)
      backward_task(s, comps[tasks[t].comp], blocks, tasks[t].kv_head, accumulate, dout.data, q.data, k.data, v.data,
                    out.data, lse.data, dq.data, dk.data, dv.data, base);
  }
}

}  // namespace

int attention_query_tile() { return static_cast<int>(kBq); }
int attention_key_tile() { return static_cast<int>(kBk); }

void attention_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       const IndexTensor& cu_seqlens, int64_t window) {
  forward_core(out, lse, q, k, v, document_blocks(cu_seqlens, band_of(window)), /*merge=*/false);
}

void attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse, const IndexTensor& cu_seqlens,
                        int64_t window) {
  backward_core(dq, dk, dv, dout, q, k, v, out, lse, document_blocks(cu_seqlens, band_of(window)),
                /*accumulate=*/false);
}

void attention_forward_blocks(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v,
                              std::span<const AttentionBlock> blocks, int64_t window) {
  forward_core(out, lse, q, k, v, visible_blocks(blocks, band_of(window)), /*merge=*/true);
}

void attention_reset_rows(Tensor out, Tensor lse, int64_t begin, int64_t end) {
  if (end <= begin) return;
  const int64_t T = out.dim(0), row = out.row_numel();
  std::fill(out.data + begin * row, out.data + end * row, 0.0f);
  for (int64_t h = 0; h < lse.dim(0); ++h) std::fill(lse.data + h * T + begin, lse.data + h * T + end, kNegInf);
}

void attention_backward_blocks(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& out, const Tensor& lse,
                               std::span<const AttentionBlock> blocks, int64_t window) {
  backward_core(dq, dk, dv, dout, q, k, v, out, lse, visible_blocks(blocks, band_of(window)), /*accumulate=*/true);
}

}  // namespace hdp::cpu

// Attention between row blocks (attention_forward_blocks / attention_reset_rows /
// attention_backward_blocks), as ring attention uses it, against a naive double
// reference over explicit (query row, key row) visibility lists.
//
//   * Ring simulation: documents cut zig-zag into 2k chunks over k "ranks" (rank r
//     holds chunks r and 2k-1-r with their true positions). Each rank resets its
//     rows, then calls the forward once per ring step with the blocks of that step
//     against the key/value tensor of the step's owner; the backward is called once
//     per step with the final out/lse, adding dq locally and dk/dv into the owner's
//     buffer. Compared with full causal attention of the whole documents (reference
//     and the cu_seqlens kernel).
//   * Arbitrary blocks: partial overlaps in query rows and key rows, a pair covered
//     by two blocks (counted twice), several calls merging into the same rows.
//   * Fully masked blocks leave rows (and gradients) bit-for-bit unchanged; rows
//     that never see a key keep out = 0, lse = -inf, no NaN.
//   * Determinism across thread counts, shape and device errors.
//   * All of it again with a sliding window (Mistral 7B, Jiang et al. 2023; key
//     visible iff q_pos - W < k_pos <= q_pos): ring steps whose chunk pairs lie
//     wholly outside the window, blocks trimmed on both sides by it, and blocks
//     wholly outside it leaving rows and gradients bit-for-bit unchanged.
//
// Tolerances, relative to max(1, largest magnitude): observed errors against the
// double reference are <= 3e-7 for out and lse and <= 1.2e-6 for gradients; we allow
// 2e-6 and 1e-5. Merging ring steps through (out, lse) agrees with the single-pass
// cu_seqlens kernel to <= 2.2e-7 for out and lse (allowed 1e-6) and <= 1.2e-6 for
// gradients (allowed 5e-6).

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cuda/cuda_runtime.h"
#include "kernels/ops.h"

namespace {

using hdp::AttentionBlock;
using hdp::IndexTensor;
using hdp::Tensor;

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<float> random_vector(size_t n, float mag, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-mag, mag);
  std::vector<float> x(n);
  for (auto& e : x) e = u(rng);
  return x;
}

// ---- naive double reference over explicit visibility lists ------------------------

struct Shape {
  int64_t Tq, Tk, Hq, Hkv, d;
};

struct Ref {
  std::vector<double> out, lse, dq, dk, dv;
};

// visible[i]: the key rows query row i attends to (a key listed twice counts twice).
// Rows with no key: out 0, lse -inf, no gradient.
Ref reference(const Shape& s, const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
              const std::vector<float>& dout, const std::vector<std::vector<int32_t>>& visible) {
  const int64_t Hq = s.Hq, Hkv = s.Hkv, d = s.d, G = Hq / Hkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  Ref r;
  r.out.assign(s.Tq * Hq * d, 0.0);
  r.lse.assign(Hq * s.Tq, -kInf);
  r.dq.assign(s.Tq * Hq * d, 0.0);
  r.dk.assign(s.Tk * Hkv * d, 0.0);
  r.dv.assign(s.Tk * Hkv * d, 0.0);
  std::vector<double> P, dP;
  for (int64_t h = 0; h < Hq; ++h) {
    const int64_t g = h / G;
    for (int64_t i = 0; i < s.Tq; ++i) {
      const auto& keys = visible[i];
      if (keys.empty()) continue;
      const float* qi = &q[(i * Hq + h) * d];
      const float* doi = &dout[(i * Hq + h) * d];
      P.assign(keys.size(), 0.0);
      dP.assign(keys.size(), 0.0);
      double mx = -kInf;
      for (size_t t = 0; t < keys.size(); ++t) {
        const float* kj = &k[(keys[t] * Hkv + g) * d];
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += static_cast<double>(qi[c]) * kj[c];
        P[t] = dot * scale;
        mx = std::max(mx, P[t]);
      }
      double sum = 0;
      for (double& x : P) sum += (x = std::exp(x - mx));
      for (double& x : P) x /= sum;
      r.lse[h * s.Tq + i] = mx + std::log(sum);
      double pdp = 0;
      for (size_t t = 0; t < keys.size(); ++t) {
        const float* vj = &v[(keys[t] * Hkv + g) * d];
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) {
          r.out[(i * Hq + h) * d + c] += P[t] * vj[c];
          dot += static_cast<double>(doi[c]) * vj[c];
        }
        dP[t] = dot;
        pdp += P[t] * dot;
      }
      for (size_t t = 0; t < keys.size(); ++t) {
        const int64_t j = keys[t];
        const double ds = P[t] * (dP[t] - pdp) * scale;
        for (int64_t c = 0; c < d; ++c) {
          r.dq[(i * Hq + h) * d + c] += ds * k[(j * Hkv + g) * d + c];
          r.dk[(j * Hkv + g) * d + c] += ds * qi[c];
          r.dv[(j * Hkv + g) * d + c] += P[t] * doi[c];
        }
      }
    }
  }
  return r;
}

// Key position kp visible to query position qp.
bool visible(int64_t qp, int64_t kp, int64_t window) {
  return kp <= qp && (window == hdp::kNoWindow || kp > qp - window);
}

// Visibility lists of a set of blocks (what attention_*_blocks must compute).
std::vector<std::vector<int32_t>> visible_of_blocks(int64_t Tq, const std::vector<AttentionBlock>& blocks,
                                                    int64_t window = hdp::kNoWindow) {
  std::vector<std::vector<int32_t>> vis(Tq);
  for (const AttentionBlock& b : blocks)
    for (int32_t i = b.q_begin; i < b.q_end; ++i)
      for (int32_t j = b.k_begin; j < b.k_end; ++j)
        if (visible(b.q_position + (i - b.q_begin), b.k_position + (j - b.k_begin), window)) vis[i].push_back(j);
  return vis;
}

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double a : x)
    if (std::isfinite(a)) m = std::max(m, std::fabs(a));
  return m;
}

// max |a - b| <= tol * max(1, max|b|); -inf must match -inf exactly.
template <class A>
void expect_close(const std::vector<A>& a, const std::vector<double>& b, double tol, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  const double bound = tol * std::max(1.0, max_abs(b));
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = static_cast<double>(a[i]);
    if (std::isinf(b[i]) || std::isinf(x)) {
      EXPECT_EQ(x, b[i]) << what << " at " << i;
      continue;
    }
    const double e = std::fabs(x - b[i]);
    if (!(e <= worst)) {  // NaN is the worst
      worst = e;
      at = i;
    }
  }
  EXPECT_LE(worst, bound) << what << ": worst error at index " << at << " kernel " << a[at] << " reference " << b[at];
}

template <class A>
std::vector<double> as_double(const std::vector<A>& x) {
  return std::vector<double>(x.begin(), x.end());
}

// ---- zig-zag ring simulation -------------------------------------------------------

// Documents packed one after another; row t of the packed sequence is position
// pos[t] of document doc[t].
struct Packed {
  Shape s;  // Tq = Tk = T
  std::vector<int32_t> lens, cu, doc, pos;
  std::vector<float> q, k, v, dout;
};

Packed make_packed(const std::vector<int32_t>& lens, int64_t Hq, int64_t Hkv, int64_t d, uint32_t seed) {
  Packed p;
  p.lens = lens;
  p.cu.push_back(0);
  for (size_t i = 0; i < lens.size(); ++i) {
    for (int32_t t = 0; t < lens[i]; ++t) {
      p.doc.push_back(static_cast<int32_t>(i));
      p.pos.push_back(t);
    }
    p.cu.push_back(p.cu.back() + lens[i]);
  }
  const int64_t T = p.cu.back();
  p.s = {T, T, Hq, Hkv, d};
  std::mt19937 rng(seed);
  p.q = random_vector(T * Hq * d, 1.5f, rng);
  p.k = random_vector(T * Hkv * d, 1.5f, rng);
  p.v = random_vector(T * Hkv * d, 1.0f, rng);
  p.dout = random_vector(T * Hq * d, 1.0f, rng);
  return p;
}

// Full causal attention inside each document (within the window, if any).
Ref full_reference(const Packed& p, int64_t window = hdp::kNoWindow) {
  std::vector<std::vector<int32_t>> vis(p.s.Tq);
  for (int64_t i = 0; i < p.s.Tq; ++i)
    for (int64_t j = 0; j < p.s.Tq; ++j)
      if (p.doc[j] == p.doc[i] && visible(p.pos[i], p.pos[j], window)) vis[i].push_back(static_cast<int32_t>(j));
  return reference(p.s, p.q, p.k, p.v, p.dout, vis);
}

struct Chunk {
  int32_t doc, local_begin, local_end, position;
};

// One rank's share: the global rows it holds, in local order, and its chunks.
struct RankData {
  std::vector<int32_t> rows;
  std::vector<Chunk> chunks;
  std::vector<float> q, k, v, dout;  // gathered rows
  int64_t T() const { return static_cast<int64_t>(rows.size()); }
};

std::vector<float> gather(const std::vector<float>& x, int64_t row_numel, const std::vector<int32_t>& rows) {
  std::vector<float> out(rows.size() * row_numel);
  for (size_t r = 0; r < rows.size(); ++r)
    std::copy_n(&x[rows[r] * row_numel], row_numel, &out[r * row_numel]);
  return out;
}

// Document i cut at floor(c * L / 2k); rank r holds chunks r and 2k-1-r of every document.
std::vector<RankData> split_zigzag(const Packed& p, int k) {
  std::vector<RankData> ranks(k);
  for (int r = 0; r < k; ++r) {
    RankData& rd = ranks[r];
    for (size_t di = 0; di < p.lens.size(); ++di) {
      const int64_t L = p.lens[di];
      for (int c : {r, 2 * k - 1 - r}) {
        const int32_t b = static_cast<int32_t>(c * L / (2 * k)), e = static_cast<int32_t>((c + 1) * L / (2 * k));
        const int32_t lb = static_cast<int32_t>(rd.rows.size());
        for (int32_t t = b; t < e; ++t) rd.rows.push_back(p.cu[di] + t);
        rd.chunks.push_back({static_cast<int32_t>(di), lb, static_cast<int32_t>(rd.rows.size()), b});
      }
    }
    rd.q = gather(p.q, p.s.Hq * p.s.d, rd.rows);
    rd.k = gather(p.k, p.s.Hkv * p.s.d, rd.rows);
    rd.v = gather(p.v, p.s.Hkv * p.s.d, rd.rows);
    rd.dout = gather(p.dout, p.s.Hq * p.s.d, rd.rows);
  }
  return ranks;
}

// Every (my chunk, their chunk) pair of the same document, masked ones included:
// the kernel must skip those itself.
std::vector<AttentionBlock> step_blocks(const RankData& mine, const RankData& theirs) {
  std::vector<AttentionBlock> blocks;
  for (const Chunk& a : mine.chunks)
    for (const Chunk& b : theirs.chunks)
      if (a.doc == b.doc) blocks.push_back({a.local_begin, a.local_end, b.local_begin, b.local_end, a.position, b.position});
  return blocks;
}

struct RingResult {
  // Scattered back to global rows.
  std::vector<float> out, lse, dq, dk, dv;
};

RingResult run_ring(const Packed& p, int k, int64_t window = hdp::kNoWindow) {
  const int64_t Hq = p.s.Hq, Hkv = p.s.Hkv, d = p.s.d, T = p.s.Tq;
  std::vector<RankData> ranks = split_zigzag(p, k);
  std::vector<std::vector<float>> out(k), lse(k), dq(k), dk(k), dv(k);
  for (int r = 0; r < k; ++r) {
    const int64_t Tr = ranks[r].T();
    out[r].assign(Tr * Hq * d, 123.0f);  // garbage the reset must clear
    lse[r].assign(Hq * Tr, 123.0f);
    dq[r].assign(Tr * Hq * d, 0.0f);
    dk[r].assign(Tr * Hkv * d, 0.0f);
    dv[r].assign(Tr * Hkv * d, 0.0f);
  }
  auto qt = [&](int r, std::vector<float>& x, int64_t H) { return Tensor(x.data(), {ranks[r].T(), H, d}); };
  auto kt = [&](int r, std::vector<float>& x) { return Tensor(x.data(), {ranks[r].T(), Hkv, d}); };
  // Forward: step s brings the keys of rank (r - s) mod k.
  for (int r = 0; r < k; ++r) {
    RankData& me = ranks[r];
    const Tensor o = qt(r, out[r], Hq), l(lse[r].data(), {Hq, me.T()});
    hdp::attention_reset_rows(o, l, 0, me.T());
    for (int step = 0; step < k; ++step) {
      const int src = (r - step + k) % k;
      const std::vector<AttentionBlock> blocks = step_blocks(me, ranks[src]);
      hdp::attention_forward_blocks(o, l, qt(r, me.q, Hq), kt(src, ranks[src].k), kt(src, ranks[src].v), blocks,
                                    window);
    }
  }
  // Backward: dq locally, dk/dv into the buffer travelling with the owner's keys.
  for (int r = 0; r < k; ++r) {
    RankData& me = ranks[r];
    for (int step = 0; step < k; ++step) {
      const int src = (r - step + k) % k;
      const std::vector<AttentionBlock> blocks = step_blocks(me, ranks[src]);
      hdp::attention_backward_blocks(qt(r, dq[r], Hq), Tensor(dk[src].data(), {ranks[src].T(), Hkv, d}),
                                     Tensor(dv[src].data(), {ranks[src].T(), Hkv, d}), qt(r, me.dout, Hq),
                                     qt(r, me.q, Hq), kt(src, ranks[src].k), kt(src, ranks[src].v), qt(r, out[r], Hq),
                                     Tensor(lse[r].data(), {Hq, me.T()}), blocks, window);
    }
  }
  RingResult g;
  g.out.assign(T * Hq * d, NAN);
  g.lse.assign(Hq * T, NAN);
  g.dq.assign(T * Hq * d, NAN);
  g.dk.assign(T * Hkv * d, NAN);
  g.dv.assign(T * Hkv * d, NAN);
  for (int r = 0; r < k; ++r) {
    const int64_t Tr = ranks[r].T();
    for (int64_t i = 0; i < Tr; ++i) {
      const int64_t t = ranks[r].rows[i];
      std::copy_n(&out[r][i * Hq * d], Hq * d, &g.out[t * Hq * d]);
      std::copy_n(&dq[r][i * Hq * d], Hq * d, &g.dq[t * Hq * d]);
      std::copy_n(&dk[r][i * Hkv * d], Hkv * d, &g.dk[t * Hkv * d]);
      std::copy_n(&dv[r][i * Hkv * d], Hkv * d, &g.dv[t * Hkv * d]);
      for (int64_t h = 0; h < Hq; ++h) g.lse[h * T + t] = lse[r][h * Tr + i];
    }
  }
  return g;
}

// The cu_seqlens kernel on the whole packed sequence.
RingResult run_packed_kernel(Packed& p, int64_t window = hdp::kNoWindow) {
  const int64_t Hq = p.s.Hq, Hkv = p.s.Hkv, d = p.s.d, T = p.s.Tq;
  RingResult r;
  r.out.resize(T * Hq * d);
  r.lse.resize(Hq * T);
  r.dq.resize(p.q.size());
  r.dk.resize(p.k.size());
  r.dv.resize(p.v.size());
  IndexTensor cu(p.cu.data(), {static_cast<int64_t>(p.cu.size())});
  Tensor q(p.q.data(), {T, Hq, d}), k(p.k.data(), {T, Hkv, d}), v(p.v.data(), {T, Hkv, d});
  Tensor out(r.out.data(), {T, Hq, d}), lse(r.lse.data(), {Hq, T});
  hdp::attention_forward(out, lse, q, k, v, cu, window);
  hdp::attention_backward(Tensor(r.dq.data(), {T, Hq, d}), Tensor(r.dk.data(), {T, Hkv, d}),
                          Tensor(r.dv.data(), {T, Hkv, d}), Tensor(p.dout.data(), {T, Hq, d}), q, k, v, out, lse, cu,
                          window);
  return r;
}

void check_ring(Packed& p, const Ref& ref, const RingResult& packed, int k, int64_t window = hdp::kNoWindow) {
  SCOPED_TRACE(::testing::Message() << "ranks=" << k << " Hq=" << p.s.Hq << " Hkv=" << p.s.Hkv << " d=" << p.s.d
                                    << " T=" << p.s.Tq << " window=" << window);
  const RingResult ring = run_ring(p, k, window);
  expect_close(ring.out, ref.out, 2e-6, "out");
  expect_close(ring.lse, ref.lse, 2e-6, "lse");
  expect_close(ring.dq, ref.dq, 1e-5, "dq");
  expect_close(ring.dk, ref.dk, 1e-5, "dk");
  expect_close(ring.dv, ref.dv, 1e-5, "dv");
  // Merging per ring step is equivalent to the single pass over all keys.
  expect_close(ring.out, as_double(packed.out), 1e-6, "out vs cu_seqlens kernel");
  expect_close(ring.lse, as_double(packed.lse), 1e-6, "lse vs cu_seqlens kernel");
  expect_close(ring.dq, as_double(packed.dq), 5e-6, "dq vs cu_seqlens kernel");
  expect_close(ring.dk, as_double(packed.dk), 5e-6, "dk vs cu_seqlens kernel");
  expect_close(ring.dv, as_double(packed.dv), 5e-6, "dv vs cu_seqlens kernel");
}

}  // namespace

TEST(KernelsAttentionBlocks, RingZigZagOneDocument) {
  for (int32_t L : {300, 301}) {
    Packed p = make_packed({L}, 4, 2, 64, 100 + L);
    const Ref ref = full_reference(p);
    const RingResult packed = run_packed_kernel(p);
    for (int k : {2, 3, 4}) check_ring(p, ref, packed, k);
  }
}

TEST(KernelsAttentionBlocks, RingZigZagSlidingWindow) {
  // Chunks of 300 / 2k tokens: with the small windows most chunk pairs of a ring
  // step lie wholly outside the window and must contribute nothing, and the others
  // are cut by it; a window of 300 is the whole document.
  Packed p = make_packed({300}, 4, 2, 64, 400);
  for (int64_t window : {1, 20, 64, 100, 300}) {
    const Ref ref = full_reference(p, window);
    const RingResult packed = run_packed_kernel(p, window);
    for (int k : {2, 3, 4}) check_ring(p, ref, packed, k, window);
  }
}

TEST(KernelsAttentionBlocks, RingSeveralDocumentsSlidingWindowGqa) {
  // Documents longer and shorter than the window, MQA and GQA.
  for (int64_t Hkv : {2, 1}) {
    Packed p = make_packed({150, 37, 5, 1, 90}, 4, Hkv, 24, static_cast<uint32_t>(50 + Hkv));
    const Ref ref = full_reference(p, 30);
    const RingResult packed = run_packed_kernel(p, 30);
    check_ring(p, ref, packed, 3, 30);
  }
}

TEST(KernelsAttentionBlocks, RingSeveralDocumentsGqaHeadDims) {
  // Documents of uneven lengths, one shorter than 2k (empty chunks), one of length 1.
  for (int64_t Hkv : {2, 1})
    for (int64_t d : {8, 64, 80}) {
      Packed p = make_packed({150, 37, 5, 1, 90}, 4, Hkv, d, static_cast<uint32_t>(7 * d + Hkv));
      const Ref ref = full_reference(p);
      const RingResult packed = run_packed_kernel(p);
      check_ring(p, ref, packed, 3);
    }
}

TEST(KernelsAttentionBlocks, OneBlockPerDocumentMatchesCuSeqlensKernelBitForBit) {
  for (int64_t window : {hdp::kNoWindow, int64_t{50}}) {
    SCOPED_TRACE(window);
    Packed p = make_packed({200, 1, 70, 129}, 4, 2, 32, 5);
    const RingResult packed = run_packed_kernel(p, window);
    const int64_t Hq = p.s.Hq, Hkv = p.s.Hkv, d = p.s.d, T = p.s.Tq;
    std::vector<AttentionBlock> blocks;
    for (size_t i = 0; i + 1 < p.cu.size(); ++i) blocks.push_back({p.cu[i], p.cu[i + 1], p.cu[i], p.cu[i + 1], 0, 0});
    std::vector<float> out(T * Hq * d), lse(Hq * T), dq(p.q.size(), 0.0f), dk(p.k.size(), 0.0f),
        dv(p.v.size(), 0.0f);
    Tensor q(p.q.data(), {T, Hq, d}), k(p.k.data(), {T, Hkv, d}), v(p.v.data(), {T, Hkv, d});
    Tensor o(out.data(), {T, Hq, d}), l(lse.data(), {Hq, T});
    hdp::attention_reset_rows(o, l, 0, T);
    hdp::attention_forward_blocks(o, l, q, k, v, blocks, window);
    EXPECT_EQ(out, packed.out);
    EXPECT_EQ(lse, packed.lse);
    hdp::attention_backward_blocks(Tensor(dq.data(), {T, Hq, d}), Tensor(dk.data(), {T, Hkv, d}),
                                   Tensor(dv.data(), {T, Hkv, d}), Tensor(p.dout.data(), {T, Hq, d}), q, k, v, o, l,
                                   blocks, window);
    EXPECT_EQ(dq, packed.dq);
    EXPECT_EQ(dk, packed.dk);
    EXPECT_EQ(dv, packed.dv);
  }
}

namespace {

// Separate q and k tensors (Tq != Tk), arbitrary blocks, forward split over calls.
struct Arbitrary {
  Shape s;
  std::vector<float> q, k, v, dout;
};

Arbitrary make_arbitrary(int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t d, uint32_t seed) {
  Arbitrary a;
  a.s = {Tq, Tk, Hq, Hkv, d};
  std::mt19937 rng(seed);
  a.q = random_vector(Tq * Hq * d, 1.5f, rng);
  a.k = random_vector(Tk * Hkv * d, 1.5f, rng);
  a.v = random_vector(Tk * Hkv * d, 1.0f, rng);
  a.dout = random_vector(Tq * Hq * d, 1.0f, rng);
  return a;
}

struct BlockRun {
  std::vector<float> out, lse, dq, dk, dv;
};

// Reset all rows, one forward call per group of blocks, one backward call per
// group; gradients start from `grad_init` (they are added into).
BlockRun run_blocks(Arbitrary& a, const std::vector<std::vector<AttentionBlock>>& calls, float grad_init = 0.0f,
                    int64_t window = hdp::kNoWindow) {
  const Shape& s = a.s;
  BlockRun r;
  r.out.assign(s.Tq * s.Hq * s.d, 5.0f);
  r.lse.assign(s.Hq * s.Tq, 5.0f);
  r.dq.assign(a.q.size(), grad_init);
  r.dk.assign(a.k.size(), grad_init);
  r.dv.assign(a.v.size(), grad_init);
  Tensor q(a.q.data(), {s.Tq, s.Hq, s.d}), k(a.k.data(), {s.Tk, s.Hkv, s.d}), v(a.v.data(), {s.Tk, s.Hkv, s.d});
  Tensor o(r.out.data(), {s.Tq, s.Hq, s.d}), l(r.lse.data(), {s.Hq, s.Tq});
  hdp::attention_reset_rows(o, l, 0, s.Tq);
  for (const auto& blocks : calls) hdp::attention_forward_blocks(o, l, q, k, v, blocks, window);
  for (const auto& blocks : calls)
    hdp::attention_backward_blocks(Tensor(r.dq.data(), {s.Tq, s.Hq, s.d}), Tensor(r.dk.data(), {s.Tk, s.Hkv, s.d}),
                                   Tensor(r.dv.data(), {s.Tk, s.Hkv, s.d}), Tensor(a.dout.data(), {s.Tq, s.Hq, s.d}),
                                   q, k, v, o, l, blocks, window);
  return r;
}

std::vector<double> plus(std::vector<double> x, double c) {
  for (double& e : x) e += c;
  return x;
}

}  // namespace

TEST(KernelsAttentionBlocks, ArbitraryOverlappingBlocksOverSeveralCalls) {
  // Query rows 0..259, key rows 0..229. Blocks overlap partially in query rows
  // (segments covered by 1, 2 or 3 blocks) and in key rows; block 4 repeats part of
  // block 0's rectangle, so those pairs count twice. Positions put some blocks on a
  // diagonal (one not tile-aligned), some fully visible, some partly before their
  // keys. Rows 250..259 are never touched (out 0, lse -inf, gradient unchanged).
  // With a window of 40 the last block loses key rows at its start and query rows
  // at its end (trimmed on both sides), "fully visible" blocks become bands, and
  // with a window of 1 each query sees at most one key per block.
  Arbitrary a = make_arbitrary(260, 230, 4, 2, 24, 11);
  const std::vector<AttentionBlock> call0 = {
      {0, 150, 0, 150, 1000, 1000},    // causal diagonal
      {100, 200, 150, 230, 537, 500},  // diagonal shifted by 37: query i sees 38 + i keys
  };
  const std::vector<AttentionBlock> call1 = {
      {50, 130, 20, 100, 70, 100},     // queries 50..79 precede every key; the rest partly masked
      {120, 250, 0, 70, 300, 200},     // fully visible
      {10, 40, 10, 40, 1010, 1010},    // inside block 0's rectangle, counted a second time
      {0, 250, 100, 200, 0, 100000},   // fully masked
      {150, 250, 100, 200, 2000, 1930}, // queries at 2000.., keys 70 positions earlier
  };
  std::vector<AttentionBlock> all = call0;
  all.insert(all.end(), call1.begin(), call1.end());
  for (int64_t window : {hdp::kNoWindow, int64_t{1}, int64_t{40}, int64_t{130}})
    for (const auto& calls : {std::vector<std::vector<AttentionBlock>>{call0, call1},
                              std::vector<std::vector<AttentionBlock>>{all}}) {
      SCOPED_TRACE(::testing::Message() << "calls=" << calls.size() << " window=" << window);
      const Ref ref = reference(a.s, a.q, a.k, a.v, a.dout, visible_of_blocks(a.s.Tq, all, window));
      const BlockRun r = run_blocks(a, calls, 0.25f, window);
      expect_close(r.out, ref.out, 2e-6, "out");
      expect_close(r.lse, ref.lse, 2e-6, "lse");
      expect_close(r.dq, plus(ref.dq, 0.25), 1e-5, "dq");
      expect_close(r.dk, plus(ref.dk, 0.25), 1e-5, "dk");
      expect_close(r.dv, plus(ref.dv, 0.25), 1e-5, "dv");
    }
}

TEST(KernelsAttentionBlocks, FullyMaskedBlocksLeaveRowsUnchanged) {
  Arbitrary a = make_arbitrary(100, 80, 2, 1, 16, 12);
  const Shape& s = a.s;
  std::vector<float> out(s.Tq * s.Hq * s.d), lse(s.Hq * s.Tq);
  Tensor q(a.q.data(), {s.Tq, s.Hq, s.d}), k(a.k.data(), {s.Tk, s.Hkv, s.d}), v(a.v.data(), {s.Tk, s.Hkv, s.d});
  Tensor o(out.data(), {s.Tq, s.Hq, s.d}), l(lse.data(), {s.Hq, s.Tq});
  hdp::attention_reset_rows(o, l, 0, s.Tq);
  for (float x : out) ASSERT_EQ(x, 0.0f);
  for (float x : lse) ASSERT_EQ(x, -std::numeric_limits<float>::infinity());
  // Rows 0..59 see keys; rows 60..99 stay reset.
  const std::vector<AttentionBlock> live = {{0, 60, 0, 80, 500, 450}};
  hdp::attention_forward_blocks(o, l, q, k, v, live);
  const std::vector<float> out0 = out, lse0 = lse;

  // Every key after every query (by one position, and far), empty blocks: nothing changes.
  const std::vector<AttentionBlock> masked = {
      {0, 100, 0, 80, 0, 100}, {0, 100, 0, 80, 0, 1 << 30}, {0, 60, 0, 80, 400, 460}, {5, 5, 0, 80, 0, 0},
      {0, 100, 7, 7, 0, 0}};
  hdp::attention_forward_blocks(o, l, q, k, v, masked);
  EXPECT_EQ(0, std::memcmp(out.data(), out0.data(), out.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(lse.data(), lse0.data(), lse.size() * sizeof(float)));

  // A block whose keys start at the position of query row 80: rows 60..79 (reset)
  // and 0..59 (live) see nothing and stay bit-for-bit; rows 80..99 change.
  const std::vector<AttentionBlock> partial = {{0, 100, 0, 80, 1000, 1080}};
  hdp::attention_forward_blocks(o, l, q, k, v, partial);
  const int64_t row = s.Hq * s.d;
  EXPECT_EQ(0, std::memcmp(out.data(), out0.data(), 80 * row * sizeof(float)));
  for (int64_t h = 0; h < s.Hq; ++h) {
    EXPECT_EQ(0, std::memcmp(&lse[h * s.Tq], &lse0[h * s.Tq], 80 * sizeof(float)));
    for (int64_t i = 80; i < 100; ++i) EXPECT_TRUE(std::isfinite(lse[h * s.Tq + i])) << i;
  }
  for (float x : out) ASSERT_FALSE(std::isnan(x));
  // Check the changed rows against the reference of both calls.
  std::vector<AttentionBlock> both = live;
  both.push_back(partial[0]);
  const Ref ref = reference(s, a.q, a.k, a.v, a.dout, visible_of_blocks(s.Tq, both));
  expect_close(out, ref.out, 2e-6, "out");
  expect_close(lse, ref.lse, 2e-6, "lse");

  // The backward of masked blocks adds nothing.
  std::mt19937 rng(3);
  std::vector<float> dq = random_vector(a.q.size(), 1.0f, rng), dk = random_vector(a.k.size(), 1.0f, rng),
                     dv = random_vector(a.v.size(), 1.0f, rng);
  const std::vector<float> dq0 = dq, dk0 = dk, dv0 = dv;
  hdp::attention_backward_blocks(Tensor(dq.data(), {s.Tq, s.Hq, s.d}), Tensor(dk.data(), {s.Tk, s.Hkv, s.d}),
                                 Tensor(dv.data(), {s.Tk, s.Hkv, s.d}), Tensor(a.dout.data(), {s.Tq, s.Hq, s.d}), q, k,
                                 v, o, l, masked);
  EXPECT_EQ(dq, dq0);
  EXPECT_EQ(dk, dk0);
  EXPECT_EQ(dv, dv0);
}

TEST(KernelsAttentionBlocks, DeterministicAcrossRunsAndThreadCounts) {
  // A ring step of two documents: components of two blocks sharing query rows and
  // key rows, GQA, tiles straddling chunk boundaries; without and with a window.
  Packed p = make_packed({700, 300}, 4, 2, 64, 21);
  const int threads = omp_get_max_threads();
  for (int64_t window : {hdp::kNoWindow, int64_t{90}}) {
    std::vector<RingResult> runs;
    for (int t : {threads, 1, 2, threads}) {
      omp_set_num_threads(t);
      runs.push_back(run_ring(p, 2, window));
    }
    omp_set_num_threads(threads);
    for (size_t i = 1; i < runs.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "run " << i << " window=" << window);
      EXPECT_EQ(0, std::memcmp(runs[0].out.data(), runs[i].out.data(), runs[0].out.size() * 4));
      EXPECT_EQ(0, std::memcmp(runs[0].lse.data(), runs[i].lse.data(), runs[0].lse.size() * 4));
      EXPECT_EQ(0, std::memcmp(runs[0].dq.data(), runs[i].dq.data(), runs[0].dq.size() * 4));
      EXPECT_EQ(0, std::memcmp(runs[0].dk.data(), runs[i].dk.data(), runs[0].dk.size() * 4));
      EXPECT_EQ(0, std::memcmp(runs[0].dv.data(), runs[i].dv.data(), runs[0].dv.size() * 4));
    }
  }
}

TEST(KernelsAttentionBlocks, RejectsBadShapesBlocksAndDevices) {
  std::vector<float> buf(8192);
  // q [8, 4, 4], k/v [6, 2, 4] (Tk != Tq is fine), out [8, 4, 4], lse [4, 8]
  Tensor q(buf.data(), {8, 4, 4}), k(buf.data(), {6, 2, 4}), v(buf.data(), {6, 2, 4});
  Tensor out(buf.data(), {8, 4, 4}), lse(buf.data(), {4, 8});
  const std::vector<AttentionBlock> ok = {{0, 8, 0, 6, 10, 0}};
  EXPECT_NO_THROW(hdp::attention_forward_blocks(out, lse, q, k, v, ok));
  EXPECT_NO_THROW(hdp::attention_forward_blocks(out, lse, q, k, v, {}));
  auto bad_block = [&](AttentionBlock b) {
    const std::vector<AttentionBlock> blocks = {{0, 1, 0, 1, 0, 0}, b};
    EXPECT_THROW(hdp::attention_forward_blocks(out, lse, q, k, v, blocks), std::invalid_argument);
    EXPECT_THROW(hdp::attention_backward_blocks(out, k, v, out, q, k, v, out, lse, blocks), std::invalid_argument);
  };
  bad_block({0, 9, 0, 6, 0, 0});   // past Tq
  bad_block({0, 8, 0, 7, 0, 0});   // past Tk
  bad_block({-1, 8, 0, 6, 0, 0});  // negative
  bad_block({5, 4, 0, 6, 0, 0});   // begin > end
  bad_block({0, 8, 3, 2, 0, 0});
  try {
    const std::vector<AttentionBlock> blocks = {{0, 8, 0, 7, 0, 0}};
    hdp::attention_forward_blocks(out, lse, q, k, v, blocks);
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("attention_forward_blocks"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("block 0"), std::string::npos) << e.what();
  }
  // Shapes: lse transposed, 3 query heads over 2 kv heads, v rows != k rows, d mismatch.
  EXPECT_THROW(hdp::attention_forward_blocks(out, Tensor(buf.data(), {8, 4}), q, k, v, ok), std::invalid_argument);
  EXPECT_THROW(hdp::attention_forward_blocks(Tensor(buf.data(), {8, 3, 4}), Tensor(buf.data(), {3, 8}),
                                             Tensor(buf.data(), {8, 3, 4}), k, v, ok),
               std::invalid_argument);
  EXPECT_THROW(hdp::attention_forward_blocks(out, lse, q, k, Tensor(buf.data(), {5, 2, 4}), ok), std::invalid_argument);
  EXPECT_THROW(hdp::attention_forward_blocks(out, lse, q, Tensor(buf.data(), {6, 2, 8}), v, ok), std::invalid_argument);
  // Backward: gradients must match their tensors.
  EXPECT_NO_THROW(hdp::attention_backward_blocks(Tensor(buf.data(), {8, 4, 4}), Tensor(buf.data(), {6, 2, 4}),
                                                 Tensor(buf.data(), {6, 2, 4}), out, q, k, v, out, lse, {}));
  EXPECT_THROW(hdp::attention_backward_blocks(Tensor(buf.data(), {8, 4, 4}), Tensor(buf.data(), {8, 2, 4}),
                                              Tensor(buf.data(), {6, 2, 4}), out, q, k, v, out, lse, ok),
               std::invalid_argument);
  EXPECT_THROW(hdp::attention_backward_blocks(Tensor(buf.data(), {8, 4, 4}), Tensor(buf.data(), {6, 2, 4}),
                                              Tensor(buf.data(), {6, 2, 4}), Tensor(buf.data(), {8, 4, 2}), q, k, v,
                                              out, lse, ok),
               std::invalid_argument);
  // A negative window.
  EXPECT_THROW(hdp::attention_forward_blocks(out, lse, q, k, v, ok, -1), std::invalid_argument);
  EXPECT_THROW(hdp::attention_backward_blocks(out, k, v, out, q, k, v, out, lse, ok, -1), std::invalid_argument);
  // Reset: row range and lse shape.
  EXPECT_NO_THROW(hdp::attention_reset_rows(out, lse, 8, 8));
  EXPECT_THROW(hdp::attention_reset_rows(out, lse, 0, 9), std::invalid_argument);
  EXPECT_THROW(hdp::attention_reset_rows(out, lse, 3, 2), std::invalid_argument);
  EXPECT_THROW(hdp::attention_reset_rows(out, Tensor(buf.data(), {8, 4}), 0, 8), std::invalid_argument);
  // Devices: mixed is a shape-style error, all-CUDA is unsupported.
  const auto cuda = hdp::Device::CUDA;
  EXPECT_THROW(hdp::attention_forward_blocks(out, lse, Tensor(buf.data(), {8, 4, 4}, cuda), k, v, ok),
               std::invalid_argument);
  EXPECT_THROW(hdp::attention_reset_rows(out, Tensor(buf.data(), {4, 8}, cuda), 0, 8), std::invalid_argument);
  // Host memory posing as device tensors would run where a CUDA device is present.
  if (hdp::cuda::available()) return;
  Tensor cq(buf.data(), {8, 4, 4}, cuda), ck(buf.data(), {6, 2, 4}, cuda), co(buf.data(), {8, 4, 4}, cuda),
      cl(buf.data(), {4, 8}, cuda);
  EXPECT_THROW(hdp::attention_forward_blocks(co, cl, cq, ck, ck, ok), hdp::UnsupportedDevice);
  EXPECT_THROW(hdp::attention_backward_blocks(co, ck, ck, co, cq, ck, ck, co, cl, ok), hdp::UnsupportedDevice);
  EXPECT_THROW(hdp::attention_reset_rows(co, cl, 0, 8), hdp::UnsupportedDevice);
}

TEST(KernelsAttentionBlocks, BlocksWhollyOutsideTheWindowContributeNothing) {
  const int64_t w = 30;
  Arbitrary a = make_arbitrary(100, 80, 2, 1, 16, 13);
  const Shape& s = a.s;
  std::vector<float> out(s.Tq * s.Hq * s.d), lse(s.Hq * s.Tq);
  Tensor q(a.q.data(), {s.Tq, s.Hq, s.d}), k(a.k.data(), {s.Tk, s.Hkv, s.d}), v(a.v.data(), {s.Tk, s.Hkv, s.d});
  Tensor o(out.data(), {s.Tq, s.Hq, s.d}), l(lse.data(), {s.Hq, s.Tq});
  hdp::attention_reset_rows(o, l, 0, s.Tq);
  const std::vector<AttentionBlock> live = {{0, 60, 0, 80, 500, 450}};  // a band: keys 450..529, queries 500..559
  hdp::attention_forward_blocks(o, l, q, k, v, live, w);
  const std::vector<float> out0 = out, lse0 = lse;

  // Every key at least W positions before every query: the first query (position
  // 79 + W) exactly W after the last key (position 79), and far beyond.
  const std::vector<AttentionBlock> outside = {{0, 100, 0, 80, static_cast<int32_t>(79 + w), 0},
                                               {0, 100, 0, 80, 1 << 30, 0}};
  hdp::attention_forward_blocks(o, l, q, k, v, outside, w);
  EXPECT_EQ(0, std::memcmp(out.data(), out0.data(), out.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(lse.data(), lse0.data(), lse.size() * sizeof(float)));
  {  // Without the window the same blocks see every key: the check above can fail.
    std::vector<float> out1 = out0, lse1 = lse0;
    hdp::attention_forward_blocks(Tensor(out1.data(), {s.Tq, s.Hq, s.d}), Tensor(lse1.data(), {s.Hq, s.Tq}), q, k, v,
                                  outside);
    EXPECT_NE(out1, out0);
  }

  // One position closer: the last key is visible to the first query row only.
  const std::vector<AttentionBlock> edge = {{0, 100, 0, 80, static_cast<int32_t>(78 + w), 0}};
  hdp::attention_forward_blocks(o, l, q, k, v, edge, w);
  const int64_t row = s.Hq * s.d;
  EXPECT_EQ(0, std::memcmp(out.data() + row, out0.data() + row, (s.Tq - 1) * row * sizeof(float)));
  std::vector<AttentionBlock> both = live;
  both.push_back(edge[0]);
  const Ref ref = reference(s, a.q, a.k, a.v, a.dout, visible_of_blocks(s.Tq, both, w));
  expect_close(out, ref.out, 2e-6, "out");
  expect_close(lse, ref.lse, 2e-6, "lse");
  for (int64_t h = 0; h < s.Hq; ++h) EXPECT_NE(lse[h * s.Tq], lse0[h * s.Tq]) << "row 0 takes the edge key";

  // The backward of blocks outside the window adds nothing.
  std::mt19937 rng(4);
  std::vector<float> dq = random_vector(a.q.size(), 1.0f, rng), dk = random_vector(a.k.size(), 1.0f, rng),
                     dv = random_vector(a.v.size(), 1.0f, rng);
  const std::vector<float> dq0 = dq, dk0 = dk, dv0 = dv;
  hdp::attention_backward_blocks(Tensor(dq.data(), {s.Tq, s.Hq, s.d}), Tensor(dk.data(), {s.Tk, s.Hkv, s.d}),
                                 Tensor(dv.data(), {s.Tk, s.Hkv, s.d}), Tensor(a.dout.data(), {s.Tq, s.Hq, s.d}), q, k,
                                 v, o, l, outside, w);
  EXPECT_EQ(dq, dq0);
  EXPECT_EQ(dk, dk0);
  EXPECT_EQ(dv, dv0);
}

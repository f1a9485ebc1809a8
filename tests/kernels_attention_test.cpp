// Tiled causal attention over packed documents against a naive O(T^2) reference
// in double: forward output and lse, the backward against the reference's
// analytic gradient, and (small cases) against central finite differences of the
// double reference forward. GQA, uneven documents (length 1 included), sizes that
// are not multiples of the tile sizes, several head dims, determinism. The same
// with a sliding window (Mistral 7B, Jiang et al. 2023; query i sees keys j with
// i - W < j <= i of its document): windows smaller than, equal to and larger than
// the documents, tile-aligned or not, and key tiles outside the window never read.
//
// Tolerances: the kernel works in float with a fast exp (rel. error ~1e-7); the
// observed forward error is <= 6e-7 and gradient error <= 3e-6 of the largest
// magnitude (the worst case is lse ~ 50 in the large-score test). We allow 1e-5 of
// the largest magnitude (or of 1) for out and lse, 3e-5 for gradients. Finite differences in double with h = 1e-4 on the double
// reference have truncation error ~h^2 ~ 1e-8, so the FD check measures the
// kernel's float error too: 2e-5 of the largest gradient.

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/ops.h"

namespace {

using hdp::IndexTensor;
using hdp::Tensor;

struct Problem {
  int64_t T, Hq, Hkv, d;
  int64_t window = hdp::kNoWindow;
  std::vector<int32_t> cu;
  std::vector<float> q, k, v, dout;
};

Problem make_problem(std::vector<int32_t> lens, int64_t Hq, int64_t Hkv, int64_t d, uint32_t seed, float mag = 1.5f,
                     int64_t window = hdp::kNoWindow) {
  Problem p;
  p.window = window;
  p.Hq = Hq;
  p.Hkv = Hkv;
  p.d = d;
  p.cu.push_back(0);
  for (int32_t l : lens) p.cu.push_back(p.cu.back() + l);
  p.T = p.cu.back();
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-mag, mag), u1(-1.0f, 1.0f);
  p.q.resize(p.T * Hq * d);
  p.k.resize(p.T * Hkv * d);
  p.v.resize(p.T * Hkv * d);
  p.dout.resize(p.T * Hq * d);
  for (auto& x : p.q) x = u(rng);
  for (auto& x : p.k) x = u(rng);
  for (auto& x : p.v) x = u1(rng);
  for (auto& x : p.dout) x = u1(rng);
  return p;
}

// ---- naive double reference ------------------------------------------------------

// First key row query row i of the document starting at row b sees.
int64_t first_key(const Problem& p, int64_t b, int64_t i) {
  return p.window == hdp::kNoWindow ? b : std::max(b, i - p.window + 1);
}

struct RefOut {
  std::vector<double> out, lse;
};

RefOut ref_forward(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                   const std::vector<double>& v) {
  const int64_t T = p.T, Hq = p.Hq, Hkv = p.Hkv, d = p.d, G = Hq / Hkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  RefOut r;
  r.out.assign(T * Hq * d, 0.0);
  r.lse.assign(Hq * T, 0.0);
  std::vector<double> s;
  for (size_t doc = 0; doc + 1 < p.cu.size(); ++doc) {
    const int64_t b = p.cu[doc], e = p.cu[doc + 1];
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t g = h / G;
      for (int64_t i = b; i < e; ++i) {
        const int64_t f = first_key(p, b, i);
        s.assign(i - f + 1, 0.0);
        double mx = -1e300;
        for (int64_t j = f; j <= i; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += q[(i * Hq + h) * d + c] * k[(j * Hkv + g) * d + c];
          s[j - f] = dot * scale;
          mx = std::max(mx, s[j - f]);
        }
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - mx));
        for (int64_t j = f; j <= i; ++j)
          for (int64_t c = 0; c < d; ++c) r.out[(i * Hq + h) * d + c] += s[j - f] / sum * v[(j * Hkv + g) * d + c];
        r.lse[h * T + i] = mx + std::log(sum);
      }
    }
  }
  return r;
}

struct RefGrad {
  std::vector<double> dq, dk, dv;
};

// Analytic backward written from the softmax Jacobian directly (not the
// FlashAttention recurrences): dP = dO V^T, dS = P o (dP - rowsum(P o dP)).
RefGrad ref_backward(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                     const std::vector<double>& v, const std::vector<double>& dout) {
  const int64_t T = p.T, Hq = p.Hq, Hkv = p.Hkv, d = p.d, G = Hq / Hkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  RefGrad gr;
  gr.dq.assign(T * Hq * d, 0.0);
  gr.dk.assign(T * Hkv * d, 0.0);
  gr.dv.assign(T * Hkv * d, 0.0);
  std::vector<double> P, dP;
  for (size_t doc = 0; doc + 1 < p.cu.size(); ++doc) {
    const int64_t b = p.cu[doc], e = p.cu[doc + 1];
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t g = h / G;
      for (int64_t i = b; i < e; ++i) {
        const int64_t f = first_key(p, b, i), n = i - f + 1;
        P.assign(n, 0.0);
        dP.assign(n, 0.0);
        double mx = -1e300;
        for (int64_t j = f; j <= i; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += q[(i * Hq + h) * d + c] * k[(j * Hkv + g) * d + c];
          P[j - f] = dot * scale;
          mx = std::max(mx, P[j - f]);
        }
        double sum = 0;
        for (double& x : P) sum += (x = std::exp(x - mx));
        for (double& x : P) x /= sum;
        double pdp = 0;
        for (int64_t j = f; j <= i; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += dout[(i * Hq + h) * d + c] * v[(j * Hkv + g) * d + c];
          dP[j - f] = dot;
          pdp += P[j - f] * dot;
        }
        for (int64_t j = f; j <= i; ++j) {
          const double ds = P[j - f] * (dP[j - f] - pdp) * scale;
          for (int64_t c = 0; c < d; ++c) {
            gr.dq[(i * Hq + h) * d + c] += ds * k[(j * Hkv + g) * d + c];
            gr.dk[(j * Hkv + g) * d + c] += ds * q[(i * Hq + h) * d + c];
            gr.dv[(j * Hkv + g) * d + c] += P[j - f] * dout[(i * Hq + h) * d + c];
          }
        }
      }
    }
  }
  return gr;
}

std::vector<double> to_double(const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); }

// ---- running the kernel -----------------------------------------------------------

struct KernelOut {
  std::vector<float> out, lse, dq, dk, dv;
};

KernelOut run_kernel(Problem& p) {
  KernelOut r;
  r.out.assign(p.T * p.Hq * p.d, -7.0f);  // garbage that must be overwritten
  r.lse.assign(p.Hq * p.T, -7.0f);
  r.dq.assign(p.q.size(), -7.0f);
  r.dk.assign(p.k.size(), -7.0f);
  r.dv.assign(p.v.size(), -7.0f);
  const int64_t T = p.T, Hq = p.Hq, Hkv = p.Hkv, d = p.d;
  IndexTensor cu(p.cu.data(), {static_cast<int64_t>(p.cu.size())});
  Tensor q(p.q.data(), {T, Hq, d}), k(p.k.data(), {T, Hkv, d}), v(p.v.data(), {T, Hkv, d});
  Tensor out(r.out.data(), {T, Hq, d}), lse(r.lse.data(), {Hq, T});
  hdp::attention_forward(out, lse, q, k, v, cu, p.window);
  Tensor dout(p.dout.data(), {T, Hq, d});
  hdp::attention_backward(Tensor(r.dq.data(), {T, Hq, d}), Tensor(r.dk.data(), {T, Hkv, d}),
                          Tensor(r.dv.data(), {T, Hkv, d}), dout, q, k, v, out, lse, cu, p.window);
  return r;
}

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double a : x) m = std::max(m, std::fabs(a));
  return m;
}

// max |a - b| <= tol * max(1, max|b|)
template <class A>
void expect_close(const std::vector<A>& a, const std::vector<double>& b, double tol, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  const double bound = tol * std::max(1.0, max_abs(b));
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (!(e <= worst)) {
      worst = e;
      at = i;
    }
  }
  EXPECT_LE(worst, bound) << what << ": worst error at index " << at << " kernel " << a[at] << " reference "
                          << b[at];
}

void check_against_reference(std::vector<int32_t> lens, int64_t Hq, int64_t Hkv, int64_t d, uint32_t seed,
                             float mag = 1.5f, int64_t window = hdp::kNoWindow) {
  SCOPED_TRACE(::testing::Message() << "Hq=" << Hq << " Hkv=" << Hkv << " d=" << d << " docs=" << lens.size()
                                    << " window=" << window);
  Problem p = make_problem(lens, Hq, Hkv, d, seed, mag, window);
  const KernelOut got = run_kernel(p);
  const auto q = to_double(p.q), k = to_double(p.k), v = to_double(p.v), dout = to_double(p.dout);
  const RefOut ref = ref_forward(p, q, k, v);
  expect_close(got.out, ref.out, 1e-5, "out");
  expect_close(got.lse, ref.lse, 1e-5, "lse");
  const RefGrad g = ref_backward(p, q, k, v, dout);
  expect_close(got.dq, g.dq, 3e-5, "dq");
  expect_close(got.dk, g.dk, 3e-5, "dk");
  expect_close(got.dv, g.dv, 3e-5, "dv");
}

}  // namespace

TEST(KernelsAttention, TileSizesAreWhatTheseTestsAssume) {
  // The shapes below are chosen to straddle these tiles.
  EXPECT_EQ(hdp::cpu::attention_query_tile(), 64);
  EXPECT_EQ(hdp::cpu::attention_key_tile(), 64);
}

TEST(KernelsAttention, SingleDocumentSeveralTilesGqa) {
  // 200 rows: > 3 tiles of 64, not a multiple.
  check_against_reference({200}, 4, 2, 64, 1);
}

TEST(KernelsAttention, PackedUnevenDocumentsMqa) {
  check_against_reference({1, 70, 1, 130, 3, 64, 1, 65}, 4, 1, 16, 2);
}

TEST(KernelsAttention, MultiHeadNoGrouping) { check_against_reference({90, 37}, 3, 3, 32, 3); }

TEST(KernelsAttention, HeadDims) {
  for (int64_t d : {4, 8, 12, 20, 64, 80, 128}) check_against_reference({150, 7, 1}, 4, 2, d, 10 + d);
}

TEST(KernelsAttention, EmptyDocumentsInCuSeqlens) { check_against_reference({0, 5, 0, 66, 0}, 2, 1, 8, 4); }

TEST(KernelsAttention, LargeScoresExerciseOnlineRescaling) {
  // Scores of order +-50: the running max must be rescaled across key tiles.
  check_against_reference({257}, 2, 1, 16, 5, 4.0f);
}

TEST(KernelsAttention, LseMatchesHandComputedForTinyCase) {
  // One doc of 2 tokens, d = 4: lse of row 0 is its only scaled score.
  std::vector<float> q = {1, 0, 0, 0, 0, 1, 0, 0}, k = {2, 0, 0, 0, 0, 4, 0, 0}, v = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<float> out(8), lse(2);
  std::vector<int32_t> cu = {0, 2};
  hdp::attention_forward(Tensor(out.data(), {2, 1, 4}), Tensor(lse.data(), {1, 2}), Tensor(q.data(), {2, 1, 4}),
                         Tensor(k.data(), {2, 1, 4}), Tensor(v.data(), {2, 1, 4}), IndexTensor(cu.data(), {2}));
  // Row 0: score q0.k0 * 0.5 = 1; out = v0.  Row 1: scores 0 and 2.
  EXPECT_NEAR(lse[0], 1.0, 1e-6);
  EXPECT_NEAR(lse[1], std::log(1.0 + std::exp(2.0)), 1e-6);
  const double p1 = std::exp(2.0) / (1.0 + std::exp(2.0));
  for (int c = 0; c < 4; ++c) {
    EXPECT_NEAR(out[c], v[c], 1e-6);
    EXPECT_NEAR(out[4 + c], (1 - p1) * v[c] + p1 * v[4 + c], 1e-6);
  }
}

namespace {

// L = sum(out * dout); dL/dx by central differences of the double reference.
void check_finite_differences(Problem& p) {
  SCOPED_TRACE(::testing::Message() << "window=" << p.window);
  const KernelOut got = run_kernel(p);
  auto q = to_double(p.q), k = to_double(p.k), v = to_double(p.v);
  const auto dout = to_double(p.dout);
  auto loss = [&]() {
    const RefOut r = ref_forward(p, q, k, v);
    double s = 0;
    for (size_t i = 0; i < r.out.size(); ++i) s += r.out[i] * dout[i];
    return s;
  };
  const double h = 1e-4;
  auto fd = [&](std::vector<double>& x, const std::vector<float>& g, const char* what) {
    // Every 3rd element keeps the test fast while touching every row, head and column class.
    std::vector<float> kg;
    std::vector<double> ng;
    for (size_t i = 0; i < x.size(); i += 3) {
      const double x0 = x[i];
      x[i] = x0 + h;
      const double lp = loss();
      x[i] = x0 - h;
      const double lm = loss();
      x[i] = x0;
      ng.push_back((lp - lm) / (2 * h));
      kg.push_back(g[i]);
    }
    expect_close(kg, ng, 2e-5, what);
  };
  fd(q, got.dq, "dq vs FD");
  fd(k, got.dk, "dk vs FD");
  fd(v, got.dv, "dv vs FD");
}

void check_deterministic(Problem& p) {
  SCOPED_TRACE(::testing::Message() << "window=" << p.window);
  const KernelOut a = run_kernel(p);
  const KernelOut b = run_kernel(p);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const KernelOut c = run_kernel(p);
  omp_set_num_threads(threads);
  for (const KernelOut* o : {&b, &c}) {
    EXPECT_EQ(0, std::memcmp(a.out.data(), o->out.data(), a.out.size() * 4));
    EXPECT_EQ(0, std::memcmp(a.lse.data(), o->lse.data(), a.lse.size() * 4));
    EXPECT_EQ(0, std::memcmp(a.dq.data(), o->dq.data(), a.dq.size() * 4));
    EXPECT_EQ(0, std::memcmp(a.dk.data(), o->dk.data(), a.dk.size() * 4));
    EXPECT_EQ(0, std::memcmp(a.dv.data(), o->dv.data(), a.dv.size() * 4));
  }
}

}  // namespace

TEST(KernelsAttention, BackwardMatchesFiniteDifferencesOfReference) {
  Problem p = make_problem({1, 9, 70}, 4, 2, 8, 6);
  check_finite_differences(p);
}

TEST(KernelsAttention, DeterministicAcrossRunsAndThreadCounts) {
  Problem p = make_problem({300, 45, 1, 170}, 4, 2, 64, 7);
  check_deterministic(p);
}

TEST(KernelsAttention, RejectsBadShapes) {
  std::vector<float> buf(4096);
  std::vector<int32_t> cu = {0, 8};
  IndexTensor cus(cu.data(), {2});
  Tensor q(buf.data(), {8, 3, 4}), k(buf.data(), {8, 2, 4}), v(buf.data(), {8, 2, 4});
  Tensor out(buf.data(), {8, 3, 4}), lse(buf.data(), {3, 8});
  // 3 query heads over 2 kv heads
  EXPECT_THROW(hdp::attention_forward(out, lse, q, k, v, cus), std::invalid_argument);
  Tensor q4(buf.data(), {8, 4, 4}), out4(buf.data(), {8, 4, 4}), lse_bad(buf.data(), {8, 4});
  EXPECT_THROW(hdp::attention_forward(out4, lse_bad, q4, k, v, cus), std::invalid_argument);
  std::vector<int32_t> bad_cu = {0, 9};
  EXPECT_THROW(hdp::attention_forward(out4, Tensor(buf.data(), {4, 8}), q4, k, v, IndexTensor(bad_cu.data(), {2})),
               std::invalid_argument);
  EXPECT_THROW(hdp::attention_forward(out4, Tensor(buf.data(), {4, 8}), q4, k, v, cus, -1), std::invalid_argument);
  EXPECT_THROW(hdp::attention_backward(q4, k, v, out4, q4, k, v, out4, Tensor(buf.data(), {4, 8}), cus, -1),
               std::invalid_argument);
  Tensor cuda_q(buf.data(), {8, 4, 4}, hdp::Device::CUDA);
  EXPECT_THROW(hdp::attention_forward(out4, Tensor(buf.data(), {4, 8}), cuda_q, k, v, cus), std::invalid_argument);
  try {
    hdp::attention_forward(out4, lse_bad, q4, k, v, cus);
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("attention_forward"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[8, 4]"), std::string::npos) << e.what();
  }
}

TEST(KernelsAttention, AllCudaTensorsThrowUnsupportedDevice) {
  if (hdp::cuda::available()) GTEST_SKIP() << "a CUDA device is present: host memory posing as device tensors would run";
  std::vector<float> buf(4096);
  std::vector<int32_t> cu = {0, 8};
  const auto dev = hdp::Device::CUDA;
  Tensor q(buf.data(), {8, 2, 4}, dev), k(buf.data(), {8, 1, 4}, dev), out(buf.data(), {8, 2, 4}, dev),
      lse(buf.data(), {2, 8}, dev);
  EXPECT_THROW(hdp::attention_forward(out, lse, q, k, k, IndexTensor(cu.data(), {2}, dev)), hdp::UnsupportedDevice);
}

// ---- sliding window ----------------------------------------------------------------

TEST(KernelsAttention, SlidingWindowSmallerThanDocumentsGqa) {
  // Windows below, at and just past the 64-row tiles, and one key only.
  for (int64_t w : {1, 7, 63, 64, 65, 150}) check_against_reference({200, 130}, 4, 2, 64, 20 + w, 1.5f, w);
}

TEST(KernelsAttention, SlidingWindowPackedUnevenDocumentsMqa) {
  // Documents shorter than, equal to and longer than the window.
  for (int64_t w : {37, 64}) check_against_reference({1, 70, 1, 130, 3, 64, 1, 65, 37}, 4, 1, 16, 30 + w, 1.5f, w);
}

TEST(KernelsAttention, SlidingWindowHeadDimsAndLargeScores) {
  for (int64_t d : {8, 80, 128}) check_against_reference({150, 7, 1}, 4, 2, d, 40 + d, 1.5f, 50);
  // Scores of order +-50: the running max leaves the window as it slides.
  check_against_reference({257}, 2, 1, 16, 5, 4.0f, 70);
}

TEST(KernelsAttention, WindowOfOneSeesOnlyItself) {
  // Each query's only key is its own: out = v of its row, lse = its own scaled score.
  Problem p = make_problem({3, 100}, 2, 1, 8, 9, 1.5f, 1);
  const KernelOut got = run_kernel(p);
  const double scale = 1.0 / std::sqrt(8.0);
  for (int64_t i = 0; i < p.T; ++i)
    for (int64_t h = 0; h < 2; ++h) {
      double dot = 0;
      for (int64_t c = 0; c < 8; ++c) {
        EXPECT_NEAR(got.out[(i * 2 + h) * 8 + c], p.v[i * 8 + c], 1e-6);
        dot += static_cast<double>(p.q[(i * 2 + h) * 8 + c]) * p.k[i * 8 + c];
      }
      EXPECT_NEAR(got.lse[h * p.T + i], dot * scale, 1e-5);
    }
}

TEST(KernelsAttention, WindowNotSmallerThanAnyDocumentIsFullAttentionBitForBit) {
  for (int64_t w : {int64_t{200}, int64_t{201}, int64_t{5000}, int64_t{1} << 40, std::numeric_limits<int64_t>::max()}) {
    SCOPED_TRACE(w);
    Problem full = make_problem({200, 1, 70}, 4, 2, 32, 8);
    Problem windowed = make_problem({200, 1, 70}, 4, 2, 32, 8, 1.5f, w);
    const KernelOut a = run_kernel(full), b = run_kernel(windowed);
    EXPECT_EQ(a.out, b.out);
    EXPECT_EQ(a.lse, b.lse);
    EXPECT_EQ(a.dq, b.dq);
    EXPECT_EQ(a.dk, b.dk);
    EXPECT_EQ(a.dv, b.dv);
  }
}

TEST(KernelsAttention, SlidingWindowBackwardMatchesFiniteDifferencesOfReference) {
  Problem p = make_problem({1, 9, 70}, 4, 2, 8, 16, 1.5f, 13);
  check_finite_differences(p);
}

TEST(KernelsAttention, SlidingWindowDeterministicAcrossRunsAndThreadCounts) {
  Problem p = make_problem({300, 45, 1, 170}, 4, 2, 64, 17, 1.5f, 100);
  check_deterministic(p);
}

TEST(KernelsAttention, SlidingWindowNeverReadsTilesOutsideTheWindow) {
  // NaN in key and value row 0: a kernel that loaded (and masked) key tiles outside
  // the window would spread it (0 * NaN = NaN) to every row of a 512-token document.
  // Rows a few windows away must instead match the reference of the clean inputs:
  // the kernel only visits tiles near the diagonal, so its cost is O(T W), not O(T^2).
  const int64_t w = 64, far = 3 * w;
  Problem p = make_problem({512}, 2, 1, 16, 18, 1.5f, w);
  Problem clean = p;
  for (int64_t c = 0; c < p.d; ++c) p.k[c] = p.v[c] = std::numeric_limits<float>::quiet_NaN();
  const KernelOut got = run_kernel(p);
  const auto q = to_double(clean.q), k = to_double(clean.k), v = to_double(clean.v), dout = to_double(clean.dout);
  const RefOut ref = ref_forward(clean, q, k, v);
  const RefGrad g = ref_backward(clean, q, k, v, dout);
  auto rows_from = [&](const auto& x, int64_t row_numel) {
    return std::vector<double>(x.begin() + far * row_numel, x.end());
  };
  std::vector<double> lse_far, ref_lse_far;
  for (int64_t h = 0; h < p.Hq; ++h)
    for (int64_t i = far; i < p.T; ++i) {
      lse_far.push_back(got.lse[h * p.T + i]);
      ref_lse_far.push_back(ref.lse[h * p.T + i]);
    }
  expect_close(rows_from(got.out, p.Hq * p.d), rows_from(ref.out, p.Hq * p.d), 1e-5, "out");
  expect_close(lse_far, ref_lse_far, 1e-5, "lse");
  expect_close(rows_from(got.dq, p.Hq * p.d), rows_from(g.dq, p.Hq * p.d), 3e-5, "dq");
  expect_close(rows_from(got.dk, p.Hkv * p.d), rows_from(g.dk, p.Hkv * p.d), 3e-5, "dk");
  expect_close(rows_from(got.dv, p.Hkv * p.d), rows_from(g.dv, p.Hkv * p.d), 3e-5, "dv");
}

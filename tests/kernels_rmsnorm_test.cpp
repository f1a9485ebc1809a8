// RMSNorm forward against a double reference; backward against central finite
// differences of that reference (L = sum(y * G)), checking that dx and dw
// accumulate; thread-count independence.
//
// Tolerances: forward 2e-6 relative (float output of a double computation);
// FD in double with h = 1e-5 is accurate to ~1e-9, so the FD comparison measures
// the kernel's float error: 1e-5 of the largest gradient.

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/ops.h"
#include "test_util.h"

namespace {
using hdp::testing::random_floats;
using hdp::Tensor;


std::vector<double> ref_forward(const std::vector<double>& x, const std::vector<double>& w, int64_t T, int64_t H,
                                double eps, std::vector<double>* rstd = nullptr) {
  std::vector<double> y(T * H);
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < H; ++i) ss += x[t * H + i] * x[t * H + i];
    const double r = 1.0 / std::sqrt(ss / H + eps);
    if (rstd) rstd->push_back(r);
    for (int64_t i = 0; i < H; ++i) y[t * H + i] = w[i] * x[t * H + i] * r;
  }
  return y;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}
}  // namespace

TEST(KernelsRmsnorm, ForwardMatchesReference) {
  const int64_t T = 64, H = 300;  // H not a multiple of 8; T * H uses the threaded path
  const float eps = 1e-5f;
  const auto x = random_floats(T * H, 1, -3, 3), w = random_floats(H, 2, 0.5, 1.5);
  std::vector<float> y(T * H), rstd(T);
  hdp::rmsnorm_forward(Tensor(y.data(), {T, H}), Tensor(rstd.data(), {T}), Tensor(const_cast<float*>(x.data()), {T, H}),
                       Tensor(const_cast<float*>(w.data()), {H}), eps);
  std::vector<double> rref;
  const auto yref = ref_forward({x.begin(), x.end()}, {w.begin(), w.end()}, T, H, eps, &rref);
  for (int64_t t = 0; t < T; ++t) EXPECT_NEAR(rstd[t], rref[t], 2e-6 * rref[t]);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], yref[i], 2e-6 * std::max(1.0, std::fabs(yref[i]))) << i;
}

TEST(KernelsRmsnorm, BackwardMatchesFiniteDifferencesAndAccumulates) {
  const int64_t T = 6, H = 37;
  const double eps = 1e-5;
  const auto x = random_floats(T * H, 3, -2, 2), w = random_floats(H, 4, 0.5, 1.5), G = random_floats(T * H, 5);
  std::vector<float> y(T * H), rstd(T);
  hdp::rmsnorm_forward(Tensor(y.data(), {T, H}), Tensor(rstd.data(), {T}), Tensor(const_cast<float*>(x.data()), {T, H}),
                       Tensor(const_cast<float*>(w.data()), {H}), static_cast<float>(eps));
  const auto dx0 = random_floats(T * H, 6), dw0 = random_floats(H, 7);
  std::vector<float> dx = dx0, dw = dw0;
  hdp::rmsnorm_backward(Tensor(dx.data(), {T, H}), Tensor(dw.data(), {H}), Tensor(const_cast<float*>(G.data()), {T, H}),
                        Tensor(const_cast<float*>(x.data()), {T, H}), Tensor(const_cast<float*>(w.data()), {H}),
                        Tensor(rstd.data(), {T}));
  std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end());
  auto loss = [&]() {
    const auto yy = ref_forward(xd, wd, T, H, eps);
    double s = 0;
    for (size_t i = 0; i < yy.size(); ++i) s += yy[i] * G[i];
    return s;
  };
  const double h = 1e-5;
  auto fd = [&](std::vector<double>& p) {
    std::vector<double> g(p.size());
    for (size_t i = 0; i < p.size(); ++i) {
      const double p0 = p[i];
      p[i] = p0 + h;
      const double lp = loss();
      p[i] = p0 - h;
      const double lm = loss();
      p[i] = p0;
      g[i] = (lp - lm) / (2 * h);
    }
    return g;
  };
  const auto gx = fd(xd), gw = fd(wd);
  const double sx = max_abs(gx), sw = max_abs(gw);
  for (size_t i = 0; i < gx.size(); ++i) ASSERT_NEAR(dx[i] - dx0[i], gx[i], 1e-5 * sx) << "dx " << i;
  for (size_t i = 0; i < gw.size(); ++i) ASSERT_NEAR(dw[i] - dw0[i], gw[i], 1e-5 * sw) << "dw " << i;
}

TEST(KernelsRmsnorm, BackwardSameBitsForAnyThreadCount) {
  const int64_t T = 300, H = 200;
  const auto x = random_floats(T * H, 8), w = random_floats(H, 9), G = random_floats(T * H, 10);
  std::vector<float> y(T * H), rstd(T);
  hdp::rmsnorm_forward(Tensor(y.data(), {T, H}), Tensor(rstd.data(), {T}), Tensor(const_cast<float*>(x.data()), {T, H}),
                       Tensor(const_cast<float*>(w.data()), {H}), 1e-6f);
  auto run = [&](std::vector<float>& dx, std::vector<float>& dw) {
    dx.assign(T * H, 0.5f);
    dw.assign(H, 0.25f);
    hdp::rmsnorm_backward(Tensor(dx.data(), {T, H}), Tensor(dw.data(), {H}), Tensor(const_cast<float*>(G.data()), {T, H}),
                          Tensor(const_cast<float*>(x.data()), {T, H}), Tensor(const_cast<float*>(w.data()), {H}),
                          Tensor(rstd.data(), {T}));
  };
  std::vector<float> dx2, dw2, dx1, dw1;
  run(dx2, dw2);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  run(dx1, dw1);
  omp_set_num_threads(threads);
  EXPECT_EQ(0, std::memcmp(dx1.data(), dx2.data(), dx1.size() * 4));
  EXPECT_EQ(0, std::memcmp(dw1.data(), dw2.data(), dw1.size() * 4));
}

TEST(KernelsRmsnorm, ShapeChecks) {
  std::vector<float> buf(1000);
  EXPECT_THROW(hdp::rmsnorm_forward(Tensor(buf.data(), {4, 8}), Tensor(buf.data(), {4}), Tensor(buf.data(), {4, 8}),
                                    Tensor(buf.data(), {7}), 1e-5f),
               std::invalid_argument);
  EXPECT_THROW(hdp::rmsnorm_forward(Tensor(buf.data(), {4, 8}), Tensor(buf.data(), {3}), Tensor(buf.data(), {4, 8}),
                                    Tensor(buf.data(), {8}), 1e-5f),
               std::invalid_argument);
}

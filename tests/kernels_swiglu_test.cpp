// SwiGLU against a double reference (forward) and central finite differences of
// it (backward, L = sum(out * G)); saturated inputs stay finite; the vectorised
// body and the scalar tail agree bit for bit.
//
// Tolerances: the kernel's exp has ~1e-7 relative error and a division, so the
// forward is within 1e-6 relative; FD (h = 1e-5, accurate to ~1e-9) vs the float
// backward: 2e-6 relative to max(1, |grad|).

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/ops.h"
#include "test_util.h"

namespace {
using hdp::testing::random_floats;
using hdp::Tensor;

double silu(double g) { return g / (1.0 + std::exp(-g)); }
}  // namespace

TEST(KernelsSwiglu, ForwardMatchesReference) {
  const int64_t T = 33, F = 1001;  // threaded path, odd length
  const auto g = random_floats(T * F, 1, -8, 8), u = random_floats(T * F, 2, -2, 2);
  std::vector<float> out(T * F);
  hdp::swiglu_forward(Tensor(out.data(), {T, F}), Tensor(const_cast<float*>(g.data()), {T, F}),
                      Tensor(const_cast<float*>(u.data()), {T, F}));
  for (size_t i = 0; i < out.size(); ++i) {
    const double ref = silu(g[i]) * u[i];
    ASSERT_NEAR(out[i], ref, 1e-6 * std::max(1.0, std::fabs(ref))) << i;
  }
}

TEST(KernelsSwiglu, BackwardMatchesFiniteDifferences) {
  const int64_t n = 257;
  const auto g = random_floats(n, 3, -6, 6), u = random_floats(n, 4, -2, 2), G = random_floats(n, 5, -1, 1);
  std::vector<float> dg(n, 9.0f), du(n, 9.0f);  // overwritten, not accumulated
  hdp::swiglu_backward(Tensor(dg.data(), {n}), Tensor(du.data(), {n}), Tensor(const_cast<float*>(G.data()), {n}),
                       Tensor(const_cast<float*>(g.data()), {n}), Tensor(const_cast<float*>(u.data()), {n}));
  const double h = 1e-5;
  for (int64_t i = 0; i < n; ++i) {
    // L = sum_i silu(g_i) u_i G_i is separable: differentiate element i alone.
    const double fdg = (silu(g[i] + h) - silu(g[i] - h)) / (2 * h) * u[i] * G[i];
    const double fdu = silu(g[i]) * G[i];
    EXPECT_NEAR(dg[i], fdg, 2e-6 * std::max(1.0, std::fabs(fdg))) << i;
    EXPECT_NEAR(du[i], fdu, 2e-6 * std::max(1.0, std::fabs(fdu))) << i;
  }
}

TEST(KernelsSwiglu, SaturatedInputsStayFinite) {
  std::vector<float> g = {-1000, -100, -90, -88, 0, 88, 90, 100, 1000}, u(9, 1.0f), dy(9, 1.0f);
  const int64_t n = 9;
  std::vector<float> out(n), dg(n), du(n);
  hdp::swiglu_forward(Tensor(out.data(), {n}), Tensor(g.data(), {n}), Tensor(u.data(), {n}));
  hdp::swiglu_backward(Tensor(dg.data(), {n}), Tensor(du.data(), {n}), Tensor(dy.data(), {n}), Tensor(g.data(), {n}),
                       Tensor(u.data(), {n}));
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_TRUE(std::isfinite(out[i]) && std::isfinite(dg[i]) && std::isfinite(du[i])) << g[i];
    EXPECT_NEAR(out[i], silu(g[i]), 1e-6 * std::max(1.0, std::fabs(silu(g[i])))) << g[i];
  }
  EXPECT_EQ(out[8], 1000.0f);
  EXPECT_NEAR(dg[8], 1.0f, 1e-6);
  EXPECT_NEAR(dg[0], 0.0f, 1e-30);
}

TEST(KernelsSwiglu, VectorBodyEqualsScalarTailBitForBit) {
  // The kernel runs whole SIMD vectors and a scalar tail; a one-element call is all
  // tail. Every element of a long (threaded, vectorised) call must equal, bit for
  // bit, the same element computed alone, so results do not depend on where an
  // element falls (vector width, chunk, tensor length).
  const int64_t n = 3 * 4096 + 37;
  const auto g = random_floats(n, 6, -20, 20), u = random_floats(n, 7, -2, 2), G = random_floats(n, 8, -1, 1);
  auto T = [](const float* p, int64_t len) { return Tensor(const_cast<float*>(p), {len}); };
  std::vector<float> out(n), dg(n), du(n);
  hdp::swiglu_forward(T(out.data(), n), T(g.data(), n), T(u.data(), n));
  hdp::swiglu_backward(T(dg.data(), n), T(du.data(), n), T(G.data(), n), T(g.data(), n), T(u.data(), n));
  for (int64_t i = 0; i < n; ++i) {
    float out1, dg1, du1;
    hdp::swiglu_forward(T(&out1, 1), T(&g[i], 1), T(&u[i], 1));
    hdp::swiglu_backward(T(&dg1, 1), T(&du1, 1), T(&G[i], 1), T(&g[i], 1), T(&u[i], 1));
    ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(out1)) << i << " g=" << g[i];
    ASSERT_EQ(std::bit_cast<uint32_t>(dg[i]), std::bit_cast<uint32_t>(dg1)) << i << " g=" << g[i];
    ASSERT_EQ(std::bit_cast<uint32_t>(du[i]), std::bit_cast<uint32_t>(du1)) << i << " g=" << g[i];
  }
}

TEST(KernelsSwiglu, BackwardWithOutputEqualsForwardThenBackwardBitForBit) {
  // The MLP's backward recomputes the forward's output inside the backward kernel:
  // it must be what swiglu_forward gives, and the gradients what the plain backward
  // gives, bit for bit (threaded, vectorised, and a partial last vector).
  for (const int64_t n : {int64_t{1}, int64_t{13}, int64_t{5 * 4096 + 21}}) {
    const auto g = random_floats(n, 21, -20, 20), u = random_floats(n, 22, -2, 2), G = random_floats(n, 23, -1, 1);
    auto T = [](const float* p, int64_t len) { return Tensor(const_cast<float*>(p), {len}); };
    std::vector<float> out(n), dg(n), du(n), out2(n, 7.0f), dg2(n, 7.0f), du2(n, 7.0f);
    hdp::swiglu_forward(T(out.data(), n), T(g.data(), n), T(u.data(), n));
    hdp::swiglu_backward(T(dg.data(), n), T(du.data(), n), T(G.data(), n), T(g.data(), n), T(u.data(), n));
    hdp::swiglu_backward(T(dg2.data(), n), T(du2.data(), n), T(G.data(), n), T(g.data(), n), T(u.data(), n),
                         T(out2.data(), n));
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(out2[i])) << n << " " << i;
      ASSERT_EQ(std::bit_cast<uint32_t>(dg[i]), std::bit_cast<uint32_t>(dg2[i])) << n << " " << i;
      ASSERT_EQ(std::bit_cast<uint32_t>(du[i]), std::bit_cast<uint32_t>(du2[i])) << n << " " << i;
    }
  }
  std::vector<float> a(8), b(8), c(9);
  EXPECT_THROW(hdp::swiglu_backward(Tensor(a.data(), {8}), Tensor(a.data(), {8}), Tensor(a.data(), {8}),
                                    Tensor(b.data(), {8}), Tensor(b.data(), {8}), Tensor(c.data(), {9})),
               std::invalid_argument);
}

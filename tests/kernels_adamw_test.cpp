// AdamW against values worked out by hand (in double, textbook formulas) for two
// elements over three steps, with weight decay and a gradient scale; the float
// kernel must agree to 1e-6 relative (plus 1e-8 absolute for m, which at step 3
// is a small difference of terms ~0.03 and carries their float rounding). Plus a large tensor (threaded path) against
// a serial float implementation of the torch sequence, bit for bit.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/ops.h"

namespace {
using hdp::Tensor;

// Parameters, gradients and moments of n elements as training has them (v >= 0).
struct AdamwState {
  std::vector<float> p, g, m, v;
};
AdamwState random_state(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  AdamwState s{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
  for (int64_t i = 0; i < n; ++i) {
    s.p[i] = u(rng);
    s.g[i] = u(rng);
    s.m[i] = 0.1f * u(rng);
    s.v[i] = 0.01f * std::fabs(u(rng));
  }
  return s;
}
}  // namespace

TEST(KernelsAdamw, ThreeStepsAgainstHandComputation) {
  hdp::AdamWStep s;
  s.lr = 0.01f;
  s.beta1 = 0.9f;
  s.beta2 = 0.95f;
  s.eps = 1e-8f;
  s.weight_decay = 0.1f;
  s.grad_scale = 0.5f;
  std::vector<float> p = {1.0f, -2.0f}, m = {0, 0}, v = {0, 0};
  const std::vector<std::vector<float>> grads = {{0.2f, -0.4f}, {0.1f, 0.3f}, {-0.6f, 0.05f}};
  double P[2] = {1.0, -2.0}, M[2] = {0, 0}, Vv[2] = {0, 0};
  for (int step = 1; step <= 3; ++step) {
    s.step = step;
    std::vector<float> g = grads[step - 1];
    hdp::adamw_update(Tensor(p.data(), {2}), Tensor(g.data(), {2}), Tensor(m.data(), {2}), Tensor(v.data(), {2}), s);
    for (int i = 0; i < 2; ++i) {
      // Decoupled decay, moments, bias-corrected update.
      const double gi = 0.5 * g[i];
      P[i] *= 1.0 - 0.01 * 0.1;
      M[i] = 0.9 * M[i] + 0.1 * gi;
      Vv[i] = 0.95 * Vv[i] + 0.05 * gi * gi;
      const double mhat = M[i] / (1 - std::pow(0.9, step)), vhat = Vv[i] / (1 - std::pow(0.95, step));
      P[i] -= 0.01 * mhat / (std::sqrt(vhat) + 1e-8);
      EXPECT_NEAR(m[i], M[i], 1e-6 * std::fabs(M[i]) + 1e-8) << "step " << step;
      EXPECT_NEAR(v[i], Vv[i], 1e-6 * std::fabs(Vv[i]) + 1e-12) << "step " << step;
      EXPECT_NEAR(p[i], P[i], 1e-6 * std::fabs(P[i])) << "step " << step;
    }
  }
  // Step 1 by hand for element 0: g = 0.1, m = 0.01, v = 5e-4, mhat = 0.1,
  // vhat = 0.01, update = 0.01 * 0.1 / 0.1 = 0.01 after decay 1 -> 0.999: 0.989.
  std::vector<float> p1 = {1.0f}, m1 = {0}, v1 = {0}, g1 = {0.2f};
  s.step = 1;
  hdp::adamw_update(Tensor(p1.data(), {1}), Tensor(g1.data(), {1}), Tensor(m1.data(), {1}), Tensor(v1.data(), {1}), s);
  EXPECT_NEAR(p1[0], 0.989, 1e-6);
}

TEST(KernelsAdamw, LargeTensorMatchesSerialFloatSequence) {
  const int64_t n = 100000;
  auto [p, g, m, v] = random_state(n, 1);
  std::vector<float> p2 = p, m2 = m, v2 = v;
  hdp::AdamWStep s;
  s.lr = 3e-4f;
  s.beta1 = 0.9f;
  s.beta2 = 0.95f;
  s.eps = 1e-8f;
  s.weight_decay = 0.1f;
  s.step = 7;
  s.grad_scale = 0.8f;
  hdp::adamw_update(Tensor(p.data(), {n}), Tensor(g.data(), {n}), Tensor(m.data(), {n}), Tensor(v.data(), {n}), s);
  // torch's single-tensor sequence in float with double-formed scalars.
  const float decay = static_cast<float>(1.0 - double(s.lr) * double(s.weight_decay));
  const float w1 = static_cast<float>(1.0 - double(s.beta1));
  const float omb2 = static_cast<float>(1.0 - double(s.beta2));
  const float step_size = static_cast<float>(double(s.lr) / (1.0 - std::pow(double(s.beta1), 7.0)));
  const float bc2 = static_cast<float>(std::sqrt(1.0 - std::pow(double(s.beta2), 7.0)));
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * s.grad_scale;
    const float pi = p2[i] * decay;
    const float mi = m2[i] + w1 * (gi - m2[i]);
    const float vi = v2[i] * s.beta2 + omb2 * gi * gi;
    p2[i] = pi - step_size * (mi / (std::sqrt(vi) / bc2 + s.eps));
    m2[i] = mi;
    v2[i] = vi;
  }
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_NEAR(p[i], p2[i], 1e-7f * std::fabs(p2[i]) + 1e-12f) << i;
    ASSERT_EQ(m[i], m2[i]) << i;
  }
}

TEST(KernelsAdamw, RejectsBadArguments) {
  std::vector<float> a(4), b(5);
  hdp::AdamWStep s;
  EXPECT_THROW(hdp::adamw_update(Tensor(a.data(), {4}), Tensor(b.data(), {5}), Tensor(a.data(), {4}),
                                 Tensor(a.data(), {4}), s),
               std::invalid_argument);
  s.step = 0;
  EXPECT_THROW(hdp::adamw_update(Tensor(a.data(), {4}), Tensor(a.data(), {4}), Tensor(a.data(), {4}),
                                 Tensor(a.data(), {4}), s),
               std::invalid_argument);
}

TEST(KernelsAdamw, TheBf16CopyIsTheUpdatedParameterRounded) {
  // Mixed precision's compute copy written by the update's own pass: each element
  // the updated fp32 parameter rounded to nearest even, as copy rounds it; the fp32
  // results the same as without the copy, bit for bit.
  const int64_t n = 70001;  // threaded, and not a whole number of packs
  auto [p, g, m, v] = random_state(n, 2);
  std::vector<float> p2 = p, m2 = m, v2 = v;
  std::vector<hdp::bf16> copy(n, hdp::to_bf16(5.0f)), rounded(n);
  const hdp::AdamWStep s{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 3};
  hdp::adamw_update(Tensor(p.data(), {n}), Tensor(g.data(), {n}), Tensor(m.data(), {n}), Tensor(v.data(), {n}), s,
                    Tensor::of_bf16(copy.data(), {n}));
  hdp::adamw_update(Tensor(p2.data(), {n}), Tensor(g.data(), {n}), Tensor(m2.data(), {n}), Tensor(v2.data(), {n}), s);
  hdp::copy(Tensor::of_bf16(rounded.data(), {n}), Tensor(p2.data(), {n}));
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(std::memcmp(&p[i], &p2[i], 4), 0) << i;
    ASSERT_EQ(std::memcmp(&m[i], &m2[i], 4), 0) << i;
    ASSERT_EQ(std::memcmp(&v[i], &v2[i], 4), 0) << i;
    ASSERT_EQ(copy[i].bits, rounded[i].bits) << i;
  }
  // The copy must be bf16 and of the parameter's shape.
  std::vector<float> wrong(n);
  EXPECT_THROW(hdp::adamw_update(Tensor(p.data(), {n}), Tensor(g.data(), {n}), Tensor(m.data(), {n}),
                                 Tensor(v.data(), {n}), s, Tensor(wrong.data(), {n})),
               std::invalid_argument);
  EXPECT_THROW(hdp::adamw_update(Tensor(p.data(), {n}), Tensor(g.data(), {n}), Tensor(m.data(), {n}),
                                 Tensor(v.data(), {n}), s, Tensor::of_bf16(copy.data(), {n - 1})),
               std::invalid_argument);
}

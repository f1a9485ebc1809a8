// RoPE (rotate-half) against hand-computed values (LLaMA 3 scaled frequencies too), a double reference with the
// Hugging Face float32 frequencies, forward-then-backward identity, and the
// backward as the exact transpose: rope_backward(G) equals the finite-difference
// gradient of L = sum(rope(x) * G) of the reference.
//
// Tolerances: the reference uses the same float32 angle as the kernel (HF
// computes inv_freq and pos * inv_freq in float32), so only cos/sin rounding and
// two float products remain: 1e-6 relative to max(1, |value|). The op caches its
// cos/sin table; its results equal per-element sincosf bit for bit.

#include <gtest/gtest.h>

#include <math.h>

#include <bit>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "test_util.h"

namespace {
using hdp::testing::random_floats;
using hdp::IndexTensor;
using hdp::Tensor;


// HF: inv_freq = 1.0 / (theta ** (arange(0, d, 2).float() / d)), float32; angle = float(pos) * inv_freq (float32).
std::vector<double> ref_rope(const std::vector<double>& x, const std::vector<int32_t>& pos, int64_t heads, int64_t d,
                             float theta) {
  const int64_t T = static_cast<int64_t>(pos.size()), half = d / 2;
  std::vector<double> y(x.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t j = 0; j < half; ++j) {
        const float inv = 1.0f / std::pow(theta, static_cast<float>(2 * j) / static_cast<float>(d));
        const double a = static_cast<double>(static_cast<float>(pos[t]) * inv);
        const int64_t i = (t * heads + h) * d + j;
        y[i] = x[i] * std::cos(a) - x[i + half] * std::sin(a);
        y[i + half] = x[i + half] * std::cos(a) + x[i] * std::sin(a);
      }
  return y;
}
}  // namespace

TEST(KernelsRope, HandComputedValuesForOnePosition) {
  // d = 4, theta = 1e4: inv_freq = {1, 0.01}; pos = 3: angles 3 and 0.03.
  // Pairs (x0, x2) = (1, 3) rotated by 3 rad, (x1, x3) = (2, 4) by 0.03 rad:
  //   out0 = 1 cos 3 - 3 sin 3,  out2 = 3 cos 3 + 1 sin 3,
  //   out1 = 2 cos .03 - 4 sin .03,  out3 = 4 cos .03 + 2 sin .03.
  std::vector<float> x = {1, 2, 3, 4};
  std::vector<int32_t> pos = {3};
  hdp::rope_forward(Tensor(x.data(), {1, 1, 4}), IndexTensor(pos.data(), {1}), 10000.0f);
  EXPECT_NEAR(x[0], -1.4133525, 1e-6);
  EXPECT_NEAR(x[1], 1.8791181, 1e-6);
  EXPECT_NEAR(x[2], -2.8288575, 1e-6);
  EXPECT_NEAR(x[3], 4.0581911, 1e-6);
  // Position 0 is the identity.
  std::vector<float> y = {1, 2, 3, 4};
  pos[0] = 0;
  hdp::rope_forward(Tensor(y.data(), {1, 1, 4}), IndexTensor(pos.data(), {1}), 10000.0f);
  EXPECT_EQ(y, (std::vector<float>{1, 2, 3, 4}));
}

TEST(KernelsRope, ForwardMatchesReferenceAndBackwardInverts) {
  for (int64_t d : {8, 64, 128, 6}) {
    SCOPED_TRACE(::testing::Message() << "d=" << d);
    const int64_t T = 70, heads = 3;
    std::vector<int32_t> pos(T);
    for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>((t * 977) % 8192);  // large positions too
    const auto x0 = random_floats(T * heads * d, static_cast<uint32_t>(d));
    std::vector<float> x = x0;
    hdp::rope_forward(Tensor(x.data(), {T, heads, d}), IndexTensor(pos.data(), {T}), 500000.0f);
    const auto ref = ref_rope({x0.begin(), x0.end()}, pos, heads, d, 500000.0f);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], ref[i], 1e-6) << i;
    hdp::rope_backward(Tensor(x.data(), {T, heads, d}), IndexTensor(pos.data(), {T}), 500000.0f);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], x0[i], 1e-6) << i;
  }
}

TEST(KernelsRope, BackwardIsGradientOfForward) {
  const int64_t T = 5, heads = 2, d = 8;
  const std::vector<int32_t> pos = {0, 1, 7, 100, 3000};
  const auto x = random_floats(T * heads * d, 1), G = random_floats(T * heads * d, 2);
  std::vector<double> xd(x.begin(), x.end());
  auto loss = [&]() {
    const auto y = ref_rope(xd, pos, heads, d, 10000.0f);
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * G[i];
    return s;
  };
  std::vector<float> g = G;
  std::vector<int32_t> p = pos;
  hdp::rope_backward(Tensor(g.data(), {T, heads, d}), IndexTensor(p.data(), {T}), 10000.0f);
  const double h = 1e-6;
  for (size_t i = 0; i < xd.size(); ++i) {
    const double x0 = xd[i];
    xd[i] = x0 + h;
    const double lp = loss();
    xd[i] = x0 - h;
    const double lm = loss();
    xd[i] = x0;
    EXPECT_NEAR(g[i], (lp - lm) / (2 * h), 1e-6) << i;
  }
}

TEST(KernelsRope, QueriesAndKeysInOneCallEqualTwoCalls) {
  const int64_t T = 33, heads = 4, kv_heads = 2, d = 64;
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>((t * 331) % 5000);
  const IndexTensor positions(pos.data(), {T});
  const auto q0 = random_floats(T * heads * d, 11), k0 = random_floats(T * kv_heads * d, 12);
  std::vector<float> q = q0, k = k0, q1 = q0, k1 = k0;
  for (const bool backward : {false, true}) {
    const auto rotate = backward ? hdp::rope_backward : hdp::rope_forward;
    rotate(Tensor(q.data(), {T, heads, d}), positions, 10000.0f, Tensor(k.data(), {T, kv_heads, d}));
    rotate(Tensor(q1.data(), {T, heads, d}), positions, 10000.0f, Tensor());
    rotate(Tensor(k1.data(), {T, kv_heads, d}), positions, 10000.0f, Tensor());
    EXPECT_EQ(q, q1);
    EXPECT_EQ(k, k1);
  }
  // The keys must have the queries' tokens and head size.
  EXPECT_THROW(hdp::rope_forward(Tensor(q.data(), {T, heads, d}), positions, 10000.0f,
                                 Tensor(k.data(), {T, kv_heads * 2, d / 2})),
               std::invalid_argument);
  EXPECT_THROW(hdp::rope_forward(Tensor(q.data(), {T, heads, d}), positions, 10000.0f,
                                 Tensor(k.data(), {T - 1, kv_heads, d})),
               std::invalid_argument);
}

TEST(KernelsRope, RejectsOddHeadDimAndWrongPositions) {
  std::vector<float> buf(100);
  std::vector<int32_t> pos(5);
  EXPECT_THROW(hdp::rope_forward(Tensor(buf.data(), {5, 2, 5}), IndexTensor(pos.data(), {5}), 1e4f),
               std::invalid_argument);
  EXPECT_THROW(hdp::rope_forward(Tensor(buf.data(), {5, 2, 4}), IndexTensor(pos.data(), {4}), 1e4f),
               std::invalid_argument);
}

namespace {
// The kernel's formula evaluated directly per element (sincosf of the float angle),
// as the kernel computed it before it kept a table.
std::vector<float> direct_rope(std::vector<float> x, const std::vector<int32_t>& pos, int64_t heads, int64_t d,
                               float theta, bool inverse) {
  const int64_t half = d / 2;
  for (size_t t = 0; t < pos.size(); ++t)
    for (int64_t j = 0; j < half; ++j) {
      const float inv = 1.0f / std::pow(theta, static_cast<float>(2 * j) / static_cast<float>(d));
      float s, c;
      ::sincosf(static_cast<float>(pos[t]) * inv, &s, &c);
      const float sn = (inverse ? -1.0f : 1.0f) * s;
      for (int64_t h = 0; h < heads; ++h) {
        float* lo = x.data() + (t * heads + h) * d;
        const float x1 = lo[j], x2 = lo[j + half];
        lo[j] = x1 * c - x2 * sn;
        lo[j + half] = x2 * c + x1 * sn;
      }
    }
  return x;
}
}  // namespace

TEST(KernelsRope, CachedAnglesEqualSincosfBitForBit) {
  // The op keeps cos/sin per (position, frequency) and grows the table to the largest
  // position seen; a new theta or head dim rebuilds it. Every call, in any order,
  // must give exactly the bits of sincosf evaluated per element.
  const int64_t heads = 2;
  struct Call {
    int64_t d;
    float theta;
    int32_t max_pos;
  };
  for (const Call& call : {Call{64, 10000.0f, 100}, Call{64, 10000.0f, 5000}, Call{64, 500000.0f, 300},
                           Call{16, 500000.0f, 70000}, Call{64, 10000.0f, 10}}) {
    SCOPED_TRACE(::testing::Message() << "d=" << call.d << " theta=" << call.theta << " max_pos=" << call.max_pos);
    const int64_t T = 37;
    std::vector<int32_t> pos(T);
    for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>((t * 7919) % (call.max_pos + 1));
    pos[T - 1] = call.max_pos;
    const auto x0 = random_floats(T * heads * call.d, 11);
    for (bool inverse : {false, true}) {
      std::vector<float> x = x0;
      const Tensor xt(x.data(), {T, heads, call.d});
      const hdp::IndexTensor pt(pos.data(), {T});
      if (inverse) hdp::rope_backward(xt, pt, call.theta);
      else hdp::rope_forward(xt, pt, call.theta);
      const auto want = direct_rope(x0, pos, heads, call.d, call.theta, inverse);
      for (size_t i = 0; i < x.size(); ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(x[i]), std::bit_cast<uint32_t>(want[i])) << i << " inverse=" << inverse;
    }
  }
}

TEST(KernelsRope, RejectsNegativePosition) {
  std::vector<float> buf(5 * 2 * 4);
  std::vector<int32_t> pos = {0, 1, 2, -3, 4};
  try {
    hdp::rope_forward(Tensor(buf.data(), {5, 2, 4}), IndexTensor(pos.data(), {5}), 1e4f);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("position -3 of row 3"), std::string::npos) << e.what();
  }
}

// The inverse frequencies of a small head, d = 8 and theta = 1e4: plain RoPE's
// 1e4^(-2j/8) = 1, 0.1, 0.01, 0.001, and LLaMA 3's scaling of them with factor 8,
// low_freq_factor 1, high_freq_factor 4 and an original context of 64 positions.
// The wavelengths 2 pi / f are 6.28, 62.8, 628 and 6283; those below 64 / 4 = 16
// keep f (j = 0), those above 64 / 1 = 64 get f / 8 (j = 2, 3), and 62.8 lies in
// between: s = (64 / 62.83 - 1) / (4 - 1) = 0.0061972, f = (1 - s) 0.1 / 8 + s 0.1
// = 0.013042256.
TEST(KernelsRope, InverseFrequenciesByHand) {
  hdp::RopeSettings rope(1e4);
  const std::vector<float> plain = rope.inverse_frequencies(8);
  const std::vector<double> plain_want = {1.0, 0.1, 0.01, 0.001};
  ASSERT_EQ(plain.size(), plain_want.size());
  for (size_t j = 0; j < plain.size(); ++j) EXPECT_NEAR(plain[j], plain_want[j], 1e-7 * plain_want[j]) << j;

  rope.rope_scaling = hdp::RopeScaling::Llama3;
  rope.rope_scaling_factor = 8;
  rope.rope_low_freq_factor = 1;
  rope.rope_high_freq_factor = 4;
  rope.rope_original_max_positions = 64;
  const std::vector<float> scaled = rope.inverse_frequencies(8);
  const std::vector<double> scaled_want = {1.0, 0.013042256, 0.00125, 0.000125};
  ASSERT_EQ(scaled.size(), scaled_want.size());
  for (size_t j = 0; j < scaled.size(); ++j) EXPECT_NEAR(scaled[j], scaled_want[j], 1e-6 * scaled_want[j]) << j;
  // Kept and divided frequencies are exactly the plain ones (divided by 8, a power of 2).
  EXPECT_EQ(scaled[0], plain[0]);
  EXPECT_EQ(scaled[2], plain[2] / 8);
  EXPECT_EQ(scaled[3], plain[3] / 8);

  // The op rotates by them: (1, 0) pairs at position 1 become (cos f_j, sin f_j).
  std::vector<float> x = {1, 1, 1, 1, 0, 0, 0, 0};
  std::vector<int32_t> pos = {1};
  hdp::rope_forward(Tensor(x.data(), {1, 1, 8}), IndexTensor(pos.data(), {1}), rope);
  for (size_t j = 0; j < 4; ++j) {
    EXPECT_NEAR(x[j], std::cos(scaled_want[j]), 1e-6) << j;
    EXPECT_NEAR(x[j + 4], std::sin(scaled_want[j]), 1e-6) << j;
  }
}

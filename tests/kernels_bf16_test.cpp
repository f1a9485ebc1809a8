// BF16: the conversions (round to nearest even, NaN, Inf, denormals, the largest
// values), the tensor's dtype-aware offsets, the op layer's dtype checks, and every
// CPU bf16 twin against its fp32 op.
//
// The twins' contract (kernels/cpu/bf16.cpp) is "read bf16 exactly, compute in
// fp32, round once on store". So the test feeds the fp32 op the same values the
// twin sees (inputs already rounded to bf16, held in fp32) and requires the twin's
// bf16 result to equal the fp32 result rounded to bf16, bit for bit (same kernel,
// same thread count, so there is nothing to tolerate). fp32 outputs of a twin (1/rms,
// log-sum-exp, cross-entropy statistics, gradients of weights) must equal the fp32
// op's exactly. A separate case bounds how far bf16 rounding of the inputs moves
// a result (BF16's unit round-off is 2^-8).

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <functional>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"
#include "test_util.h"

namespace {

using hdp::testing::thrown_message;

using hdp::bf16;
using hdp::DType;
using hdp::IndexTensor;
using hdp::Tensor;
using hdp::to_bf16;
using hdp::to_float;

uint16_t bits_of(float x) { return to_bf16(x).bits; }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

TEST(Bf16Conversion, RoundsToNearestTiesToEven) {
  EXPECT_EQ(bits_of(1.0f), 0x3F80);
  EXPECT_EQ(bits_of(-2.0f), 0xC000);
  // 1 + 2^-8 lies exactly between 1 (0x3F80, even) and 1 + 2^-7 (0x3F81): to even.
  EXPECT_EQ(bits_of(from_bits(0x3F808000u)), 0x3F80);
  // Between 0x3F81 (odd) and 0x3F82 (even): up to even.
  EXPECT_EQ(bits_of(from_bits(0x3F818000u)), 0x3F82);
  // Just off the tie goes to the nearer neighbour.
  EXPECT_EQ(bits_of(from_bits(0x3F808001u)), 0x3F81);
  EXPECT_EQ(bits_of(from_bits(0x3F807FFFu)), 0x3F80);
  // A carry into the exponent: the largest mantissa below 2 rounds to 2.
  EXPECT_EQ(bits_of(from_bits(0x3FFFFFFFu)), 0x4000);
  EXPECT_EQ(bits_of(-0.0f), 0x8000);
  EXPECT_EQ(bits_of(0.0f), 0x0000);
}

TEST(Bf16Conversion, NaNInfinityAndTheLargestValues) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(bits_of(inf), 0x7F80);
  EXPECT_EQ(bits_of(-inf), 0xFF80);
  EXPECT_TRUE(std::isnan(to_float(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload lies only in the low bits would round into Inf by plain
  // rounding; it must stay NaN, with its sign.
  EXPECT_TRUE(std::isnan(to_float(to_bf16(from_bits(0x7F800001u)))));
  const float negative_nan = to_float(to_bf16(from_bits(0xFF800001u)));
  EXPECT_TRUE(std::isnan(negative_nan));
  EXPECT_TRUE(std::signbit(negative_nan));
  // The largest bf16 (0x7F7F = (2 - 2^-7) 2^127) is exact; above it, half way to
  // the next binade rounds to even, which is Inf (IEEE overflow); FLT_MAX is past it.
  EXPECT_EQ(bits_of(from_bits(0x7F7F0000u)), 0x7F7F);
  EXPECT_EQ(bits_of(from_bits(0x7F7F7FFFu)), 0x7F7F);
  EXPECT_EQ(bits_of(from_bits(0x7F7F8000u)), 0x7F80);
  EXPECT_EQ(bits_of(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(bits_of(-std::numeric_limits<float>::max()), 0xFF80);
}

TEST(Bf16Conversion, Denormals) {
  // The smallest fp32 denormal is below half of the smallest bf16 denormal (2^-133): to +0.
  EXPECT_EQ(bits_of(from_bits(0x00000001u)), 0x0000);
  // Ties between denormals go to even too.
  EXPECT_EQ(bits_of(from_bits(0x00008000u)), 0x0000);
  EXPECT_EQ(bits_of(from_bits(0x00018000u)), 0x0002);
  EXPECT_EQ(bits_of(from_bits(0x00010000u)), 0x0001);  // the smallest bf16 denormal is exact
  EXPECT_EQ(to_float(bf16{0x0001}), from_bits(0x00010000u));
  // The largest fp32 denormal rounds up into the smallest normal bf16.
  EXPECT_EQ(bits_of(from_bits(0x007FFFFFu)), 0x0080);
}

TEST(Bf16Conversion, WideningIsExactForEveryBitPattern) {
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const bf16 x{static_cast<uint16_t>(b)};
    const float f = to_float(x);
    EXPECT_EQ(std::bit_cast<uint32_t>(f), b << 16);
    if (!std::isnan(f)) {
      EXPECT_EQ(to_bf16(f).bits, b) << "bits " << b;
    }
  }
}

TEST(Bf16Conversion, RelativeErrorIsAtMostHalfAnUlp) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-100, 100);
  for (int i = 0; i < 100000; ++i) {
    const float x = std::ldexp(mantissa(rng), exponent(rng));
    const float r = hdp::round_bf16(x);
    EXPECT_LE(std::fabs(static_cast<double>(r) - x), std::ldexp(std::fabs(static_cast<double>(x)), -8)) << x;
  }
}

TEST(Bf16Tensor, OffsetsAndSizesFollowTheDtype) {
  std::vector<bf16> memory(24);
  const Tensor t = Tensor::of_bf16(memory.data(), {4, 6});
  EXPECT_EQ(t.dtype, DType::BF16);
  EXPECT_EQ(t.bytes(), 48u);
  EXPECT_EQ(t.rows(2, 4).bf16_data(), memory.data() + 12);
  EXPECT_EQ(t.view({24}).dtype, DType::BF16);
  EXPECT_THROW(t.f32(), std::logic_error);
  std::vector<float> f(4);
  EXPECT_THROW(Tensor(f.data(), {4}).bf16_data(), std::logic_error);
}

// ---- the twins against the fp32 ops ----------------------------------------------

// One tensor in both dtypes: values already rounded to bf16, held as fp32 (for the
// fp32 op) and as bf16 (for the twin).
struct Pair {
  std::vector<float> f;
  std::vector<bf16> b;
  Tensor F, B;
};

Pair make(std::initializer_list<int64_t> dims, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  Pair p;
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  p.f.resize(n);
  p.b.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    p.b[i] = to_bf16(u(rng));
    p.f[i] = to_float(p.b[i]);
  }
  p.F = Tensor(p.f.data(), dims);
  p.B = Tensor::of_bf16(p.b.data(), dims);
  return p;
}

// The twin's bf16 result equals the fp32 op's result rounded once. Afterwards the
// fp32 side holds the rounded values too, so both continue from the same inputs.
void expect_rounded(Pair& p, const char* what) {
  int64_t mismatches = 0, first = -1;
  for (size_t i = 0; i < p.f.size(); ++i) {
    if (to_bf16(p.f[i]).bits != p.b[i].bits && !(std::isnan(p.f[i]) && std::isnan(to_float(p.b[i])))) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++mismatches;
    }
  }
  EXPECT_EQ(mismatches, 0) << what << ": first at " << first << ": fp32 " << p.f[first] << " bf16 "
                           << to_float(p.b[first]);
  for (size_t i = 0; i < p.f.size(); ++i) p.f[i] = to_float(p.b[i]);
}

void expect_equal(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    ASSERT_EQ(a[i], b[i]) << what << " at " << i;
  }
}

TEST(Bf16Twins, LinearAndMatmul) {
  Pair x = make({13, 24}, 1), w = make({10, 24}, 2), y = make({13, 10}, 3);
  hdp::linear_forward(y.F, x.F, w.F);
  hdp::linear_forward(y.B, x.B, w.B);
  expect_rounded(y, "linear_forward y");
  // With a residual: the fp32 product plus the residual, rounded once (not the
  // rounded product plus the residual, rounded again).
  {
    Pair r = make({13, 10}, 21), yr = make({13, 10}, 22);
    hdp::linear_forward(yr.F, x.F, w.F, r.F);  // fp32: product, then the add
    hdp::linear_forward(yr.B, x.B, w.B, r.B);
    std::vector<float> product(130);
    hdp::linear_forward(Tensor(product.data(), {13, 10}), x.F, w.F);
    int twice_rounded_differs = 0;
    for (int64_t i = 0; i < 130; ++i) {
      ASSERT_EQ(to_float(yr.b[i]), to_float(to_bf16(yr.f[i]))) << i;
      twice_rounded_differs += to_float(yr.b[i]) != to_float(to_bf16(to_float(to_bf16(product[i])) + r.f[i]));
    }
    EXPECT_GT(twice_rounded_differs, 0);  // the test can tell the two roundings apart
    EXPECT_THROW(hdp::linear_forward(yr.B, x.B, w.B, yr.B), std::invalid_argument);
  }

  // Backward: dx accumulates (bf16 in, fp32 sum, one rounding); dw is an fp32 gradient.
  Pair dy = make({13, 10}, 4), dx = make({13, 24}, 5);
  std::vector<float> dw_f(240, 0.25f), dw_b(240, 0.25f);
  hdp::linear_backward(dx.F, Tensor(dw_f.data(), {10, 24}), dy.F, x.F, w.F, true);
  hdp::linear_backward(dx.B, Tensor(dw_b.data(), {10, 24}), dy.B, x.B, w.B, true);
  expect_rounded(dx, "linear_backward dx");
  expect_equal(dw_f, dw_b, "linear_backward dw");
  // The two halves apart (dw skipped, then dx skipped) equal the whole call.
  Pair dx2 = make({13, 24}, 5);
  std::vector<float> dw_halves(240, 0.25f), dw_whole(240, 0.25f);
  Pair dx3 = make({13, 24}, 5);
  hdp::linear_backward(dx2.B, Tensor(), dy.B, x.B, w.B, true);
  hdp::linear_backward(Tensor(), Tensor(dw_halves.data(), {10, 24}), dy.B, x.B, w.B, false);
  hdp::linear_backward(dx3.B, Tensor(dw_whole.data(), {10, 24}), dy.B, x.B, w.B, true);
  EXPECT_EQ(dw_halves, dw_whole);
  for (int64_t i = 0; i < dx2.B.numel(); ++i) ASSERT_EQ(to_float(dx2.b[i]), to_float(dx3.b[i])) << i;

  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      Pair a = ta ? make({7, 5}, 6) : make({5, 7}, 6), b = tb ? make({9, 7}, 7) : make({7, 9}, 7),
           c = make({5, 9}, 8);
      hdp::matmul(c.F, a.F, ta, b.F, tb, 0.5f, 1.5f);
      hdp::matmul(c.B, a.B, ta, b.B, tb, 0.5f, 1.5f);
      expect_rounded(c, "matmul c");
    }
}

TEST(Bf16Twins, ElementwiseAndCopy) {
  Pair y = make({1000}, 1), x = make({1000}, 2);
  hdp::add_inplace(y.F, x.F);
  hdp::add_inplace(y.B, x.B);
  expect_rounded(y, "add_inplace");
  hdp::scale_inplace(y.F, 0.3f);
  hdp::scale_inplace(y.B, 0.3f);
  expect_rounded(y, "scale_inplace");
  hdp::fill(y.F, 0.1f);
  hdp::fill(y.B, 0.1f);
  expect_rounded(y, "fill");

  // fp32 -> bf16 rounds (the weight refresh), bf16 -> fp32 is exact, bf16 -> bf16 bytes.
  const std::vector<float> src = [] {
    std::vector<float> v(1000);
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(-4.0f, 4.0f);
    for (float& e : v) e = u(rng);
    return v;
  }();
  std::vector<bf16> rounded(1000), again(1000);
  std::vector<float> widened(1000);
  hdp::copy(Tensor::of_bf16(rounded.data(), {1000}), Tensor(const_cast<float*>(src.data()), {1000}));
  hdp::copy(Tensor(widened.data(), {1000}), Tensor::of_bf16(rounded.data(), {1000}));
  hdp::copy(Tensor::of_bf16(again.data(), {1000}), Tensor::of_bf16(rounded.data(), {1000}));
  for (int i = 0; i < 1000; ++i) {
    ASSERT_EQ(rounded[i].bits, to_bf16(src[i]).bits);
    ASSERT_EQ(widened[i], to_float(rounded[i]));
    ASSERT_EQ(again[i].bits, rounded[i].bits);
  }
}

TEST(Bf16Twins, EmbeddingRmsnormRopeSwiglu) {
  std::vector<int32_t> tokens = {3, 0, 7, 12, 5, 7, 1, 9};  // 12 is outside the slice [2, 12) -> zero row
  const IndexTensor tok(tokens.data(), {8});
  Pair table = make({10, 16}, 1), out = make({8, 16}, 2);
  hdp::embedding_forward(out.F, tok, table.F, 2);
  hdp::embedding_forward(out.B, tok, table.B, 2);
  expect_rounded(out, "embedding_forward");
  std::vector<float> dt_f(160, 0.5f), dt_b(160, 0.5f);
  hdp::embedding_backward(Tensor(dt_f.data(), {10, 16}), tok, out.F, 2);
  hdp::embedding_backward(Tensor(dt_b.data(), {10, 16}), tok, out.B, 2);
  expect_equal(dt_f, dt_b, "embedding_backward dtable");

  Pair x = make({11, 32}, 3, -3.0f, 3.0f), w = make({32}, 4, 0.5f, 1.5f), y = make({11, 32}, 5);
  std::vector<float> rstd_f(11), rstd_b(11);
  hdp::rmsnorm_forward(y.F, Tensor(rstd_f.data(), {11}), x.F, w.F, 1e-5f);
  hdp::rmsnorm_forward(y.B, Tensor(rstd_b.data(), {11}), x.B, w.B, 1e-5f);
  expect_rounded(y, "rmsnorm_forward y");
  expect_equal(rstd_f, rstd_b, "rmsnorm_forward rstd");
  Pair dx = make({11, 32}, 6), dy = make({11, 32}, 7);
  std::vector<float> dw_f(32, 0.0f), dw_b(32, 0.0f);
  hdp::rmsnorm_backward(dx.F, Tensor(dw_f.data(), {32}), dy.F, x.F, w.F, Tensor(rstd_f.data(), {11}));
  hdp::rmsnorm_backward(dx.B, Tensor(dw_b.data(), {32}), dy.B, x.B, w.B, Tensor(rstd_b.data(), {11}));
  expect_rounded(dx, "rmsnorm_backward dx");
  expect_equal(dw_f, dw_b, "rmsnorm_backward dw");

  std::vector<int32_t> positions = {0, 1, 2, 0, 1, 2, 3, 4, 100, 101, 5000};
  const IndexTensor pos(positions.data(), {11});
  Pair r = make({11, 2, 16}, 8);
  hdp::rope_forward(r.F, pos, 10000.0f);
  hdp::rope_forward(r.B, pos, 10000.0f);
  expect_rounded(r, "rope_forward");
  hdp::rope_backward(r.F, pos, 10000.0f);
  hdp::rope_backward(r.B, pos, 10000.0f);
  expect_rounded(r, "rope_backward");

  Pair gate = make({9, 40}, 9, -4.0f, 4.0f), up = make({9, 40}, 10), act = make({9, 40}, 11);
  hdp::swiglu_forward(act.F, gate.F, up.F);
  hdp::swiglu_forward(act.B, gate.B, up.B);
  expect_rounded(act, "swiglu_forward");
  Pair dg = make({9, 40}, 12), du = make({9, 40}, 13);
  hdp::swiglu_backward(dg.F, du.F, act.F, gate.F, up.F);
  hdp::swiglu_backward(dg.B, du.B, act.B, gate.B, up.B);
  expect_rounded(dg, "swiglu_backward dgate");
  expect_rounded(du, "swiglu_backward dup");
  // With the output recomputed by the backward: the same three bf16 results.
  Pair dg2 = make({9, 40}, 14), du2 = make({9, 40}, 15), act2 = make({9, 40}, 16);
  hdp::swiglu_backward(dg2.B, du2.B, act.B, gate.B, up.B, act2.B);
  const auto bits = [](const Tensor& t) {
    return std::vector<uint16_t>(reinterpret_cast<const uint16_t*>(t.raw()),
                                 reinterpret_cast<const uint16_t*>(t.raw()) + t.numel());
  };
  EXPECT_EQ(bits(dg2.B), bits(dg.B));
  EXPECT_EQ(bits(du2.B), bits(du.B));
  Pair act3 = make({9, 40}, 17);
  hdp::swiglu_forward(act3.B, gate.B, up.B);
  EXPECT_EQ(bits(act2.B), bits(act3.B));
}

TEST(Bf16Twins, AttentionWholeAndBlocks) {
  const int64_t T = 37, Hq = 4, Hkv = 2, d = 16;
  std::vector<int32_t> cu = {0, 20, 37};
  const IndexTensor cu_t(cu.data(), {3});
  Pair q = make({T, Hq, d}, 1, -2.0f, 2.0f), k = make({T, Hkv, d}, 2, -2.0f, 2.0f), v = make({T, Hkv, d}, 3),
       out = make({T, Hq, d}, 4), dout = make({T, Hq, d}, 5);
  std::vector<float> lse_f(Hq * T), lse_b(Hq * T);
  const Tensor LF(lse_f.data(), {Hq, T}), LB(lse_b.data(), {Hq, T});
  for (int64_t window : {hdp::kNoWindow, int64_t{6}}) {
    hdp::attention_forward(out.F, LF, q.F, k.F, v.F, cu_t, window);
    hdp::attention_forward(out.B, LB, q.B, k.B, v.B, cu_t, window);
    expect_rounded(out, "attention_forward out");
    expect_equal(lse_f, lse_b, "attention_forward lse");
    Pair dq = make({T, Hq, d}, 6), dk = make({T, Hkv, d}, 7), dv = make({T, Hkv, d}, 8);
    hdp::attention_backward(dq.F, dk.F, dv.F, dout.F, q.F, k.F, v.F, out.F, LF, cu_t, window);
    hdp::attention_backward(dq.B, dk.B, dv.B, dout.B, q.B, k.B, v.B, out.B, LB, cu_t, window);
    expect_rounded(dq, "attention_backward dq");
    expect_rounded(dk, "attention_backward dk");
    expect_rounded(dv, "attention_backward dv");
  }

  // Blocks as a ring merges them: rows [0, 20) against two key blocks, in two calls
  // (each merge rounds the running output once), then the backward of both.
  const std::vector<hdp::AttentionBlock> first = {{0, 20, 0, 10, 0, 0}}, second = {{0, 20, 10, 20, 0, 10}};
  hdp::attention_reset_rows(out.F, LF, 0, T);
  hdp::attention_reset_rows(out.B, LB, 0, T);
  expect_rounded(out, "attention_reset_rows out");
  expect_equal(lse_f, lse_b, "attention_reset_rows lse");
  for (const auto* blocks : {&first, &second}) {
    hdp::attention_forward_blocks(out.F, LF, q.F, k.F, v.F, *blocks);
    hdp::attention_forward_blocks(out.B, LB, q.B, k.B, v.B, *blocks);
    expect_rounded(out, "attention_forward_blocks out");
    expect_equal(lse_f, lse_b, "attention_forward_blocks lse");
  }
  Pair dq = make({T, Hq, d}, 9), dk = make({T, Hkv, d}, 10), dv = make({T, Hkv, d}, 11);
  for (const auto* blocks : {&first, &second}) {
    hdp::attention_backward_blocks(dq.F, dk.F, dv.F, dout.F, q.F, k.F, v.F, out.F, LF, *blocks);
    hdp::attention_backward_blocks(dq.B, dk.B, dv.B, dout.B, q.B, k.B, v.B, out.B, LB, *blocks);
    expect_rounded(dq, "attention_backward_blocks dq");
    expect_rounded(dk, "attention_backward_blocks dk");
    expect_rounded(dv, "attention_backward_blocks dv");
  }
}

TEST(Bf16Twins, CrossEntropyOverBf16Logits) {
  const int64_t T = 9, V = 50;
  std::vector<int32_t> targets = {3, -1, 49, 0, 17, 17, -1, 8, 25};
  const IndexTensor tgt(targets.data(), {T});
  Pair logits = make({T, V}, 1, -6.0f, 6.0f);
  std::vector<float> stats_f(3 * T), stats_b(3 * T);
  auto part = [&](std::vector<float>& s, int i) { return Tensor(s.data() + i * T, {T}); };
  hdp::cross_entropy_stats(part(stats_f, 0), part(stats_f, 1), part(stats_f, 2), logits.F, tgt, 0);
  hdp::cross_entropy_stats(part(stats_b, 0), part(stats_b, 1), part(stats_b, 2), logits.B, tgt, 0);
  expect_equal(stats_f, stats_b, "cross_entropy_stats");
  std::vector<float> lse(T);
  for (int64_t t = 0; t < T; ++t) lse[t] = stats_f[t] + std::log(stats_f[T + t]);
  Pair l2 = logits;  // a second copy for the fused op
  l2.F = Tensor(l2.f.data(), {T, V});
  l2.B = Tensor::of_bf16(l2.b.data(), {T, V});
  hdp::cross_entropy_backward_inplace(logits.F, Tensor(lse.data(), {T}), tgt, 0, 0.125f);
  hdp::cross_entropy_backward_inplace(logits.B, Tensor(lse.data(), {T}), tgt, 0, 0.125f);
  expect_rounded(logits, "cross_entropy_backward_inplace");
  std::vector<float> s_f(3 * T), s_b(3 * T);
  const double loss_f = hdp::cross_entropy_forward_backward(l2.F, tgt, 0.125f, Tensor(s_f.data(), {3 * T}));
  const double loss_b = hdp::cross_entropy_forward_backward(l2.B, tgt, 0.125f, Tensor(s_b.data(), {3 * T}));
  EXPECT_EQ(loss_f, loss_b);
  expect_rounded(l2, "cross_entropy_forward_backward");
}

// How far bf16 inputs move a result: a linear layer of width 256 on bf16-rounded
// operands with fp32 accumulation stays within a few bf16 ulps of the exact fp32
// product, relative to the output's scale (the rounding errors of the inputs,
// 2^-9 relative each, average out over the sum).
TEST(Bf16Twins, RoundingInputsMovesResultsByAboutOneUlp) {
  const int64_t T = 16, in = 256, out = 32;
  std::vector<float> x = std::vector<float>(T * in), w = std::vector<float>(out * in), y(T * out);
  std::mt19937 rng(5);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  for (float& e : x) e = n01(rng);
  for (float& e : w) e = n01(rng) / 16.0f;
  std::vector<bf16> xb(x.size()), wb(w.size()), yb(y.size());
  for (size_t i = 0; i < x.size(); ++i) xb[i] = to_bf16(x[i]);
  for (size_t i = 0; i < w.size(); ++i) wb[i] = to_bf16(w[i]);
  hdp::linear_forward(Tensor(y.data(), {T, out}), Tensor(x.data(), {T, in}), Tensor(w.data(), {out, in}));
  hdp::linear_forward(Tensor::of_bf16(yb.data(), {T, out}), Tensor::of_bf16(xb.data(), {T, in}),
                      Tensor::of_bf16(wb.data(), {out, in}));
  double max_err = 0, scale = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    max_err = std::max(max_err, std::fabs(static_cast<double>(to_float(yb[i])) - y[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(y[i])));
  }
  EXPECT_GT(max_err, 0.0);                // bf16 really rounds
  EXPECT_LT(max_err, 4 * 0x1p-8 * scale);  // within 4 ulps of the largest output
}

// ---- the op layer refuses dtype combinations it has no kernel for ----------------


TEST(Bf16Dispatch, MixedOrUnsupportedDtypesAreRefusedByName) {
  Pair x = make({4, 8}, 1), w = make({6, 8}, 2), y = make({4, 6}, 3);
  std::string e = thrown_message([&] { hdp::linear_forward(y.B, x.F, w.B); });
  EXPECT_NE(e.find("linear_forward"), std::string::npos) << e;
  EXPECT_NE(e.find("x=fp32"), std::string::npos) << e;
  EXPECT_NE(e.find("all fp32 or all bf16"), std::string::npos) << e;

  // Statistics stay fp32: a bf16 rstd is refused.
  Pair rstd = make({4}, 4), norm_w = make({8}, 5), out = make({4, 8}, 6);
  e = thrown_message([&] { hdp::rmsnorm_forward(out.B, rstd.B, x.B, norm_w.B, 1e-5f); });
  EXPECT_NE(e.find("rmsnorm_forward"), std::string::npos) << e;
  EXPECT_NE(e.find("rstd=bf16"), std::string::npos) << e;

  // Gradients of weights are fp32: a bf16 dw is refused.
  Pair dw = make({6, 8}, 7);
  e = thrown_message([&] { hdp::linear_backward(x.B, dw.B, y.B, x.B, w.B, false); });
  EXPECT_NE(e.find("dw=bf16"), std::string::npos) << e;

  // The optimizer and the gradient norm run on fp32 only.
  Pair p = make({8}, 8), g = make({8}, 9), m = make({8}, 10), v = make({8}, 11);
  e = thrown_message([&] { hdp::adamw_update(p.B, g.F, m.F, v.F, hdp::AdamWStep{}); });
  EXPECT_NE(e.find("adamw_update"), std::string::npos) << e;
  EXPECT_NE(e.find("param=bf16"), std::string::npos) << e;
  e = thrown_message([&] { hdp::sum_squares(g.B); });
  EXPECT_NE(e.find("sum_squares"), std::string::npos) << e;
}

}  // namespace

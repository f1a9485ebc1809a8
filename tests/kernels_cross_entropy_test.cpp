// Fused softmax cross-entropy: statistics and in-place gradient against a naive
// double reference, ignored rows, vocabulary sharded in two halves with the
// statistics combined by hand, and the gradient against finite differences of the
// double loss.
//
// Tolerances: row max and target logit are exact copies; sumexp goes through the
// fast exp (~1e-7) and a float sum over V terms: 2e-6 relative. Loss in double
// from float statistics: 1e-6 relative. Gradient entries are
// grad_scale * (softmax - onehot) computed from a float lse: 1e-6 of grad_scale.

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/ops.h"
#include "test_util.h"

namespace {
using hdp::testing::random_floats;
using hdp::IndexTensor;
using hdp::Tensor;


struct Case {
  int64_t T, V;
  std::vector<float> logits;
  std::vector<int32_t> targets;
};

// V > the kernel's 2048-logit block and not a multiple of the vector width; row t
// has its largest logits late in the row so the running max is rescaled.
Case make_case(int64_t T = 9, int64_t V = 5003) {
  Case c{T, V, random_floats(T * V, 1, -5, 5), std::vector<int32_t>(T)};
  for (int64_t t = 0; t < T; ++t) {
    c.targets[t] = static_cast<int32_t>((t * 2731 + 11) % V);
    for (int64_t i = 0; i < V; ++i) c.logits[t * V + i] += static_cast<float>(6.0 * i / V);
  }
  for (int64_t t : {2, 5})
    if (t < T) c.targets[t] = -1;  // rows without a prediction
  return c;
}

double ref_lse(const float* x, int64_t V) {
  double m = -1e300, s = 0;
  for (int64_t i = 0; i < V; ++i) m = std::max(m, static_cast<double>(x[i]));
  for (int64_t i = 0; i < V; ++i) s += std::exp(x[i] - m);
  return m + std::log(s);
}

double ref_loss(const Case& c) {
  double loss = 0;
  for (int64_t t = 0; t < c.T; ++t)
    if (c.targets[t] >= 0) loss += ref_lse(&c.logits[t * c.V], c.V) - c.logits[t * c.V + c.targets[t]];
  return loss;
}
}  // namespace

TEST(KernelsCrossEntropy, StatsMatchReference) {
  Case c = make_case();
  std::vector<float> mx(c.T), se(c.T), tl(c.T);
  hdp::cross_entropy_stats(Tensor(mx.data(), {c.T}), Tensor(se.data(), {c.T}), Tensor(tl.data(), {c.T}),
                           Tensor(c.logits.data(), {c.T, c.V}), IndexTensor(c.targets.data(), {c.T}), 0);
  for (int64_t t = 0; t < c.T; ++t) {
    if (c.targets[t] < 0) {
      EXPECT_TRUE(std::isfinite(mx[t]) && std::isfinite(se[t]) && se[t] > 0) << t;
      continue;
    }
    const float* x = &c.logits[t * c.V];
    const float m = *std::max_element(x, x + c.V);
    double s = 0;
    for (int64_t i = 0; i < c.V; ++i) s += std::exp(static_cast<double>(x[i]) - m);
    EXPECT_EQ(mx[t], m) << t;
    EXPECT_NEAR(se[t], s, 2e-6 * s) << t;
    EXPECT_EQ(tl[t], x[c.targets[t]]) << t;
  }
}

TEST(KernelsCrossEntropy, ForwardBackwardLossAndGradient) {
  Case c = make_case();
  const float gs = 0.125f;
  const double want = ref_loss(c);
  std::vector<float> grad = c.logits, scratch(3 * c.T + 5);
  const double loss = hdp::cross_entropy_forward_backward(Tensor(grad.data(), {c.T, c.V}),
                                                          IndexTensor(c.targets.data(), {c.T}), gs,
                                                          Tensor(scratch.data(), {3 * c.T + 5}));
  EXPECT_NEAR(loss, want, 1e-6 * want);
  // The scratch is left holding [lse | sumexp | target_logit].
  for (int64_t t = 0; t < c.T; ++t) {
    if (c.targets[t] < 0) continue;
    const double lse = ref_lse(&c.logits[t * c.V], c.V);
    EXPECT_NEAR(scratch[t], lse, 1e-6 * std::fabs(lse)) << t;
    EXPECT_EQ(scratch[2 * c.T + t], c.logits[t * c.V + c.targets[t]]) << t;
  }
  for (int64_t t = 0; t < c.T; ++t) {
    const float* x = &c.logits[t * c.V];
    const double lse = ref_lse(x, c.V);
    for (int64_t i = 0; i < c.V; ++i) {
      const double ref =
          c.targets[t] < 0 ? 0.0 : gs * (std::exp(x[i] - lse) - (i == c.targets[t] ? 1.0 : 0.0));
      ASSERT_NEAR(grad[t * c.V + i], ref, 1e-6 * gs) << t << " " << i;
      if (c.targets[t] < 0) {
        ASSERT_EQ(grad[t * c.V + i], 0.0f);
      }
    }
  }
}

TEST(KernelsCrossEntropy, GradientMatchesFiniteDifferencesOfLoss) {
  Case c = make_case(3, 37);
  std::vector<float> grad = c.logits, scratch(3 * c.T);
  hdp::cross_entropy_forward_backward(Tensor(grad.data(), {c.T, c.V}), IndexTensor(c.targets.data(), {c.T}), 1.0f,
                                      Tensor(scratch.data(), {3 * c.T}));
  // Central differences of the double loss in the logits (perturbed as doubles).
  std::vector<double> x(c.logits.begin(), c.logits.end());
  auto loss = [&]() {
    double l = 0;
    for (int64_t t = 0; t < c.T; ++t) {
      if (c.targets[t] < 0) continue;
      double m = -1e300, s = 0;
      for (int64_t i = 0; i < c.V; ++i) m = std::max(m, x[t * c.V + i]);
      for (int64_t i = 0; i < c.V; ++i) s += std::exp(x[t * c.V + i] - m);
      l += m + std::log(s) - x[t * c.V + c.targets[t]];
    }
    return l;
  };
  const double h = 1e-6;
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double lp = loss();
    x[i] = x0 - h;
    const double lm = loss();
    x[i] = x0;
    ASSERT_NEAR(grad[i], (lp - lm) / (2 * h), 1e-6) << i;
  }
}

TEST(KernelsCrossEntropy, VocabularyShardedInTwoHalvesMatchesUnsharded) {
  Case c = make_case();
  const int64_t T = c.T, V = c.V, V0 = 2600, V1 = V - V0;  // the target falls in either half
  const float gs = 0.5f;
  // Shards hold columns [0, V0) and [V0, V) as separate contiguous blocks.
  std::vector<float> a(T * V0), b(T * V1);
  for (int64_t t = 0; t < T; ++t) {
    std::copy(&c.logits[t * V], &c.logits[t * V] + V0, &a[t * V0]);
    std::copy(&c.logits[t * V] + V0, &c.logits[(t + 1) * V], &b[t * V1]);
  }
  std::vector<float> ma(T), sa(T), ta(T), mb(T), sb(T), tb(T);
  IndexTensor tg(c.targets.data(), {T});
  hdp::cross_entropy_stats(Tensor(ma.data(), {T}), Tensor(sa.data(), {T}), Tensor(ta.data(), {T}),
                           Tensor(a.data(), {T, V0}), tg, 0);
  hdp::cross_entropy_stats(Tensor(mb.data(), {T}), Tensor(sb.data(), {T}), Tensor(tb.data(), {T}),
                           Tensor(b.data(), {T, V1}), tg, V0);
  // The reduction a vocabulary-parallel caller does between the passes.
  std::vector<float> lse(T);
  double loss = 0;
  for (int64_t t = 0; t < T; ++t) {
    const double m = std::max(ma[t], mb[t]);
    const double s = sa[t] * std::exp(ma[t] - m) + sb[t] * std::exp(mb[t] - m);
    lse[t] = static_cast<float>(m + std::log(s));
    if (c.targets[t] >= 0) loss += m + std::log(s) - (ta[t] + tb[t]);
  }
  hdp::cross_entropy_backward_inplace(Tensor(a.data(), {T, V0}), Tensor(lse.data(), {T}), tg, 0, gs);
  hdp::cross_entropy_backward_inplace(Tensor(b.data(), {T, V1}), Tensor(lse.data(), {T}), tg, V0, gs);

  std::vector<float> full = c.logits, scratch(3 * T);
  const double full_loss = hdp::cross_entropy_forward_backward(Tensor(full.data(), {T, V}), tg, gs,
                                                               Tensor(scratch.data(), {3 * T}));
  EXPECT_NEAR(loss, full_loss, 1e-6 * full_loss);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < V; ++i) {
      const float got = i < V0 ? a[t * V0 + i] : b[t * V1 + i - V0];
      ASSERT_NEAR(got, full[t * V + i], 1e-6 * gs) << t << " " << i;
    }
}

// The vocabulary-parallel glue equals, bit for bit, the host loops LlamaModel::
// cross_entropy ran before it became an op (kept here as the reference).
TEST(KernelsCrossEntropy, GlueBetweenPassesIsBitIdenticalToTheHostLoops) {
  const int64_t T = 1001;
  std::vector<float> row_max = random_floats(T, 3, -4, 8), headroom = random_floats(T, 4, 0, 3),
                     sumexp = random_floats(T, 5, 1, 3000), target_logit = random_floats(T, 6, -8, 8);
  std::vector<float> global_max(T);
  std::vector<int32_t> targets(T);
  for (int64_t i = 0; i < T; ++i) {
    global_max[i] = i % 7 == 0 ? row_max[i] : row_max[i] + headroom[i];  // this rank holds the max, or not
    targets[i] = i % 5 == 2 ? -1 : static_cast<int32_t>((i * 37) % 32000);
  }
  // The old host loops, verbatim (row_max becomes the lse).
  std::vector<float> want_sumexp = sumexp, want_lse = row_max;
  for (int64_t i = 0; i < T; ++i) want_sumexp[i] *= std::exp(want_lse[i] - global_max[i]);
  double want_loss = 0;
  for (int64_t i = 0; i < T; ++i) {
    want_lse[i] = global_max[i] + std::log(want_sumexp[i]);
    if (targets[i] >= 0) want_loss += static_cast<double>(want_lse[i]) - target_logit[i];
  }

  const Tensor m(row_max.data(), {T}), s(sumexp.data(), {T}), g(global_max.data(), {T}),
      tl(target_logit.data(), {T});
  const IndexTensor tg(targets.data(), {T});
  hdp::cross_entropy_rescale_sumexp(s, m, g);
  const double loss = hdp::cross_entropy_global_loss(m, g, s, tl, tg);
  EXPECT_EQ(std::memcmp(sumexp.data(), want_sumexp.data(), T * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(row_max.data(), want_lse.data(), T * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(&loss, &want_loss, sizeof(double)), 0) << loss << " vs " << want_loss;

  // Shapes are checked.
  std::vector<float> small(3);
  EXPECT_THROW(hdp::cross_entropy_rescale_sumexp(s, Tensor(small.data(), {3}), g), std::invalid_argument);
  EXPECT_THROW(hdp::cross_entropy_global_loss(m, g, s, tl, IndexTensor(targets.data(), {3})), std::invalid_argument);
}

// Two vocabulary shards combined with the glue ops equal the unsharded loss.
TEST(KernelsCrossEntropy, ShardsCombinedWithTheGlueOpsMatchUnsharded) {
  Case c = make_case();
  const int64_t T = c.T, V = c.V, V0 = 2600, V1 = V - V0;
  std::vector<float> a(T * V0), b(T * V1);
  for (int64_t t = 0; t < T; ++t) {
    std::copy(&c.logits[t * V], &c.logits[t * V] + V0, &a[t * V0]);
    std::copy(&c.logits[t * V] + V0, &c.logits[(t + 1) * V], &b[t * V1]);
  }
  std::vector<float> ma(T), sa(T), ta(T), mb(T), sb(T), tb(T);
  IndexTensor tg(c.targets.data(), {T});
  hdp::cross_entropy_stats(Tensor(ma.data(), {T}), Tensor(sa.data(), {T}), Tensor(ta.data(), {T}),
                           Tensor(a.data(), {T, V0}), tg, 0);
  hdp::cross_entropy_stats(Tensor(mb.data(), {T}), Tensor(sb.data(), {T}), Tensor(tb.data(), {T}),
                           Tensor(b.data(), {T, V1}), tg, V0);
  // What the tp all-reduces would do: max of the maxes, then sums of the rescaled sums and target logits.
  std::vector<float> gm(T), s(T), tl(T), lse(T);
  for (int64_t t = 0; t < T; ++t) gm[t] = std::max(ma[t], mb[t]);
  hdp::cross_entropy_rescale_sumexp(Tensor(sa.data(), {T}), Tensor(ma.data(), {T}), Tensor(gm.data(), {T}));
  hdp::cross_entropy_rescale_sumexp(Tensor(sb.data(), {T}), Tensor(mb.data(), {T}), Tensor(gm.data(), {T}));
  for (int64_t t = 0; t < T; ++t) {
    s[t] = sa[t] + sb[t];
    tl[t] = ta[t] + tb[t];
  }
  const double loss = hdp::cross_entropy_global_loss(Tensor(lse.data(), {T}), Tensor(gm.data(), {T}),
                                                     Tensor(s.data(), {T}), Tensor(tl.data(), {T}), tg);
  std::vector<float> full = c.logits, scratch(3 * T);
  const double full_loss = hdp::cross_entropy_forward_backward(Tensor(full.data(), {T, V}), tg, 0.5f,
                                                               Tensor(scratch.data(), {3 * T}));
  EXPECT_NEAR(loss, full_loss, 1e-6 * full_loss);
  for (int64_t t = 0; t < T; ++t) {
    if (c.targets[t] < 0) continue;
    EXPECT_NEAR(lse[t], scratch[t], 1e-6 * std::abs(scratch[t]) + 1e-6) << t;
  }
}

TEST(KernelsCrossEntropy, DeterministicAndNanPropagates) {
  Case c = make_case(64, 3001);
  auto run = [&](std::vector<float>& g) {
    g = c.logits;
    std::vector<float> scratch(3 * c.T);
    return hdp::cross_entropy_forward_backward(Tensor(g.data(), {c.T, c.V}), IndexTensor(c.targets.data(), {c.T}),
                                               1.0f / 64, Tensor(scratch.data(), {3 * c.T}));
  };
  std::vector<float> g2, g1;
  const double l2 = run(g2);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const double l1 = run(g1);
  omp_set_num_threads(threads);
  EXPECT_EQ(l1, l2);
  EXPECT_EQ(0, std::memcmp(g1.data(), g2.data(), g1.size() * 4));
  // A NaN logit in a predicted row makes the loss NaN rather than hiding it.
  c.logits[7 * c.V + 100] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> g;
  EXPECT_TRUE(std::isnan(run(g)));
}

TEST(KernelsCrossEntropy, ChecksShapesAndTargets) {
  std::vector<float> buf(1000);
  std::vector<int32_t> tg = {0, 3, -1, 9};
  EXPECT_THROW(hdp::cross_entropy_forward_backward(Tensor(buf.data(), {4, 10}), IndexTensor(tg.data(), {4}), 1.0f,
                                                   Tensor(buf.data() + 500, {11})),
               std::invalid_argument);  // scratch too small
  tg[3] = 10;                           // outside a single shard of 10
  EXPECT_THROW(hdp::cross_entropy_forward_backward(Tensor(buf.data(), {4, 10}), IndexTensor(tg.data(), {4}), 1.0f,
                                                   Tensor(buf.data() + 500, {12})),
               std::invalid_argument);
  tg[3] = -2;
  std::vector<float> s(12);
  EXPECT_THROW(hdp::cross_entropy_stats(Tensor(s.data(), {4}), Tensor(s.data() + 4, {4}), Tensor(s.data() + 8, {4}),
                                        Tensor(buf.data(), {4, 10}), IndexTensor(tg.data(), {4}), 0),
               std::invalid_argument);
}

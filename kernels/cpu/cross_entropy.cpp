// Softmax cross-entropy over a (possibly vocabulary-sharded) logits block.
//
// Statistics stream each row once: the row is taken in blocks of kBlock logits
// (L1-resident); a block's max updates the running max (rescaling the running sum
// by exp(old - new) when it grows), then the block's exp(x - max) are summed.
// exp is the vectorised fast exp of fast_math.h. Rows are independent, so the
// OpenMP split over rows cannot change any result.

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/simd.h"

namespace hdp::cpu {
namespace {

using namespace simd;

constexpr int64_t kBlock = 2048;

float block_max(const float* x, int64_t n) {
  int64_t i = 0;
  float m = -std::numeric_limits<float>::infinity();
  if (n >= 4 * kW) {
    vf m0 = load(x), m1 = load(x + kW), m2 = load(x + 2 * kW), m3 = load(x + 3 * kW);
    for (i = 4 * kW; i + 4 * kW <= n; i += 4 * kW) {
      m0 = max(m0, load(x + i));
      m1 = max(m1, load(x + i + kW));
      m2 = max(m2, load(x + i + 2 * kW));
      m3 = max(m3, load(x + i + 3 * kW));
    }
    m = reduce_max(max(max(m0, m1), max(m2, m3)));
  }
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// sum exp(x - m), four vector accumulators then a fixed-order tail.
float block_sumexp(const float* x, int64_t n, float m) {
  const vf vm = set1(m);
  vf s0 = zero(), s1 = zero(), s2 = zero(), s3 = zero();
  int64_t i = 0;
  for (; i + 4 * kW <= n; i += 4 * kW) {
    s0 = add(s0, exp_softmax(sub(load(x + i), vm)));
    s1 = add(s1, exp_softmax(sub(load(x + i + kW), vm)));
    s2 = add(s2, exp_softmax(sub(load(x + i + 2 * kW), vm)));
    s3 = add(s3, exp_softmax(sub(load(x + i + 3 * kW), vm)));
  }
  float s = reduce_add(add(add(s0, s1), add(s2, s3)));
  for (; i < n; ++i) s += fast_expf_softmax(x[i] - m);
  return s;
}

void row_stats(const float* x, int64_t V, float& row_max, float& row_sumexp) {
  float m = -std::numeric_limits<float>::infinity();
  double s = 0;
  for (int64_t b0 = 0; b0 < V; b0 += kBlock) {
    const int64_t n = std::min(kBlock, V - b0);
    const float bm = block_max(x + b0, n);
    if (bm > m) {
      s *= static_cast<double>(fast_expf_softmax(m - bm));
      m = bm;
    }
    s += static_cast<double>(block_sumexp(x + b0, n, m));
  }
  row_max = m;
  row_sumexp = static_cast<float>(s);
}

// x = grad_scale * exp(x - lse), then subtract grad_scale at the target.
void row_backward(float* x, int64_t V, float lse, int64_t local_target, float grad_scale) {
  const vf vl = set1(lse), vg = set1(grad_scale);
  int64_t i = 0;
  for (; i + kW <= V; i += kW) store(x + i, mul(vg, exp_softmax(sub(load(x + i), vl))));
  for (; i < V; ++i) x[i] = grad_scale * fast_expf_softmax(x[i] - lse);
  if (local_target >= 0 && local_target < V) x[local_target] -= grad_scale;
}

int64_t local_target(const IndexTensor& targets, int64_t t, int64_t vocab_begin, int64_t V) {
  const int64_t tgt = targets.data[t];
  if (tgt < 0) return -1;
  const int64_t local = tgt - vocab_begin;
  return local >= 0 && local < V ? local : -1;
}

}  // namespace

void cross_entropy_stats(Tensor row_max, Tensor row_sumexp, Tensor target_logit, const Tensor& logits,
                         const IndexTensor& targets, int64_t vocab_begin) {
  const int64_t T = logits.dim(0), V = logits.dim(1);
#pragma omp parallel for schedule(static) if (T * V >= (1 << 15))
  for (int64_t t = 0; t < T; ++t) {
    const float* x = logits.data + t * V;
    if (targets.data[t] < 0) {  // no prediction: cheap finite stats
      row_max.data[t] = 0.0f;
      row_sumexp.data[t] = 1.0f;
      target_logit.data[t] = 0.0f;
      continue;
    }
    row_stats(x, V, row_max.data[t], row_sumexp.data[t]);
    const int64_t lt = local_target(targets, t, vocab_begin, V);
    target_logit.data[t] = lt >= 0 ? x[lt] : 0.0f;
  }
}

void cross_entropy_backward_inplace(Tensor logits, const Tensor& lse, const IndexTensor& targets, int64_t vocab_begin,
                                    float grad_scale) {
  const int64_t T = logits.dim(0), V = logits.dim(1);
#pragma omp parallel for schedule(static) if (T * V >= (1 << 15))
  for (int64_t t = 0; t < T; ++t) {
    float* x = logits.data + t * V;
    if (targets.data[t] < 0) {
      std::fill(x, x + V, 0.0f);
      continue;
    }
    row_backward(x, V, lse.data[t], local_target(targets, t, vocab_begin, V), grad_scale);
  }
}

// Both passes fused per row (the row is still in cache for the second), then the
// loss summed over rows in order in double. On return the scratch holds
// [lse | row_sumexp | target_logit] per row (lse = 0 for rows without a target),
// so a caller can read per-row losses lse - target_logit.
double cross_entropy_forward_backward(Tensor logits, const IndexTensor& targets, float grad_scale, Tensor scratch_3xT) {
  const int64_t T = logits.dim(0), V = logits.dim(1);
  float* row_max = scratch_3xT.data;
  float* row_sumexp = row_max + T;
  float* target_logit = row_max + 2 * T;
#pragma omp parallel for schedule(static) if (T * V >= (1 << 15))
  for (int64_t t = 0; t < T; ++t) {
    float* x = logits.data + t * V;
    const int64_t tgt = targets.data[t];
    if (tgt < 0) {
      row_max[t] = 0.0f;
      row_sumexp[t] = 1.0f;
      target_logit[t] = 0.0f;
      std::fill(x, x + V, 0.0f);
      continue;
    }
    row_stats(x, V, row_max[t], row_sumexp[t]);
    target_logit[t] = x[tgt];
    const float lse = row_max[t] + std::log(row_sumexp[t]);
    row_backward(x, V, lse, tgt, grad_scale);
  }
  double loss = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (targets.data[t] < 0) continue;
    const double lse = static_cast<double>(row_max[t]) + std::log(static_cast<double>(row_sumexp[t]));
    loss += lse - static_cast<double>(target_logit[t]);
    row_max[t] = static_cast<float>(lse);
  }
  return loss;
}

// The vocabulary-parallel glue, one row after the other in float (exp, log) and
// the loss in double, exactly the operations (and order) of the host loops that the
// vocabulary-parallel cross-entropy (vocab_parallel_cross_entropy) ran before they
// moved here: a CPU run's losses stay bit-identical.
void cross_entropy_rescale_sumexp(Tensor row_sumexp, const Tensor& row_max, const Tensor& global_max) {
  const int64_t T = row_sumexp.dim(0);
  for (int64_t i = 0; i < T; ++i) row_sumexp.data[i] *= std::exp(row_max.data[i] - global_max.data[i]);
}

double cross_entropy_global_loss(Tensor lse, const Tensor& global_max, const Tensor& row_sumexp,
                                 const Tensor& target_logit, const IndexTensor& targets) {
  const int64_t T = lse.dim(0);
  double loss = 0;
  for (int64_t i = 0; i < T; ++i) {
    lse.data[i] = global_max.data[i] + std::log(row_sumexp.data[i]);
    if (targets.data[i] >= 0) loss += static_cast<double>(lse.data[i]) - target_logit.data[i];
  }
  return loss;
}

}  // namespace hdp::cpu

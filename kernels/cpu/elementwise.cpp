// Elementwise ops and sum of squares. OpenMP static schedule over elements; small
// tensors stay on the calling thread. Each element's result depends only on its
// inputs, so these give the same bits for any thread count; sum_squares sums
// fixed-size chunks and then the chunk sums in order, so it does too.

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace hdp::cpu {
namespace {
constexpr int64_t kParallelMin = 1 << 15;  // below this an OpenMP fork costs more than it saves
constexpr int64_t kSumChunk = 1 << 14;
}  // namespace

void add_inplace(Tensor y, const Tensor& x) {
  const int64_t n = y.numel();
  float* __restrict yd = y.data;
  const float* __restrict xd = x.data;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) yd[i] += xd[i];
}

void scale_inplace(Tensor y, float s) {
  const int64_t n = y.numel();
  float* __restrict yd = y.data;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) yd[i] *= s;
}

void fill(Tensor y, float value) {
  const int64_t n = y.numel();
  float* __restrict yd = y.data;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) yd[i] = value;
}

void copy(Tensor dst, const Tensor& src) {
  const int64_t n = dst.numel();
  if (n == 0 || dst.data == src.data) return;
  float* __restrict d = dst.data;
  const float* __restrict s = src.data;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) d[i] = s[i];
}

namespace {
// Sum of squares of n floats in double, eight independent lanes (vectorisable).
double chunk_sum_squares(const float* __restrict x, int64_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += static_cast<double>(x[i + l]) * static_cast<double>(x[i + l]);
  for (int l = 0; i < n; ++i, ++l) acc[l] += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}
}  // namespace

double sum_squares(const Tensor& x) {
  const int64_t n = x.numel();
  const int64_t chunks = (n + kSumChunk - 1) / kSumChunk;
  if (chunks <= 1) return n ? chunk_sum_squares(x.data, n) : 0.0;
  std::vector<double> part(chunks);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t c = 0; c < chunks; ++c)
    part[c] = chunk_sum_squares(x.data + c * kSumChunk, std::min(kSumChunk, n - c * kSumChunk));
  double total = 0;
  for (double p : part) total += p;
  return total;
}

}  // namespace hdp::cpu

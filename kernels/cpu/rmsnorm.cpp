// RMSNorm as Hugging Face LlamaRMSNorm: y = w * (x * rsqrt(mean(x^2) + eps)).
// Row statistics are accumulated in double; rstd is rounded to float once.

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_ops.h"

namespace hdp::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 14;

// sum a[i] * b[i] in double over eight independent lanes (vectorisable, fixed order).
double dot_f64(const float* __restrict a, const float* __restrict b, int64_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += static_cast<double>(a[i + l]) * static_cast<double>(b[i + l]);
  for (int l = 0; i < n; ++i, ++l) acc[l] += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

}  // namespace

void rmsnorm_forward(Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps) {
  const int64_t T = x.dim(0), H = x.dim(1);
  const float* __restrict wd = w.data;
#pragma omp parallel for schedule(static) if (T * H >= kParallelMin)
  for (int64_t t = 0; t < T; ++t) {
    const float* __restrict xr = x.data + t * H;
    float* __restrict yr = y.data + t * H;
    const double mean = dot_f64(xr, xr, H) / static_cast<double>(H);
    const float r = static_cast<float>(1.0 / std::sqrt(mean + static_cast<double>(eps)));
    rstd.data[t] = r;
    for (int64_t i = 0; i < H; ++i) yr[i] = wd[i] * (xr[i] * r);
  }
}

// With xhat = x * r and g = w * dy:
//   dx += r * g - x * r^3 * sum(g * x) / H
//   dw += sum over rows of dy * xhat
void rmsnorm_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd) {
  const int64_t T = x.dim(0), H = x.dim(1);
  const float* __restrict wd = w.data;
  const bool parallel = T * H >= kParallelMin;
#pragma omp parallel if (parallel)
  {
    // Rows: the input gradient.
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const float* __restrict xr = x.data + t * H;
      const float* __restrict dyr = dy.data + t * H;
      float* __restrict dxr = dx.data + t * H;
      const float r = rstd.data[t];
      double gx[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t i = 0;
      for (; i + 8 <= H; i += 8)
        for (int l = 0; l < 8; ++l)
          gx[l] += static_cast<double>(wd[i + l] * dyr[i + l]) * static_cast<double>(xr[i + l]);
      for (int l = 0; i < H; ++i, ++l) gx[l] += static_cast<double>(wd[i] * dyr[i]) * static_cast<double>(xr[i]);
      const double dot = ((gx[0] + gx[1]) + (gx[2] + gx[3])) + ((gx[4] + gx[5]) + (gx[6] + gx[7]));
      const double rd = r;
      const float c = static_cast<float>(rd * rd * rd * dot / static_cast<double>(H));
      for (int64_t j = 0; j < H; ++j) dxr[j] += r * (wd[j] * dyr[j]) - c * xr[j];
    }
    // Columns: the weight gradient, each column summed over rows in order.
    constexpr int64_t kCols = 64;
    const int64_t blocks = (H + kCols - 1) / kCols;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t c0 = b * kCols, n = std::min(kCols, H - c0);
      double acc[kCols] = {};
      for (int64_t t = 0; t < T; ++t) {
        const float r = rstd.data[t];
        const float* __restrict xr = x.data + t * H + c0;
        const float* __restrict dyr = dy.data + t * H + c0;
        for (int64_t j = 0; j < n; ++j) acc[j] += static_cast<double>(dyr[j] * (xr[j] * r));
      }
      for (int64_t j = 0; j < n; ++j) dw.data[c0 + j] += static_cast<float>(acc[j]);
    }
  }
}

}  // namespace hdp::cpu

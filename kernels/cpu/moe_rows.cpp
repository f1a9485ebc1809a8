// The mixture-of-experts block's row movement: gather (dispatch, permutation), the
// weighted combine and the combine's weight gradient. Every output row (or (t, j)
// pair) is written by one thread from its own inputs, so no two threads touch one
// element and the results are the same bits for any thread count.
//
// The file is compiled with -ffp-contract=off (kernels/CMakeLists.txt): the combine
// rounds each product and each sum as written, as the CUDA kernel does with its _rn
// intrinsics, so the two backends give the same bits (a fused multiply-add here would
// round once where the GPU rounds twice).

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/cpu_ops.h"

namespace hdp::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 15;  // elements below which an OpenMP fork costs more than it saves

bool absent(const Tensor& t) { return t.ndim == 0 && t.data == nullptr; }

}  // namespace

// out[r] = scale[r] * x[index[r]], or a plain copy of the row without scale.
void gather_rows(Tensor out, const Tensor& x, const IndexTensor& index, const Tensor& scale) {
  const int64_t N = index.numel(), H = x.dim(1);
  if (N == 0 || H == 0) return;
  const float* s = absent(scale) ? nullptr : scale.data;
#pragma omp parallel for schedule(static) if (N * H >= kParallelMin)
  for (int64_t r = 0; r < N; ++r) {
    const float* __restrict src = x.data + static_cast<int64_t>(index.data[r]) * H;
    float* __restrict dst = out.data + r * H;
    if (s == nullptr) {
      std::memcpy(dst, src, static_cast<size_t>(H) * sizeof(float));
    } else {
      const float sr = s[r];
      for (int64_t h = 0; h < H; ++h) dst[h] = sr * src[h];
    }
  }
}

// out[t] = sum over j of weights[t, j] * rows[index[t, j]], from 0 in j order in fp32.
void combine_rows(Tensor out, const Tensor& rows, const IndexTensor& index, const Tensor& weights) {
  const int64_t T = index.dim(0), k = index.dim(1), H = rows.dim(1);
  const float* w = absent(weights) ? nullptr : weights.data;
#pragma omp parallel for schedule(static) if (T * k * H >= kParallelMin)
  for (int64_t t = 0; t < T; ++t) {
    float* __restrict dst = out.data + t * H;
    std::fill(dst, dst + H, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const float* __restrict src = rows.data + static_cast<int64_t>(index.data[t * k + j]) * H;
      if (w == nullptr) {
        for (int64_t h = 0; h < H; ++h) dst[h] += src[h];
      } else {
        const float wj = w[t * k + j];
        for (int64_t h = 0; h < H; ++h) dst[h] += wj * src[h];
      }
    }
  }
}

// dweights[t, j] = <dout[t], rows[index[t, j]]>, products and sum in double, rounded
// to fp32 once, so the summation error over H stays far below one fp32 rounding.
void combine_rows_weight_backward(Tensor dweights, const Tensor& dout, const Tensor& rows, const IndexTensor& index) {
  const int64_t T = index.dim(0), k = index.dim(1), H = rows.dim(1);
#pragma omp parallel for schedule(static) if (T * k * H >= kParallelMin)
  for (int64_t t = 0; t < T; ++t) {
    const float* __restrict g = dout.data + t * H;
    for (int64_t j = 0; j < k; ++j) {
      const float* __restrict src = rows.data + static_cast<int64_t>(index.data[t * k + j]) * H;
      double dot = 0;
      for (int64_t h = 0; h < H; ++h) dot += static_cast<double>(g[h]) * src[h];
      dweights.data[t * k + j] = static_cast<float>(dot);
    }
  }
}

}  // namespace hdp::cpu

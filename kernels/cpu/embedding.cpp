// Token embedding over a (possibly vocabulary-sliced) table.

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/cpu_ops.h"

namespace hdp::cpu {

// out[t] = table[tokens[t] - vocab_begin] when this slice holds the token, else 0.
void embedding_forward(Tensor out, const IndexTensor& tokens, const Tensor& table, int64_t vocab_begin) {
  const int64_t T = tokens.numel(), V = table.dim(0), H = table.dim(1);
#pragma omp parallel for schedule(static) if (T * H >= (1 << 15))
  for (int64_t t = 0; t < T; ++t) {
    const int64_t row = static_cast<int64_t>(tokens.data[t]) - vocab_begin;
    float* dst = out.data + t * H;
    if (row >= 0 && row < V)
      std::memcpy(dst, table.data + row * H, H * sizeof(float));
    else
      std::fill(dst, dst + H, 0.0f);
  }
}

// dtable[tokens[t] - vocab_begin] += dout[t]. Threads own disjoint column ranges
// and each walks all tokens in order, so every element is summed in token order:
// no atomics, and the same bits for any thread count.
void embedding_backward(Tensor dtable, const IndexTensor& tokens, const Tensor& dout, int64_t vocab_begin) {
  const int64_t T = tokens.numel(), V = dtable.dim(0), H = dtable.dim(1);
  if (T == 0 || H == 0) return;
  constexpr int64_t kColBlock = 64;  // one cache line of floats x 4
  const int64_t blocks = (H + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static) if (T * H >= (1 << 15))
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = b * kColBlock, c1 = std::min(H, c0 + kColBlock);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t row = static_cast<int64_t>(tokens.data[t]) - vocab_begin;
      if (row < 0 || row >= V) continue;
      float* __restrict dst = dtable.data + row * H;
      const float* __restrict src = dout.data + t * H;
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

}  // namespace hdp::cpu

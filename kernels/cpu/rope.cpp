// Rotary position embedding, rotate-half pairing as in Hugging Face LLaMA:
// element j pairs with j + d/2, angle = float(pos) * inv_freq_j with
// inv_freq_j = 1 / theta^(float(2j) / d) computed in float32 like
// `1.0 / (theta ** (arange(0, d, 2).float() / d))`. cos and sin of the float angle
// come from glibc's sincosf (float32 like HF's emb.cos()/emb.sin(); glibc's are
// within an ulp, and 2.5x cheaper than double sin + cos here), computed once per
// (token, j) and reused across the heads of the token.

#include <omp.h>

#include <math.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace hdp::cpu {
namespace {

void rope_rotate(Tensor x, const IndexTensor& positions, float theta, bool inverse) {
  const int64_t T = x.dim(0), heads = x.dim(1), d = x.dim(2), half = d / 2;
  std::vector<float> inv_freq(half);
  for (int64_t j = 0; j < half; ++j)
    inv_freq[j] = 1.0f / std::pow(theta, static_cast<float>(2 * j) / static_cast<float>(d));
  const float sign = inverse ? -1.0f : 1.0f;  // backward rotates by -angle
#pragma omp parallel if (T * heads * d >= (1 << 14))
  {
    std::vector<float> cs(half), sn(half);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const float pos = static_cast<float>(positions.data[t]);
      for (int64_t j = 0; j < half; ++j) {
        float sin_a, cos_a;
        ::sincosf(pos * inv_freq[j], &sin_a, &cos_a);
        cs[j] = cos_a;
        sn[j] = sign * sin_a;
      }
      for (int64_t h = 0; h < heads; ++h) {
        float* __restrict lo = x.data + (t * heads + h) * d;
        float* __restrict hi = lo + half;
        for (int64_t j = 0; j < half; ++j) {
          const float x1 = lo[j], x2 = hi[j];
          lo[j] = x1 * cs[j] - x2 * sn[j];
          hi[j] = x2 * cs[j] + x1 * sn[j];
        }
      }
    }
  }
}

}  // namespace

void rope_forward(Tensor x, const IndexTensor& positions, float theta) { rope_rotate(x, positions, theta, false); }

void rope_backward(Tensor dx, const IndexTensor& positions, float theta) { rope_rotate(dx, positions, theta, true); }

}  // namespace hdp::cpu

// Rotary position embedding, rotate-half pairing as in Hugging Face LLaMA:
// element j pairs with j + d/2, angle = float(pos) * inv_freq_j with inv_freq from
// RopeSettings::inverse_frequencies (spec/rope.h). cos and sin of the float angle
// come from glibc's sincosf (float32 like HF's emb.cos()/emb.sin(); glibc's are
// within an ulp, and 2.5x cheaper than double sin + cos here).
//
// The angles depend only on (position, j), so the op keeps a table of cos and sin
// for positions [0, rows) (HF's cos_cached/sin_cached), computed with exactly the
// formula above and grown to the largest position a call brings: a training step
// calls RoPE four times per layer on the same positions, and sincosf per element
// per call was 2.4% of a bench-llama step. The table is per calling thread (ranks
// run as threads in some tests) and is only read inside the parallel loop.

#include <omp.h>

#include <math.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace hdp::cpu {
namespace {

// cos and sin of angle(pos, j) for pos in [0, rows), j in [0, half), row-major.
struct RopeTable {
  RopeSettings rope{0.0};
  int64_t d = 0, rows = 0;
  std::vector<float> cos, sin;

  // Makes the table cover positions [0, max_position] for (rope, d).
  void cover(const RopeSettings& rope_, int64_t d_, int64_t max_position) {
    if (rope_ == rope && d_ == d && max_position < rows) return;
    if (!(rope_ == rope) || d_ != d) rows = 0;
    rope = rope_;
    d = d_;
    const int64_t half = d / 2;
    const std::vector<float> inv_freq = rope.inverse_frequencies(d);
    // Whole powers of two, so a run whose documents grow rebuilds the table a few times only.
    const int64_t new_rows = std::max<int64_t>(int64_t{1} << 10, std::bit_ceil(static_cast<uint64_t>(max_position) + 1));
    cos.resize(new_rows * half);
    sin.resize(new_rows * half);
#pragma omp parallel for schedule(static) if ((new_rows - rows) * half >= (1 << 14))
    for (int64_t p = rows; p < new_rows; ++p) {
      const float pos = static_cast<float>(p);
      for (int64_t j = 0; j < half; ++j) ::sincosf(pos * inv_freq[j], &sin[p * half + j], &cos[p * half + j]);
    }
    rows = new_rows;
  }
};

void rope_rotate(Tensor x, const IndexTensor& positions, const RopeSettings& rope, bool inverse) {
  const int64_t T = x.dim(0), heads = x.dim(1), d = x.dim(2), half = d / 2;
  int64_t max_position = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (positions.data[t] < 0)
      throw std::invalid_argument(std::string(inverse ? "rope_backward" : "rope_forward") + ": position " +
                                  std::to_string(positions.data[t]) + " of row " + std::to_string(t) +
                                  " is negative");
    max_position = std::max<int64_t>(max_position, positions.data[t]);
  }
  thread_local RopeTable table;  // the caller's; the OpenMP threads below read it through `cos_table`, `sin_table`
  table.cover(rope, d, max_position);
  const float* cos_table = table.cos.data();
  const float* sin_table = table.sin.data();
  const float sign = inverse ? -1.0f : 1.0f;  // backward rotates by -angle
#pragma omp parallel if (T * heads * d >= (1 << 14))
  {
    std::vector<float> sn(half);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const float* cs = cos_table + positions.data[t] * half;
      const float* s = sin_table + positions.data[t] * half;
      for (int64_t j = 0; j < half; ++j) sn[j] = sign * s[j];
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

void rope_forward(Tensor x, const IndexTensor& positions, const RopeSettings& rope, Tensor x2) {
  rope_rotate(x, positions, rope, false);
  if (x2.data) rope_rotate(x2, positions, rope, false);
}

void rope_backward(Tensor dx, const IndexTensor& positions, const RopeSettings& rope, Tensor dx2) {
  rope_rotate(dx, positions, rope, true);
  if (dx2.data) rope_rotate(dx2, positions, rope, true);
}

}  // namespace hdp::cpu

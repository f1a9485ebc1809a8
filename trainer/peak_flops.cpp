#include "trainer/peak_flops.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "kernels/ops.h"

namespace hdp {

double measure_gemm_flops(int size, int repeats) {
  const int64_t n = size;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n, 0.0f);
  const Tensor ta(a.data(), {n, n}), tb(b.data(), {n, n}), tc(c.data(), {n, n});
  matmul(tc, ta, false, tb, false);  // warm-up: threads started, pages touched
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    matmul(tc, ta, false, tb, false);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * n * n * n / s);
  }
  return best;
}

}  // namespace hdp

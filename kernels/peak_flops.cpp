#include "kernels/peak_flops.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/ops.h"

namespace hdp {

double measure_gemm_flops(Device device, int size, int repeats) {
  const int64_t n = size;
  Arena arena(device, 3 * static_cast<size_t>(n * n) * sizeof(float) + 3 * Arena::kAlignment, "GEMM probe");
  const Tensor ta = arena.tensor({n, n}), tb = arena.tensor({n, n}), tc = arena.tensor({n, n});
  fill(ta, 0.5f);
  fill(tb, 0.25f);
  matmul(tc, ta, false, tb, false);  // warm-up: threads started, pages touched, algorithm chosen
  sum_squares(tc);                   // returns only when the device has finished
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    matmul(tc, ta, false, tb, false);
    sum_squares(tc.rows(0, 1));
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * n * n * n / s);
  }
  return best;
}

double gpu_bf16_peak_flops(const std::string& description) {
  auto has = [&](const char* s) { return description.find(s) != std::string::npos; };
  if (has("H100") && has("PCIe")) return 756e12;
  if (has("H100") || has("H200") || has("GH200")) return 989e12;
  if (has("A100")) return 312e12;
  return 0;
}

}  // namespace hdp

#include "kernels/peak_flops.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/cpu/blas_threads.h"
#include "kernels/cpu/gemm.h"
#include "kernels/ops.h"

namespace hdp {
namespace {

std::mutex summary_mutex;
std::string summary;

// Best rate of `repeats` timed calls of `product` (one warm-up first: threads
// started, pages touched, kernels generated or chosen).
template <typename Product>
double best_rate(int64_t n, int repeats, Product product) {
  product();
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    product();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * n * n * n / s);
  }
  return best;
}

}  // namespace

double measure_gemm_flops(Device device, int size, int repeats) {
  const int64_t n = size;
  Arena arena(device, 3 * static_cast<size_t>(n * n) * sizeof(float) + 3 * Arena::kAlignment, "GEMM probe");
  const Tensor ta = arena.tensor({n, n}), tb = arena.tensor({n, n}), tc = arena.tensor({n, n});
  fill(ta, 0.5f);
  fill(tb, 0.25f);
  if (device != Device::CPU) {
    return best_rate(n, repeats, [&] {
      matmul(tc, ta, false, tb, false);
      sum_squares(tc.rows(0, 1));  // returns only when the device has finished
    });
  }
  double best = 0;
  std::string rates;
  for (cpu::GemmLibrary library : {cpu::GemmLibrary::onednn, cpu::GemmLibrary::openblas}) {
    const double rate = best_rate(n, repeats, [&] {
      cpu::sgemm(library, false, false, n, n, n, 1.0f, ta.data, n, tb.data, n, 0.0f, tc.data, n);
    });
    best = std::max(best, rate);
    const std::string kernels =
        library == cpu::GemmLibrary::onednn ? cpu::onednn_sgemm_isa() : cpu::blas_core_name();
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s%s %s %.1f", rates.empty() ? "" : ", ", cpu::gemm_library_name(library),
                  kernels.c_str(), rate / 1e9);
    rates += buf;
  }
  std::lock_guard lock(summary_mutex);
  summary = rates + " GFLOP/s";
  return best;
}

std::string cpu_gemm_rates_summary() {
  std::lock_guard lock(summary_mutex);
  return summary;
}

double gpu_bf16_peak_flops(const std::string& description) {
  auto has = [&](const char* s) { return description.find(s) != std::string::npos; };
  if (has("H100") && has("PCIe")) return 756e12;
  if (has("H100") || has("H200") || has("GH200")) return 989e12;
  if (has("A100")) return 312e12;
  return 0;
}

}  // namespace hdp

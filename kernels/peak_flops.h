#pragma once
// The denominator of MFU: the CPU's measured fp32 GEMM rate, or a GPU's
// published dense BF16 tensor-core peak.

#include <string>

#include "kernels/device.h"

namespace hdp {

// Dense BF16 peak in FLOP/s of a known data-center GPU named in `description`
// (cuda::device_description()), 0 when unknown. Figures from NVIDIA's datasheets:
// H100 SXM and H200 989 TFLOP/s, H100 PCIe 756, A100 312.
double gpu_bf16_peak_flops(const std::string& description);

// Measured fp32 GEMM rate on `device` in FLOP/s: the best of `repeats` square
// size^3 products after one warm-up.
//
// CPU: the machine's fp32 matrix rate, i.e. the best GEMM this process can run,
// not merely the one matmul uses: every linked library (oneDNN, the backend's
// GEMM, and OpenBLAS; kernels/cpu/gemm.h) is timed through the same split over
// all OpenMP threads as matmul, and the fastest counts. So a library that
// misdetects the CPU (Debian 12's OpenBLAS on CPUs newer than it falls back to
// SSE3 kernels, 5x slower: docs/performance.md) cannot lower the denominator and
// inflate MFU. It is still a measurement, on a machine perhaps shared with other
// processes; train.peak_flops overrides it.
// CUDA: one cuBLAS product (only used for GPUs without a datasheet figure).
double measure_gemm_flops(Device device = Device::CPU, int size = 2048, int repeats = 3);

// Each CPU library's rate from the latest CPU measure_gemm_flops call in this
// process, for logs: e.g. "oneDNN 2.6.3 avx512_core 221.0, OpenBLAS 0.3.21
// Prescott 36.2 GFLOP/s"; empty before the first.
std::string cpu_gemm_rates_summary();

}  // namespace hdp

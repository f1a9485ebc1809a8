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

// Best of a few square fp32 GEMMs through the kernels' matmul on `device`, in FLOP/s.
double measure_gemm_flops(Device device = Device::CPU, int size = 2048, int repeats = 3);

}  // namespace hdp

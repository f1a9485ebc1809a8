#pragma once
// The machine's fp32 GEMM rate, the denominator of MFU.

namespace hdp {

// Best of a few square SGEMMs through the kernels' matmul, in FLOP/s.
double measure_gemm_flops(int size = 2048, int repeats = 3);

}  // namespace hdp

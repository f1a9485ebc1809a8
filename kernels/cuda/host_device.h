#pragma once
// HDP_HD marks a function that CUDA kernels and host code (CPU tests among them)
// both call: __host__ __device__ under nvcc, nothing for the host compiler. Plain
// C++ headers of the CUDA backend use it so one definition serves both sides
// (kernels/cuda/mma_fragments.h, kernels/cuda/cudnn_attention_plan.h).

#if defined(__CUDACC__)
#define HDP_HD __host__ __device__
#else
#define HDP_HD
#endif

#pragma once
// cuDNN's fused scaled-dot-product attention behind the attention ops of
// kernels/ops.h, for packed documents (attention_forward, attention_backward):
// same arguments and semantics as our kernels (kernels/cuda/attention.cu), which
// stay the reference and the fallback; kernels/attention_impl.h chooses between
// them. Plain C++ (kernels/ops.cpp includes it). Built with HDP_CUDNN
// (kernels/cuda/cudnn_attention.cpp); otherwise kernels/cuda/cudnn_absent.cpp
// reports cuDNN unavailable.
//
// libcudnn is opened at run time (dlopen), not linked: a machine without cuDNN
// still runs everything else, and cudnn_runtime() says why cuDNN is missing.

#include <cstdint>
#include <string>

#include "kernels/attention_impl.h"
#include "kernels/tensor.h"

namespace hdp::cuda {

// The cuDNN this process can use (its library, version and the device's compute
// capability); probed once, on the first call, after initialize().
const CudnnRuntime& cudnn_runtime();

// The ops on cuDNN, enqueued on the compute stream. The caller has checked the call
// with cudnn_attention_supported(). The graph of the call's shape
// (kernels/cuda/cudnn_attention_plan.h) is built on its first use and cached; when
// cuDNN refuses to build it, these return false with `why` and enqueue nothing
// (the refusal is cached too, so it is not built again).
bool cudnn_attention_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v,
                             const IndexTensor& cu_seqlens, int64_t window, std::string* why);
bool cudnn_attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& out, const Tensor& lse, const IndexTensor& cu_seqlens,
                              int64_t window, std::string* why);

}  // namespace hdp::cuda

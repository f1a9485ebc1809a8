// cuDNN attention's entry points in a build without it (HDP_CUDNN=OFF, or its
// frontend headers or libcudnn not found at configure time, or no CUDA at all):
// cuDNN is reported unavailable, so the attention ops never call the others.

#include <stdexcept>

#include "kernels/cuda/cudnn_attention.h"

namespace hdp::cuda {
namespace {
[[noreturn]] void absent() { throw std::logic_error("cuDNN attention called in a build without it"); }
}  // namespace

const CudnnRuntime& cudnn_runtime() {
  static const CudnnRuntime runtime{
      "this build has no cuDNN attention (configured with HDP_CUDNN=OFF, without CUDA, or without cuDNN's frontend "
      "headers or libcudnn)"};
  return runtime;
}

bool cudnn_attention_forward(Tensor, Tensor, const Tensor&, const Tensor&, const Tensor&, const IndexTensor&, int64_t,
                             std::string*) {
  absent();
}
bool cudnn_attention_backward(Tensor, Tensor, Tensor, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, const Tensor&, const IndexTensor&, int64_t, std::string*) {
  absent();
}

}  // namespace hdp::cuda

// The dispatcher: every op sends CUDA tensors to UnsupportedDevice (this build has
// no CUDA backend), rejects tensors on mixed devices, and names itself in errors.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/cuda/cuda_runtime.h"
#include "kernels/ops.h"
#include "test_util.h"

namespace {

using hdp::testing::thrown_message;
using hdp::Device;
using hdp::IndexTensor;
using hdp::Tensor;

}  // namespace

TEST(KernelsOps, EveryOpRejectsCudaTensors) {
  if (hdp::cuda::available()) GTEST_SKIP() << "a CUDA device is present: host memory posing as device tensors would run";
  std::vector<float> buf(4096);
  std::vector<int32_t> ibuf(64, 0);
  const Device C = Device::CUDA;
  float* b = buf.data();
  auto t = [&](std::initializer_list<int64_t> dims) { return Tensor(b, dims, C); };
  IndexTensor tok(ibuf.data(), {4}, C);
  std::vector<int32_t> cu_host = {0, 4};
  IndexTensor cu(cu_host.data(), {2}, C);
  hdp::AdamWStep s;
  using U = hdp::UnsupportedDevice;
  EXPECT_THROW(hdp::matmul(t({4, 4}), t({4, 4}), false, t({4, 4}), false), U);
  EXPECT_THROW(hdp::linear_forward(t({4, 3}), t({4, 5}), t({3, 5})), U);
  EXPECT_THROW(hdp::linear_backward(t({4, 5}), t({3, 5}), t({4, 3}), t({4, 5}), t({3, 5}), false), U);
  EXPECT_THROW(hdp::add_inplace(t({4}), t({4})), U);
  EXPECT_THROW(hdp::scale_inplace(t({4}), 2.0f), U);
  EXPECT_THROW(hdp::copy(t({4}), t({4})), U);
  EXPECT_THROW(hdp::embedding_forward(t({4, 8}), tok, t({10, 8}), 0), U);
  EXPECT_THROW(hdp::embedding_backward(t({10, 8}), tok, t({4, 8}), 0), U);
  EXPECT_THROW(hdp::rmsnorm_forward(t({4, 8}), t({4}), t({4, 8}), t({8}), 1e-5f), U);
  EXPECT_THROW(hdp::rmsnorm_backward(t({4, 8}), t({8}), t({4, 8}), t({4, 8}), t({8}), t({4})), U);
  EXPECT_THROW(hdp::rope_forward(t({4, 2, 8}), tok, 1e4f), U);
  EXPECT_THROW(hdp::rope_backward(t({4, 2, 8}), tok, 1e4f), U);
  EXPECT_THROW(hdp::attention_forward(t({4, 2, 8}), t({2, 4}), t({4, 2, 8}), t({4, 1, 8}), t({4, 1, 8}), cu), U);
  EXPECT_THROW(hdp::attention_backward(t({4, 2, 8}), t({4, 1, 8}), t({4, 1, 8}), t({4, 2, 8}), t({4, 2, 8}),
                                       t({4, 1, 8}), t({4, 1, 8}), t({4, 2, 8}), t({2, 4}), cu),
               U);
  EXPECT_THROW(hdp::swiglu_forward(t({4, 8}), t({4, 8}), t({4, 8})), U);
  EXPECT_THROW(hdp::swiglu_backward(t({4, 8}), t({4, 8}), t({4, 8}), t({4, 8}), t({4, 8})), U);
  EXPECT_THROW(hdp::cross_entropy_stats(t({4}), t({4}), t({4}), t({4, 10}), tok, 0), U);
  EXPECT_THROW(hdp::cross_entropy_backward_inplace(t({4, 10}), t({4}), tok, 0, 1.0f), U);
  EXPECT_THROW(hdp::cross_entropy_forward_backward(t({4, 10}), tok, 1.0f, t({12})), U);
  EXPECT_THROW(hdp::cross_entropy_rescale_sumexp(t({4}), t({4}), t({4})), U);
  EXPECT_THROW(hdp::cross_entropy_global_loss(t({4}), t({4}), t({4}), t({4}), tok), U);
  EXPECT_THROW(hdp::adamw_update(t({4}), t({4}), t({4}), t({4}), s), U);
  const std::string msg = thrown_message([&] { hdp::swiglu_forward(t({4, 8}), t({4, 8}), t({4, 8})); });
  EXPECT_NE(msg.find("swiglu_forward"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cuda"), std::string::npos) << msg;
}

TEST(KernelsOps, MixedDevicesAndBadShapesAreInvalidArguments) {
  std::vector<float> buf(4096);
  float* b = buf.data();
  const std::string mixed = thrown_message([&] {
    hdp::swiglu_forward(Tensor(b, {4, 8}), Tensor(b, {4, 8}, Device::CUDA), Tensor(b, {4, 8}));
  });
  EXPECT_NE(mixed.find("swiglu_forward"), std::string::npos) << mixed;
  EXPECT_NE(mixed.find("device"), std::string::npos) << mixed;
  const std::string shape = thrown_message([&] { hdp::swiglu_forward(Tensor(b, {4, 8}), Tensor(b, {4, 8}), Tensor(b, {4, 9})); });
  EXPECT_NE(shape.find("swiglu_forward"), std::string::npos) << shape;
  EXPECT_NE(shape.find("[4, 9]"), std::string::npos) << shape;
  EXPECT_THROW(hdp::swiglu_forward(Tensor(b, {4, 8}), Tensor(b, {4, 8}), Tensor(b, {4, 9})), std::invalid_argument);
}

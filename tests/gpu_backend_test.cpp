// The CUDA backend against the CPU backend, op by op (fp32 and bf16) and over five
// training steps of a small model in fp32 and bf16 (the checks of `trainer
// selftest`). Skipped with a message where no CUDA device is usable, as on the CI
// machines: there the backend is compiled but cannot run.

#include <gtest/gtest.h>

#include <string>

#include "kernels/backend_check.h"
#include "kernels/cuda/cuda_runtime.h"
#include "trainer/selftest.h"

namespace {

bool skip_without_device() {
  std::string why;
  if (hdp::cuda::available(&why)) return false;
  GTEST_LOG_(INFO) << "no CUDA device: " << why;
  return true;
}

void expect_all_pass(const std::vector<hdp::OpCheck>& checks) {
  ASSERT_FALSE(checks.empty());
  for (const hdp::OpCheck& c : checks) {
    EXPECT_TRUE(c.pass) << c.op << " [" << c.shape << "]: max rel " << c.max_rel << " > " << c.tolerance;
  }
}

TEST(GpuBackend, EveryOpEqualsCpu) {
  if (skip_without_device()) GTEST_SKIP() << "no CUDA device";
  hdp::cuda::initialize(0);
  for (uint64_t seed : {1, 2}) expect_all_pass(hdp::check_backend(hdp::Device::CUDA, seed));
}

TEST(GpuBackend, TrainingStepsEqualCpu) {
  if (skip_without_device()) GTEST_SKIP() << "no CUDA device";
  hdp::cuda::initialize(0);
  expect_all_pass(hdp::check_model_training(hdp::Device::CUDA, 3));
}

TEST(GpuBackend, Bf16TrainingStepsEqualCpuBf16) {
  if (skip_without_device()) GTEST_SKIP() << "no CUDA device";
  hdp::cuda::initialize(0);
  expect_all_pass(hdp::check_model_training(hdp::Device::CUDA, 3, hdp::DType::BF16));
}

TEST(GpuBackend, OffloadEqualsCpu) {
  if (skip_without_device()) GTEST_SKIP() << "no CUDA device";
  hdp::cuda::initialize(0);
  expect_all_pass(hdp::check_offload(hdp::Device::CUDA, 3));
}

// The same check with the CPU as the device: proves the check itself (and the CPU
// copy engine) where there is no GPU.
TEST(GpuBackend, OffloadCheckPassesOnTheCpu) { expect_all_pass(hdp::check_offload(hdp::Device::CPU, 3)); }

TEST(GpuBackend, DeviceRequestWithoutDeviceIsRefused) {
  std::string why;
  if (hdp::cuda::available(&why)) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_THROW(hdp::cuda::initialize(0), std::runtime_error);
  EXPECT_FALSE(why.empty());
}

}  // namespace

// add_inplace, scale_inplace, fill, copy, sum_squares; thread-count independence.

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cuda/cuda_runtime.h"
#include "kernels/ops.h"
#include "test_util.h"

namespace {
using hdp::testing::random_floats;
using hdp::Tensor;

}  // namespace

TEST(KernelsElementwise, AddScaleFillCopyExact) {
  // Large enough for the OpenMP path, odd length for the tails.
  const int64_t n = 100003;
  auto y = random_floats(n, 1), x = random_floats(n, 2);
  const auto y0 = y;
  hdp::add_inplace(Tensor(y.data(), {n}), Tensor(x.data(), {n}));
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], y0[i] + x[i]) << i;
  hdp::scale_inplace(Tensor(y.data(), {n}), -0.25f);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], (y0[i] + x[i]) * -0.25f) << i;
  hdp::fill(Tensor(y.data(), {n}), 3.5f);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], 3.5f) << i;
  hdp::copy(Tensor(y.data(), {n}), Tensor(x.data(), {n}));
  EXPECT_EQ(0, std::memcmp(y.data(), x.data(), n * sizeof(float)));
  // small tensors (serial path)
  std::vector<float> a = {1, 2, 3}, b = {10, 20, 30};
  hdp::add_inplace(Tensor(a.data(), {3}), Tensor(b.data(), {3}));
  EXPECT_EQ(a, (std::vector<float>{11, 22, 33}));
}

TEST(KernelsElementwise, SumSquaresInDoubleAndThreadIndependent) {
  const int64_t n = 1000001;  // many chunks plus a tail
  auto x = random_floats(n, 3, -10.0f, 10.0f);
  long double ref = 0;
  for (float v : x) ref += static_cast<long double>(v) * v;
  const double got = hdp::sum_squares(Tensor(x.data(), {n}));
  EXPECT_NEAR(got, static_cast<double>(ref), 1e-12 * static_cast<double>(ref));
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const double one = hdp::sum_squares(Tensor(x.data(), {n}));
  omp_set_num_threads(threads);
  EXPECT_EQ(got, one);
  std::vector<float> small = {3, 4};
  EXPECT_EQ(hdp::sum_squares(Tensor(small.data(), {2})), 25.0);
  EXPECT_EQ(hdp::sum_squares(Tensor(small.data(), {0})), 0.0);
}

TEST(KernelsElementwise, ShapeAndDeviceChecks) {
  if (hdp::cuda::available()) GTEST_SKIP() << "a CUDA device is present: host memory posing as device tensors would run";
  std::vector<float> buf(64);
  EXPECT_THROW(hdp::add_inplace(Tensor(buf.data(), {4, 4}), Tensor(buf.data(), {16})), std::invalid_argument);
  EXPECT_THROW(hdp::copy(Tensor(buf.data(), {4}), Tensor(buf.data(), {5})), std::invalid_argument);
  EXPECT_THROW(hdp::add_inplace(Tensor(buf.data(), {4}), Tensor(buf.data(), {4}, hdp::Device::CUDA)),
               std::invalid_argument);
  EXPECT_THROW(hdp::fill(Tensor(buf.data(), {4}, hdp::Device::CUDA), 1.0f), hdp::UnsupportedDevice);
  EXPECT_THROW(hdp::sum_squares(Tensor(buf.data(), {4}, hdp::Device::CUDA)), hdp::UnsupportedDevice);
  try {
    hdp::add_inplace(Tensor(buf.data(), {4, 4}), Tensor(buf.data(), {16}));
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("add_inplace"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("[4, 4]"), std::string::npos);
  }
}

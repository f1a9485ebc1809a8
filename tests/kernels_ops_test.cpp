// The dispatcher: every op sends CUDA tensors to UnsupportedDevice (this build has
// no CUDA backend), rejects tensors on mixed devices, and names itself in errors; the
// host reads it counts, and the sums it keeps on the device.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/ops.h"
#include "kernels/upload_staging.h"
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
  std::vector<double> dbuf(4);
  const hdp::DoubleTensor sums(dbuf.data(), {4}, C);
  EXPECT_THROW(hdp::fill(sums, 0.0), U);
  EXPECT_THROW(hdp::add_inplace(sums, sums), U);
  EXPECT_THROW(hdp::add_scalar(sums, 1.0), U);
  EXPECT_THROW(hdp::sum_squares(t({4}), sums), U);
  EXPECT_THROW(hdp::read_back(sums), U);
  EXPECT_THROW(hdp::cross_entropy_forward_backward(t({4, 10}), tok, 1.0f, t({12}), sums), U);
  EXPECT_THROW(hdp::cross_entropy_global_loss(t({4}), t({4}), t({4}), t({4}), tok, sums), U);
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

// kernels/ops.h's host reads: the ops that bring a device value to the host count one,
// on the device the value came from; ops that leave it there count none. The guarded
// device stands for a GPU; the CPU counts the same logical reads.
TEST(HostReads, CountTheOpsThatBringADeviceValueBack) {
  for (Device device : {Device::Guarded, Device::CPU}) {
    SCOPED_TRACE(hdp::device_name(device));
    hdp::Arena arena(device, 1 << 16, "host reads");
    const Tensor x = arena.tensor({100});
    const hdp::DoubleTensor sums = arena.double_tensor({2});
    std::vector<float> host(100, 0.5f);
    const Tensor h(host.data(), {100}, Device::CPU);
    const int64_t start = hdp::host_reads(device);
    hdp::copy(x, h);
    hdp::fill(sums, 0.0);
    hdp::sum_squares(x, sums.rows(0, 1));
    hdp::add_scalar(sums.rows(1, 2), 2.0);
    hdp::add_inplace(sums.rows(1, 2), sums.rows(0, 1));
    EXPECT_EQ(hdp::host_reads(device), start) << "nothing came back yet";
    EXPECT_EQ(hdp::read_back(sums), (std::vector<double>{25.0, 27.0}));
    EXPECT_EQ(hdp::host_reads(device), start + 1);
    EXPECT_EQ(hdp::sum_squares(x), 25.0);
    EXPECT_EQ(hdp::host_reads(device), start + 2);
    hdp::copy(h, x);  // device to host: a read, except from CPU memory to CPU memory
    EXPECT_EQ(hdp::host_reads(device), start + (device == Device::CPU ? 2 : 3));
    EXPECT_EQ(hdp::staged_host_reads(device), 0);
    {
      const hdp::StagedCopies staged;  // a communicator's staging copy counts apart
      hdp::copy(h, x);
    }
    EXPECT_EQ(hdp::host_reads(device), start + (device == Device::CPU ? 2 : 3));
    EXPECT_EQ(hdp::staged_host_reads(device), device == Device::CPU ? 0 : 1);
  }
}

// kernels/ops.h's host waits: every host read, a synchronize and a copy from host into
// device memory make the host wait for the device; copy_async, events and a timer read
// after the work has run do not. The guarded device stands for a GPU.
TEST(HostWaits, CountTheOpsThatWaitForTheDevice) {
  for (Device device : {Device::Guarded, Device::CPU}) {
    SCOPED_TRACE(hdp::device_name(device));
    hdp::Arena arena(device, 1 << 16, "host waits");
    const Tensor x = arena.tensor({4});
    const IndexTensor index = arena.index_tensor({3});
    const hdp::DoubleTensor sums = arena.double_tensor({1});
    std::vector<float> host(4, 0.5f);
    std::vector<int32_t> host_index = {7, 8, 9};
    const int64_t start = hdp::host_waits(device);
    const int64_t upload = device == Device::CPU ? 0 : 1;  // CPU memory to CPU memory waits for nothing
    hdp::copy(x, Tensor(host.data(), {4}, Device::CPU));
    EXPECT_EQ(hdp::host_waits(device), start + upload);
    hdp::copy_async(index, IndexTensor(host_index.data(), {3}, Device::CPU));
    hdp::fill(sums, 1.0);
    EXPECT_EQ(hdp::host_waits(device), start + upload) << "copy_async waits for nothing";
    hdp::synchronize(device);
    EXPECT_EQ(hdp::host_waits(device), start + upload + 1);
    EXPECT_EQ(hdp::read_back(sums), std::vector<double>{1.0});  // a read is a wait
    EXPECT_EQ(hdp::host_waits(device), start + upload + 2);
    std::vector<int32_t> back(3);
    hdp::copy(IndexTensor(back.data(), {3}, Device::CPU), index);
    EXPECT_EQ(back, host_index) << "copy_async moved the values";
    EXPECT_EQ(hdp::host_waits(device), start + 2 * upload + 2);
    {
      const hdp::StagedCopies staged;  // a communicator's staging waits count apart
      hdp::copy(x, Tensor(host.data(), {4}, Device::CPU));
    }
    EXPECT_EQ(hdp::host_waits(device), start + 2 * upload + 2);
  }
}

// A DeviceTimer sums the device time of its stretches, read at once by take_ms(), and
// waits for nothing; on the CPU and the guarded device its events are the host clock.
TEST(DeviceTimer, SumsItsStretchesWithoutWaiting) {
  for (Device device : {Device::Guarded, Device::CPU}) {
    SCOPED_TRACE(hdp::device_name(device));
    hdp::DeviceTimer timer(device);
    const int64_t start = hdp::host_waits(device);
    using std::chrono::milliseconds, std::this_thread::sleep_for;
    for (int round = 0; round < 2; ++round) {
      timer.start();
      sleep_for(milliseconds(30));
      timer.stop();
      sleep_for(milliseconds(200));  // between stretches: not counted
      timer.start();
      sleep_for(milliseconds(20));
      timer.stop();
      const double ms = timer.take_ms();
      EXPECT_GE(ms, 50.0) << "round " << round;
      EXPECT_LT(ms, 200.0) << "round " << round << ": the 200 ms between the stretches counted";
      EXPECT_EQ(timer.take_ms(), 0.0) << "take_ms() forgets what it read";
    }
    timer.start();
    EXPECT_THROW(timer.start(), std::logic_error);
    EXPECT_THROW(timer.take_ms(), std::logic_error);
    timer.discard();
    EXPECT_THROW(timer.stop(), std::logic_error);
    EXPECT_EQ(hdp::host_waits(device), start);
  }
}

// UploadStaging moves a set of host lists into device tensors through one buffer,
// without a host wait, and refuses a set larger than the buffer.
TEST(UploadStaging, UploadsSetsThroughItsBufferWithoutWaiting) {
  for (Device device : {Device::Guarded, Device::CPU}) {
    SCOPED_TRACE(hdp::device_name(device));
    hdp::Arena arena(device, 1 << 16, "uploads");
    const IndexTensor a = arena.index_tensor({4}), b = arena.index_tensor({4});
    hdp::UploadStaging staging(device, 6);
    const auto values = [](const IndexTensor& t, int64_t n) {
      std::vector<int32_t> v(static_cast<size_t>(n));
      hdp::copy(IndexTensor(v.data(), {n}, Device::CPU), t.rows(0, n));
      return v;
    };
    const int64_t start = hdp::host_waits(device);
    for (int32_t set = 0; set < 3; ++set) {
      std::vector<int32_t> first = {set, set + 1, set + 2, set + 3}, second = {-set, 10};
      staging.begin();
      staging.upload(a, first);
      staging.upload(b, second);
      first.assign(4, -99);  // the host lists may change at once: the buffer holds them
      second.assign(2, -99);
      EXPECT_EQ(hdp::host_waits(device), start + (device == Device::CPU ? 0 : 2 * set));
      EXPECT_EQ(values(a, 4), (std::vector<int32_t>{set, set + 1, set + 2, set + 3}));
      EXPECT_EQ(values(b, 2), (std::vector<int32_t>{-set, 10}));
    }
    if (device != Device::CPU) {
      staging.begin();
      staging.upload(a, std::vector<int32_t>{1, 2, 3, 4});
      EXPECT_THROW(staging.upload(b, std::vector<int32_t>{5, 6, 7}), std::logic_error);
    }
  }
}

// Sums on the device add as the host loop `total += op()` does: a sum of squares and
// cross-entropy losses added into one equal that loop bit for bit.
TEST(HostReads, SumsOnTheDeviceAddAsTheHostLoopBitForBit) {
  hdp::Arena arena(Device::Guarded, 1 << 20, "sums");
  std::vector<float> values(3000), logits(8 * 50);
  uint64_t seed = 7;
  auto next = [&] { return static_cast<float>(((seed = seed * 6364136223846793005ull + 1) >> 40) % 2000) / 997.0f - 1.0f; };
  for (float& v : values) v = next();
  for (float& v : logits) v = 4.0f * next();
  std::vector<int32_t> targets = {3, -1, 49, 0, 17, 17, -1, 8};
  const Tensor x = arena.tensor({3000}), l = arena.tensor({8, 50}), scratch = arena.tensor({24});
  const IndexTensor tg = arena.index_tensor({8});
  hdp::copy(x, Tensor(values.data(), {3000}, Device::CPU));
  hdp::copy(tg, IndexTensor(targets.data(), {8}, Device::CPU));
  double host_total = 0.125;
  const hdp::DoubleTensor sum = arena.double_tensor({1});
  hdp::fill(sum, 0.125);
  for (int64_t b = 0; b < 3000; b += 700) {
    const Tensor part = x.rows(b, std::min<int64_t>(3000, b + 700));
    host_total += hdp::sum_squares(part);
    hdp::sum_squares(part, sum);
  }
  for (int chunk = 0; chunk < 2; ++chunk) {
    hdp::copy(l, Tensor(logits.data(), {8, 50}, Device::CPU));
    host_total += hdp::cross_entropy_forward_backward(l, tg, 0.5f, scratch);
    hdp::copy(l, Tensor(logits.data(), {8, 50}, Device::CPU));
    hdp::cross_entropy_forward_backward(l, tg, 0.5f, scratch, sum);
  }
  EXPECT_EQ(hdp::read_back(sum)[0], host_total);
}

// Host buffers over a chosen memory source (kernels/allocator.h): a buffer switched
// to another source keeps it through assignment and resizing, and its memory comes
// from that source (checkpoint snapshots rely on it to stay page-locked on GPUs).

#include <gtest/gtest.h>

#include <cstdlib>

#include "kernels/allocator.h"

namespace hdp {
namespace {

// Host memory that counts what it hands out.
class CountingHostAllocator final : public DeviceAllocator {
 public:
  void* allocate(size_t bytes) override {
    ++allocations;
    return bytes == 0 ? nullptr : std::malloc(bytes);
  }
  void deallocate(void* ptr) override {
    if (ptr) ++frees;
    std::free(ptr);
  }
  Device device() const override { return Device::CPU; }
  int allocations = 0, frees = 0;
};

TEST(HostBuffer, ASwitchedSourceStaysThroughAssignmentAndGrowth) {
  CountingHostAllocator counting;
  {
    HostBuffer buffer(100, 1.0f);  // the heap by default
    EXPECT_EQ(buffer.get_allocator().source(), &allocator_for(Device::CPU));
    buffer = HostBuffer(HostVectorAllocator<float>(counting));
    EXPECT_EQ(buffer.get_allocator().source(), &counting);
    buffer.resize(1000, 2.0f);
    buffer.resize(5000, 3.0f);
    EXPECT_EQ(buffer.get_allocator().source(), &counting);
    EXPECT_GE(counting.allocations, 2);
    EXPECT_EQ(buffer[999], 2.0f);
    EXPECT_EQ(buffer[4999], 3.0f);
  }
  EXPECT_EQ(counting.frees, counting.allocations);
}

}  // namespace
}  // namespace hdp

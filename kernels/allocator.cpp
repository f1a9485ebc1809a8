#include "kernels/allocator.h"

#include "kernels/cuda/cuda_runtime.h"
#include "kernels/guarded_memory.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <utility>

namespace hdp {
namespace {

class CpuAllocator final : public DeviceAllocator {
 public:
  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    size_t rounded = (bytes + Arena::kAlignment - 1) / Arena::kAlignment * Arena::kAlignment;
    void* p = std::aligned_alloc(Arena::kAlignment, rounded);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void deallocate(void* ptr) override { std::free(ptr); }
  Device device() const override { return Device::CPU; }
};

// Device memory through the CUDA backend (cudaMalloc; refused when it is not built in).
class CudaAllocator final : public DeviceAllocator {
 public:
  void* allocate(size_t bytes) override { return bytes == 0 ? nullptr : cuda::device_malloc(bytes); }
  void deallocate(void* ptr) override { cuda::device_free(ptr); }
  Device device() const override { return Device::CUDA; }
};

// The test-only device (kernels/guarded_memory.h): host pages closed outside ops.
class GuardedAllocator final : public DeviceAllocator {
 public:
  void* allocate(size_t bytes) override { return guarded::allocate(bytes); }
  void deallocate(void* ptr) override { guarded::deallocate(ptr); }
  Device device() const override { return Device::Guarded; }
};

// Page-locked host memory through the CUDA backend (refused when it is not built in).
class PinnedHostAllocator final : public DeviceAllocator {
 public:
  void* allocate(size_t bytes) override { return bytes == 0 ? nullptr : cuda::pinned_malloc(bytes); }
  void deallocate(void* ptr) override { cuda::pinned_free(ptr); }
  Device device() const override { return Device::CPU; }
};

size_t align_up(size_t n) { return (n + Arena::kAlignment - 1) / Arena::kAlignment * Arena::kAlignment; }

}  // namespace

DeviceAllocator& allocator_for(Device device) {
  static CpuAllocator cpu;
  static CudaAllocator cuda;
  static GuardedAllocator guarded;
  if (device == Device::CPU) return cpu;
  if (device == Device::Guarded) return guarded;
  if (device == Device::CUDA && cuda::compiled()) return cuda;
  throw UnsupportedDevice("allocator", device);
}

DeviceAllocator& pinned_host_allocator() {
  static PinnedHostAllocator pinned;
  return pinned;
}

Arena::Arena(Device device, std::string name) : device_(device), name_(std::move(name)) {}

Arena::Arena(Device device, size_t capacity_bytes, std::string name)
    : Arena(allocator_for(device), capacity_bytes, std::move(name)) {}

Arena::Arena(DeviceAllocator& allocator, size_t capacity_bytes, std::string name)
    : device_(allocator.device()), name_(std::move(name)), allocator_(&allocator), capacity_(align_up(capacity_bytes)) {
  try {
    base_ = static_cast<char*>(allocator.allocate(capacity_));
  } catch (const std::bad_alloc&) {
    char size[32];
    std::snprintf(size, sizeof(size), "%.1f GiB", static_cast<double>(capacity_) / (1024.0 * 1024.0 * 1024.0));
    throw OutOfMemory("memory: the '" + name_ + "' arena needs " + std::to_string(capacity_) + " bytes (" + size +
                      ") of " + device_name(device_) + " memory, more than this machine could give; the config's "
                      "model (hidden_size, num_layers, vocab_size), data.micro_batch_tokens or layout (more tp or "
                      "pp ranks split the model) must need less");
  }
  if (device_ == Device::Guarded && base_) guarded::set_name(base_, name_);
}

Arena Arena::pinned_host(size_t capacity_bytes, std::string name) {
  if (!cuda::compiled()) throw UnsupportedDevice("pinned host memory", Device::CUDA);
  return Arena(pinned_host_allocator(), capacity_bytes, std::move(name));
}

Arena Arena::counting(Device device, std::string name) {
  Arena a(device, std::move(name));
  a.counting_ = true;
  return a;
}

Arena::~Arena() {
  if (base_) allocator_->deallocate(base_);
}

Arena::Arena(Arena&& o) noexcept
    : device_(o.device_), name_(std::move(o.name_)), allocator_(o.allocator_), base_(std::exchange(o.base_, nullptr)),
      capacity_(o.capacity_), used_(o.used_), counting_(o.counting_) {}

Arena& Arena::operator=(Arena&& o) noexcept {
  if (this != &o) {
    if (base_) allocator_->deallocate(base_);
    device_ = o.device_;
    name_ = std::move(o.name_);
    allocator_ = o.allocator_;
    base_ = std::exchange(o.base_, nullptr);
    capacity_ = o.capacity_;
    used_ = o.used_;
    counting_ = o.counting_;
  }
  return *this;
}

void* Arena::allocate_bytes(size_t bytes) {
  size_t size = align_up(bytes);
  if (counting_) {
    used_ += size;
    return nullptr;
  }
  if (used_ + size > capacity_) {
    throw std::length_error("arena '" + name_ + "' exhausted: " + std::to_string(used_ + size) + " bytes needed, " +
                            std::to_string(capacity_) + " reserved");
  }
  void* p = base_ + used_;
  used_ += size;
  return p;
}


}  // namespace hdp

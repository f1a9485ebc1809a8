#pragma once
// Device-aware memory: one allocator per device, and arenas that carve a block
// sized up front into tensors, so a training step never allocates.

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "base/errors.h"
#include "kernels/device.h"
#include "kernels/tensor.h"

namespace hdp {

// An arena larger than its device (or the host) can give: the config asks for a model,
// batch or layout this machine cannot hold. Bad input (exit 2) naming the arena and the
// size, rather than a bare std::bad_alloc.
class OutOfMemory : public InputError {
 public:
  using InputError::InputError;
};

class DeviceAllocator {
 public:
  virtual ~DeviceAllocator() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr) = 0;
  virtual Device device() const = 0;
};

// The process-wide allocator for a device; throws UnsupportedDevice when the
// backend is not compiled in.
DeviceAllocator& allocator_for(Device device);

// Page-locked host memory (cudaHostAlloc): host tensors (Device::CPU) that the CUDA
// copy engine moves to and from the device asynchronously and at full bandwidth.
// Throws UnsupportedDevice when the CUDA backend is not compiled in.
DeviceAllocator& pinned_host_allocator();

// A std::vector allocator over host memory from a DeviceAllocator of host memory:
// the heap (allocator_for(Device::CPU)), or page-locked memory
// (pinned_host_allocator()), which device-to-host copies fill at full bandwidth
// without a staging copy. Vectors compare equal only with the same source.
template <class T>
class HostVectorAllocator {
 public:
  using value_type = T;
  // Assigning or swapping vectors takes the other's memory source along (a
  // snapshot buffer switched to pinned memory stays pinned).
  using propagate_on_container_copy_assignment = std::true_type;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;
  HostVectorAllocator() : source_(&allocator_for(Device::CPU)) {}
  explicit HostVectorAllocator(DeviceAllocator& source) : source_(&source) {}
  template <class U>
  HostVectorAllocator(const HostVectorAllocator<U>& other) : source_(other.source()) {}
  T* allocate(size_t n) { return static_cast<T*>(source_->allocate(n * sizeof(T))); }
  void deallocate(T* p, size_t) { source_->deallocate(p); }
  DeviceAllocator* source() const { return source_; }
  bool operator==(const HostVectorAllocator& other) const { return source_ == other.source_; }

 private:
  DeviceAllocator* source_;
};

// Host copies of device state (checkpoint snapshots): pinned when the state is on a GPU.
using HostBuffer = std::vector<float, HostVectorAllocator<float>>;

// Bump allocator over one block. An arena made with Arena::counting() hands out
// no memory and only adds up sizes, so a layout function can run once to size
// the real arena and once to fill it.
class Arena {
 public:
  static constexpr size_t kAlignment = 64;

  Arena(Device device, size_t capacity_bytes, std::string name);
  static Arena counting(Device device, std::string name);
  // Host memory (Device::CPU tensors) from pinned_host_allocator().
  static Arena pinned_host(size_t capacity_bytes, std::string name);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  Arena(Arena&& other) noexcept;
  Arena& operator=(Arena&& other) noexcept;

  template <class T>
  T* allocate(size_t count) {
    return static_cast<T*>(allocate_bytes(count * sizeof(T)));
  }
  Tensor tensor(std::initializer_list<int64_t> dims) { return make<float>(dims); }
  // fp32 or bf16 elements.
  Tensor tensor(std::initializer_list<int64_t> dims, DType dtype) {
    if (dtype == DType::F32) return make<float>(dims);
    Tensor t = Tensor::of_bf16(nullptr, dims, device_);
    t.data = static_cast<float*>(allocate_bytes(t.bytes()));
    return t;
  }
  IndexTensor index_tensor(std::initializer_list<int64_t> dims) { return make<int32_t>(dims); }
  DoubleTensor double_tensor(std::initializer_list<int64_t> dims) { return make<double>(dims); }

  Device device() const { return device_; }
  size_t used() const { return used_; }
  size_t capacity() const { return capacity_; }
  const std::string& name() const { return name_; }
  bool pinned() const { return allocator_ == &pinned_host_allocator(); }

 private:
  Arena(Device device, std::string name);
  Arena(DeviceAllocator& allocator, size_t capacity_bytes, std::string name);
  void* allocate_bytes(size_t bytes);
  template <class T>
  TensorOf<T> make(std::initializer_list<int64_t> dims) {
    TensorOf<T> t(nullptr, dims, device_);
    t.data = allocate<T>(static_cast<size_t>(t.numel()));
    return t;
  }

  Device device_;
  std::string name_;
  DeviceAllocator* allocator_ = nullptr;  // where base_ came from
  char* base_ = nullptr;
  size_t capacity_ = 0;
  size_t used_ = 0;
  bool counting_ = false;
};

}  // namespace hdp

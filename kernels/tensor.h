#pragma once
// A non-owning, contiguous, row-major view of memory on one device.
// Memory is owned by an Arena (allocator.h); tensors are cheap to copy.

#include <array>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "kernels/device.h"

namespace hdp {

constexpr int kMaxDims = 4;

template <class T>
struct TensorOf {
  T* data = nullptr;
  std::array<int64_t, kMaxDims> shape{};
  int ndim = 0;
  Device device = Device::CPU;

  TensorOf() = default;
  TensorOf(T* ptr, std::initializer_list<int64_t> dims, Device dev = Device::CPU) : data(ptr), device(dev) {
    if (dims.size() > kMaxDims) throw std::invalid_argument("tensor: more than 4 dimensions");
    for (int64_t d : dims) shape[ndim++] = d;
  }

  int64_t dim(int i) const { return shape[i < 0 ? ndim + i : i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  size_t bytes() const { return static_cast<size_t>(numel()) * sizeof(T); }
  // Elements per index of dimension 0.
  int64_t row_numel() const { return ndim == 0 ? 1 : numel() / shape[0]; }

  // Rows [begin, end) along dimension 0; contiguous because the layout is row-major.
  TensorOf rows(int64_t begin, int64_t end) const {
    if (begin < 0 || end > shape[0] || begin > end) throw std::out_of_range("tensor: row range out of bounds");
    TensorOf t = *this;
    t.data = data + begin * row_numel();
    t.shape[0] = end - begin;
    return t;
  }

  // Same memory, new shape with the same number of elements.
  TensorOf view(std::initializer_list<int64_t> dims) const {
    TensorOf t(data, dims, device);
    if (t.numel() != numel()) throw std::invalid_argument("tensor: view changes the number of elements");
    return t;
  }

  std::string shape_string() const {
    std::string s = "[";
    for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
  }
};

using Tensor = TensorOf<float>;
using IndexTensor = TensorOf<int32_t>;

}  // namespace hdp

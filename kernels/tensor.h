#pragma once
// A non-owning, contiguous, row-major view of memory on one device.
// Memory is owned by an Arena (allocator.h); tensors are cheap to copy.
//
// A tensor knows its device and its element type (kernels/dtype.h). `Tensor`
// holds fp32 or bf16 elements: its `data` member keeps the address typed as
// float* (so the fp32 code that reads `data` stays as it is), and it is an fp32
// pointer only when dtype is F32. Kernels that may see bf16 read through
// f32() / bf16_data(), which check the dtype; the op layer (kernels/ops.cpp)
// checks the dtypes of every op before a kernel runs, so an fp32 kernel that
// reads `data` never receives a bf16 tensor. Offsets (rows(), byte sizes) follow
// the dtype.

#include <array>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/device.h"
#include "kernels/dtype.h"

namespace hdp {

constexpr int kMaxDims = 4;

template <class T>
struct TensorOf {
  // The dtype a pointer of type T means when none is given.
  static constexpr DType kNativeDType =
      std::is_same_v<T, int32_t> ? DType::I32 : std::is_same_v<T, double> ? DType::F64 : DType::F32;

  T* data = nullptr;
  std::array<int64_t, kMaxDims> shape{};
  int ndim = 0;
  Device device = Device::CPU;
  DType dtype = kNativeDType;

  TensorOf() = default;
  TensorOf(T* ptr, std::initializer_list<int64_t> dims, Device dev = Device::CPU) : data(ptr), device(dev) {
    set_shape(dims);
  }
  // A bf16 tensor (only Tensor holds bf16).
  static TensorOf of_bf16(bf16* ptr, std::initializer_list<int64_t> dims, Device dev = Device::CPU)
    requires std::is_same_v<T, float>
  {
    TensorOf t(reinterpret_cast<float*>(ptr), dims, dev);
    t.dtype = DType::BF16;
    return t;
  }

  int64_t dim(int i) const { return shape[i < 0 ? ndim + i : i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  size_t element_size() const { return dtype_size(dtype); }
  size_t bytes() const { return static_cast<size_t>(numel()) * element_size(); }
  // Elements per index of dimension 0.
  int64_t row_numel() const { return ndim == 0 ? 1 : numel() / shape[0]; }

  // Typed access for kernels: the pointer as the element type it holds.
  T* f32() const {
    if (dtype != kNativeDType) throw std::logic_error(std::string("tensor: read as fp32 but holds ") + dtype_name(dtype));
    return data;
  }
  bf16* bf16_data() const {
    if (dtype != DType::BF16) throw std::logic_error(std::string("tensor: read as bf16 but holds ") + dtype_name(dtype));
    return reinterpret_cast<bf16*>(data);
  }
  // The same memory as raw bytes, whatever the dtype (copies, communication).
  void* raw() const { return data; }

  // Rows [begin, end) along dimension 0; contiguous because the layout is row-major.
  TensorOf rows(int64_t begin, int64_t end) const {
    if (begin < 0 || end > shape[0] || begin > end) throw std::out_of_range("tensor: row range out of bounds");
    TensorOf t = *this;
    t.data = reinterpret_cast<T*>(reinterpret_cast<char*>(data) +
                                  static_cast<size_t>(begin * row_numel()) * element_size());
    t.shape[0] = end - begin;
    return t;
  }

  // Same memory, new shape with the same number of elements (and dtype).
  TensorOf view(std::initializer_list<int64_t> dims) const {
    TensorOf t = *this;
    t.ndim = 0;
    t.shape = {};
    t.set_shape(dims);
    if (t.numel() != numel()) throw std::invalid_argument("tensor: view changes the number of elements");
    return t;
  }

  std::string shape_string() const {
    std::string s = "[";
    for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
  }

 private:
  void set_shape(std::initializer_list<int64_t> dims) {
    if (dims.size() > kMaxDims) throw std::invalid_argument("tensor: more than 4 dimensions");
    for (int64_t d : dims) shape[ndim++] = d;
  }
};

using Tensor = TensorOf<float>;
using IndexTensor = TensorOf<int32_t>;
// Sums in double kept on the device (kernels/ops.h, "sums on the device").
using DoubleTensor = TensorOf<double>;

}  // namespace hdp

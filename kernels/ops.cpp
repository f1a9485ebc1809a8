// The op interface: check shapes and devices, then dispatch to a backend.
// Errors are std::invalid_argument naming the op and the offending shapes.

#include "kernels/ops.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/attention_impl.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/guarded_memory.h"

// A backend's case in a dispatch switch, present only when it is compiled in.
// Each CUDA op is timed on the device when HDP_CUDA_OP_TIMES=1 (cuda_runtime.h).
// Every op first names the dtype it computes in (`dtype_`, from check_dtypes); the
// CUDA backend has a kernel for both fp32 and bf16 of every op (bf16: the twins of
// kernels/cpu/bf16.cpp, kernels/cuda/common.cuh).
#if HDP_HAVE_CUDA
#define HDP_CUDA_CASE(call)             \
  case Device::CUDA: {                  \
    cuda::require_device(op);           \
    const cuda::OpTimer op_timer_(op);  \
    return cuda::call;                  \
  }
// A GEMM op: its device time is named by its shape (cuda::GemmShape).
#define HDP_CUDA_GEMM_CASE(call, ...)                    \
  case Device::CUDA: {                                   \
    cuda::require_device(op);                            \
    const cuda::OpTimer op_timer_(op, {__VA_ARGS__});    \
    return cuda::call;                                   \
  }
#else
#define HDP_CUDA_CASE(call)
#define HDP_CUDA_GEMM_CASE(call, ...)
#endif

// The CPU backend and the test-only guarded device (the CPU kernels behind a
// device boundary, its memory open to the host only while the op runs:
// kernels/guarded_memory.h), for ops with a bf16 twin (kernels/cpu/bf16.cpp).
#define HDP_CPU_CASES(call)                                                       \
  case Device::CPU: return dtype_ == DType::BF16 ? cpu::bf16_ops::call : cpu::call;  \
  case Device::Guarded: {                                                       \
    const guarded::Access guarded_access_;                                      \
    return dtype_ == DType::BF16 ? cpu::bf16_ops::call : cpu::call;                 \
  }

// The guarded device for the ops that exist in fp32 only.
#define HDP_GUARDED_CASE(call)                   \
  case Device::Guarded: {                        \
    const guarded::Access guarded_access_;       \
    return cpu::call;                            \
  }

namespace hdp {
namespace {

[[noreturn]] void fail(const char* op, const std::string& msg) { throw std::invalid_argument(std::string(op) + ": " + msg); }

// One argument of an op, for its dtype check.
struct DTypeArg {
  const char* name;
  const Tensor& tensor;
};

// An op's dtype rule: the `compute` tensors share one dtype, fp32 or bf16 (the
// precision the op runs in), and the `fp32` tensors are fp32 whatever it is
// (statistics, gradients of weights, optimizer state). Returns the compute dtype
// (fp32 for an op without compute tensors). Any other combination is an error
// naming the op and every dtype, so bf16 memory cannot reach an fp32 kernel.
DType check_dtypes(const char* op, std::initializer_list<DTypeArg> compute, std::initializer_list<DTypeArg> fp32 = {}) {
  const DType dtype = compute.size() ? compute.begin()->tensor.dtype : DType::F32;
  bool ok = dtype == DType::F32 || dtype == DType::BF16;
  for (const DTypeArg& a : compute) ok = ok && a.tensor.dtype == dtype;
  for (const DTypeArg& a : fp32) ok = ok && a.tensor.dtype == DType::F32;
  if (ok) return dtype;
  std::string got, rule;
  for (const DTypeArg& a : compute) {
    got += std::string(got.empty() ? "" : ", ") + a.name + "=" + dtype_name(a.tensor.dtype);
    rule += std::string(rule.empty() ? "" : ", ") + a.name;
  }
  std::string fixed;
  for (const DTypeArg& a : fp32) {
    got += std::string(got.empty() ? "" : ", ") + a.name + "=" + dtype_name(a.tensor.dtype);
    fixed += std::string(fixed.empty() ? "" : ", ") + a.name;
  }
  std::string valid;
  if (!rule.empty()) valid = rule + " all fp32 or all bf16";
  if (!fixed.empty()) valid += (valid.empty() ? "" : ", and ") + fixed + " fp32";
  fail(op, "unsupported dtypes " + got + " (supported: " + valid + ")");
}

// name=[shape] for error messages
template <class T>
std::string arg(const char* name, const TensorOf<T>& t) {
  return std::string(name) + "=" + t.shape_string();
}

template <class T>
void require_dims(const char* op, const char* name, const TensorOf<T>& t, std::initializer_list<int64_t> dims) {
  bool ok = t.ndim == static_cast<int>(dims.size());
  int i = 0;
  for (int64_t d : dims) {
    if (ok && d >= 0 && t.shape[i] != d) ok = false;
    ++i;
  }
  if (!ok) {
    std::string want = "[";
    i = 0;
    for (int64_t d : dims) want += (i++ ? ", " : "") + (d >= 0 ? std::to_string(d) : std::string("*"));
    fail(op, arg(name, t) + " must have shape " + want + "]");
  }
  if (t.numel() > 0 && t.data == nullptr) fail(op, std::string(name) + " has no data");
}

template <class A, class B>
void require_same_shape(const char* op, const char* na, const TensorOf<A>& a, const char* nb, const TensorOf<B>& b) {
  bool ok = a.ndim == b.ndim;
  for (int i = 0; ok && i < a.ndim; ++i) ok = a.shape[i] == b.shape[i];
  if (!ok) fail(op, arg(na, a) + " and " + arg(nb, b) + " must have the same shape");
  if (a.numel() > 0 && (a.data == nullptr || b.data == nullptr)) fail(op, "tensor without data");
}

// All tensors on one device; returns it.
template <class First, class... Rest>
Device common_device(const char* op, const First& first, const Rest&... rest) {
  const Device dev = first.device;
  const bool same = ((rest.device == dev) && ...);
  if (!same) fail(op, "tensors live on different devices");
  return dev;
}

void require(bool cond, const char* op, const std::string& msg) {
  if (!cond) fail(op, msg);
}

// Host reads per device (kernels/ops.h), this thread's.
thread_local std::array<int64_t, 3> t_host_reads{}, t_staged_host_reads{}, t_host_waits{};
thread_local int t_staging = 0;  // StagedCopies alive in this thread

// Host waits (kernels/ops.h), this thread's; the communicator's staging is not counted.
void count_host_wait(Device device) {
  if (t_staging == 0) ++t_host_waits[static_cast<size_t>(device)];
}

void count_host_read(Device device) {
  ++(t_staging > 0 ? t_staged_host_reads : t_host_reads)[static_cast<size_t>(device)];
  count_host_wait(device);
}

}  // namespace

// ---- dense algebra ---------------------------------------------------------------

void matmul(Tensor c, const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, float alpha, float beta) {
  const char* op = "matmul";
  [[maybe_unused]] const DType dtype_ = check_dtypes(op, {{"c", c}, {"a", a}, {"b", b}});
  require_dims(op, "a", a, {-1, -1});
  require_dims(op, "b", b, {-1, -1});
  require_dims(op, "c", c, {-1, -1});
  const int64_t M = transpose_a ? a.dim(1) : a.dim(0), K = transpose_a ? a.dim(0) : a.dim(1);
  const int64_t Kb = transpose_b ? b.dim(1) : b.dim(0), N = transpose_b ? b.dim(0) : b.dim(1);
  if (K != Kb || c.dim(0) != M || c.dim(1) != N)
    fail(op, "c=" + c.shape_string() + " = op(a=" + a.shape_string() + (transpose_a ? "^T" : "") + ") * op(b=" +
                 b.shape_string() + (transpose_b ? "^T" : "") + ") does not match");
  switch (common_device(op, c, a, b)) {
    HDP_CUDA_GEMM_CASE(matmul(c, a, transpose_a, b, transpose_b, alpha, beta), M, N, K, 1)
    HDP_CPU_CASES(matmul(c, a, transpose_a, b, transpose_b, alpha, beta))
    default: throw UnsupportedDevice(op, c.device);
  }
}

void linear_forward(Tensor y, const Tensor& x, const Tensor& w, const Tensor& residual) {
  const char* op = "linear_forward";
  const bool with_residual = residual.data != nullptr;
  [[maybe_unused]] const DType dtype_ = with_residual
                                            ? check_dtypes(op, {{"y", y}, {"x", x}, {"w", w}, {"residual", residual}})
                                            : check_dtypes(op, {{"y", y}, {"x", x}, {"w", w}});
  require_dims(op, "x", x, {-1, -1});
  require_dims(op, "w", w, {-1, x.dim(1)});
  require_dims(op, "y", y, {x.dim(0), w.dim(0)});
  if (with_residual) {
    require_same_shape(op, "residual", residual, "y", y);
    // The CPU writes the product into y before it adds the residual. (Empty views of
    // different tensors may share an address.)
    if (residual.data == y.data && y.numel() > 0)
      throw std::invalid_argument(std::string(op) + ": the residual is y itself");
  }
  const Device device = with_residual ? common_device(op, y, x, w, residual) : common_device(op, y, x, w);
  switch (device) {
    HDP_CUDA_GEMM_CASE(linear_forward(y, x, w, residual), x.dim(0), w.dim(0), x.dim(1), 1)
    HDP_CPU_CASES(linear_forward(y, x, w, residual))
    default: throw UnsupportedDevice(op, y.device);
  }
}

void linear_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w, bool accumulate_dx) {
  const char* op = "linear_backward";
  require_dims(op, "x", x, {-1, -1});
  require_dims(op, "w", w, {-1, x.dim(1)});
  require_dims(op, "dy", dy, {x.dim(0), w.dim(0)});
  // An empty dx or dw (Tensor{}) skips that gradient; not both.
  const bool skip_dx = dx.ndim == 0 && dx.data == nullptr, skip_dw = dw.ndim == 0 && dw.data == nullptr;
  if (skip_dx && skip_dw) throw std::invalid_argument(std::string(op) + ": both dx and dw are empty");
  if (!skip_dx) require_dims(op, "dx", dx, {x.dim(0), x.dim(1)});
  if (!skip_dw) require_dims(op, "dw", dw, {w.dim(0), w.dim(1)});
  // dw is the fp32 gradient buffer: its dtype is checked apart from the compute dtype.
  [[maybe_unused]] const DType dtype_ = [&] {
    if (skip_dx) return check_dtypes(op, {{"dy", dy}, {"x", x}, {"w", w}}, {{"dw", dw}});
    if (skip_dw) return check_dtypes(op, {{"dx", dx}, {"dy", dy}, {"x", x}, {"w", w}});
    return check_dtypes(op, {{"dx", dx}, {"dy", dy}, {"x", x}, {"w", w}}, {{"dw", dw}});
  }();
  const Device dev = skip_dx   ? common_device(op, dw, dy, x, w)
                     : skip_dw ? common_device(op, dx, dy, x, w)
                               : common_device(op, dx, dw, dy, x, w);
  switch (dev) {
    HDP_CUDA_GEMM_CASE(linear_backward(dx, dw, dy, x, w, accumulate_dx), x.dim(0), w.dim(0), x.dim(1),
                       (skip_dx || skip_dw) ? 1 : 2)
    HDP_CPU_CASES(linear_backward(dx, dw, dy, x, w, accumulate_dx))
    default: throw UnsupportedDevice(op, dev);
  }
}

void add_inplace(Tensor y, const Tensor& x) {
  const char* op = "add_inplace";
  [[maybe_unused]] const DType dtype_ = check_dtypes(op, {{"y", y}, {"x", x}});
  require_same_shape(op, "y", y, "x", x);
  switch (common_device(op, y, x)) {
    HDP_CUDA_CASE(add_inplace(y, x))
    HDP_CPU_CASES(add_inplace(y, x))
    default: throw UnsupportedDevice(op, y.device);
  }
}

void scale_inplace(Tensor y, float s) {
  const char* op = "scale_inplace";
  [[maybe_unused]] const DType dtype_ = check_dtypes(op, {{"y", y}});
  require(y.numel() == 0 || y.data, op, "tensor without data");
  switch (y.device) {
    HDP_CUDA_CASE(scale_inplace(y, s))
    HDP_CPU_CASES(scale_inplace(y, s))
    default: throw UnsupportedDevice(op, y.device);
  }
}

void fill(Tensor y, float value) {
  const char* op = "fill";
  [[maybe_unused]] const DType dtype_ = check_dtypes(op, {{"y", y}});
  require(y.numel() == 0 || y.data, op, "tensor without data");
  switch (y.device) {
    HDP_CUDA_CASE(fill(y, value))
    HDP_CPU_CASES(fill(y, value))
    default: throw UnsupportedDevice(op, y.device);
  }
}

namespace {
// An index copy the host makes itself: in CPU memory, or with the guarded device's
// memory opened for it.
void host_copy_index(IndexTensor dst, const IndexTensor& src) {
  std::optional<guarded::Access> open;
  if (dst.device == Device::Guarded || src.device == Device::Guarded) open.emplace();
  std::copy_n(src.data, src.numel(), dst.data);
}
}  // namespace

// Copies between devices go through the device's backend (host memory is the CPU's).
template <class T>
Device copy_backend(const char* op, const TensorOf<T>& dst, const TensorOf<T>& src) {
  require_same_shape(op, "dst", dst, "src", src);
  if (dst.device != Device::CPU && src.device != Device::CPU && dst.device != src.device)
    fail(op, std::string("no copy between ") + device_name(src.device) + " and " + device_name(dst.device) +
                 " memory");
  if (dst.device == Device::CPU && src.device != Device::CPU) count_host_read(src.device);
  if (dst.device != Device::CPU && src.device == Device::CPU) count_host_wait(dst.device);
  return dst.device != Device::CPU ? dst.device : src.device;
}

void copy(Tensor dst, const Tensor& src) {
  const char* op = "copy";
  // Any of fp32 and bf16 on either side: a copy between dtypes converts (rounding
  // to nearest even into bf16), which is how the bf16 weights follow the fp32 master.
  for (const Tensor* t : std::initializer_list<const Tensor*>{&dst, &src})
    if (t->dtype != DType::F32 && t->dtype != DType::BF16)
      fail(op, std::string("unsupported dtype ") + dtype_name(t->dtype) + " (supported: fp32 and bf16)");
  [[maybe_unused]] const DType dtype_ = dst.dtype == DType::F32 && src.dtype == DType::F32 ? DType::F32 : DType::BF16;
  switch (copy_backend(op, dst, src)) {
    HDP_CUDA_CASE(copy(dst, src))
    HDP_CPU_CASES(copy(dst, src))
    default: throw UnsupportedDevice(op, dst.device);
  }
}

void copy(IndexTensor dst, const IndexTensor& src) {
  const char* op = "copy";
  [[maybe_unused]] const DType dtype_ = DType::F32;  // 4-byte elements, as the CUDA case expects
  switch (copy_backend(op, dst, src)) {
    case Device::CPU:
    case Device::Guarded: return host_copy_index(dst, src);
    HDP_CUDA_CASE(copy_index(dst, src))
    default: throw UnsupportedDevice(op, dst.device);
  }
}

void copy_async(IndexTensor dst, const IndexTensor& src) {
  const char* op = "copy_async";
  [[maybe_unused]] const DType dtype_ = DType::F32;  // 4-byte elements
  require_same_shape(op, "dst", dst, "src", src);
  require(src.device == Device::CPU, op, std::string("src must be host memory, not ") + device_name(src.device));
  switch (dst.device) {
    case Device::CPU:
    case Device::Guarded: return host_copy_index(dst, src);
    HDP_CUDA_CASE(copy_index_async(dst, src))
    default: throw UnsupportedDevice(op, dst.device);
  }
}

double sum_squares(const Tensor& x) {
  const char* op = "sum_squares";
  [[maybe_unused]] const DType dtype_ = check_dtypes(op, {}, {{"x", x}});
  require(x.numel() == 0 || x.data, op, "tensor without data");
  count_host_read(x.device);
  switch (x.device) {
    case Device::CPU: return cpu::sum_squares(x);
    HDP_CUDA_CASE(sum_squares(x))
    HDP_GUARDED_CASE(sum_squares(x))
    default: throw UnsupportedDevice(op, x.device);
  }
}

void synchronize(Device device) {
  const char* op = "synchronize";
  [[maybe_unused]] const DType dtype_ = DType::F32;
  count_host_wait(device);
  switch (device) {
    case Device::CPU:
    case Device::Guarded: return;  // the CPU kernels finish before they return
    HDP_CUDA_CASE(synchronize())
    default: throw UnsupportedDevice(op, device);
  }
}

int64_t host_reads(Device device) { return t_host_reads[static_cast<size_t>(device)]; }
int64_t staged_host_reads(Device device) { return t_staged_host_reads[static_cast<size_t>(device)]; }
int64_t host_waits(Device device) { return t_host_waits[static_cast<size_t>(device)]; }
StagedCopies::StagedCopies() { ++t_staging; }
StagedCopies::~StagedCopies() { --t_staging; }

// ---- events and device time --------------------------------------------------------

DeviceEvent::DeviceEvent(Device device) : device_(device) {
  if (device == Device::CUDA) event_ = cuda::timing_event_create();
}

DeviceEvent::~DeviceEvent() { cuda::timing_event_destroy(event_); }

DeviceEvent::DeviceEvent(DeviceEvent&& other) noexcept
    : device_(other.device_), event_(std::exchange(other.event_, nullptr)), host_ns_(other.host_ns_) {}

DeviceEvent& DeviceEvent::operator=(DeviceEvent&& other) noexcept {
  if (this != &other) {
    cuda::timing_event_destroy(event_);
    device_ = other.device_;
    event_ = std::exchange(other.event_, nullptr);
    host_ns_ = other.host_ns_;
  }
  return *this;
}

void DeviceEvent::record() {
  if (event_ != nullptr) return cuda::event_record(event_);
  host_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(
                 std::chrono::steady_clock::now().time_since_epoch()).count();
}

void DeviceEvent::wait() const {
  if (event_ == nullptr || cuda::event_done(event_)) return;
  count_host_wait(device_);
  cuda::event_synchronize(event_);
}

double elapsed_ms(const DeviceEvent& start, const DeviceEvent& end) {
  if (start.device_ != end.device_) fail("elapsed_ms", "events of different devices");
  if (end.event_ == nullptr) return static_cast<double>(end.host_ns_ - start.host_ns_) * 1e-6;
  end.wait();
  return cuda::event_elapsed_ms(start.event_, end.event_);
}

void DeviceTimer::start() {
  if (recorded_ % 2 != 0) throw std::logic_error("DeviceTimer: start() twice without a stop()");
  if (recorded_ == events_.size()) events_.emplace_back(device_);
  events_[recorded_++].record();
}

void DeviceTimer::stop() {
  if (recorded_ % 2 == 0) throw std::logic_error("DeviceTimer: stop() without a start()");
  if (recorded_ == events_.size()) events_.emplace_back(device_);
  events_[recorded_++].record();
}

double DeviceTimer::take_ms() {
  if (recorded_ % 2 != 0) throw std::logic_error("DeviceTimer: take_ms() inside a stretch (no stop())");
  double total = 0;
  for (size_t i = 0; i < recorded_; i += 2) total += elapsed_ms(events_[i], events_[i + 1]);
  recorded_ = 0;
  return total;
}

// ---- sums on the device ------------------------------------------------------------

namespace {
// Sums are fp64 vectors (one element per sum).
void require_sums(const char* op, const char* name, const DoubleTensor& t) {
  require(t.dtype == DType::F64 && t.ndim == 1 && (t.numel() == 0 || t.data), op,
          std::string(name) + "=" + t.shape_string() + " must be a vector of fp64 sums");
}

// The CPU's and the guarded device's sums are plain doubles on the host side, the
// guarded device's open to it only inside an Access (as while its kernels run).
template <class F>
void host_side(Device device, F&& f) {
  if (device == Device::Guarded) {
    const guarded::Access guarded_access_;
    return f();
  }
  f();
}
}  // namespace

void fill(DoubleTensor y, double value) {
  const char* op = "fill";
  require_sums(op, "y", y);
  switch (y.device) {
    HDP_CUDA_CASE(fill(y, value))
    case Device::CPU:
    case Device::Guarded: return host_side(y.device, [&] { std::fill_n(y.data, y.numel(), value); });
    default: throw UnsupportedDevice(op, y.device);
  }
}

void add_inplace(DoubleTensor y, const DoubleTensor& x) {
  const char* op = "add_inplace";
  require_sums(op, "y", y);
  require_sums(op, "x", x);
  require_same_shape(op, "y", y, "x", x);
  switch (common_device(op, y, x)) {
    HDP_CUDA_CASE(add_inplace(y, x))
    case Device::CPU:
    case Device::Guarded:
      return host_side(y.device, [&] {
        for (int64_t i = 0; i < y.numel(); ++i) y.data[i] += x.data[i];
      });
    default: throw UnsupportedDevice(op, y.device);
  }
}

void add_scalar(DoubleTensor y, double value) {
  const char* op = "add_scalar";
  require_sums(op, "y", y);
  require(y.numel() >= 1, op, "y is empty");
  switch (y.device) {
    HDP_CUDA_CASE(add_scalar(y, value))
    case Device::CPU:
    case Device::Guarded: return host_side(y.device, [&] { y.data[0] += value; });
    default: throw UnsupportedDevice(op, y.device);
  }
}

void sum_squares(const Tensor& x, DoubleTensor sum) {
  const char* op = "sum_squares";
  [[maybe_unused]] const DType dtype_ = check_dtypes(op, {}, {{"x", x}});
  require(x.numel() == 0 || x.data, op, "tensor without data");
  require_sums(op, "sum", sum);
  require(sum.numel() >= 1, op, "sum is empty");
  switch (common_device(op, x, sum)) {
    HDP_CUDA_CASE(sum_squares(x, sum))
    case Device::CPU:
    case Device::Guarded: return host_side(x.device, [&] { sum.data[0] += cpu::sum_squares(x); });
    default: throw UnsupportedDevice(op, x.device);
  }
}

void read_back(const DoubleTensor& x, std::span<double> out) {
  const char* op = "read_back";
  require_sums(op, "x", x);
  require(static_cast<int64_t>(out.size()) == x.numel(), op,
          std::to_string(out.size()) + " host values for x=" + x.shape_string());
  count_host_read(x.device);
  switch (x.device) {
    HDP_CUDA_CASE(read_back(x, out))
    case Device::CPU:
    case Device::Guarded: return host_side(x.device, [&] { std::copy_n(x.data, x.numel(), out.data()); });
    default: throw UnsupportedDevice(op, x.device);
  }
}

// ---- embedding -------------------------------------------------------------------

void embedding_forward(Tensor out, const IndexTensor& tokens, const Tensor& table, int64_t vocab_begin) {
  const char* op = "embedding_forward";
  [[maybe_unused]] const DType dtype_ = check_dtypes(op, {{"out", out}, {"table", table}});
  require_dims(op, "tokens", tokens, {-1});
  require_dims(op, "table", table, {-1, -1});
  require_dims(op, "out", out, {tokens.dim(0), table.dim(1)});
  require(vocab_begin >= 0, op, "vocab_begin must be >= 0");
  switch (common_device(op, out, tokens, table)) {
    HDP_CUDA_CASE(embedding_forward(out, tokens, table, vocab_begin))
    HDP_CPU_CASES(embedding_forward(out, tokens, table, vocab_begin))
    default: throw UnsupportedDevice(op, out.device);
  }
}

void embedding_backward(Tensor dtable, const IndexTensor& tokens, const Tensor& dout, int64_t vocab_begin) {
  const char* op = "embedding_backward";
  [[maybe_unused]] const DType dtype_ = check_dtypes(op, {{"dout", dout}}, {{"dtable", dtable}});
  require_dims(op, "tokens", tokens, {-1});
  require_dims(op, "dtable", dtable, {-1, -1});
  require_dims(op, "dout", dout, {tokens.dim(0), dtable.dim(1)});
  require(vocab_begin >= 0, op, "vocab_begin must be >= 0");
  switch (common_device(op, dtable, tokens, dout)) {
    HDP_CUDA_CASE(embedding_backward(dtable, tokens, dout, vocab_begin))
    HDP_CPU_CASES(embedding_backward(dtable, tokens, dout, vocab_begin))
    default: throw UnsupportedDevice(op, dtable.device);
  }
}

// ---- RMSNorm ---------------------------------------------------------------------

void rmsnorm_forward(Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps) {
  const char* op = "rmsnorm_forward";
  [[maybe_unused]] const DType dtype_ = check_dtypes(op, {{"y", y}, {"x", x}, {"w", w}}, {{"rstd", rstd}});
  require_dims(op, "x", x, {-1, -1});
  require_dims(op, "y", y, {x.dim(0), x.dim(1)});
  require_dims(op, "w", w, {x.dim(1)});
  require_dims(op, "rstd", rstd, {x.dim(0)});
  require(eps >= 0, op, "eps must be >= 0");
  switch (common_device(op, y, rstd, x, w)) {
    HDP_CUDA_CASE(rmsnorm_forward(y, rstd, x, w, eps))
    HDP_CPU_CASES(rmsnorm_forward(y, rstd, x, w, eps))
    default: throw UnsupportedDevice(op, y.device);
  }
}

void rmsnorm_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd) {
  const char* op = "rmsnorm_backward";
  [[maybe_unused]] const DType dtype_ = check_dtypes(op, {{"dx", dx}, {"dy", dy}, {"x", x}, {"w", w}}, {{"dw", dw}, {"rstd", rstd}});
  require_dims(op, "x", x, {-1, -1});
  require_dims(op, "dx", dx, {x.dim(0), x.dim(1)});
  require_dims(op, "dy", dy, {x.dim(0), x.dim(1)});
  require_dims(op, "w", w, {x.dim(1)});
  require_dims(op, "dw", dw, {x.dim(1)});
  require_dims(op, "rstd", rstd, {x.dim(0)});
  switch (common_device(op, dx, dw, dy, x, w, rstd)) {
    HDP_CUDA_CASE(rmsnorm_backward(dx, dw, dy, x, w, rstd))
    HDP_CPU_CASES(rmsnorm_backward(dx, dw, dy, x, w, rstd))
    default: throw UnsupportedDevice(op, dx.device);
  }
}

// ---- RoPE ------------------------------------------------------------------------

namespace {
// The checks of x and, when given, of x2 (the same tokens, head size, dtype and device).
DType check_rope(const char* op, const Tensor& x, const Tensor& x2, const IndexTensor& positions,
                 const RopeSettings& rope) {
  const bool with_x2 = x2.data != nullptr;
  const DType dtype = with_x2 ? check_dtypes(op, {{"x", x}, {"x2", x2}}) : check_dtypes(op, {{"x", x}});
  require_dims(op, "x", x, {-1, -1, -1});
  require_dims(op, "positions", positions, {x.dim(0)});
  require(x.dim(2) % 2 == 0, op, "head dim of x=" + x.shape_string() + " must be even");
  require(rope.rope_theta > 0, op, "theta must be > 0");
  if (with_x2) {
    require_dims(op, "x2", x2, {x.dim(0), -1, x.dim(2)});
    common_device(op, x, x2, positions);
  } else {
    common_device(op, x, positions);
  }
  return dtype;
}
}  // namespace

void rope_forward(Tensor x, const IndexTensor& positions, const RopeSettings& rope, Tensor x2) {
  const char* op = "rope_forward";
  [[maybe_unused]] const DType dtype_ = check_rope(op, x, x2, positions, rope);
  switch (x.device) {
    HDP_CUDA_CASE(rope_forward(x, positions, rope, x2))
    HDP_CPU_CASES(rope_forward(x, positions, rope, x2))
    default: throw UnsupportedDevice(op, x.device);
  }
}

void rope_backward(Tensor dx, const IndexTensor& positions, const RopeSettings& rope, Tensor dx2) {
  const char* op = "rope_backward";
  [[maybe_unused]] const DType dtype_ = check_rope(op, dx, dx2, positions, rope);
  switch (dx.device) {
    HDP_CUDA_CASE(rope_backward(dx, positions, rope, dx2))
    HDP_CPU_CASES(rope_backward(dx, positions, rope, dx2))
    default: throw UnsupportedDevice(op, dx.device);
  }
}

// ---- attention -------------------------------------------------------------------

namespace {
void check_window(const char* op, int64_t window) {
  require(window >= 0, op, "window=" + std::to_string(window) + " must be >= 0 (kNoWindow = 0: full causal attention)");
}

#if HDP_HAVE_CUDA
// On CUDA an attention call runs cuDNN's fused attention or our kernels, as the
// process-wide choice says (kernels/attention_impl.h): whether cuDNN takes `call`.
// Under AttentionImpl::Cudnn a call it cannot take throws, saying why; under auto
// our kernels take it. cuDNN's calls are timed as "attention_forward (cudnn)" and
// "attention_backward (cudnn)" (HDP_CUDA_OP_TIMES), so a step's report tells the
// two apart.
bool cudnn_takes(const char* op, const CudnnAttentionCall& call) {
  const AttentionImpl impl = attention_impl();
  if (impl == AttentionImpl::Own) return false;
  // Under auto, what cuDNN never takes goes to our kernels without asking it.
  if (impl == AttentionImpl::Auto && (call.dtype != DType::BF16 || call.blocks)) return false;
  std::string why;
  if (cudnn_attention_supported(cuda::cudnn_runtime(), call, &why)) return true;
  if (impl == AttentionImpl::Cudnn) throw CudnnAttentionRefused(op, why);
  return false;
}

// After cuDNN refused the graph of a call it was to take: an error under
// AttentionImpl::Cudnn; under auto our kernels run the call.
void cudnn_refused_graph(const char* op, const std::string& why) {
  if (attention_impl() == AttentionImpl::Cudnn) throw CudnnAttentionRefused(op, why);
}

// The call of an op whose operands are `tensors` (q first, then k: the shapes).
CudnnAttentionCall attention_call(DType dtype, bool blocks, std::initializer_list<const Tensor*> tensors) {
  const Tensor& q = **tensors.begin();
  const Tensor& k = **(tensors.begin() + 1);
  CudnnAttentionCall call{dtype, q.dim(0), q.dim(1), k.dim(1), q.dim(2), blocks, true};
  for (const Tensor* t : tensors) call.aligned = call.aligned && reinterpret_cast<uintptr_t>(t->raw()) % 16 == 0;
  return call;
}
#endif

void check_attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                     const Tensor& lse, const IndexTensor& cu_seqlens) {
  require_dims(op, "q", q, {-1, -1, -1});
  const int64_t T = q.dim(0), Hq = q.dim(1), d = q.dim(2);
  require_dims(op, "k", k, {T, -1, d});
  require_dims(op, "v", v, {T, k.dim(1), d});
  require_dims(op, "out", out, {T, Hq, d});
  require_dims(op, "lse", lse, {Hq, T});
  require_dims(op, "cu_seqlens", cu_seqlens, {-1});
  require(d > 0, op, "head dim must be > 0");
  require(k.dim(1) > 0 && Hq % k.dim(1) == 0, op,
          "query heads of q=" + q.shape_string() + " must be a multiple of kv heads of k=" + k.shape_string());
  require(cu_seqlens.numel() >= 1, op, "cu_seqlens must hold at least one entry");
  // Values live in host memory for the CPU backend; a device backend checks its own copy.
  if (cu_seqlens.device == Device::CPU) {
    const int64_t n = cu_seqlens.numel();
    bool ok = cu_seqlens.data[0] == 0 && cu_seqlens.data[n - 1] == T;
    for (int64_t i = 0; ok && i + 1 < n; ++i) ok = cu_seqlens.data[i] <= cu_seqlens.data[i + 1];
    require(ok, op, "cu_seqlens=" + cu_seqlens.shape_string() + " must rise from 0 to T=" + std::to_string(T));
  }
}
}  // namespace

void attention_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       const IndexTensor& cu_seqlens, int64_t window) {
  const char* op = "attention_forward";
  [[maybe_unused]] const DType dtype_ = check_dtypes(op, {{"out", out}, {"q", q}, {"k", k}, {"v", v}}, {{"lse", lse}});
  check_attention(op, q, k, v, out, lse, cu_seqlens);
  check_window(op, window);
  switch (common_device(op, out, lse, q, k, v, cu_seqlens)) {
#if HDP_HAVE_CUDA
    case Device::CUDA: {
      cuda::require_device(op);
      std::string why;
      if (cudnn_takes(op, attention_call(dtype_, false, {&q, &k, &v, &out}))) {
        const cuda::OpTimer op_timer_("attention_forward (cudnn)");
        if (cuda::cudnn_attention_forward(out, lse, q, k, v, cu_seqlens, window, &why)) return;
        cudnn_refused_graph(op, why);
      }
      const cuda::OpTimer op_timer_(op);
      return cuda::attention_forward(out, lse, q, k, v, cu_seqlens, window);
    }
#endif
    HDP_CPU_CASES(attention_forward(out, lse, q, k, v, cu_seqlens, window))
    default: throw UnsupportedDevice(op, out.device);
  }
}

void attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse, const IndexTensor& cu_seqlens,
                        int64_t window) {
  const char* op = "attention_backward";
  [[maybe_unused]] const DType dtype_ = check_dtypes(op, {{"dq", dq}, {"dk", dk}, {"dv", dv}, {"dout", dout}, {"q", q}, {"k", k}, {"v", v}, {"out", out}}, {{"lse", lse}});
  check_attention(op, q, k, v, out, lse, cu_seqlens);
  check_window(op, window);
  require_same_shape(op, "dq", dq, "q", q);
  require_same_shape(op, "dk", dk, "k", k);
  require_same_shape(op, "dv", dv, "v", v);
  require_same_shape(op, "dout", dout, "out", out);
  switch (common_device(op, dq, dk, dv, dout, q, k, v, out, lse, cu_seqlens)) {
#if HDP_HAVE_CUDA
    case Device::CUDA: {
      cuda::require_device(op);
      std::string why;
      if (cudnn_takes(op, attention_call(dtype_, false, {&q, &k, &v, &out, &dout, &dq, &dk, &dv}))) {
        const cuda::OpTimer op_timer_("attention_backward (cudnn)");
        if (cuda::cudnn_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, cu_seqlens, window, &why)) return;
        cudnn_refused_graph(op, why);
      }
      const cuda::OpTimer op_timer_(op);
      return cuda::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, cu_seqlens, window);
    }
#endif
    HDP_CPU_CASES(attention_backward(dq, dk, dv, dout, q, k, v, out, lse, cu_seqlens, window))
    default: throw UnsupportedDevice(op, dq.device);
  }
}

namespace {
// q [Tq, Hq, d], k and v [Tk, Hkv, d], out [Tq, Hq, d], lse [Hq, Tq]; every block
// inside [0, Tq) x [0, Tk).
void check_attention_blocks(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                            const Tensor& lse, std::span<const AttentionBlock> blocks) {
  require_dims(op, "q", q, {-1, -1, -1});
  const int64_t Tq = q.dim(0), Hq = q.dim(1), d = q.dim(2);
  require_dims(op, "k", k, {-1, -1, d});
  const int64_t Tk = k.dim(0);
  require_dims(op, "v", v, {Tk, k.dim(1), d});
  require_dims(op, "out", out, {Tq, Hq, d});
  require_dims(op, "lse", lse, {Hq, Tq});
  require(d > 0, op, "head dim must be > 0");
  require(k.dim(1) > 0 && Hq % k.dim(1) == 0, op,
          "query heads of q=" + q.shape_string() + " must be a multiple of kv heads of k=" + k.shape_string());
  for (size_t i = 0; i < blocks.size(); ++i) {
    const AttentionBlock& b = blocks[i];
    if (!(0 <= b.q_begin && b.q_begin <= b.q_end && b.q_end <= Tq && 0 <= b.k_begin && b.k_begin <= b.k_end &&
          b.k_end <= Tk))
      fail(op, "block " + std::to_string(i) + " (query rows [" + std::to_string(b.q_begin) + ", " +
                   std::to_string(b.q_end) + "), key rows [" + std::to_string(b.k_begin) + ", " +
                   std::to_string(b.k_end) + ")) must lie inside q=" + q.shape_string() + " and k=" +
                   k.shape_string());
  }
}
}  // namespace

void attention_forward_blocks(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v,
                              std::span<const AttentionBlock> blocks, int64_t window) {
  const char* op = "attention_forward_blocks";
  [[maybe_unused]] const DType dtype_ = check_dtypes(op, {{"out", out}, {"q", q}, {"k", k}, {"v", v}}, {{"lse", lse}});
  check_attention_blocks(op, q, k, v, out, lse, blocks);
  check_window(op, window);
  switch (common_device(op, out, lse, q, k, v)) {
#if HDP_HAVE_CUDA
    case Device::CUDA: {
      cuda::require_device(op);
      const cuda::OpTimer op_timer_(op);
      // No cuDNN counterpart: cudnn_takes never takes a blocks call, and throws under cudnn.
      (void)cudnn_takes(op, attention_call(dtype_, true, {&q, &k}));
      return cuda::attention_forward_blocks(out, lse, q, k, v, blocks, window);
    }
#endif
    HDP_CPU_CASES(attention_forward_blocks(out, lse, q, k, v, blocks, window))
    default: throw UnsupportedDevice(op, out.device);
  }
}

void attention_reset_rows(Tensor out, Tensor lse, int64_t begin, int64_t end) {
  const char* op = "attention_reset_rows";
  [[maybe_unused]] const DType dtype_ = check_dtypes(op, {{"out", out}}, {{"lse", lse}});
  require_dims(op, "out", out, {-1, -1, -1});
  const int64_t T = out.dim(0);
  require_dims(op, "lse", lse, {out.dim(1), T});
  require(0 <= begin && begin <= end && end <= T, op,
          "rows [" + std::to_string(begin) + ", " + std::to_string(end) + ") must lie inside out=" +
              out.shape_string());
  switch (common_device(op, out, lse)) {
    HDP_CUDA_CASE(attention_reset_rows(out, lse, begin, end))
    HDP_CPU_CASES(attention_reset_rows(out, lse, begin, end))
    default: throw UnsupportedDevice(op, out.device);
  }
}

void attention_backward_blocks(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& out, const Tensor& lse,
                               std::span<const AttentionBlock> blocks, int64_t window) {
  const char* op = "attention_backward_blocks";
  [[maybe_unused]] const DType dtype_ = check_dtypes(op, {{"dq", dq}, {"dk", dk}, {"dv", dv}, {"dout", dout}, {"q", q}, {"k", k}, {"v", v}, {"out", out}}, {{"lse", lse}});
  check_attention_blocks(op, q, k, v, out, lse, blocks);
  check_window(op, window);
  require_same_shape(op, "dq", dq, "q", q);
  require_same_shape(op, "dk", dk, "k", k);
  require_same_shape(op, "dv", dv, "v", v);
  require_same_shape(op, "dout", dout, "out", out);
  switch (common_device(op, dq, dk, dv, dout, q, k, v, out, lse)) {
#if HDP_HAVE_CUDA
    case Device::CUDA: {
      cuda::require_device(op);
      const cuda::OpTimer op_timer_(op);
      // No cuDNN counterpart: cudnn_takes never takes a blocks call, and throws under cudnn.
      (void)cudnn_takes(op, attention_call(dtype_, true, {&q, &k}));
      return cuda::attention_backward_blocks(dq, dk, dv, dout, q, k, v, out, lse, blocks, window);
    }
#endif
    HDP_CPU_CASES(attention_backward_blocks(dq, dk, dv, dout, q, k, v, out, lse, blocks, window))
    default: throw UnsupportedDevice(op, dq.device);
  }
}

// ---- SwiGLU ----------------------------------------------------------------------

void swiglu_forward(Tensor out, const Tensor& gate, const Tensor& up) {
  const char* op = "swiglu_forward";
  [[maybe_unused]] const DType dtype_ = check_dtypes(op, {{"out", out}, {"gate", gate}, {"up", up}});
  require_same_shape(op, "gate", gate, "up", up);
  require_same_shape(op, "out", out, "gate", gate);
  switch (common_device(op, out, gate, up)) {
    HDP_CUDA_CASE(swiglu_forward(out, gate, up))
    HDP_CPU_CASES(swiglu_forward(out, gate, up))
    default: throw UnsupportedDevice(op, out.device);
  }
}

void swiglu_backward(Tensor dgate, Tensor dup, const Tensor& dout, const Tensor& gate, const Tensor& up, Tensor out) {
  const char* op = "swiglu_backward";
  const bool with_out = out.data != nullptr;
  [[maybe_unused]] const DType dtype_ =
      with_out
          ? check_dtypes(op, {{"dgate", dgate}, {"dup", dup}, {"dout", dout}, {"gate", gate}, {"up", up}, {"out", out}})
          : check_dtypes(op, {{"dgate", dgate}, {"dup", dup}, {"dout", dout}, {"gate", gate}, {"up", up}});
  require_same_shape(op, "gate", gate, "up", up);
  require_same_shape(op, "dout", dout, "gate", gate);
  require_same_shape(op, "dgate", dgate, "gate", gate);
  require_same_shape(op, "dup", dup, "up", up);
  if (with_out) require_same_shape(op, "out", out, "gate", gate);
  const Device device =
      with_out ? common_device(op, dgate, dup, dout, gate, up, out) : common_device(op, dgate, dup, dout, gate, up);
  switch (device) {
    HDP_CUDA_CASE(swiglu_backward(dgate, dup, dout, gate, up, out))
    HDP_CPU_CASES(swiglu_backward(dgate, dup, dout, gate, up, out))
    default: throw UnsupportedDevice(op, dgate.device);
  }
}

// ---- mixture-of-experts row movement ------------------------------------------------

namespace {
// An optional argument left out: a default Tensor (scale, weights of value 1).
bool absent(const Tensor& t) { return t.ndim == 0 && t.data == nullptr; }

// Every entry of `index` names a row of `of` (rows [0, limit)). The CPU and the guarded
// device read the indices where they lie (the guarded device inside an op's access,
// as its kernels do); on CUDA that would take a synchronizing copy to the host per
// call, so there the caller guarantees it and the kernels read nothing for a bad
// index (kernels/cuda/moe_rows.cu).
void check_row_indices(const char* op, const IndexTensor& index, const char* of, const Tensor& rows) {
  if (index.device == Device::CUDA) return;
  const auto check = [&] {
    const int64_t limit = rows.dim(0), k = index.ndim == 2 ? index.dim(1) : 1;
    for (int64_t i = 0; i < index.numel(); ++i) {
      const int64_t v = index.data[i];
      if (v < 0 || v >= limit) {
        const std::string where = index.ndim == 1 ? std::to_string(i)
                                         : std::to_string(i / k) + ", " + std::to_string(i % k);
        fail(op, "index[" + where + "] = " + std::to_string(v) + " is not a row of " + arg(of, rows));
      }
    }
  };
  if (index.device == Device::Guarded) {
    const guarded::Access guarded_access_;
    return check();
  }
  check();
}
}  // namespace

void gather_rows(Tensor out, const Tensor& x, const IndexTensor& index, const Tensor& scale) {
  const char* op = "gather_rows";
  const bool scaled = !absent(scale);
  [[maybe_unused]] const DType dtype_ = scaled ? check_dtypes(op, {{"out", out}, {"x", x}}, {{"scale", scale}})
                                               : check_dtypes(op, {{"out", out}, {"x", x}});
  require_dims(op, "x", x, {-1, -1});
  require_dims(op, "index", index, {-1});
  require_dims(op, "out", out, {index.dim(0), x.dim(1)});
  if (scaled) require_dims(op, "scale", scale, {index.dim(0)});
  const Device dev = scaled ? common_device(op, out, x, index, scale) : common_device(op, out, x, index);
  check_row_indices(op, index, "x", x);
  switch (dev) {
    HDP_CUDA_CASE(gather_rows(out, x, index, scale))
    HDP_CPU_CASES(gather_rows(out, x, index, scale))
    default: throw UnsupportedDevice(op, dev);
  }
}

void combine_rows(Tensor out, const Tensor& rows, const IndexTensor& index, const Tensor& weights) {
  const char* op = "combine_rows";
  const bool weighted = !absent(weights);
  [[maybe_unused]] const DType dtype_ = weighted
                                            ? check_dtypes(op, {{"out", out}, {"rows", rows}}, {{"weights", weights}})
                                            : check_dtypes(op, {{"out", out}, {"rows", rows}});
  require_dims(op, "rows", rows, {-1, -1});
  require_dims(op, "index", index, {-1, -1});
  require_dims(op, "out", out, {index.dim(0), rows.dim(1)});
  if (weighted) require_dims(op, "weights", weights, {index.dim(0), index.dim(1)});
  const Device dev = weighted ? common_device(op, out, rows, index, weights) : common_device(op, out, rows, index);
  check_row_indices(op, index, "rows", rows);
  switch (dev) {
    HDP_CUDA_CASE(combine_rows(out, rows, index, weights))
    HDP_CPU_CASES(combine_rows(out, rows, index, weights))
    default: throw UnsupportedDevice(op, dev);
  }
}

void combine_rows_weight_backward(Tensor dweights, const Tensor& dout, const Tensor& rows, const IndexTensor& index) {
  const char* op = "combine_rows_weight_backward";
  [[maybe_unused]] const DType dtype_ =
      check_dtypes(op, {{"dout", dout}, {"rows", rows}}, {{"dweights", dweights}});
  require_dims(op, "rows", rows, {-1, -1});
  require_dims(op, "index", index, {-1, -1});
  require_dims(op, "dout", dout, {index.dim(0), rows.dim(1)});
  require_dims(op, "dweights", dweights, {index.dim(0), index.dim(1)});
  const Device dev = common_device(op, dweights, dout, rows, index);
  check_row_indices(op, index, "rows", rows);
  switch (dev) {
    HDP_CUDA_CASE(combine_rows_weight_backward(dweights, dout, rows, index))
    HDP_CPU_CASES(combine_rows_weight_backward(dweights, dout, rows, index))
    default: throw UnsupportedDevice(op, dev);
  }
}

// ---- cross-entropy ---------------------------------------------------------------

namespace {
// Targets are global vocabulary ids or -1; a single shard must hold every target.
void check_targets(const char* op, const IndexTensor& targets, int64_t vocab_limit) {
  if (targets.device != Device::CPU) return;
  for (int64_t i = 0; i < targets.numel(); ++i) {
    const int64_t t = targets.data[i];
    if (t < -1 || (vocab_limit >= 0 && t >= vocab_limit))
      fail(op, "targets[" + std::to_string(i) + "] = " + std::to_string(t) + " is not -1 or a vocabulary id" +
                   (vocab_limit >= 0 ? " below " + std::to_string(vocab_limit) : std::string()));
  }
}
}  // namespace

void cross_entropy_stats(Tensor row_max, Tensor row_sumexp, Tensor target_logit, const Tensor& logits,
                         const IndexTensor& targets, int64_t vocab_begin) {
  const char* op = "cross_entropy_stats";
  [[maybe_unused]] const DType dtype_ = check_dtypes(op, {{"logits", logits}}, {{"row_max", row_max}, {"row_sumexp", row_sumexp}, {"target_logit", target_logit}});
  require_dims(op, "logits", logits, {-1, -1});
  const int64_t T = logits.dim(0);
  require_dims(op, "targets", targets, {T});
  require_dims(op, "row_max", row_max, {T});
  require_dims(op, "row_sumexp", row_sumexp, {T});
  require_dims(op, "target_logit", target_logit, {T});
  require(vocab_begin >= 0, op, "vocab_begin must be >= 0");
  const Device dev = common_device(op, row_max, row_sumexp, target_logit, logits, targets);
  check_targets(op, targets, -1);
  switch (dev) {
    HDP_CUDA_CASE(cross_entropy_stats(row_max, row_sumexp, target_logit, logits, targets, vocab_begin))
    HDP_CPU_CASES(cross_entropy_stats(row_max, row_sumexp, target_logit, logits, targets, vocab_begin))
    default: throw UnsupportedDevice(op, dev);
  }
}

void cross_entropy_backward_inplace(Tensor logits, const Tensor& lse, const IndexTensor& targets, int64_t vocab_begin,
                                    float grad_scale) {
  const char* op = "cross_entropy_backward_inplace";
  [[maybe_unused]] const DType dtype_ = check_dtypes(op, {{"logits", logits}}, {{"lse", lse}});
  require_dims(op, "logits", logits, {-1, -1});
  const int64_t T = logits.dim(0);
  require_dims(op, "targets", targets, {T});
  require_dims(op, "lse", lse, {T});
  require(vocab_begin >= 0, op, "vocab_begin must be >= 0");
  const Device dev = common_device(op, logits, lse, targets);
  check_targets(op, targets, -1);
  switch (dev) {
    HDP_CUDA_CASE(cross_entropy_backward_inplace(logits, lse, targets, vocab_begin, grad_scale))
    HDP_CPU_CASES(cross_entropy_backward_inplace(logits, lse, targets, vocab_begin, grad_scale))
    default: throw UnsupportedDevice(op, dev);
  }
}

void cross_entropy_rescale_sumexp(Tensor row_sumexp, const Tensor& row_max, const Tensor& global_max) {
  const char* op = "cross_entropy_rescale_sumexp";
  [[maybe_unused]] const DType dtype_ = check_dtypes(op, {}, {{"row_sumexp", row_sumexp}, {"row_max", row_max}, {"global_max", global_max}});
  require_dims(op, "row_sumexp", row_sumexp, {-1});
  const int64_t T = row_sumexp.dim(0);
  require_dims(op, "row_max", row_max, {T});
  require_dims(op, "global_max", global_max, {T});
  const Device dev = common_device(op, row_sumexp, row_max, global_max);
  switch (dev) {
    case Device::CPU: return cpu::cross_entropy_rescale_sumexp(row_sumexp, row_max, global_max);
    HDP_CUDA_CASE(cross_entropy_rescale_sumexp(row_sumexp, row_max, global_max))
    HDP_GUARDED_CASE(cross_entropy_rescale_sumexp(row_sumexp, row_max, global_max))
    default: throw UnsupportedDevice(op, dev);
  }
}

namespace {
// The checks of cross_entropy_global_loss; returns the device.
Device check_global_loss(const char* op, const Tensor& lse, const Tensor& global_max, const Tensor& row_sumexp,
                         const Tensor& target_logit, const IndexTensor& targets) {
  check_dtypes(op, {}, {{"lse", lse}, {"global_max", global_max}, {"row_sumexp", row_sumexp}, {"target_logit", target_logit}});
  require_dims(op, "lse", lse, {-1});
  const int64_t T = lse.dim(0);
  require_dims(op, "global_max", global_max, {T});
  require_dims(op, "row_sumexp", row_sumexp, {T});
  require_dims(op, "target_logit", target_logit, {T});
  require_dims(op, "targets", targets, {T});
  return common_device(op, lse, global_max, row_sumexp, target_logit, targets);
}

// The checks of cross_entropy_forward_backward; returns the compute dtype (the device is logits').
DType check_forward_backward(const char* op, const Tensor& logits, const IndexTensor& targets,
                             const Tensor& scratch_3xT) {
  const DType dtype = check_dtypes(op, {{"logits", logits}}, {{"scratch_3xT", scratch_3xT}});
  require_dims(op, "logits", logits, {-1, -1});
  const int64_t T = logits.dim(0);
  require_dims(op, "targets", targets, {T});
  require(scratch_3xT.numel() >= 3 * T && (T == 0 || scratch_3xT.data), op,
          arg("scratch_3xT", scratch_3xT) + " must hold at least 3*T = " + std::to_string(3 * T) + " floats");
  common_device(op, logits, targets, scratch_3xT);
  check_targets(op, targets, logits.dim(1));
  return dtype;
}
}  // namespace

double cross_entropy_global_loss(Tensor lse, const Tensor& global_max, const Tensor& row_sumexp,
                                 const Tensor& target_logit, const IndexTensor& targets) {
  const char* op = "cross_entropy_global_loss";
  [[maybe_unused]] const DType dtype_ = DType::F32;
  const Device dev = check_global_loss(op, lse, global_max, row_sumexp, target_logit, targets);
  count_host_read(dev);
  switch (dev) {
    case Device::CPU: return cpu::cross_entropy_global_loss(lse, global_max, row_sumexp, target_logit, targets);
    HDP_CUDA_CASE(cross_entropy_global_loss(lse, global_max, row_sumexp, target_logit, targets))
    HDP_GUARDED_CASE(cross_entropy_global_loss(lse, global_max, row_sumexp, target_logit, targets))
    default: throw UnsupportedDevice(op, dev);
  }
}

void cross_entropy_global_loss(Tensor lse, const Tensor& global_max, const Tensor& row_sumexp,
                               const Tensor& target_logit, const IndexTensor& targets, DoubleTensor loss_sum) {
  const char* op = "cross_entropy_global_loss";
  [[maybe_unused]] const DType dtype_ = DType::F32;
  const Device dev = check_global_loss(op, lse, global_max, row_sumexp, target_logit, targets);
  require_sums(op, "loss_sum", loss_sum);
  require(loss_sum.numel() >= 1 && loss_sum.device == dev, op, "loss_sum must hold a sum on the tensors' device");
  switch (dev) {
    HDP_CUDA_CASE(cross_entropy_global_loss(lse, global_max, row_sumexp, target_logit, targets, loss_sum))
    case Device::CPU:
    case Device::Guarded:
      return host_side(dev, [&] {
        loss_sum.data[0] += cpu::cross_entropy_global_loss(lse, global_max, row_sumexp, target_logit, targets);
      });
    default: throw UnsupportedDevice(op, dev);
  }
}

double cross_entropy_forward_backward(Tensor logits, const IndexTensor& targets, float grad_scale, Tensor scratch_3xT) {
  const char* op = "cross_entropy_forward_backward";
  [[maybe_unused]] const DType dtype_ = check_forward_backward(op, logits, targets, scratch_3xT);
  count_host_read(logits.device);
  switch (logits.device) {
    HDP_CUDA_CASE(cross_entropy_forward_backward(logits, targets, grad_scale, scratch_3xT))
    HDP_CPU_CASES(cross_entropy_forward_backward(logits, targets, grad_scale, scratch_3xT))
    default: throw UnsupportedDevice(op, logits.device);
  }
}

void cross_entropy_forward_backward(Tensor logits, const IndexTensor& targets, float grad_scale, Tensor scratch_3xT,
                                    DoubleTensor loss_sum) {
  const char* op = "cross_entropy_forward_backward";
  [[maybe_unused]] const DType dtype_ = check_forward_backward(op, logits, targets, scratch_3xT);
  const Device dev = logits.device;
  require_sums(op, "loss_sum", loss_sum);
  require(loss_sum.numel() >= 1 && loss_sum.device == dev, op, "loss_sum must hold a sum on the tensors' device");
  switch (dev) {
    HDP_CUDA_CASE(cross_entropy_forward_backward(logits, targets, grad_scale, scratch_3xT, loss_sum))
    case Device::CPU:
    case Device::Guarded:
      return host_side(dev, [&] {
        loss_sum.data[0] += dtype_ == DType::BF16
                                ? cpu::bf16_ops::cross_entropy_forward_backward(logits, targets, grad_scale, scratch_3xT)
                                : cpu::cross_entropy_forward_backward(logits, targets, grad_scale, scratch_3xT);
      });
    default: throw UnsupportedDevice(op, dev);
  }
}

// ---- AdamW -----------------------------------------------------------------------

void adamw_update(Tensor param, const Tensor& grad, Tensor m, Tensor v, const AdamWStep& s, Tensor param_bf16) {
  const char* op = "adamw_update";
  [[maybe_unused]] const DType dtype_ = check_dtypes(op, {}, {{"param", param}, {"grad", grad}, {"m", m}, {"v", v}});
  require_same_shape(op, "param", param, "grad", grad);
  require_same_shape(op, "m", m, "param", param);
  require_same_shape(op, "v", v, "param", param);
  const bool with_bf16 = param_bf16.data != nullptr;
  if (with_bf16) {
    require_same_shape(op, "param_bf16", param_bf16, "param", param);
    require(param_bf16.dtype == DType::BF16, op, "param_bf16 must be bf16");
  }
  require(s.step >= 1, op, "step must be >= 1 (got " + std::to_string(s.step) + ")");
  require(s.beta1 >= 0 && s.beta1 < 1 && s.beta2 >= 0 && s.beta2 < 1, op, "betas must lie in [0, 1)");
  const Device device =
      with_bf16 ? common_device(op, param, grad, m, v, param_bf16) : common_device(op, param, grad, m, v);
  switch (device) {
    case Device::CPU: return cpu::adamw_update(param, grad, m, v, s, param_bf16);
    HDP_CUDA_CASE(adamw_update(param, grad, m, v, s, param_bf16))
    HDP_GUARDED_CASE(adamw_update(param, grad, m, v, s, param_bf16))
    default: throw UnsupportedDevice(op, param.device);
  }
}

}  // namespace hdp

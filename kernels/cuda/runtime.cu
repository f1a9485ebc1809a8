// The CUDA backend's process-wide state: the device, the compute stream every op
// is enqueued on, and the precision switch for fp32 GEMMs. Errors become
// std::runtime_error naming the call, so a failing GPU ends the job with a message
// (the trainer's exit-code table maps it) instead of a crash.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <vector>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/device.h"

namespace hdp::cuda {
namespace {

struct State {
  std::once_flag once;
  int device = -1;
  cudaStream_t stream = nullptr;
  bool tf32 = false;
};

State& state() {
  static State s;
  return s;
}

}  // namespace

[[noreturn]] void throw_cuda_error(const char* what, cudaError_t err, const char* file, int line) {
  throw std::runtime_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(err) + " (" + file + ":" +
                           std::to_string(line) + ")");
}

bool compiled() { return true; }

bool available(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why) *why = cudaGetErrorString(err);
    cudaGetLastError();  // clear the sticky-free error so later calls are not confused
    return false;
  }
  if (count == 0) {
    if (why) *why = "no CUDA-capable device is visible";
    return false;
  }
  return true;
}

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

void require_device(const char* op) {
  static std::string why;
  static const bool usable = available(&why);
  if (!usable) throw UnsupportedDevice(op, Device::CUDA, why);
}

void initialize(int device) {
  State& s = state();
  std::call_once(s.once, [&] {
    std::string why;
    if (!available(&why)) throw std::runtime_error("cuda: no usable CUDA device (" + why + ")");
    int count = 0;
    HDP_CUDA_CHECK(cudaGetDeviceCount(&count));
    if (device < 0 || device >= count) {
      throw std::runtime_error("cuda: device " + std::to_string(device) + " requested, " + std::to_string(count) +
                               " visible");
    }
    HDP_CUDA_CHECK(cudaSetDevice(device));
    HDP_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
    s.device = device;
  });
  // Threads other than the first (copy engine, communication) must use the same device.
  HDP_CUDA_CHECK(cudaSetDevice(s.device));
}

cudaStream_t compute_stream() {
  State& s = state();
  if (s.device < 0) initialize(0);
  return s.stream;
}

std::string device_description() {
  initialize(state().device < 0 ? 0 : state().device);
  cudaDeviceProp p{};
  HDP_CUDA_CHECK(cudaGetDeviceProperties(&p, state().device));
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s (sm_%d%d, %d SMs, %.1f GiB)", p.name, p.major, p.minor, p.multiProcessorCount,
                static_cast<double>(p.totalGlobalMem) / (1 << 30));
  return buf;
}

void* device_malloc(size_t bytes) {
  compute_stream();
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    std::fprintf(stderr, "cuda: cannot allocate %.1f MiB of device memory (%.1f MiB free of %.1f MiB): %s\n",
                 static_cast<double>(bytes) / (1 << 20), static_cast<double>(free_bytes) / (1 << 20),
                 static_cast<double>(total) / (1 << 20), cudaGetErrorString(err));
    throw std::bad_alloc();
  }
  return p;
}

void device_free(void* ptr) {
  if (ptr) cudaFree(ptr);
}

void* pinned_malloc(size_t bytes) {
  compute_stream();
  void* p = nullptr;
  if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) != cudaSuccess) {
    cudaGetLastError();
    throw std::bad_alloc();
  }
  return p;
}

void pinned_free(void* ptr) {
  if (ptr) cudaFreeHost(ptr);
}

void synchronize() { HDP_CUDA_CHECK(cudaStreamSynchronize(compute_stream())); }

void* compute_stream_handle() { return compute_stream(); }

std::string device_bus_id() {
  compute_stream();  // the device is chosen
  char id[64] = {};
  HDP_CUDA_CHECK(cudaDeviceGetPCIBusId(id, static_cast<int>(sizeof id), state().device));
  return id;
}

// ---- timing events ------------------------------------------------------------------

void* timing_event_create() {
  compute_stream();  // the device is chosen
  cudaEvent_t e = nullptr;
  HDP_CUDA_CHECK(cudaEventCreate(&e));
  return e;
}

void timing_event_destroy(void* event) {
  if (!event) return;
  cudaEventDestroy(static_cast<cudaEvent_t>(event));  // from destructors: errors dropped
  cudaGetLastError();
}

void event_record(void* event) { HDP_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), compute_stream())); }

bool event_done(void* event) {
  const cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (err == cudaErrorNotReady) {
    // "Not ready" is an answer, not a failure; runtimes that keep it as the last error
    // would have the next launch check (cudaGetLastError) report it as the kernel's.
    if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
    return false;
  }
  HDP_CUDA_CHECK(err);
  return true;
}

void event_synchronize(void* event) { HDP_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event))); }

float event_elapsed_ms(void* start, void* end) {
  float ms = 0;
  HDP_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)));
  return ms;
}

// ---- per-op device times ----------------------------------------------------------
namespace {

struct OpTimes {
  std::mutex mutex;
  std::vector<cudaEvent_t> free_events;
  struct Interval {
    std::string op;
    double flops;
    cudaEvent_t start, end;
  };
  std::vector<Interval> pending;  // recorded, not yet read
  struct Total {
    int64_t calls = 0;
    double ms = 0, flops = 0;
  };
  std::map<std::string, Total> totals;  // by op name
  bool reset = false;                   // op_times_reset() has dropped the first times

  cudaEvent_t take() {
    if (free_events.empty()) {
      cudaEvent_t e;
      HDP_CUDA_CHECK(cudaEventCreate(&e));
      return e;
    }
    cudaEvent_t e = free_events.back();
    free_events.pop_back();
    return e;
  }
  // Reads every recorded interval (waits for the device) and recycles its events.
  void drain() {
    HDP_CUDA_CHECK(cudaStreamSynchronize(compute_stream()));
    for (const Interval& i : pending) {
      float ms = 0;
      HDP_CUDA_CHECK(cudaEventElapsedTime(&ms, i.start, i.end));
      Total& t = totals[i.op];
      t.calls += 1;
      t.ms += ms;
      t.flops += i.flops;
      free_events.push_back(i.start);
      free_events.push_back(i.end);
    }
    pending.clear();
  }
};

OpTimes& op_times() {
  static OpTimes t;
  return t;
}

}  // namespace

bool op_times_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("HDP_CUDA_OP_TIMES");
    return v != nullptr && std::string(v) == "1";
  }();
  return enabled;
}

OpTimer::OpTimer(const char* op) {
  if (!op_times_enabled()) return;
  name_ = op;
  OpTimes& t = op_times();
  std::lock_guard<std::mutex> lock(t.mutex);
  cudaEvent_t e = t.take();
  HDP_CUDA_CHECK(cudaEventRecord(e, compute_stream()));
  start_ = e;
}

OpTimer::OpTimer(const char* op, const GemmShape& gemm) : OpTimer(op) {
  if (start_ == nullptr) return;
  name_ += " M=" + std::to_string(gemm.m) + " N=" + std::to_string(gemm.n) + " K=" + std::to_string(gemm.k);
  flops_ = 2.0 * static_cast<double>(gemm.m) * static_cast<double>(gemm.n) * static_cast<double>(gemm.k) *
           gemm.products;
}

OpTimer::~OpTimer() {
  if (start_ == nullptr) return;
  OpTimes& t = op_times();
  std::lock_guard<std::mutex> lock(t.mutex);
  // No throwing from a destructor (during unwinding it would end the process): after
  // a CUDA error the interval is dropped, and the error is not left for the next
  // launch check to report as its own.
  try {
    cudaEvent_t e = t.take();
    if (cudaEventRecord(e, compute_stream()) != cudaSuccess) {
      (void)cudaGetLastError();
      t.free_events.push_back(e);
      t.free_events.push_back(static_cast<cudaEvent_t>(start_));
      return;
    }
    t.pending.push_back({name_, flops_, static_cast<cudaEvent_t>(start_), e});
    if (t.pending.size() >= 16384) t.drain();
  } catch (const std::exception&) {
    (void)cudaGetLastError();
  }
}

void op_times_reset() {
  if (!op_times_enabled()) return;
  OpTimes& t = op_times();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.drain();
  t.totals.clear();
  t.reset = true;
}

std::string op_times_report() {
  if (!op_times_enabled()) return {};
  OpTimes& t = op_times();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.drain();
  std::vector<std::pair<std::string, OpTimes::Total>> rows(t.totals.begin(), t.totals.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  double total = 0;
  for (const auto& r : rows) total += r.second.ms;
  std::string out = std::string("device time per op (HDP_CUDA_OP_TIMES=1") +
                    (t.reset ? ", the steps after the first" : "") + "):\n";
  char line[200];
  std::snprintf(line, sizeof line, "  %-46s %9s %12s %7s %9s\n", "op", "calls", "total ms", "share", "TFLOP/s");
  out += line;
  for (const auto& [op, v] : rows) {
    char rate[32] = "";
    if (v.flops > 0 && v.ms > 0) std::snprintf(rate, sizeof rate, "%9.1f", v.flops / (v.ms * 1e-3) / 1e12);
    std::snprintf(line, sizeof line, "  %-46s %9lld %12.1f %6.1f%% %s\n", op.c_str(), static_cast<long long>(v.calls),
                  v.ms, total > 0 ? 100.0 * v.ms / total : 0.0, rate);
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-46s %9s %12.1f\n", "timed total", "", total);
  return out + line;
}

void set_tf32(bool enabled) { state().tf32 = enabled; }
bool tf32() { return state().tf32; }

}  // namespace hdp::cuda

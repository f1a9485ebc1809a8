#pragma once
// The CUDA backend's process-wide state, seen from host code that must not
// include CUDA headers: whether a device is usable, which one, the memory calls
// the allocator and the copy engine need, and the precision of fp32 GEMMs.
// Everything here is also declared (and does nothing but report "no device")
// when the build has no CUDA compiler, so callers need no #ifdef.

#include <cstddef>
#include <cstdint>
#include <string>

namespace hdp::cuda {

// True when this build has the CUDA backend compiled in.
bool compiled();
// Whether a CUDA device can be used; otherwise `why` (if given) says why not
// ("built without CUDA", "no CUDA-capable device", the driver's message...).
bool available(std::string* why = nullptr);
// Throws UnsupportedDevice naming `op` when no CUDA device is usable (checked once
// per process); every op dispatched to this backend calls it first.
void require_device(const char* op);
// Selects the device (first call wins; default: device 0 of those visible,
// which honours CUDA_VISIBLE_DEVICES) and creates the streams and handles.
// Throws std::runtime_error naming the device when it cannot.
void initialize(int device = 0);
// How many CUDA devices this process sees (CUDA_VISIBLE_DEVICES applies); 0 when
// none can be used or the build has no CUDA backend.
int device_count();
// "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79.1 GiB)".
std::string device_description();

void* device_malloc(size_t bytes);          // cudaMalloc; throws std::bad_alloc with the sizes on failure
void device_free(void* ptr);
void* pinned_malloc(size_t bytes);          // cudaHostAlloc (page-locked host memory)
void pinned_free(void* ptr);
// Waits for all work enqueued on the compute stream.
void synchronize();
// The compute stream itself (a cudaStream_t), for host code outside kernels/ that
// orders its own device work against the ops' (the NCCL communicator's events).
void* compute_stream_handle();
// The PCI bus id of this process's device ("0000:18:00.0"): one GPU of a node
// whatever number CUDA_VISIBLE_DEVICES gives it, so ranks can tell whether they share one.
std::string device_bus_id();

// The copy engine's stream (kernels/copy_engine.cpp, kernels/cuda/copy_stream.cu).
// Streams and events are opaque handles (cudaStream_t, cudaEvent_t) so that host
// code needs no CUDA headers.
void* copy_stream_create();          // a cudaStreamNonBlocking stream on this process's device
void copy_stream_destroy(void* stream);  // waits for its work first; never throws
void* copy_event_create();           // cudaEventDisableTiming
void copy_event_destroy(void* event);    // never throws
// One asynchronous copy ordered after everything already enqueued on the compute
// stream: `start` is recorded on the compute stream and `stream` waits for it,
// then cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault) runs on `stream` and
// `done` is recorded after it. `start` may be reused for the next copy at once.
void copy_after_compute(void* stream, void* start, void* done, void* dst, const void* src, size_t bytes);
// Work enqueued on the compute stream from now on waits for `event` (no host wait).
void compute_wait_event(void* event);
// Blocks the host until everything enqueued on `stream` has finished.
void copy_stream_synchronize(void* stream);

// Timing events on the compute stream (kernels/ops.h, DeviceEvent): opaque
// cudaEvent_t handles created with timing enabled.
void* timing_event_create();
void timing_event_destroy(void* event);  // null allowed; never throws
void event_record(void* event);          // on the compute stream
bool event_done(void* event);            // cudaEventQuery: the work before its record has run
void event_synchronize(void* event);     // blocks the host until it has
float event_elapsed_ms(void* start, void* end);  // both done

// fp32 GEMMs: exact fp32 (default) or TF32 tensor cores (faster, ~1e-3 relative).
void set_tf32(bool enabled);
bool tf32();

// Device time per op, for finding where a step's time goes: with the environment
// variable HDP_CUDA_OP_TIMES=1 every op dispatched to the CUDA backend is bracketed
// by two CUDA events on the compute stream (kernels/ops.cpp), and
// op_times_report() sums the elapsed times per op name. Off by default: the
// events cost a few microseconds per op. A GEMM's row names its shape and its
// FLOPs give it a TFLOP/s figure, so the table says which shapes run slowly.
bool op_times_enabled();
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;  // C [m, n] = A [m, k] B [k, n]
  int products = 1;             // GEMMs of this shape in the op (a backward's dx and dw: 2)
};
class OpTimer {
 public:
  explicit OpTimer(const char* op);
  OpTimer(const char* op, const GemmShape& gemm);
  ~OpTimer();
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

 private:
  std::string name_;
  double flops_ = 0;
  void* start_ = nullptr;  // the start event (a cudaEvent_t); null when timing is off
};
// Forgets the times so far (the trainer calls it after its first step, whose times
// include one-time work: cuBLASLt's and cuDNN's plans, the upload of the weights).
void op_times_reset();
// A table: op, calls, total ms, share of the timed total, TFLOP/s where the op's
// FLOPs are known; empty when timing is off.
std::string op_times_report();

}  // namespace hdp::cuda

// The CUDA side of the copy engine (kernels/copy_engine.cpp): a non-blocking
// stream of its own whose copies start after the compute already enqueued and
// whose completion the compute stream waits on without blocking the host, so
// activations move to and from pinned host memory while attention runs.

#include <cuda_runtime.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_runtime.h"

namespace hdp::cuda {
namespace {
cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }
}  // namespace

void* copy_stream_create() {
  compute_stream();  // selects the device and creates the compute stream first
  cudaStream_t s = nullptr;
  HDP_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

void copy_stream_destroy(void* stream) {
  if (!stream) return;
  // Called from destructors, possibly at exit after the driver has gone: errors
  // are dropped rather than thrown.
  cudaStreamSynchronize(as_stream(stream));
  cudaStreamDestroy(as_stream(stream));
  cudaGetLastError();
}

void* copy_event_create() {
  compute_stream();
  cudaEvent_t e = nullptr;
  HDP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void copy_event_destroy(void* event) {
  if (!event) return;
  cudaEventDestroy(as_event(event));
  cudaGetLastError();
}

void copy_after_compute(void* stream, void* start, void* done, void* dst, const void* src, size_t bytes) {
  // A stream waits on the record an event had when cudaStreamWaitEvent was called,
  // so `start` can be recorded again for the next copy right away.
  HDP_CUDA_CHECK(cudaEventRecord(as_event(start), compute_stream()));
  HDP_CUDA_CHECK(cudaStreamWaitEvent(as_stream(stream), as_event(start), 0));
  if (bytes > 0) HDP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(stream)));
  HDP_CUDA_CHECK(cudaEventRecord(as_event(done), as_stream(stream)));
}

void compute_wait_event(void* event) { HDP_CUDA_CHECK(cudaStreamWaitEvent(compute_stream(), as_event(event), 0)); }

void copy_stream_synchronize(void* stream) { HDP_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream))); }

}  // namespace hdp::cuda

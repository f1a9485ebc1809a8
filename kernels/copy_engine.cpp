#include "kernels/copy_engine.h"

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_runtime.h"
#include "kernels/guarded_memory.h"

namespace hdp {

// Completion events of the CUDA copy stream, reused: an event goes back to the
// pool when the last CopyEvent naming it is gone, so it is never re-recorded while
// someone may still wait on its earlier record. Shared with the events' states, so
// that CopyEvents may outlive their engine.
struct CopyEngine::CudaEvents {
  std::mutex mutex;
  std::vector<void*> free;
  size_t created = 0;

  void* acquire() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!free.empty()) {
        void* e = free.back();
        free.pop_back();
        return e;
      }
      ++created;
    }
    return cuda::copy_event_create();
  }
  void release(void* event) {
    std::lock_guard<std::mutex> lock(mutex);
    free.push_back(event);
  }
  ~CudaEvents() {
    for (void* e : free) cuda::copy_event_destroy(e);
  }
};

struct CopyEvent::State {
  // CPU: set by the worker thread.
  std::mutex mutex;
  std::condition_variable done_signal;
  bool done = false;
  // CUDA: recorded on the copy stream after the copy; back to its pool at the end.
  void* cuda_event = nullptr;
  std::shared_ptr<CopyEngine::CudaEvents> pool;

  State() = default;
  State(void* event, std::shared_ptr<CopyEngine::CudaEvents> events) : cuda_event(event), pool(std::move(events)) {}
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    if (cuda_event) pool->release(cuda_event);
  }
};

void CopyEvent::wait() const {
  if (!state_) return;
  if (state_->cuda_event) {
    cuda::compute_wait_event(state_->cuda_event);
    return;
  }
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->done_signal.wait(lock, [&] { return state_->done; });
}

CopyEngine::CopyEngine(Device device) : device_(device) {
  if (device == Device::CPU || device == Device::Guarded) {  // Guarded: the CPU's worker thread
    worker_ = std::thread([this] { run(); });
    return;
  }
  if (device != Device::CUDA || !cuda::compiled()) throw UnsupportedDevice("copy engine", device);
  cuda_events_ = std::make_shared<CudaEvents>();
  cuda_stream_ = cuda::copy_stream_create();
  try {
    cuda_start_ = cuda::copy_event_create();
  } catch (...) {
    cuda::copy_stream_destroy(cuda_stream_);
    throw;
  }
}

CopyEngine::~CopyEngine() {
  if (device_ == Device::CUDA) {
    cuda::copy_stream_destroy(cuda_stream_);  // waits for the copies still running
    cuda::copy_event_destroy(cuda_start_);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_.notify_one();
  worker_.join();
}

CopyEvent CopyEngine::copy_async(Tensor dst, const Tensor& src) {
  if (dst.numel() != src.numel()) throw std::invalid_argument("copy engine: source and destination sizes differ");
  // A copy moves bytes (memcpy, cudaMemcpyAsync): it cannot convert, so both sides hold
  // the same dtype (bf16 activations go to the host pool and back as bf16).
  if (dst.dtype != src.dtype) {
    throw std::invalid_argument(std::string("copy engine: copies ") + dtype_name(src.dtype) + " into " +
                                dtype_name(dst.dtype) + " (it moves bytes; convert with copy())");
  }
  if (device_ == Device::CUDA) return cuda_copy_async(dst, src);
  auto state = std::make_shared<CopyEvent::State>();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_back({dst, src, state});
    last_ = CopyEvent(state);
  }
  work_.notify_one();
  return CopyEvent(state);
}

CopyEvent CopyEngine::cuda_copy_async(Tensor dst, const Tensor& src) {
  std::lock_guard<std::mutex> lock(mutex_);  // cuda_start_ is recorded and waited on as one step
  auto state = std::make_shared<CopyEvent::State>(cuda_events_->acquire(), cuda_events_);
  cuda::copy_after_compute(cuda_stream_, cuda_start_, state->cuda_event, dst.data, src.data, src.bytes());
  last_ = CopyEvent(state);
  return last_;
}

void CopyEngine::synchronize() {
  if (device_ == Device::CUDA) {
    cuda::copy_stream_synchronize(cuda_stream_);
    return;
  }
  CopyEvent last;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    last = last_;
  }
  last.wait();
}

size_t CopyEngine::events_created() const {
  if (!cuda_events_) return 0;
  std::lock_guard<std::mutex> lock(cuda_events_->mutex);
  return cuda_events_->created + (cuda_start_ ? 1 : 0);
}

void CopyEngine::run() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping with nothing left to copy
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    if (job.src.numel() > 0) {
      if (device_ == Device::Guarded) {
        const guarded::Access access;  // device memory on one side: open it for the copy only
        std::memcpy(job.dst.data, job.src.data, job.src.bytes());
      } else {
        std::memcpy(job.dst.data, job.src.data, job.src.bytes());
      }
    }
    {
      std::lock_guard<std::mutex> lock(job.state->mutex);
      job.state->done = true;
    }
    job.state->done_signal.notify_all();
  }
}

}  // namespace hdp

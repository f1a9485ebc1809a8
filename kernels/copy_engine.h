#pragma once
// Asynchronous copies between a device's memory and host memory on a copy
// stream of their own, so that moving activations out and back in overlaps the
// computation. On the CPU backend the stream is a worker thread running the
// copies in order. On the CUDA backend it is a CUDA stream of its own
// (cudaStreamNonBlocking): each copy waits for an event recorded on the compute
// stream, so it starts after the compute already enqueued, and records an event
// when done, which the compute stream waits on (the host never blocks there).
// Host memory on the CUDA side should be pinned (pinned_host_allocator) for the
// copies to be asynchronous.

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "kernels/tensor.h"

namespace hdp {

// Completion of one enqueued copy. An empty event is complete.
class CopyEvent {
 public:
  struct State;  // kernels/copy_engine.cpp
  CopyEvent() = default;
  explicit CopyEvent(std::shared_ptr<State> state) : state_(std::move(state)) {}
  // Orders what comes next after the copy. CPU: blocks this thread until the copy
  // is done. CUDA: work enqueued on the compute stream from now on waits for the
  // copy; the host goes on at once (so the host must not read copied memory
  // without synchronizing first).
  void wait() const;

 private:
  std::shared_ptr<State> state_;
};

class CopyEngine {
 public:
  explicit CopyEngine(Device device);
  ~CopyEngine();
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  // dst <- src (equal sizes), after everything this thread computed (CPU) or
  // enqueued on the compute stream (CUDA) before the call, and after earlier
  // copies of this engine. Both must stay untouched until the event completes.
  CopyEvent copy_async(Tensor dst, const Tensor& src);
  // Blocks the host until every copy enqueued so far is done.
  void synchronize();

  Device device() const { return device_; }
  // CUDA: events created so far (the start event included). Each copy takes one from a pool and gives it back
  // when the last CopyEvent naming it is gone, so the pool grows to the number of
  // events held at once (the model holds two per offloaded layer and slot) during
  // the first micro-batch and creates none afterwards. 0 on the CPU.
  size_t events_created() const;

 private:
  struct Job {
    Tensor dst, src;
    std::shared_ptr<CopyEvent::State> state;
  };
  struct CudaEvents;  // the CUDA event pool (kernels/copy_engine.cpp)
  friend struct CopyEvent::State;  // gives its event back to the pool
  void run();
  CopyEvent cuda_copy_async(Tensor dst, const Tensor& src);

  Device device_;
  std::mutex mutex_;
  CopyEvent last_;
  // CPU: the worker thread and its queue.
  std::condition_variable work_;
  std::deque<Job> jobs_;
  bool stop_ = false;
  std::thread worker_;
  // CUDA: the copy stream, the event recorded on the compute stream before each
  // copy (re-recorded every time: a stream waits on the record it saw), and the
  // pool of completion events.
  void* cuda_stream_ = nullptr;
  void* cuda_start_ = nullptr;
  std::shared_ptr<CudaEvents> cuda_events_;
};

}  // namespace hdp

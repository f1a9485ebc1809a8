#pragma once
// Asynchronous copies between a device's memory and host memory on a copy
// stream of their own, so that moving activations out and back in overlaps the
// computation. On the CPU backend the stream is a worker thread running the
// copies in order; a CUDA backend runs them on a separate CUDA stream from pinned
// host memory, ordered after the compute already issued.

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
  struct State {
    std::mutex mutex;
    std::condition_variable done_signal;
    bool done = false;
  };
  CopyEvent() = default;
  explicit CopyEvent(std::shared_ptr<State> state) : state_(std::move(state)) {}
  void wait() const;
  bool done() const;

 private:
  std::shared_ptr<State> state_;
};

class CopyEngine {
 public:
  explicit CopyEngine(Device device);
  ~CopyEngine();
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  // dst <- src (equal sizes), after everything this thread computed before the call
  // and after earlier copies of this engine. Both must stay untouched until the
  // event completes.
  CopyEvent copy_async(Tensor dst, const Tensor& src);
  // Waits for every copy enqueued so far.
  void synchronize();

 private:
  struct Job {
    Tensor dst, src;
    std::shared_ptr<CopyEvent::State> state;
  };
  void run();

  Device device_;
  std::mutex mutex_;
  std::condition_variable work_;
  std::deque<Job> jobs_;
  bool stop_ = false;
  CopyEvent last_;
  std::thread worker_;
};

}  // namespace hdp

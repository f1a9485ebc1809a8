#include "kernels/copy_engine.h"

#include <cstring>
#include <stdexcept>

namespace hdp {

void CopyEvent::wait() const {
  if (!state_) return;
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->done_signal.wait(lock, [&] { return state_->done; });
}

bool CopyEvent::done() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->done;
}

CopyEngine::CopyEngine(Device device) : device_(device) {
  if (device != Device::CPU) throw UnsupportedDevice("copy engine", device);
  worker_ = std::thread([this] { run(); });
}

CopyEngine::~CopyEngine() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_.notify_one();
  worker_.join();
}

CopyEvent CopyEngine::copy_async(Tensor dst, const Tensor& src) {
  if (dst.numel() != src.numel()) throw std::invalid_argument("copy engine: source and destination sizes differ");
  auto state = std::make_shared<CopyEvent::State>();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_back({dst, src, state});
    last_ = CopyEvent(state);
  }
  work_.notify_one();
  return CopyEvent(state);
}

void CopyEngine::synchronize() {
  CopyEvent last;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    last = last_;
  }
  last.wait();
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
    if (job.src.numel() > 0) std::memcpy(job.dst.data, job.src.data, job.src.bytes());
    {
      std::lock_guard<std::mutex> lock(job.state->mutex);
      job.state->done = true;
    }
    job.state->done_signal.notify_all();
  }
}

}  // namespace hdp

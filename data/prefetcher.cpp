#include "data/prefetcher.h"

#include <stdexcept>

namespace hdp {

BatchPrefetcher::BatchPrefetcher(std::function<GlobalBatch()> produce, int depth)
    : produce_(std::move(produce)), depth_(depth) {
  if (depth_ < 1) throw std::invalid_argument("BatchPrefetcher: depth must be >= 1");
  if (!produce_) throw std::invalid_argument("BatchPrefetcher: no producer");
  thread_ = std::thread([this] { run(); });
}

BatchPrefetcher::~BatchPrefetcher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  space_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void BatchPrefetcher::run() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      space_.wait(lock, [&] { return stop_ || static_cast<int>(queue_.size()) < depth_; });
      if (stop_) return;
    }
    try {
      GlobalBatch batch = produce_();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        queue_.push_back(std::move(batch));
      }
      ready_.notify_one();
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        error_ = std::current_exception();
        done_ = true;
      }
      ready_.notify_all();
      return;
    }
  }
}

GlobalBatch BatchPrefetcher::next() {
  GlobalBatch batch;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [&] { return !queue_.empty() || done_; });
    if (queue_.empty()) std::rethrow_exception(error_);
    batch = std::move(queue_.front());
    queue_.pop_front();
  }
  space_.notify_one();
  return batch;
}

}  // namespace hdp

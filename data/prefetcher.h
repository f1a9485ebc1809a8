#pragma once
// Produces the next global batches on a background thread while the caller
// trains. next() blocks only when no batch is ready yet. An exception thrown
// while producing is rethrown by next() once the batches produced before it
// have been handed out; the thread then stops. The destructor stops and joins
// the thread (it waits at most for the batch being produced).

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "data/batch.h"

namespace hdp {

class BatchPrefetcher {
 public:
  // `produce` makes the batches (e.g. a planner wrapping a sampler); called only
  // on the background thread, in order.
  explicit BatchPrefetcher(std::function<GlobalBatch()> produce, int depth = 2);
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;
  ~BatchPrefetcher();

  // The next batch in order. Its `next` state is what a checkpoint saves.
  GlobalBatch next();
  int depth() const { return depth_; }

 private:
  void run();

  std::function<GlobalBatch()> produce_;
  int depth_;
  std::mutex mutex_;
  std::condition_variable ready_;   // a batch or an error arrived
  std::condition_variable space_;   // a slot freed or stop requested
  std::deque<GlobalBatch> queue_;
  std::exception_ptr error_;
  bool stop_ = false;
  bool done_ = false;  // producer thread finished (error)
  std::thread thread_;
};

}  // namespace hdp

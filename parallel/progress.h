#pragma once
// The training thread's progress marker: which phase it is in ("grads-sync:
// hdp reduce-scatter", "ring attention forward: hdp recv from rank 4", ...),
// which step, and a counter that moves every time the phase changes. The hang
// watchdog (run/hang_watchdog.h) reads it from another thread: a counter
// that has not moved for train.hang_timeout_s means this rank is stuck, and the
// phase says where. This is the per-rank heartbeat of MegaScale (Jiang et al.,
// NSDI 2024) and the stack-and-phase view ByteRobust (ByteDance, 2025) uses to
// find the odd rank out of a hung job.
//
// Two levels, both set by RAII scopes on the watched thread only (scopes opened
// on any other thread, e.g. a loader or copy thread, do nothing):
//   - a context, set by the code that knows what a collective is for (the
//     engine, ZeRO, the pipeline, ring attention): "grads-sync", "loss all-reduce";
//   - a wait, set by the communicator around every blocking wait on other ranks:
//     the group, the operation and the peer's world rank.
// Writing is a few relaxed atomic stores under a sequence counter (no lock, no
// allocation), so it costs nothing measurable per collective.

#include <cstdint>
#include <string>

namespace hdp::progress {

// Makes the calling thread the watched one (the training loop's thread).
void watch_this_thread();

// The step the watched thread is in (0: before the first).
void set_step(int64_t step);

// A phase of work: "grads-sync", "data wait", "checkpoint save". `what` must
// outlive the scope (a string literal). Restores the enclosing context on exit.
class Context {
 public:
  explicit Context(const char* what);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

 private:
  const char* previous_ = nullptr;
  bool active_ = false;
};

// A blocking wait on other ranks: `op` ("all-reduce", "recv from", "send to"),
// `group` (the communicator's name), `peer` (a world rank, or -1 for a
// collective). `op` and `group` must outlive the scope.
class Waiting {
 public:
  Waiting(const char* op, const char* group, int peer = -1);
  ~Waiting();
  Waiting(const Waiting&) = delete;
  Waiting& operator=(const Waiting&) = delete;

 private:
  bool active_ = false;
};

struct Snapshot {
  uint64_t counter = 0;  // moves on every phase change
  int64_t step = 0;
  std::string phase;     // "grads-sync: hdp reduce-scatter", "forward", "ring attention: hdp recv from rank 4"
  bool waiting = false;  // in a wait on other ranks (else computing or doing I/O)
  // The oldest communication enqueued on a device stream (NCCL) that has not
  // finished, and how long ago it was enqueued (parallel/device_ops.h); empty
  // when none. The phase names it too: under NCCL the host returns from a
  // collective at once, and a hung one stops the host later, somewhere else.
  std::string device_op;
  double device_op_age_s = 0;
};

// The watched thread's marker, read from any thread. The device operation it names
// had not finished when the training thread last polled the ledger (it does on every
// enqueue and traced step; parallel/device_ops.h). The reader makes no CUDA call:
// with a collective stuck, the training thread may hold the driver's locks, and a
// watchdog that queried events could hang with it (PyTorch's NCCL watchdog met this).
Snapshot snapshot();

}  // namespace hdp::progress

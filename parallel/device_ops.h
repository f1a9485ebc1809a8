#pragma once
// Communication enqueued on a device stream that the host has not yet seen finish.
//
// Under NCCL (nccl_communicator.h) a collective returns to the host as soon as it
// is enqueued, so the host-side views of a job see only the enqueue: a TraceSpan
// around it measures microseconds, and a hung all-reduce shows up in the progress
// marker as a hang in whatever the host does next (the next host reduction, a
// synchronizing op). This ledger keeps the other view. The communicator records a
// pair of events around each operation on its stream and enters it here; polling
// (never blocking: an event query) retires the operations that finished, with the
// device's start and end of each. From that:
//   - the op tracer gets one record per traced operation with its device time
//     (records named "device-<enclosing op>", nested, so the straggler analysis
//     reports them and does not replay them: their time is inside the host ops);
//   - the hang watchdog's progress marker names the oldest unfinished operation
//     (group, op, bytes, peers) and how long ago it was enqueued, which is what a
//     stuck NCCL job's stacks cannot show (MegaScale, Jiang et al. NSDI 2024,
//     monitors CUDA events around each collective to find the one that hangs);
//   - the watchdog polls each stream's asynchronous error (ncclCommGetAsyncError)
//     and ends the job naming the rank, the group and the unfinished operation.
// Only the events are device-specific (DeviceStream); the bookkeeping is plain C++
// (tests/parallel_device_ops_test.cpp feeds it fake completions). The MPI path
// never enters anything here. Thread-safe: the training thread enqueues, the
// watchdog thread polls and reads.

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "parallel/op_tracer.h"

namespace hdp {

// One enqueued operation, as messages name it.
struct DeviceOp {
  std::string group;     // the communicator's name ("hdp", "tp", "world", ...)
  const char* op = "";   // "all-reduce", "reduce-scatter", "all-gather", "all-to-all", "exchange" (a literal)
  int64_t bytes = 0;     // this rank's buffer (an exchange: all it sends and receives)
  int send_peer = -1;    // an exchange's first peer sent to / received from (ranks of the group), -1: none
  int recv_peer = -1;
};

// "hdp all-reduce of 4.0 MiB", "hdp exchange of 2.0 MiB (send to rank 3, recv from rank 1)".
std::string describe(const DeviceOp& op);

// Start and end of a finished operation, microseconds on the host's steady clock
// (OpTracer::local_us).
struct DeviceTimes {
  double start_us = 0, end_us = 0;
};

// A device stream whose operations the ledger follows (one per NCCL communicator).
// finished() and async_error() may be called from any thread and must not block.
class DeviceStream {
 public:
  virtual ~DeviceStream() = default;
  // When operation `handle` has finished: its device start and end; nullopt while it runs.
  virtual std::optional<DeviceTimes> finished(uint64_t handle) = 0;
  // The operation's resources (its events) go back; called once per handle, after
  // finished() returned a value or when the stream is detached.
  virtual void release(uint64_t handle) = 0;
  // The asynchronous error of the stream's communicator, empty when there is none.
  virtual std::string async_error() = 0;
};

// A traced operation that finished: its record and the step it belongs to (which
// may be over by the time it is handed out).
struct DeviceTraceRecord {
  int64_t step = 0;
  OpRecord record;
};

// An unfinished operation and how long ago (seconds) it was enqueued.
struct UnfinishedDeviceOp {
  DeviceOp op;
  double age_s = 0;
};

class DeviceOpLedger {
 public:
  // A stream enters the ledger when its communicator is made, and leaves it before
  // its events are destroyed; its operations still listed are released unrecorded.
  void attach(DeviceStream* stream);
  void detach(DeviceStream* stream);

  // Operation `handle` was enqueued on `stream` at `now_us` (local clock). When a
  // step is traced (OpTracer::active(), read on the calling thread) it is recorded
  // once finished, named after the innermost open TraceSpan.
  void enqueued(DeviceStream* stream, uint64_t handle, DeviceOp op, double now_us);

  // Retires the listed operations that finished. A stream runs its operations in
  // order, so the poll asks each stream about its operations oldest first and stops
  // at the first unfinished one (a query per finished operation and one per busy
  // stream); different streams finish in any order. Never blocks on the device.
  void poll();

  // The oldest operation not yet seen finished, as of `now_us`.
  std::optional<UnfinishedDeviceOp> oldest_unfinished(double now_us) const;
  // The first stream's asynchronous error, with the oldest unfinished operation on
  // that stream: "hdp: NCCL error ...; hdp all-reduce of 4.0 MiB enqueued 2.1 s ago
  // had not finished". Empty when no stream reports one.
  std::string async_error(double now_us) const;

  // The records of traced operations that finished, handed over and cleared.
  std::vector<DeviceTraceRecord> take_trace_records();
  // Operations listed (not yet seen finished).
  size_t unfinished() const;

 private:
  struct Entry {
    DeviceStream* stream = nullptr;
    uint64_t handle = 0;
    DeviceOp op;
    double enqueued_us = 0;
    bool traced = false;
    int64_t step = 0;
    int microbatch = -1;
    const char* trace_op = "";
    double clock_offset_us = 0;  // the tracer's offset from the local clock
  };
  std::optional<UnfinishedDeviceOp> oldest_locked(const DeviceStream* stream, double now_us) const;

  mutable std::mutex mutex_;
  std::vector<DeviceStream*> streams_;
  std::vector<Entry> entries_;  // in enqueue order
  std::vector<DeviceTraceRecord> records_;
  std::vector<DeviceStream*> busy_;  // poll(): the streams with an unfinished operation
};

// The process's ledger, which the NCCL communicators enter, the hang watchdog and
// the step tracer read.
DeviceOpLedger& device_ops();

}  // namespace hdp

// The device ledger (parallel/device_ops.h), fed by a fake stream whose
// operations finish when the test says so: what is retired and when, which
// operation the watchdog names as the oldest unfinished one, what an asynchronous
// error reports, the tracer's records of traced operations, and the progress
// marker's phase. The NCCL stream behind the same interface is compiled only
// here (no GPU); this is the part of its logic that runs on the CPU.

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "parallel/device_ops.h"
#include "parallel/op_tracer.h"
#include "parallel/progress.h"

namespace hdp {
namespace {

class FakeStream final : public DeviceStream {
 public:
  std::optional<DeviceTimes> finished(uint64_t handle) override {
    ++queries;
    const auto it = done.find(handle);
    if (it == done.end()) return std::nullopt;
    return it->second;
  }
  void release(uint64_t handle) override {
    EXPECT_TRUE(released.insert(handle).second) << "handle " << handle << " released twice";
  }
  std::string async_error() override { return error; }

  std::map<uint64_t, DeviceTimes> done;  // the operations that finished, with their times
  std::set<uint64_t> released;
  std::string error;
  int queries = 0;
};

DeviceOp collective(const char* group, const char* op, int64_t bytes) { return DeviceOp{group, op, bytes}; }

TEST(DeviceOps, DescribeNamesGroupOpSizeAndPeers) {
  EXPECT_EQ(describe(collective("hdp", "all-reduce", 4 << 20)), "hdp all-reduce of 4.0 MiB");
  EXPECT_EQ(describe(collective("tp", "all-gather", 3 * 1024 / 2)), "tp all-gather of 1.5 KiB");
  EXPECT_EQ(describe(collective("world", "all-reduce", 8)), "world all-reduce of 8 B");
  EXPECT_EQ(describe(DeviceOp{"hdp", "exchange", 2 << 20, 3, 1}),
            "hdp exchange of 2.0 MiB (send to rank 3, recv from rank 1)");
  EXPECT_EQ(describe(DeviceOp{"hdp", "exchange", 1 << 20, -1, 5}), "hdp exchange of 1.0 MiB (recv from rank 5)");
}

TEST(DeviceOps, PollRetiresFinishedOperationsOfEachStreamAndNamesTheOldestUnfinished) {
  DeviceOpLedger ledger;
  FakeStream hdp, tp;
  ledger.attach(&hdp);
  ledger.attach(&tp);
  ledger.enqueued(&hdp, 0, collective("hdp", "reduce-scatter", 1 << 20), 1e6);
  ledger.enqueued(&tp, 0, collective("tp", "all-reduce", 2048), 1.5e6);
  ledger.enqueued(&hdp, 1, collective("hdp", "all-gather", 1 << 20), 2e6);
  EXPECT_EQ(ledger.unfinished(), 3u);

  ledger.poll();  // nothing finished
  EXPECT_EQ(ledger.unfinished(), 3u);
  EXPECT_TRUE(hdp.released.empty());
  auto oldest = ledger.oldest_unfinished(4e6);
  ASSERT_TRUE(oldest);
  EXPECT_EQ(describe(oldest->op), "hdp reduce-scatter of 1.0 MiB");
  EXPECT_DOUBLE_EQ(oldest->age_s, 3.0);

  // The tp stream's operation finishes first: streams finish in any order.
  tp.done[0] = {1.6e6, 1.7e6};
  ledger.poll();
  EXPECT_EQ(ledger.unfinished(), 2u);
  EXPECT_EQ(tp.released, std::set<uint64_t>{0});
  oldest = ledger.oldest_unfinished(4e6);
  ASSERT_TRUE(oldest);
  EXPECT_EQ(std::string(oldest->op.op), "reduce-scatter");

  hdp.done[0] = {2e6, 2.5e6};
  ledger.poll();
  oldest = ledger.oldest_unfinished(4e6);
  ASSERT_TRUE(oldest);
  EXPECT_EQ(describe(oldest->op), "hdp all-gather of 1.0 MiB");
  EXPECT_DOUBLE_EQ(oldest->age_s, 2.0);

  hdp.done[1] = {2.5e6, 3e6};
  ledger.poll();
  EXPECT_EQ(ledger.unfinished(), 0u);
  EXPECT_FALSE(ledger.oldest_unfinished(4e6));
  EXPECT_EQ(hdp.released, (std::set<uint64_t>{0, 1}));
  // Untraced operations leave no records.
  EXPECT_TRUE(ledger.take_trace_records().empty());

  // A retired operation is never queried again.
  const int queries = hdp.queries;
  ledger.poll();
  EXPECT_EQ(hdp.queries, queries);
}

TEST(DeviceOps, AnAsyncErrorNamesTheGroupAndItsOldestUnfinishedOperation) {
  DeviceOpLedger ledger;
  FakeStream hdp, tp;
  ledger.attach(&hdp);
  ledger.attach(&tp);
  ledger.enqueued(&hdp, 7, collective("hdp", "all-reduce", 4 << 20), 0);
  ledger.enqueued(&tp, 2, DeviceOp{"tp", "exchange", 1 << 20, 1, 1}, 1e6);
  EXPECT_EQ(ledger.async_error(3e6), "");

  tp.error = "tp: NCCL error: remote process exited or there was a network error";
  EXPECT_EQ(ledger.async_error(3e6),
            "tp: NCCL error: remote process exited or there was a network error; tp exchange of 1.0 MiB (send to "
            "rank 1, recv from rank 1) enqueued 2.0 s ago had not finished");

  tp.done[2] = {1e6, 2e6};
  ledger.poll();
  EXPECT_EQ(ledger.async_error(3e6), tp.error + "; no operation of that group was unfinished");

  // A detached stream is asked nothing more; its listed operations are released unrecorded.
  ledger.detach(&tp);
  EXPECT_EQ(ledger.async_error(3e6), "");
  ledger.detach(&hdp);
  EXPECT_EQ(hdp.released, std::set<uint64_t>{7});
  EXPECT_EQ(ledger.unfinished(), 0u);
}

TEST(DeviceOps, TracedOperationsAreRecordedWhenTheyFinishNamedAfterTheirEnclosingSpan) {
  DeviceOpLedger ledger;
  FakeStream hdp;
  ledger.attach(&hdp);
  ledger.enqueued(&hdp, 0, collective("hdp", "all-gather", 64), 0);  // before the traced step: not recorded

  OpTracer tracer(1, 0, 0);
  tracer.set_offset_us(1000);
  tracer.begin(5);
  {
    TraceSpan outer(trace_ops::kBackwardCompute.data(), 3);
    {
      TraceSpan ring(trace_ops::kRingExchange.data());  // no micro-batch of its own: the enclosing one's
      ledger.enqueued(&hdp, 1, DeviceOp{"hdp", "exchange", 128, 1, 1}, 10);
    }
    EXPECT_STREQ(tracer.open_op(), "backward-compute");
    EXPECT_EQ(tracer.open_microbatch(), 3);
  }
  EXPECT_EQ(tracer.open_op(), nullptr);
  {
    TraceSpan grads(trace_ops::kGradsSync.data());
    ledger.enqueued(&hdp, 2, collective("hdp", "reduce-scatter", 256), 20);
  }
  ledger.enqueued(&hdp, 3, collective("world", "all-reduce", 8), 30);  // in the step, outside any span
  tracer.end();

  // A stream runs its operations in order: while its oldest is unfinished, a poll
  // asks about nothing after it (handle 2's fake completion is not seen yet).
  hdp.done[2] = {500, 900};
  int queries = hdp.queries;
  ledger.poll();
  EXPECT_EQ(hdp.queries, queries + 1);
  EXPECT_TRUE(ledger.take_trace_records().empty());
  EXPECT_EQ(ledger.unfinished(), 4u);

  // They finish after the step ended; each record keeps its step.
  hdp.done[0] = {1, 2};
  hdp.done[1] = {100, 400};
  queries = hdp.queries;
  ledger.poll();
  EXPECT_EQ(hdp.queries, queries + 4);  // three finished, then the busy one
  std::vector<DeviceTraceRecord> records = ledger.take_trace_records();
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].step, 5);
  EXPECT_STREQ(records[0].record.op, "device-ring-exchange");
  EXPECT_EQ(records[0].record.microbatch, 3);
  EXPECT_NEAR(records[0].record.end_us - records[0].record.start_us, 300, 1e-6);
  EXPECT_EQ(records[1].step, 5);
  EXPECT_STREQ(records[1].record.op, "device-grads-sync");
  EXPECT_EQ(records[1].record.microbatch, -1);
  EXPECT_NEAR(records[1].record.start_us, 1500, 1e-6);  // the device's times, on the tracer's clock
  EXPECT_NEAR(records[1].record.end_us, 1900, 1e-6);
  EXPECT_TRUE(records[1].record.group.empty());

  hdp.done[3] = {950, 960};
  ledger.poll();
  records = ledger.take_trace_records();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_STREQ(records[0].record.op, "device-all-reduce");  // no enclosing span: the operation's own name
  EXPECT_TRUE(ledger.take_trace_records().empty());
  EXPECT_EQ(hdp.released, (std::set<uint64_t>{0, 1, 2, 3}));
}

// The process's ledger is what the progress marker reads: an unfinished device
// operation is part of the phase a hang report shows, and leaves it once finished.
TEST(DeviceOps, TheProgressMarkerNamesTheOldestUnfinishedDeviceOperation) {
  FakeStream hdp;
  device_ops().attach(&hdp);
  EXPECT_EQ(progress::snapshot().device_op, "");
  progress::watch_this_thread();
  progress::Context context("loss all-reduce");
  device_ops().enqueued(&hdp, 4, collective("hdp", "reduce-scatter", 16 << 20), OpTracer::local_us() - 2.5e6);
  progress::Snapshot s = progress::snapshot();
  EXPECT_EQ(s.device_op, "hdp reduce-scatter of 16.0 MiB");
  EXPECT_GE(s.device_op_age_s, 2.5);
  EXPECT_EQ(s.phase, "loss all-reduce (device: hdp reduce-scatter of 16.0 MiB unfinished)");

  // Finished on the device: the marker says so once the training thread has polled
  // (the reader itself makes no device call).
  hdp.done[4] = {0, 1};
  EXPECT_EQ(progress::snapshot().device_op, "hdp reduce-scatter of 16.0 MiB");
  device_ops().poll();
  s = progress::snapshot();
  EXPECT_EQ(s.device_op, "");
  EXPECT_EQ(s.phase, "loss all-reduce");
  device_ops().detach(&hdp);
  EXPECT_EQ(hdp.released, std::set<uint64_t>{4});
}

}  // namespace
}  // namespace hdp

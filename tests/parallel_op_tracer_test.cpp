// The op tracer's recorder (parallel/op_tracer.h): nothing is recorded outside a
// traced step, spans record their op with ordered times on the aligned clock,
// and every member of a communication computes the same group name. A Phase
// (parallel/phase.h) is a span and a progress label that open and close together.

#include <gtest/gtest.h>

#include <string>

#include "parallel/op_tracer.h"
#include "parallel/phase.h"
#include "parallel/progress.h"

namespace hdp {
namespace {

TEST(OpTracer, RecordsOnlyWhileAStepIsTraced) {
  OpTracer tracer(1, 3, 0);
  { TraceSpan span(trace_ops::kForwardCompute.data(), 2); }
  EXPECT_EQ(OpTracer::active(), nullptr);
  EXPECT_TRUE(tracer.take().empty());

  tracer.set_offset_us(1e6);
  tracer.begin(7);
  ASSERT_EQ(OpTracer::active(), &tracer);
  const double before = OpTracer::local_us() + 1e6;
  {
    TraceSpan span(trace_ops::kGradsSync.data());
    ASSERT_EQ(span.tracer(), &tracer);
    span.set_group(tracer.stage_group("grads"));
  }
  { TraceSpan span(trace_ops::kBackwardCompute.data(), 4); }
  tracer.end();
  EXPECT_EQ(OpTracer::active(), nullptr);
  { TraceSpan span(trace_ops::kOptimizer.data()); }  // after end(): not recorded

  const std::vector<OpRecord> records = tracer.take();
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(std::string(records[0].op), "grads-sync");
  EXPECT_EQ(records[0].microbatch, -1);
  EXPECT_EQ(records[0].group, "s7/grads/t0/p1");
  EXPECT_GE(records[0].start_us, before);  // the offset applies
  EXPECT_LE(records[0].start_us, records[0].end_us);
  EXPECT_LE(records[0].end_us, records[1].start_us);
  EXPECT_EQ(std::string(records[1].op), "backward-compute");
  EXPECT_EQ(records[1].microbatch, 4);
  EXPECT_TRUE(records[1].group.empty());
  EXPECT_TRUE(tracer.take().empty());
}

TEST(OpTracer, PeersNameTheSameGroup) {
  // Stage 0 sends micro-batch 5 forward to stage 1 of the same hdp rank and tp slice.
  OpTracer sender(0, 2, 1), receiver(1, 2, 1), other_pipeline(1, 3, 1);
  sender.begin(4);
  sender.end();
  receiver.begin(4);
  receiver.end();
  other_pipeline.begin(4);
  other_pipeline.end();
  EXPECT_EQ(sender.pipeline_group(true, 0, 5), receiver.pipeline_group(true, 0, 5));
  EXPECT_EQ(sender.pipeline_group(true, 0, 5), "s4/fwd/t1/hdp2/p0/m5");
  EXPECT_NE(receiver.pipeline_group(true, 0, 5), other_pipeline.pipeline_group(true, 0, 5));
  EXPECT_NE(sender.pipeline_group(true, 0, 5), sender.pipeline_group(false, 0, 5));
  EXPECT_EQ(sender.world_group("loss"), other_pipeline.world_group("loss"));
  EXPECT_NE(sender.stage_group("grads"), receiver.stage_group("grads"));  // different stages
}

TEST(Phase, OpensTheSpanAndTheProgressLabelTogether) {
  progress::watch_this_thread();
  OpTracer tracer(0, 1, 0);
  tracer.begin(2);
  {
    progress::Context step("training step");
    {
      Phase phase(trace_ops::kLoss.data(), "loss all-reduce");
      ASSERT_EQ(phase.tracer(), &tracer);
      phase.set_group(tracer.world_group("loss"));
      EXPECT_EQ(progress::snapshot().phase, "loss all-reduce");
      EXPECT_STREQ(tracer.open_op(), "loss-allreduce");
    }
    EXPECT_EQ(progress::snapshot().phase, "training step");
    EXPECT_EQ(tracer.open_op(), nullptr);
  }
  tracer.end();
  {
    Phase untraced(trace_ops::kDataWait.data(), "data wait");  // no step traced: a label only
    EXPECT_EQ(untraced.tracer(), nullptr);
    EXPECT_EQ(progress::snapshot().phase, "data wait");
  }
  const std::vector<OpRecord> records = tracer.take();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(std::string(records[0].op), "loss-allreduce");
  EXPECT_EQ(records[0].group, "s2/loss");
  EXPECT_LE(records[0].start_us, records[0].end_us);
}

}  // namespace
}  // namespace hdp

// The remote loader's messages: a training rank's work for one step (the batch and
// its share of the plan with ring layouts) survives encode_work / decode_work, and a
// message naming an unknown sequence is refused.
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "data/remote_loader.h"

namespace hdp {
namespace {

RankWork sample_work() {
  RankWork work;
  work.step = 7;
  work.batch.sequences = {{3, 1024, 10}, {5, 0, 4}};
  work.batch.tokens = 14;
  work.batch.start = {1, 2, 1024};
  work.batch.next = {1, 4, 0};
  work.batch.planned_busy_s = 0.25;
  work.batch.planned_max_busy_s = 0.5;
  work.batch.planned_bound_s = 0.375;
  work.batch.planned_step_s = 0.625;
  RankMicroBatch local;
  local.planned.pieces = {{1, 0, 4, -1}};
  RankMicroBatch ring;
  ring.planned.ring = 0;
  ring.planned.offload_ratio = 0.75;
  ring.planned.recompute_layers = 3;
  ring.planned.pieces = {{0, 2, 3, 0}, {0, 5, 2, 0}};
  ring.ring_layout = zigzag_ring_layout(std::vector<int>{2, 5}, std::vector<int64_t>{10}, 1);
  work.micro_batches = {local, ring};
  return work;
}

TEST(DataRemoteLoader, WorkSurvivesEncodeAndDecode) {
  const RankWork in = sample_work();
  const RankWork out = decode_work(encode_work(in));
  EXPECT_EQ(out.step, 7);
  ASSERT_EQ(out.batch.sequences.size(), 2u);
  EXPECT_EQ(out.batch.sequences[0].document, 3);
  EXPECT_EQ(out.batch.sequences[0].offset, 1024);
  EXPECT_EQ(out.batch.sequences[1].length, 4);
  EXPECT_EQ(out.batch.tokens, 14);
  EXPECT_EQ(out.batch.start, in.batch.start);
  EXPECT_EQ(out.batch.next, in.batch.next);
  EXPECT_EQ(out.batch.planned_busy_s, 0.25);
  EXPECT_EQ(out.batch.planned_max_busy_s, 0.5);
  EXPECT_EQ(out.batch.planned_bound_s, 0.375);
  EXPECT_EQ(out.batch.planned_step_s, 0.625);
  ASSERT_EQ(out.micro_batches.size(), 2u);
  for (size_t m = 0; m < 2; ++m) {
    const RankMicroBatch& a = in.micro_batches[m];
    const RankMicroBatch& b = out.micro_batches[m];
    EXPECT_EQ(b.planned.ring, a.planned.ring);
    EXPECT_EQ(b.planned.offload_ratio, a.planned.offload_ratio);
    EXPECT_EQ(b.planned.recompute_layers, a.planned.recompute_layers);
    ASSERT_EQ(b.planned.pieces.size(), a.planned.pieces.size());
    for (size_t p = 0; p < a.planned.pieces.size(); ++p) {
      EXPECT_EQ(b.planned.pieces[p].sequence, a.planned.pieces[p].sequence);
      EXPECT_EQ(b.planned.pieces[p].offset, a.planned.pieces[p].offset);
      EXPECT_EQ(b.planned.pieces[p].length, a.planned.pieces[p].length);
      EXPECT_EQ(b.planned.pieces[p].ring, a.planned.pieces[p].ring);
    }
    EXPECT_EQ(b.ring_layout.peers, a.ring_layout.peers);
    EXPECT_EQ(b.ring_layout.self, a.ring_layout.self);
    ASSERT_EQ(b.ring_layout.chunks.size(), a.ring_layout.chunks.size());
    for (size_t member = 0; member < a.ring_layout.chunks.size(); ++member) {
      ASSERT_EQ(b.ring_layout.chunks[member].size(), a.ring_layout.chunks[member].size());
      for (size_t c = 0; c < a.ring_layout.chunks[member].size(); ++c) {
        EXPECT_EQ(b.ring_layout.chunks[member][c].rows, a.ring_layout.chunks[member][c].rows);
        EXPECT_EQ(b.ring_layout.chunks[member][c].position, a.ring_layout.chunks[member][c].position);
        EXPECT_EQ(b.ring_layout.chunks[member][c].sequence, a.ring_layout.chunks[member][c].sequence);
      }
    }
  }
  EXPECT_TRUE(out.micro_batches[0].ring_layout.peers.empty());
  EXPECT_EQ(out.micro_batches[1].ring_layout.rows(1), 5);  // member 1 of 10 tokens over 2: chunks [2, 5) and [5, 7)
}

TEST(DataRemoteLoader, RefusesAPieceOfAnUnknownSequence) {
  RankWork work = sample_work();
  work.micro_batches[0].planned.pieces[0].sequence = 2;
  EXPECT_THROW(decode_work(encode_work(work)), std::runtime_error);
  std::vector<int64_t> truncated = encode_work(sample_work());
  truncated.pop_back();
  EXPECT_THROW(decode_work(truncated), std::runtime_error);
}

}  // namespace
}  // namespace hdp

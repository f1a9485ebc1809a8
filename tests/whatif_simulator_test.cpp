// The op-graph replay engine (whatif/simulator.h) and the step graph built on
// it (whatif/step_simulation.h): hand-computed makespans of small graphs,
// send/receive pairs and collectives that transfer only when every member has
// started, deadlock detection, 1F1B pipelines with and without communication,
// a ring micro-batch, the DP bubble before the gradient reduce-scatter, offload
// copies that do not hide, the model's byte and FLOP counts and the memory
// budget, expert parallelism (all-to-alls that block the layer, expert gradients
// synchronised over the ranks that hold them, memory sharded by ep), and the
// Chrome trace.

#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "planning/hdp_planner.h"
#include "parallel/pipeline.h"
#include "planning/pipeline_schedule.h"
#include "planning/plan.h"
#include "whatif/simulator.h"
#include "planning/stage_split.h"
#include "whatif/step_simulation.h"

namespace hdp {
namespace {

using sim::OpGraph;
using sim::OpId;

TEST(Simulator, StreamsAndDependencies) {
  OpGraph g;
  const uint32_t op = g.label("op");
  const int a = g.add_stream(0, "compute"), b = g.add_stream(1, "compute");
  const OpId x = g.add_op(a, 2, op);
  const OpId y = g.add_op(a, 3, op);         // after x on the stream: [2, 5]
  const OpId z = g.add_op(b, 1, op, {x});    // after x: [2, 3]
  const OpId w = g.add_op(b, 4, op, {y});    // after y and z: [5, 9]
  const sim::Replay r = sim::replay(g);
  EXPECT_DOUBLE_EQ(r.start[y], 2);
  EXPECT_DOUBLE_EQ(r.start[z], 2);
  EXPECT_DOUBLE_EQ(r.end[z], 3);
  EXPECT_DOUBLE_EQ(r.start[w], 5);
  EXPECT_DOUBLE_EQ(r.makespan, 9);
  EXPECT_DOUBLE_EQ(r.stream_busy[a], 5);
  EXPECT_DOUBLE_EQ(r.stream_busy[b], 5);
  // What-if: the same graph with other durations.
  const std::vector<double> ideal = {1, 1, 1, 1};
  EXPECT_DOUBLE_EQ(sim::replay(g, ideal).makespan, 3);
}

// Two ranks in a ring of two: each computes on its own block while it sends
// that block to the other and receives the other's (send and receive posted at
// once), then computes on the received block.
TEST(Simulator, TwoRanksOneRing) {
  for (double transfer : {1.5, 4.0}) {
    OpGraph g;
    const uint32_t op = g.label("op");
    std::vector<int> compute, send, recv;
    for (int r = 0; r < 2; ++r) {
      compute.push_back(g.add_stream(r, "compute"));
      send.push_back(g.add_stream(r, "send"));
      recv.push_back(g.add_stream(r, "recv"));
    }
    const double own[2] = {2, 3};
    OpId remote[2];
    const int to1 = g.new_group(), to0 = g.new_group();
    g.add_op(send[0], transfer, op, {}, to1);
    const OpId recv1 = g.add_op(recv[1], transfer, op, {}, to1);
    g.add_op(send[1], transfer, op, {}, to0);
    const OpId recv0 = g.add_op(recv[0], transfer, op, {}, to0);
    g.add_op(compute[0], own[0], op);
    g.add_op(compute[1], own[1], op);
    remote[0] = g.add_op(compute[0], own[0], op, {recv0});
    remote[1] = g.add_op(compute[1], own[1], op, {recv1});
    const sim::Replay r = sim::replay(g);
    if (transfer == 1.5) {
      // The blocks arrive at 1.5, before either own-block compute ends.
      EXPECT_DOUBLE_EQ(r.end[remote[0]], 4);
      EXPECT_DOUBLE_EQ(r.end[remote[1]], 6);
      EXPECT_DOUBLE_EQ(r.makespan, 6);
    } else {
      // The transfer (4) is longer than both computes: 4 + 2 and 4 + 3.
      EXPECT_DOUBLE_EQ(r.start[remote[0]], 4);
      EXPECT_DOUBLE_EQ(r.end[remote[0]], 6);
      EXPECT_DOUBLE_EQ(r.makespan, 7);
    }
  }
}

// A send posted late: the pair's transfer counts from the later start.
TEST(Simulator, PairTransfersFromTheLatestStart) {
  OpGraph g;
  const uint32_t op = g.label("op");
  const int c0 = g.add_stream(0, "compute"), s0 = g.add_stream(0, "send");
  const int c1 = g.add_stream(1, "compute"), r1 = g.add_stream(1, "recv");
  const OpId a = g.add_op(c0, 4, op);
  g.add_op(c1, 1, op);
  const int pair = g.new_group();
  const OpId send = g.add_op(s0, 3, op, {a}, pair);
  const OpId recv = g.add_op(r1, 3, op, {}, pair);
  const OpId after = g.add_op(c1, 1, op, {recv});
  const sim::Replay r = sim::replay(g);
  EXPECT_DOUBLE_EQ(r.start[recv], 0);  // posted at once, waits on its stream
  EXPECT_DOUBLE_EQ(r.start[send], 4);
  EXPECT_DOUBLE_EQ(r.end[recv], 7);    // 4 + 3, not 0 + 3
  EXPECT_DOUBLE_EQ(r.end[send], 7);
  EXPECT_DOUBLE_EQ(r.start[after], 7);
  EXPECT_DOUBLE_EQ(r.makespan, 8);
  EXPECT_DOUBLE_EQ(r.stream_busy[r1], 3);
  EXPECT_DOUBLE_EQ(r.stream_occupied[r1], 7);
}

TEST(Simulator, CollectiveStartsWhenAllMembersHaveStarted) {
  OpGraph g;
  const uint32_t op = g.label("op");
  const double work[3] = {1, 2, 5};
  const int all = g.new_group();
  std::vector<OpId> members, after;
  for (int r = 0; r < 3; ++r) {
    const int s = g.add_stream(r, "compute"), d = g.add_stream(r, "dp");
    const OpId w = g.add_op(s, work[r], op);
    members.push_back(g.add_op(d, 0.5, op, {w}, all));
    after.push_back(g.add_op(s, 1, op, {members.back()}));
  }
  const sim::Replay r = sim::replay(g);
  for (int m = 0; m < 3; ++m) {
    EXPECT_DOUBLE_EQ(r.start[members[m]], work[m]);
    EXPECT_DOUBLE_EQ(r.end[members[m]], 5.5);
    EXPECT_DOUBLE_EQ(r.end[after[m]], 6.5);
  }
  EXPECT_DOUBLE_EQ(r.makespan, 6.5);
}

TEST(Simulator, DeadlockAndBadGraphsAreReported) {
  // Two collectives entered in opposite orders on two ranks.
  OpGraph g;
  const uint32_t op = g.label("allreduce");
  const int a = g.add_stream(0, "dp"), b = g.add_stream(1, "dp");
  const int x = g.new_group(), y = g.new_group();
  g.add_op(a, 1, op, {}, x);
  g.add_op(a, 1, op, {}, y);
  g.add_op(b, 1, op, {}, y);
  g.add_op(b, 1, op, {}, x);
  try {
    sim::replay(g);
    ADD_FAILURE() << "a deadlock was not detected";
  } catch (const sim::SimulationError& e) {
    EXPECT_NE(std::string(e.what()).find("deadlock"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("allreduce"), std::string::npos) << e.what();
  }
  OpGraph c;
  const uint32_t l = c.label("op");
  const int s = c.add_stream(0, "compute");
  const OpId p = c.add_op(s, 1, l);
  c.add_op(s, 1, l, {p + 1});  // depends on itself
  c.add_dependency(p, p + 1);
  EXPECT_THROW(sim::replay(c), sim::SimulationError);
  OpGraph d;
  d.add_op(d.add_stream(0, "compute"), -1, d.label("op"));
  EXPECT_THROW(sim::replay(d), sim::SimulationError);
}

TEST(Simulator, CommunicationFormulas) {
  EXPECT_DOUBLE_EQ(sim::p2p_seconds(100, 50, 1), 3);
  // 4 members, 400 bytes, 10 bytes/s, no latency: 3 x 400 / (4 x 10) = 30.
  EXPECT_DOUBLE_EQ(sim::ring_reduce_scatter_seconds(400, 4, 10, 0), 30);
  EXPECT_DOUBLE_EQ(sim::ring_all_gather_seconds(400, 4, 10, 0.5), 31.5);
  EXPECT_DOUBLE_EQ(sim::ring_all_reduce_seconds(400, 4, 10, 0), 60);
  EXPECT_DOUBLE_EQ(sim::ring_all_reduce_seconds(400, 1, 10, 0), 0);
  // All-to-all of a 400-byte buffer over 4 members: each sends 3 x 100 bytes.
  EXPECT_DOUBLE_EQ(sim::all_to_all_seconds(400, 4, 10, 0.5), 3 * (0.5 + 10));
  EXPECT_DOUBLE_EQ(sim::all_to_all_seconds(400, 1, 10, 0.5), 0);
}

// Costs for hand-computed step graphs: per layer T(s) = b1 s (+ a1 s^2), one layer
// per stage, nothing else unless a test sets it.
StepCosts hand_costs(int hdp, int pp, double forward_fraction) {
  StepCosts k;
  k.cost.b1 = 3;
  k.cost.d2h_bytes_per_s = k.cost.h2d_bytes_per_s = 1;
  k.forward_fraction = forward_fraction;
  k.stage_layers.assign(pp, 1);
  k.tp = 1;
  k.hdp = hdp;
  k.hardware.gpus_per_node = 8;
  k.hardware.nvlink_bytes_per_s = k.hardware.internode_bytes_per_s = 1;
  k.gradient_bytes.assign(pp, 0.0);
  k.parameter_bytes.assign(pp, 0.0);
  k.optimizer_seconds.assign(pp, 0.0);
  return k;
}

// hdp ranks, each with `per_rank[r]` micro-batches holding one sequence of `tokens`.
StepPlan local_plan(const std::vector<int>& per_rank, int64_t tokens, std::vector<int64_t>& lengths) {
  StepPlan plan;
  plan.capacity = tokens;
  plan.ranks.resize(per_rank.size());
  for (size_t r = 0; r < per_rank.size(); ++r)
    for (int i = 0; i < per_rank[r]; ++i) {
      PlannedMicroBatch mb;
      mb.pieces.push_back({static_cast<int64_t>(lengths.size()), 0, tokens, -1});
      lengths.push_back(tokens);
      plan.ranks[r].push_back(mb);
    }
  return plan;
}

// Two stages, F = 1 and B = 2 per micro-batch and stage, no communication time:
// 1F1B takes (m + p - 1)(F + B).
TEST(StepSimulation, OneFOneBWithoutCommunication) {
  for (int m : {1, 2, 4, 7}) {
    std::vector<int64_t> lengths;
    const StepPlan plan = local_plan({m}, 1, lengths);
    const StepSimulation s = simulate_step(plan, lengths, hand_costs(1, 2, 1.0 / 3.0));
    EXPECT_DOUBLE_EQ(s.step_seconds, (m + 2 - 1) * 3.0) << m;
    EXPECT_NEAR(s.compute_seconds, 2 * m * 3.0, 1e-12);
    // Bubble: each stage is busy m(F + B) of (m + 1)(F + B).
    EXPECT_NEAR(s.idle_fraction, 1.0 / (m + 1), 1e-12);
  }
}

// With c = 0.5 per transfer (the link latency, zero bytes), m = 4: worked by hand
// (forward sends at 1, 2, 8, 11; gradient sends at 4.5, 7.5, 11.5, 14.5; stage 0's
// last backward runs [15, 17]), and m = 2: stage 1 runs from 1.5 without a gap,
// 1.5 + 2 (F + B) + c + B = 10.
TEST(StepSimulation, OneFOneBWithCommunication) {
  StepCosts k = hand_costs(1, 2, 1.0 / 3.0);
  k.hardware.intranode_latency_s = 0.5;  // GPUs 0 and 1 share a node
  k.hardware.internode_latency_s = 100;
  std::vector<int64_t> lengths;
  StepPlan plan = local_plan({4}, 1, lengths);
  EXPECT_DOUBLE_EQ(simulate_step(plan, lengths, k).step_seconds, 17);
  lengths.clear();
  plan = local_plan({2}, 1, lengths);
  EXPECT_DOUBLE_EQ(simulate_step(plan, lengths, k).step_seconds, 10);
  // Bytes count at the link bandwidth: 1 byte per token at 2 bytes/s adds 0.5 s.
  k.hardware.intranode_latency_s = 0;
  k.hardware.nvlink_bytes_per_s = 2;
  k.boundary_bytes_per_token = 1;
  EXPECT_DOUBLE_EQ(simulate_step(plan, lengths, k).step_seconds, 10);
}

// A long micro-batch first (4 tokens: F = 4, B = 8 per stage), then four short ones
// (1 token: F = 1, B = 2), two stages, free transfers. 1F1B: stage 0 runs F0 [0, 4] and
// F1 [4, 5], then waits for B0, which stage 1 ends at 16 (F0 [4, 8], B0 [8, 16]); B0 runs
// [16, 24], and every later forward and backward of stage 0 waits for stage 1 in turn:
// F2 [24, 25], B1 [25, 27], F3 [27, 28], B2 [28, 30], F4 [30, 31], B3 [31, 33], and B4
// after stage 1's [32, 34]: [34, 36]. With all five forwards before backward 0 on stage 0 (at
// capacity 4 the shares are 1 + 4 x 0.25 = 2, stage 0's budget) its forwards end at 8,
// stage 1 runs without a gap from 4 to 28 (F0, B0 [8, 16], then F1 B1 ... B4 [26, 28]),
// and stage 0's backwards run [16, 24], [24, 26], [26, 28], [28, 30], [30, 32]: 32.
TEST(StepSimulation, ADeeperWarmupFillsTheWindowOfALongMicroBatch) {
  const StepCosts k = hand_costs(1, 2, 1.0 / 3.0);
  StepPlan plan;
  plan.capacity = 4;
  plan.ranks.resize(1);
  const std::vector<int64_t> lengths{4, 1, 1, 1, 1};
  for (size_t q = 0; q < lengths.size(); ++q) {
    PlannedMicroBatch mb;
    mb.pieces.push_back({static_cast<int64_t>(q), 0, lengths[q], -1});
    plan.ranks[0].push_back(mb);
  }
  EXPECT_DOUBLE_EQ(simulate_step(plan, lengths, k).step_seconds, 36);
  plan.forward_limits = plan_deepest_forward_limits(plan, 1, 2);
  ASSERT_EQ(plan.forward_limits, (std::vector<std::vector<int>>{{4, 4, 4, 4, 4}, {0, 1, 2, 3, 4}}));
  check_plan(plan, lengths, 1, 2);
  EXPECT_DOUBLE_EQ(simulate_step(plan, lengths, k).step_seconds, 32);
  // 1F1B's limits, given explicitly, are 1F1B.
  plan.forward_limits = {{1, 2, 3, 4, 5}, {0, 1, 2, 3, 4}};
  EXPECT_DOUBLE_EQ(simulate_step(plan, lengths, k).step_seconds, 36);
}

// Interleaved 1F1B (Narayanan et al. 2021, section 2.2.2): pp stages of two layers
// each, equal micro-batches, F + B = 6 s per micro-batch and stage, free transfers.
// 1F1B idles (p - 1)(F + B); two chunks of one layer per stage idle half of it: the
// step is the ideal 6 m times 1 + (p - 1) / (vpp m).
TEST(StepSimulation, InterleavingShrinksTheBubbleAsTheFormulaSays) {
  for (int pp : {2, 4})
    for (int m : {pp, 2 * pp, 4 * pp}) {
      std::vector<int64_t> lengths;
      const StepPlan plan = local_plan({m}, 1, lengths);
      StepCosts k = hand_costs(1, pp, 1.0 / 3.0);
      k.stage_layers.assign(pp, 2);
      const double ideal = 6.0 * m;
      const StepSimulation plain = simulate_step(plan, lengths, k);
      EXPECT_NEAR(plain.step_seconds, ideal * (1 + pipeline_bubble_fraction(pp, 1, m)), 1e-9) << pp << " " << m;
      k.chunk_layers.assign(2 * pp, 1);
      const StepSimulation interleaved = simulate_step(plan, lengths, k);
      EXPECT_NEAR(interleaved.step_seconds, ideal * (1 + pipeline_bubble_fraction(pp, 2, m)), 1e-9) << pp << " " << m;
      EXPECT_NEAR(interleaved.compute_seconds, plain.compute_seconds, 1e-9);
      // The bubble as the simulator measures it: idle / (idle + busy) on every stage.
      const double bubble = pipeline_bubble_fraction(pp, 2, m);
      EXPECT_NEAR(interleaved.idle_fraction, bubble / (1 + bubble), 1e-9);
    }
}

// Transfers under interleaving: the last stage's chunk 0 sends on to the first
// stage's chunk 1, so a micro-batch crosses 2 pp - 1 boundaries each way.
TEST(StepSimulation, InterleavingSendsAroundThePipeline) {
  StepCosts k = hand_costs(1, 2, 1.0 / 3.0);
  k.stage_layers.assign(2, 2);
  k.chunk_layers.assign(4, 1);
  k.boundary_bytes_per_token = 1;
  std::vector<int64_t> lengths;
  const StepPlan plan = local_plan({4}, 10, lengths);
  const StepSimulation s = simulate_step(plan, lengths, k);
  EXPECT_DOUBLE_EQ(s.pipeline_bytes, 4 * 3 * 2 * 10.0);
  // Chunks that do not sum to their stage's layers, or a single stage, are refused.
  k.chunk_layers = {1, 1, 1, 2};
  EXPECT_THROW(simulate_step(plan, lengths, k), std::invalid_argument);
  StepCosts one = hand_costs(1, 1, 1.0 / 3.0);
  one.stage_layers = {2};
  one.chunk_layers = {1, 1};
  EXPECT_THROW(simulate_step(plan, lengths, one), std::invalid_argument);
}


// One sequence of `lengths` over a ring of ranks 0 and 1 (zig-zag pieces), capacity 2, checked.
StepPlan two_member_ring_plan(const std::vector<int64_t>& lengths) {
  StepPlan plan;
  plan.capacity = 2;
  plan.rings.push_back({{0, 1}, {0}});
  plan.ranks.resize(2);
  for (int j = 0; j < 2; ++j) {
    PlannedMicroBatch mb;
    mb.pieces = zigzag_ring_pieces(plan.rings[0], 0, j, lengths);
    mb.ring = 0;
    plan.ranks[j].push_back(mb);
  }
  check_plan(plan, lengths, 1, 1);
  return plan;
}

// The costs of the ring tests below: T(s) = a1 s^2 with a1 = 1, forward a quarter
// of it, 1 byte of K/V per row, each GPU on its own node.
StepCosts ring_costs() {
  StepCosts k = hand_costs(2, 1, 0.25);
  k.cost.a1 = 1;
  k.cost.b1 = 0;
  k.kv_bytes_per_token = 1;
  k.hardware.gpus_per_node = 1;
  return k;
}

// Two ranks share a ring over one 4-token sequence (zig-zag: member 0 holds
// positions 0 and 3, member 1 positions 1 and 2). T(s) = a1 s^2 with a1 = 1: one
// member's ring step is s^2 / k^2 = 4 s, forward a quarter of it. At step 1 member
// 0 reads both rows of member 1 (for position 3) and member 1 one row of member 0
// (position 0; 3 is in its future): 2 rows of 1 byte at 1 byte/s (GPUs on different
// nodes) = 2 s. Forward max(1, 2) + 1 = 3; backward max(3, 2) + (3 + 2: the
// gradients go back after the step's compute) = 8. Bytes: 3 rows, three times.
TEST(StepSimulation, RingMicroBatch) {
  const StepCosts k = ring_costs();
  const std::vector<int64_t> lengths = {4};
  const StepPlan plan = two_member_ring_plan(lengths);
  const StepSimulation s = simulate_step(plan, lengths, k, true);
  EXPECT_DOUBLE_EQ(s.step_seconds, 11);
  EXPECT_DOUBLE_EQ(s.attention_bytes, 3 * 3);
  EXPECT_DOUBLE_EQ(s.compute_seconds, 16);  // a1 s^2 in all
  EXPECT_DOUBLE_EQ(s.ring_wait_seconds, 0);
  // Rank 1 first runs a local 2-token sequence (T = 4: forward 1, backward 3): the
  // ring starts at 4 and rank 0 waits 4 s inside it: 4 + 11.
  StepPlan late = plan;
  std::vector<int64_t> more = lengths;
  more.push_back(2);
  late.ranks[1].insert(late.ranks[1].begin(), PlannedMicroBatch{{{1, 0, 2, -1}}, -1, 0});
  const StepSimulation w = simulate_step(late, more, k);
  EXPECT_DOUBLE_EQ(w.step_seconds, 15);
  EXPECT_DOUBLE_EQ(w.ring_wait_seconds, 4);
  // Each micro-batch's forward and backward without the wait: the ring 3 + 8 on both
  // members, rank 1's local one 1 + 3.
  ASSERT_EQ(w.micro_batch_seconds.size(), 2u);
  ASSERT_EQ(w.micro_batch_seconds[0].size(), 1u);
  ASSERT_EQ(w.micro_batch_seconds[1].size(), 2u);
  EXPECT_DOUBLE_EQ(w.micro_batch_seconds[0][0], 11);
  EXPECT_DOUBLE_EQ(w.micro_batch_seconds[1][0], 4);
  EXPECT_DOUBLE_EQ(w.micro_batch_seconds[1][1], 11);
  const RingStats st = ring_stats(plan, lengths);
  EXPECT_EQ(st.rings, 1);
  EXPECT_EQ(st.spread_sequences, 1);
  EXPECT_EQ(st.max_ranks, 2);
  EXPECT_DOUBLE_EQ(st.mean_ranks, 2);
}

// The same ring under a sliding window of 2 (Mistral): the 4-token sequence has
// 3 + 2 x 2 = 7 visible pairs, so a1 multiplies 2 x 7 - 4 = 10 instead of 16 and
// one member's ring step is 10 / 4 = 2.5 s. Each member now reads one row of the
// other (position 2 for 3, 0 for 1): 1 s. Forward max(0.625, 1) + 0.625 = 1.625;
// backward max(1.875, 1) + (1.875 + 1) = 4.75. Bytes: 2 rows, three times.
TEST(StepSimulation, RingMicroBatchUnderASlidingWindow) {
  StepCosts k = ring_costs();
  k.cost.window = 2;
  const std::vector<int64_t> lengths = {4};
  const StepPlan plan = two_member_ring_plan(lengths);
  const StepSimulation s = simulate_step(plan, lengths, k, true);
  EXPECT_DOUBLE_EQ(s.compute_seconds, 10);
  EXPECT_DOUBLE_EQ(s.step_seconds, 6.375);
  EXPECT_DOUBLE_EQ(s.attention_bytes, 3 * 2);
}

// Small kernels (Hockney's n_1/2): one 4-token sequence on one rank, T = a1 s^2 +
// b1 s = 16 + 12. GEMM half rows 4: the 4-row GEMMs take 12 x (1 + 4 / 4) = 24;
// attention half rows 2: 16 x (1 + 2 / 4) = 24; the step 48. MFU's compute stays
// at the large-kernel rate.
TEST(StepSimulation, SmallKernelsRunBelowTheLargeKernelRate) {
  StepCosts k = hand_costs(1, 1, 0.25);
  k.cost.a1 = 1;
  std::vector<int64_t> lengths;
  const StepPlan plan = local_plan({1}, 4, lengths);
  EXPECT_DOUBLE_EQ(simulate_step(plan, lengths, k).step_seconds, 28);
  k.hardware.gemm_half_rows = 4;
  EXPECT_DOUBLE_EQ(simulate_step(plan, lengths, k).step_seconds, 40);
  k.hardware.attention_half_rows = 2;
  const StepSimulation s = simulate_step(plan, lengths, k);
  EXPECT_DOUBLE_EQ(s.step_seconds, 48);
  EXPECT_DOUBLE_EQ(s.compute_seconds, 28);
  EXPECT_DOUBLE_EQ(s.idle_fraction, 0);
}

// RingMicroBatch's ring with attention half rows 2: a member's block holds 4 / 2 = 2
// rows of the sequence, so its ring step takes 4 x (1 + 2 / 2) = 8. Forward max(2, 2)
// + 2 = 4; backward max(6, 2) + (6 + 2) = 14: 18. Links at half their peak instead:
// the 2 rows take 4 s, forward max(1, 4) + 1 = 5, backward max(3, 4) + (3 + 4) = 11: 16.
TEST(StepSimulation, RingBlocksAndLinkEfficiency) {
  StepCosts k = ring_costs();
  const std::vector<int64_t> lengths = {4};
  const StepPlan plan = two_member_ring_plan(lengths);
  k.hardware.attention_half_rows = 2;
  const StepSimulation blocks = simulate_step(plan, lengths, k);
  EXPECT_DOUBLE_EQ(blocks.step_seconds, 18);
  EXPECT_DOUBLE_EQ(blocks.compute_seconds, 16);
  k.hardware.attention_half_rows = 0;
  k.hardware.link_efficiency = 0.5;
  const StepSimulation links = simulate_step(plan, lengths, k);
  EXPECT_DOUBLE_EQ(links.step_seconds, 16);
  EXPECT_DOUBLE_EQ(links.attention_bytes, 3 * 3);  // the same bytes, slower
}

// Link efficiency and half rows are checked with the other figures.
TEST(Hardware, EfficienciesOutOfRangeAreRefused) {
  HardwareProfile h;
  h.peak_flops = h.achievable_fraction = h.hbm_bytes = h.hbm_bytes_per_s = 1;
  h.nvlink_bytes_per_s = h.internode_bytes_per_s = h.pcie_bytes_per_s = 1;
  EXPECT_NO_THROW(validate_hardware(h));
  EXPECT_DOUBLE_EQ(h.link_bytes_per_s(0, 8), 1);
  h.link_efficiency = 0.8;
  EXPECT_DOUBLE_EQ(h.link_bytes_per_s(0, 8), 0.8);
  for (double bad : {0.0, 1.5, -0.1}) {
    h.link_efficiency = bad;
    try {
      validate_hardware(h);
      ADD_FAILURE() << bad << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("link_efficiency must be in (0, 1]"), std::string::npos) << e.what();
    }
  }
  h.link_efficiency = 1;
  h.gemm_half_rows = -1;
  EXPECT_THROW(validate_hardware(h), std::invalid_argument);
  h.gemm_half_rows = 0;
  h.attention_half_rows = -1;
  EXPECT_THROW(validate_hardware(h), std::invalid_argument);
}

// Rank 0 computes 3 s, rank 1 1 s; the reduce-scatter starts when rank 0 arrives:
// 3 + reduce-scatter (1 x 8 / (2 x 2) = 2) + optimizer 0.5 + all-gather (4 / 4 = 1).
TEST(StepSimulation, DataParallelBubbleBeforeTheGradientCollective) {
  StepCosts k = hand_costs(2, 1, 1.0 / 3.0);
  k.cost.b1 = 1;
  k.hardware.gpus_per_node = 1;
  k.hardware.internode_bytes_per_s = 2;
  k.gradient_bytes = {8};
  k.parameter_bytes = {4};
  k.optimizer_seconds = {0.5};
  std::vector<int64_t> lengths = {3, 1};
  StepPlan plan;
  plan.capacity = 3;
  plan.ranks.resize(2);
  plan.ranks[0].push_back(PlannedMicroBatch{{{0, 0, 3, -1}}, -1, 0});
  plan.ranks[1].push_back(PlannedMicroBatch{{{1, 0, 1, -1}}, -1, 0});
  const StepSimulation s = simulate_step(plan, lengths, k);
  EXPECT_DOUBLE_EQ(s.step_seconds, 6.5);
  EXPECT_DOUBLE_EQ(s.min_busy_seconds, 1.5);
  EXPECT_DOUBLE_EQ(s.max_busy_seconds, 3.5);
  EXPECT_NEAR(s.idle_fraction, 1 - 5.0 / 13.0, 1e-12);
  EXPECT_DOUBLE_EQ(s.gradient_sync_seconds, 3.5);
}

// A micro-batch of 10 tokens with offload ratio 1 on 4 layers: 2 x 10 bytes go to
// host (Act = 1 byte per token and layer) beside the forward and come back beside
// the backward. Forward 4 x 0.25 x 1 x 10... set b1 so F = 1 and B = 2 over the 4 layers.
TEST(StepSimulation, OffloadCopiesThatDoNotHideStretchTheStep) {
  StepCosts k = hand_costs(1, 1, 1.0 / 3.0);
  k.stage_layers = {4};
  k.cost.b1 = 3.0 / 40;  // 4 layers x 10 tokens x b1 = 3
  k.cost.a2 = 1;
  k.cost.d2h_bytes_per_s = 10;  // 20 bytes: 2 s against the 1 s forward
  k.cost.h2d_bytes_per_s = 10;  // 2 s against the 2 s backward
  std::vector<int64_t> lengths = {10};
  StepPlan plan;
  plan.capacity = 10;
  plan.ranks.resize(1);
  plan.ranks[0].push_back(PlannedMicroBatch{{{0, 0, 10, -1}}, -1, 1.0});
  StepSimulation s = simulate_step(plan, lengths, k);
  EXPECT_DOUBLE_EQ(s.step_seconds, 4);
  EXPECT_DOUBLE_EQ(s.offloaded_bytes, 20);
  k.cost.h2d_bytes_per_s = 5;  // 4 s: the backward waits for its activations
  s = simulate_step(plan, lengths, k);
  EXPECT_DOUBLE_EQ(s.step_seconds, 6);
  k.cost.d2h_bytes_per_s = k.cost.h2d_bytes_per_s = 1000;  // hidden
  s = simulate_step(plan, lengths, k);
  EXPECT_NEAR(s.step_seconds, 3, 1e-12);
}

TEST(StepSimulation, ChromeTraceNamesEveryRankAndStream) {
  std::vector<int64_t> lengths;
  const StepPlan plan = local_plan({2, 3}, 1, lengths);
  StepCosts k = hand_costs(2, 2, 1.0 / 3.0);
  const StepSimulation s = simulate_step(plan, lengths, k, true);
  ASSERT_TRUE(s.graph && s.replay);
  std::ostringstream out;
  sim::write_chrome_trace(out, *s.graph, *s.replay, s.process_names);
  const std::string json = out.str();
  EXPECT_EQ(json.rfind("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[", 0), 0u);
  for (int pid = 0; pid < 4; ++pid)
    EXPECT_NE(json.find("\"ph\":\"X\",\"pid\":" + std::to_string(pid) + ",\"tid\":0"), std::string::npos) << pid;
  EXPECT_NE(json.find("\"process_name\""), std::string::npos);
  EXPECT_NE(json.find("pp-fwd-recv"), std::string::npos);
  EXPECT_NE(json.find("\"name\":\"backward\""), std::string::npos);
  EXPECT_EQ(json.substr(json.size() - 4), "\n]}\n");
}

ModelShape llama7b() {
  ModelShape m;
  m.name = "llama-7b";
  m.layers = 32;
  m.hidden = 4096;
  m.heads = 32;
  m.kv_heads = 8;
  m.head_dim = 128;
  m.ffn = 11008;
  m.vocab = 32000;
  return m;
}

TEST(ModelCosts, CountsOfLlama7bAndMoe) {
  const ModelShape m = llama7b();
  const ModelCosts c = model_costs(m, 1, 1);
  // 4096 x (4096 + 2 x 1024) + 4096 x 4096 + 3 x 4096 x 11008 + 2 x 4096.
  EXPECT_DOUBLE_EQ(c.layer_parameters, 4096.0 * 6144 + 4096.0 * 4096 + 3.0 * 4096 * 11008 + 8192);
  EXPECT_DOUBLE_EQ(c.layer_matmul_flops_per_token, 6 * (4096.0 * 6144 + 4096.0 * 4096 + 3.0 * 4096 * 11008));
  EXPECT_DOUBLE_EQ(c.attention_flops_per_token_pair, 12 * 4096.0);
  EXPECT_DOUBLE_EQ(c.kv_bytes_per_token, 2 * 1024 * 2);
  // tp 8: 4 x 4096 + (512 + 2 x 128) + 512 + 2 x 1376 bf16 values, 2 + 4 fp32 ones.
  const ModelCosts t = model_costs(m, 8, 1);
  EXPECT_DOUBLE_EQ(t.saved_bytes_per_token, 2 * (4 * 4096.0 + 768 + 512 + 2 * 1376) + 4 * (2 + 4));
  EXPECT_DOUBLE_EQ(t.kv_bytes_per_token, 2 * 128 * 2);
  // MoE: FLOPs of the top-2 experts, parameters of all 8.
  ModelShape moe = m;
  moe.ffn = 14336;
  moe.experts = 8;
  moe.experts_per_token = 2;
  const ModelCosts e = model_costs(moe, 1, 1);
  EXPECT_DOUBLE_EQ(e.layer_matmul_flops_per_token, 6 * (4096.0 * 6144 + 4096.0 * 4096 + 3.0 * 4096 * 14336 * 2 + 4096 * 8));
  EXPECT_DOUBLE_EQ(e.layer_parameters, 4096.0 * 6144 + 4096.0 * 4096 + 3.0 * 4096 * 14336 * 8 + 4096 * 8 + 8192);
  ModelShape odd = m;
  odd.heads = 52;
  odd.kv_heads = 4;
  EXPECT_THROW(model_costs(odd, 8, 1), std::invalid_argument);
}

TEST(ModelCosts, MemoryBudgetFormula) {
  HardwareProfile hw;
  hw.peak_flops = 1e15;
  hw.achievable_fraction = 0.5;
  hw.hbm_bytes = 80e9;
  hw.hbm_bytes_per_s = 3e12;
  hw.reserved_bytes = 5e9;
  hw.nvlink_bytes_per_s = hw.internode_bytes_per_s = hw.pcie_bytes_per_s = 1e10;
  const ModelShape m = llama7b();
  const ParallelDegrees layout{8, 2, 4};
  const std::vector<int64_t> split = {16, 16};
  const MemoryBudget b = memory_budget(m, hw, layout, split);
  const ModelCosts c = model_costs(m, 8, 2);
  double best = 1e300;
  for (int s = 0; s < 2; ++s) {
    const double p = (16 * c.layer_parameters + (s == 0 ? c.embedding_parameters : c.head_parameters)) / 8;
    EXPECT_DOUBLE_EQ(b.parameters_per_gpu[s], p);
    const double free = 80e9 - 5e9 - 6 * p - 12 * p / 4;
    EXPECT_DOUBLE_EQ(b.free_bytes[s], free);
    best = std::min(best, free / ((2 - s) * 16 * c.saved_bytes_per_token));
  }
  EXPECT_EQ(b.capacity, static_cast<int64_t>(best));
  EXPECT_EQ(b.limiting_stage, 0);
  // Two chunks of 8 layers per stage: stage s keeps its interleaved warm-up plus one
  // (micro-batch, chunk) pairs in flight, 2 (2 - s - 1) + 2 + 1, each over 8 layers.
  const ParallelDegrees interleaved{8, 2, 4, 1, 2};
  const MemoryBudget bi = memory_budget(m, hw, interleaved, std::vector<int64_t>{8, 8, 8, 8});
  EXPECT_EQ(bi.free_bytes, b.free_bytes);
  EXPECT_EQ(bi.capacity, static_cast<int64_t>(std::min(b.free_bytes[0] / (5 * 8 * c.saved_bytes_per_token),
                                                       b.free_bytes[1] / (3 * 8 * c.saved_bytes_per_token))));
  EXPECT_THROW(memory_budget(m, hw, interleaved, split), std::invalid_argument);
  hw.hbm_bytes = 6e9;
  EXPECT_THROW(memory_budget(m, hw, layout, split), std::invalid_argument);
}

// A small model with a large vocabulary (LLaMA-3.2-1B's shape): its LM head costs
// 4 layers at 1K tokens, so the last of 4 stages keeps one layer; at 128K the
// attention makes a layer 5 times dearer and the head less than one layer.
TEST(StageSplit, CountsAttentionAtTheLongestSequence) {
  ModelShape m;
  m.layers = 16;
  m.hidden = 2048;
  m.heads = 16;
  m.kv_heads = 8;
  m.head_dim = 128;
  m.ffn = 8192;
  m.vocab = 128256;
  EXPECT_EQ(stage_layer_split(m, 1, 4, 1024), (std::vector<int64_t>{5, 5, 5, 1}));
  EXPECT_EQ(stage_layer_split(m, 1, 4, 128 * 1024), (std::vector<int64_t>{4, 4, 4, 4}));
  EXPECT_EQ(stage_layer_split(m, 2, 4, 128 * 1024), (std::vector<int64_t>{4, 4, 4, 4}));
  EXPECT_THROW(stage_layer_split(m, 1, 17, 1024), std::invalid_argument);
  EXPECT_THROW(stage_layer_split(m, 3, 4, 1024), std::invalid_argument);
  // Two chunks per stage: eight virtual stages balanced alike, chunk c of stage s
  // being virtual stage 4 c + s.
  const std::vector<int64_t> chunks = stage_layer_split(m, 1, 4, 128 * 1024, 2);
  EXPECT_EQ(chunks, (std::vector<int64_t>(8, 2)));
  EXPECT_EQ(layers_per_stage(std::vector<int64_t>{1, 2, 3, 4, 5, 6}, 3), (std::vector<int64_t>{5, 7, 9}));
  EXPECT_THROW(stage_layer_split(m, 1, 1, 1024, 2), std::invalid_argument);
  EXPECT_THROW(stage_layer_split(m, 1, 4, 1024, 5), std::invalid_argument);
}

// A planned batch end to end: plan_naive's plan of a skewed batch on 8 ranks
// replays without deadlock with 1 and 2 stages, and static's with 1.
TEST(StepSimulation, PlannersOutputReplays) {
  HardwareProfile hw;
  hw.peak_flops = 1e15;
  hw.achievable_fraction = 0.5;
  hw.hbm_bytes = 80e9;
  hw.hbm_bytes_per_s = 3e12;
  hw.reserved_bytes = 5e9;
  hw.nvlink_bytes_per_s = 4.5e11;
  hw.internode_bytes_per_s = 5e10;
  hw.pcie_bytes_per_s = 5e10;
  const ModelShape m = llama7b();
  std::vector<int64_t> lengths;
  for (int i = 0; i < 40; ++i) lengths.push_back(1000 + 997 * i % 7000);
  lengths.push_back(200000);
  lengths.push_back(90000);
  for (int pp : {1, 2}) {
    const ParallelDegrees layout{8, pp, 8};
    const std::vector<int64_t> split = stage_layer_split(m, 8, pp, 200000);
    const StepCosts k = make_step_costs(m, hw, layout, split);
    PlannerSettings st;
    st.hdp = 8;
    st.capacity = 32768;
    st.layers_per_stage = *std::min_element(split.begin(), split.end());
    st.pipeline_stages = pp;
    st.cost = k.cost;
    st.offload.enabled = pp == 1;  // without offload the long sequences need rings
    const StepPlan naive = plan_naive(lengths, st);
    check_plan(naive, lengths, st.layers_per_stage, pp);
    const StepSimulation s = simulate_step(naive, lengths, k);
    EXPECT_GT(s.step_seconds, 0);
    EXPECT_GE(s.idle_fraction, 0);
    EXPECT_LT(s.idle_fraction, 1);
    if (pp == 2) {
      EXPECT_FALSE(naive.rings.empty());
      EXPECT_GT(s.attention_bytes, 0);
      // The same plan with two chunks per stage: the same work and ring traffic, its
      // rings meeting on every virtual stage.
      ParallelDegrees chunked = layout;
      chunked.vpp = 2;
      check_plan(naive, lengths, st.layers_per_stage, pp, 2);  // its rings meet in the interleaved order too
      const StepCosts ki = make_step_costs(m, hw, chunked, stage_layer_split(m, 8, pp, 200000, 2));
      const StepSimulation si = simulate_step(naive, lengths, ki);
      EXPECT_NEAR(si.compute_seconds, s.compute_seconds, 1e-9 * s.compute_seconds);
      EXPECT_NEAR(si.attention_bytes, s.attention_bytes, 1e-9 * s.attention_bytes);
    }
    if (pp == 1) {
      const StepPlan fixed = plan_static(lengths, st, 0);
      const StepSimulation t = simulate_step(fixed, lengths, k);
      EXPECT_GT(t.attention_bytes, s.attention_bytes);
    }
  }
}

// PP-Balance's waves in the step simulator: 4 ranks, 2 stages, T(s) = 3 s per stage
// (forward a third), free transfers, capacity 100, no offload. Sequences of 240 and
// 160 tokens need rings of 3 and 2 ranks (80 tokens, 240 s per member and stage);
// four of 100 tokens are micro-batches of their own (300 s). Algorithm 2's choice
// gives the two rings a common rank, rank 0, and puts the 160-token ring at index 1
// on ranks 0 and 3, after the 240-token ring on rank 0 and after a 300 s
// micro-batch on rank 3: rank 0 comes to it first and waits. The waves put the
// 160-token ring (40 tokens per member, 120 s) at index 0 and the 240-token one (60
// tokens, 180 s) at index 1 on every rank, then one 100-token micro-batch each:
// four identical pipelines. By hand, forward 40, 60, 100 and backward 80, 120, 200:
// stage 1 runs F0 [40, 80], B0 [80, 160], F1 [160, 220], B1 [220, 340], F2 [340,
// 440], B2 [440, 640]; stage 0 F0 [0, 40], F1 [40, 100], B0 [160, 240], F2 [240,
// 340], B1 [340, 460], B2 [640, 840]: the step is 840 s, and no ring waits, nor
// under interleaved 1F1B.
TEST(StepSimulation, RingWavesRunEveryPipelineAlike) {
  const StepCosts k = hand_costs(4, 2, 1.0 / 3.0);
  PlannerSettings st;
  st.hdp = 4;
  st.capacity = 100;
  st.layers_per_stage = 1;
  st.pipeline_stages = 2;
  st.cost = k.cost;
  st.offload.enabled = false;
  const std::vector<int64_t> lengths = {100, 240, 100, 160, 100, 100};
  BalanceSettings balance;
  balance.step_seconds = [&](const StepPlan& p) { return simulate_step(p, lengths, k).step_seconds; };
  const StepPlan waves = plan_balance(lengths, st, balance);
  check_plan(waves, lengths, 1, 2);
  ASSERT_EQ(waves.rings.size(), 2u);
  for (const Ring& ring : waves.rings) EXPECT_EQ(ring.ranks, (std::vector<int>{0, 1, 2, 3}));
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(waves.ranks[r].size(), 3u);
    EXPECT_EQ(waves.ranks[r][0].ring, 0);
    EXPECT_EQ(waves.ranks[r][1].ring, 1);
    EXPECT_EQ(waves.ranks[r][2].tokens(), 100);
  }
  const StepSimulation s = simulate_step(waves, lengths, k);
  EXPECT_DOUBLE_EQ(s.step_seconds, 840);
  EXPECT_DOUBLE_EQ(s.ring_wait_seconds, 0);
  // Algorithm 2's choice by its busiest rank (no step measure): a ring waits, and
  // the step is longer (simulated: 100 s of waits over the processes, 1,140 s).
  const StepPlan old = plan_balance(lengths, st, {});
  check_plan(old, lengths, 1, 2);
  const StepSimulation o = simulate_step(old, lengths, k);
  EXPECT_GT(o.ring_wait_seconds, 0);
  EXPECT_GT(o.step_seconds, 840);
  // Interleaved 1F1B (two chunks of one layer per stage): the identical pipelines
  // still meet every ring together; Algorithm 2's still wait, and take longer.
  StepCosts chunked = k;
  chunked.stage_layers.assign(2, 2);
  chunked.chunk_layers.assign(4, 1);
  check_plan(waves, lengths, 1, 2, 2);
  const StepSimulation i = simulate_step(waves, lengths, chunked);
  EXPECT_DOUBLE_EQ(i.ring_wait_seconds, 0);
  const StepSimulation oi = simulate_step(old, lengths, chunked);
  EXPECT_GT(oi.ring_wait_seconds, 0);
  EXPECT_GT(oi.step_seconds, i.step_seconds);
}

// Mixtral-8x7B (Jiang et al. 2024, "Mixtral of Experts"): 8 experts of FFN 14336, top 2.
ModelShape mixtral8x7b() {
  ModelShape m = llama7b();
  m.name = "mixtral-8x7b";
  m.ffn = 14336;
  m.experts = 8;
  m.experts_per_token = 2;
  return m;
}

// The MFU's model FLOPs (training_flops) of top-2 of 8 experts of FFN F are those of
// a dense FFN of 2 F plus the router: 6 hidden x 8 per token and layer.
TEST(ExpertParallel, ModelFlopsCountTheActiveExperts) {
  const ModelShape moe = mixtral8x7b();
  ModelShape dense = moe;
  dense.experts = dense.experts_per_token = 1;
  dense.ffn = 2 * moe.ffn;
  const std::vector<int64_t> lengths = {4096, 100};
  EXPECT_DOUBLE_EQ(training_flops(moe, lengths) - training_flops(dense, lengths), 4196.0 * 32 * 6 * 4096 * 8);
  // Memory counts all 8: four times the dense model's FFN parameters.
  EXPECT_DOUBLE_EQ(expert_parameters(moe), 4 * expert_parameters(dense));
}

TEST(ExpertParallel, CandidatesAndErrors) {
  const ModelShape moe = mixtral8x7b();
  EXPECT_EQ(expert_parallel_candidates(moe, 12), (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(expert_parallel_candidates(moe, 64), (std::vector<int>{1, 2, 4, 8}));
  EXPECT_EQ(expert_parallel_candidates(moe, 3), (std::vector<int>{1}));
  EXPECT_EQ(expert_parallel_candidates(llama7b(), 64), (std::vector<int>{1}));
  EXPECT_NO_THROW(validate_expert_parallel(moe, 16, 8));
  EXPECT_THROW(validate_expert_parallel(moe, 12, 8), std::invalid_argument);   // hdp
  EXPECT_THROW(validate_expert_parallel(moe, 12, 3), std::invalid_argument);   // experts
  EXPECT_THROW(validate_expert_parallel(moe, 12, 0), std::invalid_argument);
  EXPECT_THROW(validate_expert_parallel(llama7b(), 8, 2), std::invalid_argument);  // dense
}

// Per GPU: weights and gradients of 1 / ep of the experts, the optimizer state of all
// parameters over hdp; the experts' gradients and weights synchronised apart, and a
// dispatch buffer of hidden x 2 bytes x 2 experts per token, and a count exchange of
// the 8 experts' fp32 row counts (8 x 4 = 32 bytes) per layer and micro-batch.
TEST(ExpertParallel, MemoryAndStepCostsOfMixtral) {
  HardwareProfile hw;  // 200 GB per GPU: the 46.7 B parameters fit tp 2 at ep 1 too
  hw.peak_flops = 1e15;
  hw.achievable_fraction = 0.5;
  hw.hbm_bytes = 200e9;
  hw.hbm_bytes_per_s = 3e12;
  hw.reserved_bytes = 5e9;
  hw.gpus_per_node = 8;
  hw.nvlink_bytes_per_s = 400e9;
  hw.internode_bytes_per_s = 50e9;
  hw.pcie_bytes_per_s = 1e10;
  const ModelShape m = mixtral8x7b();
  const ModelCosts c = model_costs(m, 2, 1);
  EXPECT_DOUBLE_EQ(c.expert_parameters, 3.0 * 4096 * 14336 * 8);
  EXPECT_DOUBLE_EQ(c.all_to_all_bytes_per_token, 4096.0 * 2 * 2);
  EXPECT_DOUBLE_EQ(model_costs(llama7b(), 1, 1).all_to_all_bytes_per_token, 0);
  EXPECT_DOUBLE_EQ(c.all_to_all_count_bytes, 8 * 4);
  EXPECT_DOUBLE_EQ(model_costs(llama7b(), 1, 1).all_to_all_count_bytes, 0);
  const ParallelDegrees layout{2, 1, 8};
  const std::vector<int64_t> split = {32};
  const double experts = 32 * 3.0 * 4096 * 14336 * 8;
  const double dense = 32 * (c.layer_parameters - 3.0 * 4096 * 14336 * 8) + c.embedding_parameters + c.head_parameters;
  for (int ep : {1, 2, 4, 8}) {
    const MemoryBudget b = memory_budget(m, hw, layout, split, ep);
    const double mine = dense / 2 + experts / 2 / ep;
    EXPECT_DOUBLE_EQ(b.parameters_per_gpu[0], mine) << ep;
    EXPECT_NEAR(b.static_bytes[0], 6 * mine + 12 * (dense + experts) / 2 / 8, 1e-3) << ep;
    EXPECT_EQ(b.capacity, static_cast<int64_t>((200e9 - 5e9 - b.static_bytes[0]) / (32 * c.saved_bytes_per_token)))
        << ep;
    const StepCosts k = make_step_costs(m, hw, layout, split, ep);
    EXPECT_EQ(k.ep, ep);
    EXPECT_DOUBLE_EQ(k.all_to_all_bytes_per_token, 16384);
    EXPECT_DOUBLE_EQ(k.all_to_all_count_bytes, 32);
    if (ep == 1) {
      EXPECT_DOUBLE_EQ(k.gradient_bytes[0], 4 * mine);
      EXPECT_TRUE(k.expert_gradient_bytes.empty());
      EXPECT_DOUBLE_EQ(all_to_all_seconds_per_token(k), 0);
    } else {
      EXPECT_DOUBLE_EQ(k.gradient_bytes[0], 4 * dense / 2);
      EXPECT_DOUBLE_EQ(k.parameter_bytes[0], 2 * dense / 2);
      EXPECT_DOUBLE_EQ(k.expert_gradient_bytes[0], 4 * experts / 2 / ep);
      EXPECT_DOUBLE_EQ(k.expert_parameter_bytes[0], 2 * experts / 2 / ep);
      // tp 2 x ep GPUs: one node up to ep 4, the network at ep 8.
      const double bw = ep <= 4 ? 400e9 : 50e9;
      EXPECT_DOUBLE_EQ(k.all_to_all_bytes_per_s, bw);
      // Four row all-to-alls per layer (two forward, two backward).
      EXPECT_DOUBLE_EQ(all_to_all_seconds_per_token(k), 4 * 16384.0 * (ep - 1) / ep / bw);
    }
    EXPECT_NEAR(k.optimizer_seconds[0], 32 * (dense + experts) / 2 / 8 / 3e12, 1e-15) << ep;
  }
  // Expert parallelism frees memory: a larger ep, a larger capacity.
  EXPECT_GT(memory_budget(m, hw, layout, split, 8).capacity, memory_budget(m, hw, layout, split, 1).capacity);
  EXPECT_THROW(memory_budget(m, hw, layout, split, 16), std::invalid_argument);
  EXPECT_THROW(make_step_costs(m, hw, layout, split, 3), std::invalid_argument);
}

// hdp 4 = two ep groups of 2 ({0, 1}, {2, 3}; two GPUs per node), one layer,
// T(s) = s with forward a quarter. Row all-to-all: 8 bytes per token over a 4 bytes/s
// link with 0.25 s latency, 2 members: (2 - 1)(0.25 + 8 t / (2 x 4)) = 0.25 + t; the
// count exchange: 8 bytes (2 experts' fp32 counts), 0.25 + 8 / (2 x 4) = 1.25. Forward:
// the count exchange and two row all-to-alls (dispatch, combine); backward two (the
// output gradients out, the input gradients back); each after its compute and before
// the next. Rank 0 (4 tokens): 1 + (1.25 + 2 x 4.25) + 3 + 2 x 4.25 = 1 + 9.75 + 3 +
// 8.5 = 22.25; ranks 1-3 (2 tokens): 0.5 + (1.25 + 2 x 2.25) + 1.5 + 2 x 2.25 = 0.5 +
// 5.75 + 1.5 + 4.5 = 12.25. Then over the network (1 byte/s): dense gradients 8 bytes
// over 4 ranks, 3 x 8 / 4 = 6 (22.25 to 28.25); expert gradients 4 bytes over ranks
// {0, 2}, 4 / 2 = 2 (to 30.25); optimizer 0.5; dense weights 4 bytes, 3 x 4 / 4 = 3;
// expert weights 2 bytes, 2 / 2 = 1: 30.25 + 0.5 + 3 + 1 = 34.75.
TEST(StepSimulation, ExpertAllToAllsBlockTheLayer) {
  StepCosts k = hand_costs(4, 1, 0.25);
  k.cost.b1 = 1;
  k.hardware.gpus_per_node = 2;
  k.hardware.nvlink_bytes_per_s = 4;
  k.hardware.intranode_latency_s = 0.25;
  k.ep = 2;
  k.all_to_all_bytes_per_token = 8;
  k.all_to_all_count_bytes = 8;
  k.all_to_all_bytes_per_s = 4;
  k.all_to_all_latency_s = 0.25;
  k.gradient_bytes = {8};
  k.parameter_bytes = {4};
  k.expert_gradient_bytes = {4};
  k.expert_parameter_bytes = {2};
  k.optimizer_seconds = {0.5};
  std::vector<int64_t> lengths = {4, 2, 2, 2};
  StepPlan plan;
  plan.capacity = 4;
  plan.ranks.resize(4);
  for (int r = 0; r < 4; ++r) plan.ranks[r].push_back(PlannedMicroBatch{{{r, 0, lengths[r], -1}}, -1, 0});
  const StepSimulation s = simulate_step(plan, lengths, k);
  EXPECT_DOUBLE_EQ(s.step_seconds, 34.75);
  EXPECT_DOUBLE_EQ(s.compute_seconds, 10);  // the all-to-alls are not compute
  // Rank 0: 9.75 + 8.5 = 18.25; ranks 1-3: 5.75 + 4.5 = 10.25 each.
  EXPECT_DOUBLE_EQ(s.all_to_all_seconds, 18.25 + 3 * 10.25);
  // Sent: 4 row all-to-alls x 8 t bytes x (ep - 1) / ep over 10 tokens, and one count
  // exchange of 8 x (ep - 1) / ep bytes per micro-batch, 4 micro-batches:
  // 4 x 8 x 10 / 2 + 4 x 8 / 2 = 160 + 16.
  EXPECT_DOUBLE_EQ(s.all_to_all_bytes, 160 + 16);
  EXPECT_DOUBLE_EQ(s.gradient_bytes, (8 + 4) * 4 + (4 + 2) * 4);
  EXPECT_DOUBLE_EQ(s.max_busy_seconds, 4 + 0.5);
  // Mismatched expert figures are refused.
  k.expert_gradient_bytes.clear();
  EXPECT_THROW(simulate_step(plan, lengths, k), std::invalid_argument);
}

// Two stages, hdp 2 = one ep group: stage 1's forward waits for stage 0's all-to-alls.
// 2 tokens, T = s (forward 0.5, backward 1.5), no latency; a row all-to-all 16 bytes /
// (2 x 4) = 2, the count exchange 8 bytes / (2 x 4) = 1. Forward: 0.5 + 1 + 2 x 2 =
// 5.5, backward 1.5 + 2 x 2 = 5.5. Stage 0 forward to 5.5; stage 1 forward to 11 and
// backward to 16.5; stage 0 backward: 22.
TEST(StepSimulation, ExpertAllToAllsBeforeThePipelineSend) {
  StepCosts k = hand_costs(2, 2, 0.25);
  k.cost.b1 = 1;
  k.hardware.gpus_per_node = 2;
  k.ep = 2;
  k.all_to_all_bytes_per_token = 8;
  k.all_to_all_count_bytes = 8;
  k.all_to_all_bytes_per_s = 4;
  k.expert_gradient_bytes = {0, 0};
  k.expert_parameter_bytes = {0, 0};
  std::vector<int64_t> lengths;
  const StepPlan plan = local_plan({1, 1}, 2, lengths);
  const StepSimulation s = simulate_step(plan, lengths, k, true);
  EXPECT_DOUBLE_EQ(s.step_seconds, 22);
  const auto& labels = s.graph->labels();
  EXPECT_NE(std::find(labels.begin(), labels.end(), "expert all-to-all forward"), labels.end());
}

}  // namespace

}  // namespace hdp

// Run by ctest under mpirun with 4 ranks: the MPI communicator's staging pool (its
// collectives and messages are in mpi_communicator_conformance_test), the process
// grid, ZeRO-1 against an unsharded AdamW step, and the training engine's
// gradients with uneven micro-batch counts across hybrid-data-parallel ranks.

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "mpi_environment.h"
#include "kernels/ops.h"
#include "parallel/local_communicator.h"
#include "parallel/mpi_communicator.h"
#include "parallel/process_groups.h"
#include "parallel/ring_attention.h"
#include "planning/ring_layout.h"
#include "parallel/zero_optimizer.h"
#include "config/config.h"
#include "data/dataset.h"
#include "data/materialize.h"
#include "test_util.h"
#include "run/engine.h"
#include "planning/plan.h"

namespace hdp {
namespace {

using testing::world_rank;
using testing::world_size;

// The staging path that device buffers take (copy in before the MPI call, copy out
// in wait(), blocks from the communicator's pool), exercised with host buffers:
// the same results as the direct path, and a second identical round allocates no
// new staging blocks.
TEST(MpiCommunicator, StagedBuffersGiveTheSameResultsAndReuseThePool) {
  ASSERT_EQ(world_size(), 4) << "run under mpirun -np 4";
  MpiCommunicator world(MPI_COMM_WORLD, "world");
  world.stage_host_buffers_for_testing(true);
  const int r = world.rank();
  auto round = [&] {
    std::vector<float> v = {1.0f + r, 10.0f * r};
    CommRequest reduce = world.all_reduce_async(Tensor(v.data(), {2}), ReduceOp::Sum);
    v[0] = -99;  // the input was copied at the call: changing it now changes nothing
    reduce.wait();
    EXPECT_EQ(v[0], 1 + 2 + 3 + 4);
    EXPECT_EQ(v[1], 60);

    std::vector<float> send(10);
    for (int i = 0; i < 10; ++i) send[i] = static_cast<float>(100 * r + i);
    const int64_t begin = part_begin(10, r, 4), end = part_begin(10, r + 1, 4);
    std::vector<float> recv(end - begin, -1.0f);
    world.reduce_scatter(Tensor(send.data(), {10}), Tensor(recv.data(), {end - begin}));
    for (int64_t i = begin; i < end; ++i) EXPECT_EQ(recv[i - begin], 600 + 4 * i) << i;

    std::vector<float> gathered(10, -1.0f);
    for (int64_t i = begin; i < end; ++i) gathered[i] = static_cast<float>(r);
    world.all_gather(Tensor(gathered.data(), {10}));
    for (int i = 0; i < 10; ++i) {
      int owner = 0;
      while (part_begin(10, owner + 1, 4) <= i) ++owner;
      EXPECT_EQ(gathered[i], owner) << i;
    }

    // Two messages in flight each way, received out of order of posting.
    std::vector<float> out1(5, static_cast<float>(r)), out2(7000, static_cast<float>(10 + r)), in1(5), in2(7000);
    CommRequest rx2 = world.recv_async(Tensor(in2.data(), {7000}), (r + 3) % 4, 9);
    CommRequest rx1 = world.recv_async(Tensor(in1.data(), {5}), (r + 3) % 4, 8);
    CommRequest tx1 = world.send_async(Tensor(out1.data(), {5}), (r + 1) % 4, 8);
    CommRequest tx2 = world.send_async(Tensor(out2.data(), {7000}), (r + 1) % 4, 9);
    rx1.wait();
    rx2.wait();
    tx1.wait();
    tx2.wait();
    EXPECT_EQ(in1[4], static_cast<float>((r + 3) % 4));
    EXPECT_EQ(in2[6999], static_cast<float>(10 + (r + 3) % 4));
  };
  round();
  const int64_t allocations = world.staging_allocations();
  EXPECT_GT(allocations, 0);
  EXPECT_GT(world.staging_bytes(), 0u);
  round();
  EXPECT_EQ(world.staging_allocations(), allocations) << "a repeated round must reuse the staging blocks";
}

// All-to-all with per-peer sizes, zero included: rank r sends (r + 2q) % 3 elements to
// rank q, valued 1000 r + 100 q + i, and receives in rank order what each rank sends
// it; directly and through the staging path (whose input is copied at the call), and
// on one rank without MPI.
TEST(MpiCommunicator, AllToAllWithPerPeerSizes) {
  ASSERT_EQ(world_size(), 4) << "run under mpirun -np 4";
  MpiCommunicator world(MPI_COMM_WORLD, "world");
  const int r = world.rank();
  auto count = [](int from, int to) { return static_cast<int64_t>((from + 2 * to) % 3); };
  std::vector<int64_t> send_counts(4), recv_counts(4);
  std::vector<float> send;
  for (int q = 0; q < 4; ++q) {
    send_counts[q] = count(r, q);
    recv_counts[q] = count(q, r);
    for (int64_t i = 0; i < send_counts[q]; ++i) send.push_back(static_cast<float>(1000 * r + 100 * q + i));
  }
  std::vector<float> expected;
  for (int q = 0; q < 4; ++q)
    for (int64_t i = 0; i < recv_counts[q]; ++i) expected.push_back(static_cast<float>(1000 * q + 100 * r + i));
  const int64_t n_send = static_cast<int64_t>(send.size()), n_recv = static_cast<int64_t>(expected.size());
  for (bool staged : {false, true}) {
    SCOPED_TRACE(staged ? "staged" : "direct");
    world.stage_host_buffers_for_testing(staged);
    world.reset_stats();
    std::vector<float> in = send, out(n_recv, -1.0f);
    CommRequest request =
        world.all_to_all_v_async(Tensor(in.data(), {n_send}), send_counts, Tensor(out.data(), {n_recv}), recv_counts);
    if (staged && n_send > 0) in[0] = -99;  // copied at the call: changing it now changes nothing
    request.wait();
    EXPECT_EQ(out, expected);
    EXPECT_EQ(world.stats().collective_bytes, (n_send - send_counts[r]) * 4);
    EXPECT_EQ(world.stats().collectives, 1);
  }
  world.stage_host_buffers_for_testing(false);
  // Counts that do not match the tensors are refused before anything is sent.
  std::vector<float> out(n_recv);
  const std::vector<int64_t> three = {1, 1, 1};
  EXPECT_THROW(world.all_to_all_v(Tensor(send.data(), {n_send}), three, Tensor(out.data(), {n_recv}), recv_counts),
               std::invalid_argument);

  LocalCommunicator local;
  std::vector<float> a = {1, 2, 3}, b(3);
  const std::vector<int64_t> all = {3};
  local.all_to_all_v(Tensor(a.data(), {3}), all, Tensor(b.data(), {3}), all);
  EXPECT_EQ(b, a);
}

TEST(ProcessGroups, RankOrderIsTpFastestThenHdpThenPp) {
  const ParallelDegrees grids[] = {{2, 1, 2}, {1, 2, 2}, {2, 2, 1}, {1, 1, 4}};
  for (const ParallelDegrees& degrees : grids) {
    ProcessGroups groups(degrees, true);
    const GridCoords c = groups.coords();
    EXPECT_EQ(degrees.rank(c), world_rank());
    EXPECT_EQ(groups.tp().size(), degrees.tp);
    EXPECT_EQ(groups.pp().size(), degrees.pp);
    EXPECT_EQ(groups.hdp().size(), degrees.hdp);
    EXPECT_EQ(groups.tp().rank(), c.tp_rank);
    EXPECT_EQ(groups.pp().rank(), c.pp_rank);
    EXPECT_EQ(groups.hdp().rank(), c.hdp_rank);
    // Members of my tp group share my pp and hdp coordinates: their world ranks sum as predicted.
    int64_t expected = 0;
    for (int t = 0; t < degrees.tp; ++t) expected += degrees.rank({t, c.pp_rank, c.hdp_rank});
    EXPECT_EQ(groups.tp().all_reduce_sum(int64_t{world_rank()}), expected);
    expected = 0;
    for (int h = 0; h < degrees.hdp; ++h) expected += degrees.rank({c.tp_rank, c.pp_rank, h});
    EXPECT_EQ(groups.hdp().all_reduce_sum(int64_t{world_rank()}), expected);
    EXPECT_EQ(groups.tied() != nullptr, degrees.pp > 1);
  }
}

// Every group is its axis of the grid: its members are ParallelDegrees::group's
// ranks, ranked by their coordinate; expert parallelism's two groups included.
TEST(ProcessGroups, EachGroupIsTheRanksThatDifferAlongItsAxis) {
  const ParallelDegrees grids[] = {{2, 1, 2}, {1, 2, 2}, {2, 2, 1}, {1, 1, 4, 2}, {1, 1, 4, 4}};
  for (const ParallelDegrees& degrees : grids) {
    ProcessGroups groups(degrees, false);
    const GridCoords c = groups.coords();
    auto expect_axis = [&](Communicator& group, GridAxis axis) {
      const std::vector<int> members = degrees.group(c, axis);
      EXPECT_EQ(group.size(), static_cast<int>(members.size()));
      EXPECT_EQ(group.rank(), degrees.coordinate(c, axis));
      // Each member puts its world rank at its place: the gathered list is the group.
      std::vector<int64_t> gathered(members.size(), 0);
      gathered[static_cast<size_t>(group.rank())] = world_rank();
      group.all_reduce(std::span<int64_t>(gathered), ReduceOp::Sum);
      EXPECT_EQ(gathered, std::vector<int64_t>(members.begin(), members.end()));
    };
    expect_axis(groups.tp(), GridAxis::Tp);
    expect_axis(groups.pp(), GridAxis::Pp);
    expect_axis(groups.hdp(), GridAxis::Hdp);
    // ZeRO-1's copy of hdp: the same ranks in the same order, a communicator of its own.
    expect_axis(groups.gradients(), GridAxis::Hdp);
    EXPECT_NE(&groups.gradients(), &groups.hdp());
    EXPECT_EQ(groups.gradients().name(), "hdp-gradients");
    if (degrees.ep > 1) {
      ASSERT_NE(groups.ep(), nullptr);
      expect_axis(*groups.ep(), GridAxis::Ep);
      expect_axis(groups.expert_dp(), GridAxis::ExpertDp);
    } else {
      EXPECT_EQ(groups.ep(), nullptr);
      EXPECT_EQ(&groups.expert_dp(), &groups.gradients());
    }
  }
}

TEST(ProcessGroups, WorldSizeMismatchIsAClearError) {
  try {
    ProcessGroups groups(ParallelDegrees{2, 2, 2}, false);
    FAIL() << "accepted 8 ranks on a 4-rank job";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("2 x 2 x 2 = 8 ranks, but the job has 4"), std::string::npos) << e.what();
  }
}

// Gradients whose sums over ranks are exact in fp32 (multiples of 2^-10), so the
// sharded and unsharded updates see bit-identical gradients.
std::vector<float> exact_gradients(int64_t n, int rank) {
  std::vector<float> g(n);
  for (int64_t i = 0; i < n; ++i) g[i] = static_cast<float>(((i * 7 + rank * 13) % 41) - 20) / 1024.0f;
  return g;
}

TEST(ZeroAdamW, ShardedStepEqualsUnshardedStep) {
  MpiCommunicator world(MPI_COMM_WORLD, "world");
  const int r = world.rank();
  // Three parameters, one without weight decay, buckets small enough to cut through them.
  const std::vector<FlatParameter> params = {{0, 1000, true}, {1008, 37, false}, {1056, 500, true}};
  const int64_t flat = 1568;
  const AdamWHyperparameters adamw{.weight_decay = 0.1};

  std::vector<float> sharded_params(flat), plain_params(flat);
  for (int64_t i = 0; i < flat; ++i) sharded_params[i] = plain_params[i] = std::sin(0.01f * static_cast<float>(i));
  // Mixed precision's bf16 copies, rounded from the start as a refresh leaves them; the
  // step keeps them equal to the parameters rounded (its shard by the update, the
  // gathered parts by a copy).
  std::vector<bf16> sharded_copy(flat), plain_copy(flat);
  for (int64_t i = 0; i < flat; ++i) sharded_copy[i] = plain_copy[i] = to_bf16(sharded_params[i]);
  LocalCommunicator local("hdp"), local_world("world");
  ZeroAdamW sharded(params, flat, adamw, world, world, 300);
  ZeroAdamW plain(params, flat, adamw, local, local_world, 300);
  // Buckets are cut at parameter boundaries: [0, 1056) and [1056, 1568); each is
  // split in four parts, so parts cut through parameters.
  EXPECT_EQ(sharded.num_buckets(), 2);
  // Moments exist only for this rank's quarter of each bucket.
  EXPECT_EQ(sharded.shard_numel(), part_begin(1056, r + 1, 4) - part_begin(1056, r, 4) +
                                       part_begin(512, r + 1, 4) - part_begin(512, r, 4));
  // ZeRO-1: the optimizer's memory shrinks with hdp. Unsharded it is the two moments;
  // sharded, the moments and the reduced gradient of a quarter of the buffer.
  EXPECT_EQ(plain.state_bytes(), 2 * flat * sizeof(float));  // 1568 floats are 64-byte aligned
  EXPECT_LE(sharded.state_bytes(), 3 * (plain.state_bytes() / 2) / 4 + 3 * Arena::kAlignment);

  for (int step = 1; step <= 3; ++step) {
    std::vector<float> mine = exact_gradients(flat, r + step), total(flat, 0.0f);
    for (int q = 0; q < 4; ++q) {
      const std::vector<float> g = exact_gradients(flat, q + step);
      for (int64_t i = 0; i < flat; ++i) total[i] += g[i];
    }
    sharded.begin_reduction(Tensor(mine.data(), {flat}));
    sharded.gradients_ready(1056);  // the last parameter is final first, as in backward
    double squares = 0, plain_squares = 0;  // sums on the host (kernels/ops.h)
    sharded.finish_gradients(DoubleTensor(&squares, {1}));
    const double norm = sharded.gradient_norm(squares);
    plain.begin_reduction(Tensor(total.data(), {flat}));
    plain.finish_gradients(DoubleTensor(&plain_squares, {1}));
    const double plain_norm = plain.gradient_norm(plain_squares);
    EXPECT_NEAR(norm, plain_norm, 1e-9 * plain_norm);
    sharded.step(Tensor(sharded_params.data(), {flat}), 1e-2, 0.5f, step, Tensor::of_bf16(sharded_copy.data(), {flat}));
    plain.step(Tensor(plain_params.data(), {flat}), 1e-2, 0.5f, step, Tensor::of_bf16(plain_copy.data(), {flat}));
    for (int64_t i = 0; i < flat; ++i) {
      ASSERT_EQ(sharded_params[i], plain_params[i]) << "step " << step << " element " << i;
      ASSERT_EQ(sharded_copy[i].bits, to_bf16(sharded_params[i]).bits) << "step " << step << " element " << i;
      ASSERT_EQ(plain_copy[i].bits, to_bf16(plain_params[i]).bits) << "step " << step << " element " << i;
    }
  }
}

Config engine_config(const std::string& parallel, const std::string& data = "{path: unused.h5, max_seq_len: 64, "
                                                                           "micro_batch_tokens: 96, global_batch_tokens: 1024}",
                     const std::string& model_extra = "", const std::string& train = "{}") {
  return parse_config_text(
      "model: {vocab_size: 50, hidden_size: 32, num_layers: 4, num_heads: 4, num_kv_heads: 2, ffn_hidden_size: 48,"
      " init_std: 0.1" + model_extra + "}\n"
      "data: " + data + "\n"
      "optim: {lr: 0.01, warmup_steps: 0, grad_clip: 0}\n"
      "offload: {enabled: false}\n"
      "train: " + train + "\n"
      "parallel: " + parallel + "\n",
      "engine-test", {}, false);
}

PackedMicroBatch micro_batch(const std::vector<int>& lengths, uint64_t seed) {
  return testing::random_documents<PackedMicroBatch>(lengths, 50, seed);
}

// The summed (global) gradient of this rank's slice after one forward_backward under `plan`:
// plan[h] lists the micro-batches of hdp rank h.
std::vector<float> global_gradient(TrainingEngine& engine, ProcessGroups& groups,
                                   const std::vector<std::vector<PackedMicroBatch>>& plan) {
  engine.model().init_weights(3);
  engine.forward_backward(plan[groups.coords().hdp_rank]);
  const Tensor g = engine.model().flat_gradients();
  std::vector<float> sum(g.data, g.data + g.numel());
  groups.hdp().all_reduce(Tensor(sum.data(), {g.numel()}), ReduceOp::Sum);
  return sum;
}

TEST(TrainingEngine, UnevenMicroBatchCountsGiveTheSameGradients) {
  std::vector<PackedMicroBatch> all;
  all.push_back(micro_batch({64, 20, 12}, 1));
  all.push_back(micro_batch({50, 40}, 2));
  all.push_back(micro_batch({30, 30, 30}, 3));
  all.push_back(micro_batch({7, 64}, 4));
  all.push_back(micro_batch({33}, 5));
  for (const char* parallel : {"{hdp: 4}", "{tp: 2, hdp: 2}", "{pp: 2, hdp: 2}"}) {
    const Config config = engine_config(parallel);
    ProcessGroups groups(config.parallel, false);
    TrainingEngine engine(config, groups);
    const int hdp = groups.degrees().hdp;
    std::vector<std::vector<PackedMicroBatch>> even(hdp), uneven(hdp);
    for (size_t i = 0; i < all.size(); ++i) even[i % hdp].push_back(all[i]);
    for (size_t i = 0; i < all.size(); ++i) uneven[i < all.size() - 1 ? 0 : hdp - 1].push_back(all[i]);
    const std::vector<float> a = global_gradient(engine, groups, even), b = global_gradient(engine, groups, uneven);
    double max_abs = 0;
    for (float x : a) max_abs = std::max(max_abs, static_cast<double>(std::abs(x)));
    ASSERT_GT(max_abs, 0.0);
    for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-5 * max_abs) << parallel << " element " << i;
  }
}

// The host reads and host waits (kernels/ops.h) of one training step: forward_backward
// over three micro-batches and the update, counted on this rank for the second step
// (the first may size buffers). The CPU counts the logical reads and waits a GPU would
// pay, and the guarded device (device memory closed to the host) must count the same;
// the copies MPI stages collectives through count apart (staged).
struct StepReads {
  int64_t reads = 0, staged = 0, waits = 0;
};
StepReads host_reads_of_a_step(const char* parallel, Device device, const std::string& model_extra = "") {
  const Config config = engine_config(parallel, "{path: unused.h5, max_seq_len: 64, micro_batch_tokens: 96, "
                                                "global_batch_tokens: 1024}",
                                      model_extra, std::string("{device: ") + device_name(device) + "}");
  ProcessGroups groups(config.parallel, false);
  TrainingEngine engine(config, groups);
  engine.model().init_weights(3);
  const uint64_t seed = 10 * static_cast<uint64_t>(groups.coords().hdp_rank);
  const std::vector<PackedMicroBatch> batches = {micro_batch({64, 20, 12}, seed + 1), micro_batch({50, 40}, seed + 2),
                                                 micro_batch({30, 30, 30}, seed + 3)};
  StepReads before;
  for (int64_t step = 1; step <= 2; ++step) {
    before = {host_reads(device), staged_host_reads(device), host_waits(device)};
    const StepResult result = engine.forward_backward(batches);
    EXPECT_TRUE(std::isfinite(result.loss) && result.loss > 0) << parallel;
    EXPECT_GT(result.busy_ms, 0.0) << parallel << ": forward and backward timed on device events";
    engine.apply_update(1e-3, step);
  }
  return {host_reads(device) - before.reads, staged_host_reads(device) - before.staged,
          host_waits(device) - before.waits};
}

TEST(TrainingEngine, AStepReadsTheDeviceBackOnce) {
  for (const char* parallel : {"{hdp: 4}", "{tp: 2, hdp: 2}", "{pp: 2, hdp: 2}"}) {
    const StepReads cpu = host_reads_of_a_step(parallel, Device::CPU);
    const StepReads guarded = host_reads_of_a_step(parallel, Device::Guarded);
    // The loss and the gradient's squared norm, read together at the step's end. Before
    // they were summed on the device this was 10-23 per rank and step: one read per
    // micro-batch's loss (per head chunk) and one per ZeRO segment's sum of squares.
    EXPECT_EQ(cpu.reads, 1) << parallel << " rank " << world_rank();
    EXPECT_EQ(guarded.reads, 1) << parallel << " rank " << world_rank();
    EXPECT_EQ(cpu.staged, 0) << parallel << ": MPI stages nothing of host memory";
    EXPECT_GT(guarded.staged, 0) << parallel << ": MPI stages the collectives of device memory, counted apart";
  }
}

// Nothing in a step waits for the device but its one read-back at the end. Before
// (main at c8990fe) a step of 3 micro-batches waited 19 times on the guarded device
// and 7 on the CPU under each layout: a synchronize after each micro-batch's forward
// and backward (6, timing busy_ms), and on a device, the upload of each micro-batch's
// tokens, targets, positions and document boundaries from pageable host memory (12).
TEST(TrainingEngine, AStepWaitsForTheDeviceOnlyAtItsEnd) {
  for (const char* parallel : {"{hdp: 4}", "{tp: 2, hdp: 2}", "{pp: 2, hdp: 2}"}) {
    for (Device device : {Device::CPU, Device::Guarded}) {
      const StepReads step = host_reads_of_a_step(parallel, device);
      // The one wait: read_back of the loss and the squared gradient norm.
      EXPECT_EQ(step.waits, 1) << parallel << " " << device_name(device) << " rank " << world_rank();
    }
  }
}

// Mixtral's routing brings values to the host in every MoE layer of every micro-batch
// (model/moe.h, "Host waits"): the router's logits in forward, since the experts' GEMM
// sizes depend on them, and <dout, Y> in backward for the router's gradient, which is
// computed on the host from the routing kept there; each is followed by uploads of the
// routing it decided (from pageable host memory: waits too). Counted on the guarded
// device (on the CPU the routing's copies stay in CPU memory: no reads) so that a
// change shows: 4 layers of 4 experts, top-2, 3 micro-batches, no ep.
TEST(TrainingEngine, MixtralRoutingReadsPerLayerAndMicroBatch) {
  constexpr int64_t layers = 4, micro_batches = 3;
  const std::string mixtral = ", arch: mixtral, num_experts: 4, experts_per_token: 2";
  for (const char* parallel : {"{hdp: 4}", "{pp: 2, hdp: 2}"}) {
    const int64_t stage_layers = std::string(parallel).find("pp") != std::string::npos ? layers / 2 : layers;
    const StepReads step = host_reads_of_a_step(parallel, Device::Guarded, mixtral);
    // Two reads per MoE layer and micro-batch, and the step's read-back.
    EXPECT_EQ(step.reads, 2 * stage_layers * micro_batches + 1) << parallel;
    // Each layer's forward uploads 4 routing tensors, its backward 1.
    EXPECT_EQ(step.waits, step.reads + 5 * stage_layers * micro_batches) << parallel;
    const StepReads cpu = host_reads_of_a_step(parallel, Device::CPU, mixtral);
    EXPECT_EQ(cpu.reads, 1) << parallel;
    EXPECT_EQ(cpu.waits, 1) << parallel;
  }
}

// Documents of these lengths in a dataset of this rank's own (same content on every rank).
struct RingData {
  std::string path;
  std::vector<SequenceSpan> sequences;
};

RingData ring_data(const std::string& name, const std::vector<int64_t>& lengths) {
  RingData data;
  data.path = testing::scratch_dir("mpi-ring-" + name + "-" + std::to_string(world_rank())) + "/data.h5";
  TokenDatasetWriter writer(data.path, 50, "test", 48, 49);
  uint64_t seed = 17;
  for (size_t d = 0; d < lengths.size(); ++d) {
    std::vector<uint32_t> doc(lengths[d]);
    for (uint32_t& t : doc) t = static_cast<uint32_t>(((seed = seed * 6364136223846793005ull + 1) >> 33) % 50);
    writer.append(doc);
    data.sequences.push_back({static_cast<int64_t>(d), 0, lengths[d]});
  }
  writer.finish();
  return data;
}

// The micro-batch of member j of `ring`: its local pieces, then its zig-zag chunks.
PlannedMicroBatch ring_member(const std::vector<SequenceSpan>& sequences, const Ring& ring, int j,
                              std::vector<PlannedPiece> local = {}) {
  const std::vector<int64_t> lengths = sequence_lengths(sequences);
  PlannedMicroBatch mb;
  mb.ring = 0;
  mb.pieces = std::move(local);
  for (const PlannedPiece& p : zigzag_ring_pieces(ring, 0, j, lengths)) mb.pieces.push_back(p);
  return mb;
}

// The summed gradient of this rank's slice after one forward_backward under a plan.
std::vector<float> planned_gradient(TrainingEngine& engine, ProcessGroups& groups, const RingData& data,
                                    const StepPlan& plan) {
  const std::vector<int64_t> lengths = sequence_lengths(data.sequences);
  check_plan(plan, lengths, 4, groups.degrees().pp);
  const TokenDataset dataset(data.path);
  std::vector<PackedMicroBatch> batches;
  if (groups.coords().hdp_rank < static_cast<int>(plan.ranks.size())) {
    batches = materialize_rank_work(dataset_reader(dataset), data.sequences,
                                    rank_work(plan, lengths, groups.coords().hdp_rank));
  }
  engine.model().init_weights(5);
  engine.forward_backward(batches);
  const Tensor g = engine.model().flat_gradients();
  std::vector<float> sum(g.data, g.data + g.numel());
  groups.hdp().all_reduce(Tensor(sum.data(), {g.numel()}), ReduceOp::Sum);
  return sum;
}

// Every element within tolerance x the largest |want|.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what,
                  double tolerance = 1e-5) {
  double max_abs = 0;
  for (float x : want) max_abs = std::max(max_abs, static_cast<double>(std::abs(x)));
  ASSERT_GT(max_abs, 0.0) << what;
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], tolerance * max_abs) << what << " element " << i;
}

// The largest |got - want| relative to the largest |want|.
double relative_max_difference(const std::vector<float>& got, const std::vector<float>& want) {
  double max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_abs = std::max(max_abs, static_cast<double>(std::abs(want[i])));
    max_diff = std::max(max_diff, static_cast<double>(std::abs(got[i] - want[i])));
  }
  return max_diff / max_abs;
}

TEST(RingAttention, ADocumentSplitOver2To4RanksGivesTheWholeDocumentsGradients) {
  const RingData data = ring_data("long", {4096});
  const RingData several = ring_data("several", {2000, 1500, 50, 70, 33});
  const std::string data_config = "{path: unused.h5, max_seq_len: 4096, micro_batch_tokens: 4096, global_batch_tokens: 16384}";
  for (const char* parallel : {"{hdp: 4}", "{tp: 2, hdp: 2}"}) {
    const Config config = engine_config(parallel, data_config);
    const int hdp = config.parallel.hdp;
    ProcessGroups groups(ParallelDegrees{config.parallel.tp, 1, hdp}, false);
    TrainingEngine engine(config, groups);

    // The 4096-token document whole on rank 0, then over rings of 2, 3 and 4 ranks.
    StepPlan whole{4096, std::vector<std::vector<PlannedMicroBatch>>(hdp), {}};
    whole.ranks[0].push_back(PlannedMicroBatch{{{0, 0, 4096}}});
    const std::vector<float> want = planned_gradient(engine, groups, data, whole);
    for (int k = 2; k <= hdp; ++k) {
      StepPlan ring{4096, std::vector<std::vector<PlannedMicroBatch>>(hdp), {Ring{{}, {0}}}};
      for (int j = 0; j < k; ++j) ring.rings[0].ranks.push_back(j);
      for (int j = 0; j < k; ++j) ring.ranks[j].push_back(ring_member(data.sequences, ring.rings[0], j));
      expect_close(planned_gradient(engine, groups, data, ring), want,
                   std::string(parallel) + " ring of " + std::to_string(k));
    }

    // Two documents in one ring, with whole short documents on the members too.
    StepPlan short_whole{4096, std::vector<std::vector<PlannedMicroBatch>>(hdp), {}};
    short_whole.ranks[0].push_back(PlannedMicroBatch{{{0, 0, 2000}, {1, 0, 1500}, {2, 0, 50}, {3, 0, 70}, {4, 0, 33}}});
    const std::vector<float> want_mixed = planned_gradient(engine, groups, several, short_whole);
    const int k = std::min(hdp, 3);
    StepPlan mixed{4096, std::vector<std::vector<PlannedMicroBatch>>(hdp), {Ring{{}, {0, 1}}}};
    for (int j = 0; j < k; ++j) mixed.rings[0].ranks.push_back(j);
    for (int j = 0; j < k; ++j) {
      mixed.ranks[j].push_back(ring_member(several.sequences, mixed.rings[0], j, {{2 + j, 0, several.sequences[2 + j].length}}));
    }
    for (int j = k; j < 3; ++j) mixed.ranks[0].push_back(PlannedMicroBatch{{{2 + j, 0, several.sequences[2 + j].length}}});
    expect_close(planned_gradient(engine, groups, several, mixed), want_mixed, std::string(parallel) + " mixed ring");
  }
}

// ZeRO-1's gradient reduce-scatters travel on their own copy of the hdp group, ring
// attention's exchanges on hdp itself (ProcessGroups::gradients: NCCL runs one
// communicator's operations in order on one stream, where a ring exchange queued behind
// a bucket another member has not reached would wait for it). On the engine's step over
// a ring of 4: hdp carries the ring's point-to-point traffic and no more collective
// bytes than the token count's all-reduce; the gradients group carries the buckets.
TEST(RingAttention, GradientBucketsTravelApartFromTheRingsExchanges) {
  const RingData data = ring_data("apart", {4096});
  const Config config = engine_config(
      "{hdp: 4}", "{path: unused.h5, max_seq_len: 4096, micro_batch_tokens: 4096, global_batch_tokens: 16384}");
  ProcessGroups groups(ParallelDegrees{1, 1, 4}, false);
  TrainingEngine engine(config, groups);
  StepPlan ring{4096, std::vector<std::vector<PlannedMicroBatch>>(4), {Ring{{}, {0}}}};
  for (int j = 0; j < 4; ++j) ring.rings[0].ranks.push_back(j);
  for (int j = 0; j < 4; ++j) ring.ranks[j].push_back(ring_member(data.sequences, ring.rings[0], j));
  const std::vector<int64_t> lengths = sequence_lengths(data.sequences);
  const TokenDataset dataset(data.path);
  const std::vector<PackedMicroBatch> batches = materialize_rank_work(
      dataset_reader(dataset), data.sequences, rank_work(ring, lengths, groups.coords().hdp_rank));
  engine.model().init_weights(5);
  groups.hdp().reset_stats();
  groups.gradients().reset_stats();
  engine.forward_backward(batches);
  EXPECT_GT(groups.hdp().stats().p2p_bytes, 0);
  EXPECT_LE(groups.hdp().stats().collective_bytes, 64);  // the token count (an int64)
  const int64_t parameter_bytes = engine.model().flat_gradients().numel() * 4;
  EXPECT_GE(groups.gradients().stats().collective_bytes, parameter_bytes / 2);  // reduce-scatter: (n - 1) / n of them
}

// bf16 values as their ordered integers: consecutive bf16 values differ by 1.
int32_t bf16_order(bf16 x) { return (x.bits & 0x8000) ? -static_cast<int32_t>(x.bits & 0x7fff) : x.bits; }

// How `got` (this member's rows, chunk after chunk) differs from rows of `all`: the
// number of elements that differ, the most bf16 steps between two of them, and the
// largest difference relative to the largest |value| of those rows.
struct Bf16Difference {
  int64_t differing = 0, elements = 0;
  int32_t most_steps = 0;
  double largest = 0;
};
Bf16Difference bf16_difference(const std::vector<bf16>& got, const std::vector<bf16>& all, const RingLayout& layout,
                               int64_t row_elements) {
  Bf16Difference d;
  double scale = 0;
  size_t i = 0;
  for (const RingChunk& c : layout.chunks[layout.self]) {
    for (int64_t e = c.position * row_elements; e < (c.position + c.rows) * row_elements; ++e, ++i) {
      const bf16 want = all[static_cast<size_t>(e)];
      const int32_t steps = std::abs(bf16_order(got[i]) - bf16_order(want));
      d.differing += steps != 0;
      d.most_steps = std::max(d.most_steps, steps);
      d.largest = std::max(d.largest, static_cast<double>(std::abs(to_float(got[i]) - to_float(want))));
      scale = std::max(scale, static_cast<double>(std::abs(to_float(want))));
      ++d.elements;
    }
  }
  d.largest /= scale;
  return d;
}

// The bf16 ring attention op against one rank's bf16 attention on the same bf16 q,
// k, v and dout (1024 tokens, 4 query heads over 2 KV heads, d = 16), over rings of 2
// to 4 members. One rank widens, computes in fp32 and rounds once; the ring does the
// same on its fp32 images, merging the steps' partial results in another order, so
// its out, dq, dk and dv equal one rank's except where the fp32 values straddle a
// bf16 rounding boundary. Measured: 0.01-0.17% of the elements differ (out 4-15,
// dq 2-22, dk 7-28, dv 3-9 per member), by one bf16 step mostly and by up to 8 steps
// of small values whose fp32 sums cancel, never by more than 0.0041 of the tensor's
// largest value (one step of a value near the largest). Held to: at most 0.5% of the
// elements, each within 2^-7 of the largest value (one bf16 step of it at most). Rounding once per ring step instead, as the bf16 block ops on
// bf16 tensors would, changes a quarter of them: one rank's forward split into 4 key
// blocks, each call rounding, differs from one call in 26% of its outputs (held to
// more than 10%), and a ring that skipped a step would differ in most.
TEST(RingAttention, Bf16OpRoundsOnceAsOneRankDoes) {
  constexpr int64_t L = 1024, Hq = 4, Hkv = 2, d = 16;
  ProcessGroups groups(ParallelDegrees{1, 1, 4}, false);
  auto random_bf16 = [](int64_t n, uint64_t seed) {
    std::vector<bf16> v(static_cast<size_t>(n));
    for (bf16& x : v) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      x = to_bf16(2.0f * static_cast<float>(seed >> 40) / static_cast<float>(1 << 24) - 1.0f);
    }
    return v;
  };
  auto rows_of = [](std::vector<bf16>& storage, int64_t rows, int64_t heads) {
    return Tensor::of_bf16(storage.data(), {rows, heads, d});
  };
  std::vector<bf16> q = random_bf16(L * Hq * d, 1), k = random_bf16(L * Hkv * d, 2), v = random_bf16(L * Hkv * d, 3),
                    dout = random_bf16(L * Hq * d, 4);
  // One rank: the whole sequence.
  std::vector<bf16> out_one(q.size()), dq_one(q.size()), dk_one(k.size()), dv_one(k.size());
  std::vector<float> lse_one(static_cast<size_t>(Hq * L));
  std::vector<int32_t> cu_seqlens = {0, static_cast<int32_t>(L)};
  const IndexTensor cu(cu_seqlens.data(), {2});
  attention_forward(rows_of(out_one, L, Hq), Tensor(lse_one.data(), {Hq, L}), rows_of(q, L, Hq), rows_of(k, L, Hkv),
                    rows_of(v, L, Hkv), cu);
  attention_backward(rows_of(dq_one, L, Hq), rows_of(dk_one, L, Hkv), rows_of(dv_one, L, Hkv), rows_of(dout, L, Hq),
                     rows_of(q, L, Hq), rows_of(k, L, Hkv), rows_of(v, L, Hkv), rows_of(out_one, L, Hq),
                     Tensor(lse_one.data(), {Hq, L}), cu);
  // Rounding per step: the same forward as 4 calls of a quarter of the keys each.
  std::vector<bf16> out_steps(q.size());
  std::vector<float> lse_steps(lse_one.size());
  attention_reset_rows(rows_of(out_steps, L, Hq), Tensor(lse_steps.data(), {Hq, L}), 0, L);
  for (int32_t b = 0; b < 4; ++b) {
    const int32_t begin = b * static_cast<int32_t>(L) / 4, end = (b + 1) * static_cast<int32_t>(L) / 4;
    const AttentionBlock block{0, static_cast<int32_t>(L), begin, end, 0, begin};
    attention_forward_blocks(rows_of(out_steps, L, Hq), Tensor(lse_steps.data(), {Hq, L}), rows_of(q, L, Hq),
                             rows_of(k, L, Hkv), rows_of(v, L, Hkv), std::span<const AttentionBlock>(&block, 1));
  }
  RingLayout whole;
  whole.chunks = {{RingChunk{L, 0, 0}}};
  const Bf16Difference per_step = bf16_difference(out_steps, out_one, whole, Hq * d);
  EXPECT_GT(per_step.differing * 10, per_step.elements);

  RingAttention ring(groups.hdp(), L, Hq, Hkv, d, kNoWindow, DType::BF16);
  const int self = groups.hdp().rank();
  for (int members = 2; members <= 4; ++members) {
    if (self >= members) continue;  // the ring is point-to-point between its members only
    std::vector<int> peers;
    for (int j = 0; j < members; ++j) peers.push_back(j);
    const std::vector<int64_t> lengths = {L};
    const RingLayout layout = zigzag_ring_layout(peers, lengths, self);
    const int64_t T = layout.rows(self);
    auto mine = [&](const std::vector<bf16>& all, int64_t heads) {
      std::vector<bf16> rows;
      for (const RingChunk& c : layout.chunks[self]) {
        rows.insert(rows.end(), all.begin() + c.position * heads * d, all.begin() + (c.position + c.rows) * heads * d);
      }
      return rows;
    };
    std::vector<bf16> mq = mine(q, Hq), mk = mine(k, Hkv), mv = mine(v, Hkv), mdout = mine(dout, Hq);
    std::vector<bf16> out(mq.size()), dq(mq.size()), dk(mk.size()), dv(mk.size());
    std::vector<float> lse(static_cast<size_t>(Hq * T));
    ring.forward(rows_of(out, T, Hq), Tensor(lse.data(), {Hq, T}), rows_of(mq, T, Hq), rows_of(mk, T, Hkv),
                 rows_of(mv, T, Hkv), {}, layout, 0);
    ring.backward(rows_of(dq, T, Hq), rows_of(dk, T, Hkv), rows_of(dv, T, Hkv), rows_of(mdout, T, Hq),
                  rows_of(mq, T, Hq), rows_of(mk, T, Hkv), rows_of(mv, T, Hkv), rows_of(out, T, Hq),
                  Tensor(lse.data(), {Hq, T}), {}, layout, 0);
    const std::string what = std::to_string(members) + " members, member " + std::to_string(self);
    // The log-sum-exp is fp32 on both sides: equal up to the order of the merge. (No
    // ASSERT in this loop: a member that left the test early would leave the others
    // waiting in the next ring.)
    double lse_difference = 0;
    int64_t row = 0;
    for (const RingChunk& c : layout.chunks[self]) {
      for (int64_t h = 0; h < Hq; ++h) {
        for (int64_t t = 0; t < c.rows; ++t) {
          lse_difference = std::max(lse_difference, static_cast<double>(std::abs(lse[h * T + row + t] -
                                                                                  lse_one[h * L + c.position + t])));
        }
      }
      row += c.rows;
    }
    EXPECT_LE(lse_difference, 1e-5) << what;
    const std::pair<const char*, Bf16Difference> results[] = {
        {"out", bf16_difference(out, out_one, layout, Hq * d)},
        {"dq", bf16_difference(dq, dq_one, layout, Hq * d)},
        {"dk", bf16_difference(dk, dk_one, layout, Hkv * d)},
        {"dv", bf16_difference(dv, dv_one, layout, Hkv * d)}};
    for (const auto& [name, diff] : results) {
      std::printf("%s: %s differs in %lld of %lld elements, by at most %d bf16 steps, %.2g of the largest\n",
                  what.c_str(), name, static_cast<long long>(diff.differing), static_cast<long long>(diff.elements),
                  diff.most_steps, diff.largest);
      EXPECT_LE(diff.differing * 200, diff.elements) << what << " " << name;
      EXPECT_LE(diff.largest, 1.0 / 128) << what << " " << name;
    }
  }
}

// bf16 activations over rings (train.precision: bf16): the 4096-token document over
// rings of 2 to 4 ranks gives the gradients of the whole document on one rank in
// bf16. The ring computes on fp32 images of q, k, v and rounds out, dq, dk and dv
// once (parallel/ring_attention.h), as one rank's bf16 attention does, so the two
// differ by the order of fp32 sums only, which now and then flips a bf16 rounding of
// an activation by one step (Bf16OpRoundsOnceAsOneRankDoes: ~0.1% of them), and every
// later bf16 rounding that depends on it may flip too (the difference a flip makes is
// far above fp32 round-off), across 4 layers and a 4096-token causal attention.
// Measured: the largest gradient difference is 0.0034, 0.0028 and 0.0034 of the largest
// gradient over rings of 2, 3 and 4 (fp32 rings: below 1e-5); bf16 against fp32
// gradients on one rank: 0.0072. Held to 0.01 of the largest gradient: a ring that
// skips one step's keys (a real bug) misses whole chunks of the attention and fails it
// (checked by breaking the ring's last forward step on purpose: the gradients then
// differed by 0.48 to 9e4 of the largest, and Bf16OpRoundsOnceAsOneRankDoes saw half
// or more of the elements differ). The key/value
// rows travel as bf16 (2 bytes a value: 2 x 2 KV heads x 8 x 2 = 64 bytes a row) and
// their gradients as fp32 (128 bytes a row): over a ring of 4, 18 transfers of 512
// rows per layer and pass.
constexpr double kBf16RingTolerance = 1e-2;
TEST(RingAttention, Bf16RingsEqualTheWholeDocumentInBf16) {
  const RingData data = ring_data("bf16", {4096});
  const std::string data_config =
      "{path: unused.h5, max_seq_len: 4096, micro_batch_tokens: 4096, global_batch_tokens: 16384}";
  StepPlan whole{4096, std::vector<std::vector<PlannedMicroBatch>>(4), {}};
  whole.ranks[0].push_back(PlannedMicroBatch{{{0, 0, 4096}}});
  ProcessGroups groups(ParallelDegrees{1, 1, 4}, false);
  TrainingEngine fp32(engine_config("{hdp: 4}", data_config), groups);
  const std::vector<float> want_fp32 = planned_gradient(fp32, groups, data, whole);
  TrainingEngine engine(engine_config("{hdp: 4}", data_config, "", "{precision: bf16}"), groups);
  const std::vector<float> want = planned_gradient(engine, groups, data, whole);
  const double bf16_vs_fp32 = relative_max_difference(want, want_fp32);
  EXPECT_GT(bf16_vs_fp32, 100 * 1e-5);  // it ran in bf16: far from fp32, whose rings are within 1e-5
  for (int k = 2; k <= 4; ++k) {
    StepPlan ring{4096, std::vector<std::vector<PlannedMicroBatch>>(4), {Ring{{}, {0}}}};
    for (int j = 0; j < k; ++j) ring.rings[0].ranks.push_back(j);
    for (int j = 0; j < k; ++j) ring.ranks[j].push_back(ring_member(data.sequences, ring.rings[0], j));
    const int64_t before = groups.hdp().stats().p2p_bytes;
    const std::vector<float> got = planned_gradient(engine, groups, data, ring);
    double sent = static_cast<double>(groups.hdp().stats().p2p_bytes - before);
    groups.hdp().all_reduce(std::span<double>(&sent, 1), ReduceOp::Sum);
    if (world_rank() == 0) {
      std::printf("bf16 ring of %d: gradients within %.3g of the whole document (bf16 vs fp32: %.3g)\n", k,
                  relative_max_difference(got, want), bf16_vs_fp32);
    }
    expect_close(got, want, "bf16 ring of " + std::to_string(k), kBf16RingTolerance);
    if (k == 4) {
      EXPECT_EQ(sent, 4.0 * 18 * 512 * (64 + 64 + 128));
    }
  }
}

// Sliding windows (Mistral) over rings: a 4096-token document over rings of 2 to 4
// ranks equals the whole document under the same window, for windows shorter than
// a zig-zag chunk (300 < 512), longer than a chunk (1000) and longer than the
// document (5000, full attention). And a member receives only the key rows it
// reads: over a ring of 4 (8 chunks of 512) with W = 300 chunk c is read by the
// holder of chunk c + 1 only, its last W - 1 = 299 rows; chunks 3 and 4 share a
// holder, so 6 transfers of 299 rows per layer and pass (forward K/V, backward K/V,
// backward K/V gradients). Without a window chunk c is read whole by every other
// member holding a later chunk: 3 members for c <= 3, then 3, 2, 1 for c = 4, 5, 6,
// 18 transfers of 512 rows. A row of K and V is 2 x 2 KV heads x 8 x 4 bytes = 128.
TEST(RingAttention, SlidingWindowRingsEqualTheWholeDocumentAndSendOnlyTheRowsRead) {
  const RingData data = ring_data("window", {4096});
  const std::string data_config =
      "{path: unused.h5, max_seq_len: 4096, micro_batch_tokens: 4096, global_batch_tokens: 16384}";
  std::vector<float> full_attention;
  for (int64_t window : {300, 1000, 5000, 0}) {
    const std::string extra = window > 0 ? ", arch: mistral, sliding_window: " + std::to_string(window) : "";
    const Config config = engine_config("{hdp: 4}", data_config, extra);
    ProcessGroups groups(ParallelDegrees{1, 1, 4}, false);
    TrainingEngine engine(config, groups);
    StepPlan whole{4096, std::vector<std::vector<PlannedMicroBatch>>(4), {}};
    whole.ranks[0].push_back(PlannedMicroBatch{{{0, 0, 4096}}});
    const std::vector<float> want = planned_gradient(engine, groups, data, whole);
    if (window == 0) full_attention = want;
    for (int k = 2; k <= 4; ++k) {
      StepPlan ring{4096, std::vector<std::vector<PlannedMicroBatch>>(4), {Ring{{}, {0}}}};
      for (int j = 0; j < k; ++j) ring.rings[0].ranks.push_back(j);
      for (int j = 0; j < k; ++j) ring.ranks[j].push_back(ring_member(data.sequences, ring.rings[0], j));
      const int64_t before = groups.hdp().stats().p2p_bytes;
      expect_close(planned_gradient(engine, groups, data, ring), want,
                   "window " + std::to_string(window) + " ring of " + std::to_string(k));
      double sent = static_cast<double>(groups.hdp().stats().p2p_bytes - before);
      groups.hdp().all_reduce(std::span<double>(&sent, 1), ReduceOp::Sum);
      if (k == 4 && window == 300) {
        EXPECT_EQ(sent, 4.0 * 3 * 6 * 299 * 128);
      }
      if (k == 4 && (window == 0 || window == 5000)) {
        EXPECT_EQ(sent, 4.0 * 3 * 18 * 512 * 128);
      }
    }
  }
  // The windows really mask: W = 300 changes the gradient of full attention.
  const RingData again = ring_data("window-again", {4096});
  const Config config = engine_config("{hdp: 4}", data_config, ", arch: mistral, sliding_window: 300");
  ProcessGroups groups(ParallelDegrees{1, 1, 4}, false);
  TrainingEngine engine(config, groups);
  StepPlan whole{4096, std::vector<std::vector<PlannedMicroBatch>>(4), {}};
  whole.ranks[0].push_back(PlannedMicroBatch{{{0, 0, 4096}}});
  const std::vector<float> windowed = planned_gradient(engine, groups, again, whole);
  ASSERT_EQ(windowed.size(), full_attention.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < windowed.size(); ++i) {
    diff += (windowed[i] - full_attention[i]) * (windowed[i] - full_attention[i]);
    norm += full_attention[i] * full_attention[i];
  }
  EXPECT_GT(std::sqrt(diff), 1e-3 * std::sqrt(norm));
}

}  // namespace
}  // namespace hdp

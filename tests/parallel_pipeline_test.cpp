// The pipeline schedule (split_layers, one_f_one_b, pipeline_slots) against
// hand-worked cases and invariants, and PipelineExecutor driving a fake stage
// over a LocalCommunicator (no MPI): the calls it makes, in order; and over
// threads (tests/thread_communicator.h) the interleaved 1F1B of model chunks, each
// virtual stage a known function, against the composition of them all.

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <map>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/local_communicator.h"
#include "thread_communicator.h"
#include "parallel/pipeline.h"
#include "planning/stage_split.h"

namespace hdp {
namespace {

// ---- split_layers -----------------------------------------------------------

TEST(SplitLayers, EqualCostsSplitEvenly) {
  EXPECT_EQ(split_layers(8, 4, 1.0, 0, 0), (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(split_layers(32, 2, 3.5, 0, 0), (std::vector<int64_t>{16, 16}));
}

TEST(SplitLayers, OneStageTakesEveryLayer) {
  EXPECT_EQ(split_layers(7, 1, 1.0, 5.0, 9.0), (std::vector<int64_t>{7}));
}

// The optimum leaves a remainder; ties give the earlier stages fewer layers.
TEST(SplitLayers, RemainderGoesToTheLaterStages) {
  EXPECT_EQ(split_layers(7, 2, 1.0, 0, 0), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(split_layers(10, 4, 1.0, 0, 0), (std::vector<int64_t>{1, 3, 3, 3}));
  EXPECT_EQ(split_layers(9, 4, 1.0, 0, 0), (std::vector<int64_t>{1, 2, 3, 3}));
}

// The embedding on the first stage, the LM head and loss on the last: those
// stages hold fewer layers so that no stage costs more than needed.
TEST(SplitLayers, ExtraCostsOnTheEndStagesShiftLayersAway) {
  EXPECT_EQ(split_layers(8, 2, 1.0, 0, 2.0), (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(split_layers(8, 2, 1.0, 2.0, 0), (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(split_layers(12, 4, 1.0, 0, 3.0), (std::vector<int64_t>{3, 4, 4, 1}));
  EXPECT_EQ(split_layers(12, 4, 1.0, 3.0, 3.0), (std::vector<int64_t>{1, 4, 5, 2}));
}

// pp = layers: one layer per stage, however expensive the end stages are.
TEST(SplitLayers, AsManyStagesAsLayersGivesOneLayerEach) {
  EXPECT_EQ(split_layers(4, 4, 1.0, 0, 0), (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(split_layers(4, 4, 1.0, 100.0, 100.0), (std::vector<int64_t>{1, 1, 1, 1}));
}

// Every stage needs a layer: a last stage costing more than all the layers
// together still keeps one.
TEST(SplitLayers, EveryStageKeepsALayerUnderAHugeExtraCost) {
  EXPECT_EQ(split_layers(6, 2, 1.0, 0, 1000.0), (std::vector<int64_t>{5, 1}));
  EXPECT_EQ(split_layers(6, 3, 1.0, 1000.0, 0), (std::vector<int64_t>{1, 1, 4}));
}

// A million layers (a config typo the trainer must reject quickly, not spin on): the
// bisection keeps the split O(stages L log L).
TEST(SplitLayers, AMillionLayersSplitAtOnce) {
  EXPECT_EQ(split_layers(1000000, 4, 1.0, 0, 0), (std::vector<int64_t>{250000, 250000, 250000, 250000}));
  const std::vector<int64_t> got = split_layers(1000000, 3, 1.0, 10.0, 20.0);
  // The optimum is ceil((1000000 + 30) / 3) = 333344 per stage; the rebuild gives the
  // later stages as many layers as it allows (20 + 333324, 333344) and the first the rest.
  EXPECT_EQ(got, (std::vector<int64_t>{333332, 333344, 333324}));
}

TEST(SplitLayers, FewerLayersThanStagesOrNoStagesThrow) {
  EXPECT_THROW(split_layers(3, 4, 1.0, 0, 0), std::invalid_argument);
  EXPECT_THROW(split_layers(4, 0, 1.0, 0, 0), std::invalid_argument);
  EXPECT_THROW(split_layers(0, 1, 1.0, 0, 0), std::invalid_argument);
}

// Invariants over many shapes: every layer placed once, every stage at least one
// layer, and no other split has a cheaper most expensive stage than the optimum
// (checked against the best contiguous split found by brute force).
double max_stage_cost(const std::vector<int64_t>& layers, double layer_cost, double first, double last) {
  double worst = 0;
  for (size_t s = 0; s < layers.size(); ++s) {
    worst = std::max(worst, static_cast<double>(layers[s]) * layer_cost + (s == 0 ? first : 0.0) +
                                (s + 1 == layers.size() ? last : 0.0));
  }
  return worst;
}

double brute_force_best(int64_t left, int stages, std::vector<int64_t>& prefix, double layer_cost, double first,
                        double last) {
  if (stages == 1) {
    prefix.push_back(left);
    const double c = max_stage_cost(prefix, layer_cost, first, last);
    prefix.pop_back();
    return c;
  }
  double best = 1e300;
  for (int64_t n = 1; n <= left - (stages - 1); ++n) {
    prefix.push_back(n);
    best = std::min(best, brute_force_best(left - n, stages - 1, prefix, layer_cost, first, last));
    prefix.pop_back();
  }
  return best;
}

TEST(SplitLayers, PlacesEveryLayerAndReachesTheOptimum) {
  for (int64_t layers = 1; layers <= 12; ++layers) {
    for (int stages = 1; stages <= std::min<int64_t>(layers, 5); ++stages) {
      for (double first : {0.0, 1.5, 4.0}) {
        for (double last : {0.0, 2.5, 7.0}) {
          const std::vector<int64_t> got = split_layers(layers, stages, 1.0, first, last);
          std::ostringstream what;
          what << layers << " layers, " << stages << " stages, extras " << first << "/" << last;
          ASSERT_EQ(got.size(), static_cast<size_t>(stages)) << what.str();
          EXPECT_EQ(std::accumulate(got.begin(), got.end(), int64_t{0}), layers) << what.str();
          EXPECT_GE(*std::min_element(got.begin(), got.end()), 1) << what.str();
          std::vector<int64_t> prefix;
          EXPECT_NEAR(max_stage_cost(got, 1.0, first, last), brute_force_best(layers, stages, prefix, 1.0, first, last),
                      1e-9)
              << what.str();
        }
      }
    }
  }
}

// ---- one_f_one_b ------------------------------------------------------------

// "F0 F1 B0 ..." for a schedule.
std::string ops_string(const std::vector<PipelineOp>& ops) {
  std::string s;
  for (const PipelineOp& op : ops) {
    if (!s.empty()) s += ' ';
    s += (op.forward ? 'F' : 'B') + std::to_string(op.micro_batch);
  }
  return s;
}

TEST(OneFOneB, HandWrittenSchedules) {
  struct Case {
    int stage, stages, micro_batches;
    std::string want;
  };
  const std::vector<Case> cases = {
      // No pipeline: forward, backward, one micro-batch after the other.
      {0, 1, 3, "F0 B0 F1 B1 F2 B2"},
      {0, 1, 1, "F0 B0"},
      // Two stages: the first runs one warm-up forward, the last none.
      {0, 2, 3, "F0 F1 B0 F2 B1 B2"},
      {1, 2, 3, "F0 B0 F1 B1 F2 B2"},
      // Four stages, six micro-batches: warm-up 3, 2, 1, 0.
      {0, 4, 6, "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5"},
      {1, 4, 6, "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5"},
      {2, 4, 6, "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5"},
      {3, 4, 6, "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5"},
      // Fewer micro-batches than the warm-up wants: warm-up capped at m, then drain.
      {0, 4, 2, "F0 F1 B0 B1"},
      {1, 4, 2, "F0 F1 B0 B1"},
      {2, 4, 2, "F0 F1 B0 B1"},
      {3, 4, 2, "F0 B0 F1 B1"},
      {0, 8, 3, "F0 F1 F2 B0 B1 B2"},
      {0, 3, 1, "F0 B0"},
      // Warm-up exactly m: all forwards, then all backwards.
      {0, 3, 2, "F0 F1 B0 B1"},
      // A pipeline with no micro-batches in this step does nothing.
      {0, 4, 0, ""},
      {3, 4, 0, ""},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(ops_string(one_f_one_b(c.stage, c.stages, c.micro_batches)), c.want)
        << "stage " << c.stage << " of " << c.stages << ", " << c.micro_batches << " micro-batches";
  }
}

TEST(OneFOneB, InvariantsOverManyShapes) {
  for (int stages = 1; stages <= 6; ++stages) {
    for (int stage = 0; stage < stages; ++stage) {
      for (int m = 0; m <= 9; ++m) {
        const std::vector<PipelineOp> ops = one_f_one_b(stage, stages, m);
        const std::string what =
            "stage " + std::to_string(stage) + " of " + std::to_string(stages) + ", " + std::to_string(m) + " mb";
        ASSERT_EQ(ops.size(), static_cast<size_t>(2 * m)) << what;
        std::vector<int> forward_at(m, -1), backward_at(m, -1);
        int next_forward = 0, next_backward = 0, in_flight = 0, max_in_flight = 0;
        for (size_t k = 0; k < ops.size(); ++k) {
          const int i = ops[k].micro_batch;
          ASSERT_GE(i, 0) << what;
          ASSERT_LT(i, m) << what;
          if (ops[k].forward) {
            EXPECT_EQ(i, next_forward++) << what << ": forwards in micro-batch order";
            EXPECT_EQ(forward_at[i], -1) << what << ": F" << i << " twice";
            forward_at[i] = static_cast<int>(k);
            max_in_flight = std::max(max_in_flight, ++in_flight);
          } else {
            EXPECT_EQ(i, next_backward++) << what << ": backwards in micro-batch order";
            EXPECT_EQ(backward_at[i], -1) << what << ": B" << i << " twice";
            EXPECT_GE(forward_at[i], 0) << what << ": B" << i << " before F" << i;
            backward_at[i] = static_cast<int>(k);
            --in_flight;
          }
        }
        EXPECT_EQ(next_forward, m) << what;
        EXPECT_EQ(next_backward, m) << what;
        // Warm-up: stages - stage - 1 forwards before steady state, capped by m.
        const int warmup = std::min(stages - stage - 1, m);
        int leading_forwards = 0;
        while (leading_forwards < static_cast<int>(ops.size()) && ops[leading_forwards].forward) ++leading_forwards;
        EXPECT_EQ(leading_forwards, warmup < m ? warmup + 1 : m) << what;
        // Never more micro-batches in flight than the stage has slots.
        EXPECT_LE(max_in_flight, pipeline_slots(stage, stages)) << what;
        if (m > 0) {
          EXPECT_EQ(max_in_flight, std::min(m, warmup + 1)) << what;
        }
      }
    }
  }
}

TEST(PipelineSlots, EarlierStagesHoldMoreMicroBatches) {
  EXPECT_EQ(pipeline_slots(0, 1), 1);
  EXPECT_EQ(pipeline_slots(0, 4), 4);
  EXPECT_EQ(pipeline_slots(1, 4), 3);
  EXPECT_EQ(pipeline_slots(3, 4), 1);
}

// ---- PipelineExecutor -------------------------------------------------------

// Records prepare/forward/backward as "P0/0 F0/0 B0/0 ..." (micro-batch/slot).
// A one-stage pipeline has no neighbours: the activation and gradient tensors
// must never be asked for.
class RecordingStage final : public PipelineStage {
 public:
  int64_t rows(int) const override { return 4; }
  void prepare(int i, int, int slot) override { record('P', i, slot); }
  void forward(int i, int slot) override { record('F', i, slot); }
  void backward(int i, int slot) override { record('B', i, slot); }
  Tensor input_activation(int) override { return unexpected("input_activation"); }
  Tensor output_activation(int) override { return unexpected("output_activation"); }
  Tensor output_gradient(int) override { return unexpected("output_gradient"); }
  Tensor input_gradient(int) override { return unexpected("input_gradient"); }

  std::string calls;

 private:
  void record(char what, int i, int slot) {
    if (!calls.empty()) calls += ' ';
    calls += what + std::to_string(i) + "/" + std::to_string(slot);
  }
  Tensor unexpected(const char* what) {
    ADD_FAILURE() << what << " called on a one-stage pipeline";
    return Tensor();
  }
};

TEST(PipelineExecutor, OneStageRunsPrepareForwardBackwardPerMicroBatch) {
  LocalCommunicator pp("pp");
  PipelineExecutor executor(pp, 4, 8);
  EXPECT_EQ(executor.slots(), 1);
  RecordingStage stage;
  executor.run(stage, 3);
  EXPECT_EQ(stage.calls, "P0/0 F0/0 B0/0 P1/0 F1/0 B1/0 P2/0 F2/0 B2/0");
}

TEST(PipelineExecutor, OneStageWithNoMicroBatchesDoesNothing) {
  LocalCommunicator pp("pp");
  PipelineExecutor executor(pp, 4, 8);
  RecordingStage stage;
  executor.run(stage, 0);
  EXPECT_EQ(stage.calls, "");
}

TEST(PipelineExecutor, RunsAgainForTheNextStep) {
  LocalCommunicator pp("pp");
  PipelineExecutor executor(pp, 4, 8);
  RecordingStage stage;
  executor.run(stage, 1);
  executor.run(stage, 2);
  EXPECT_EQ(stage.calls, "P0/0 F0/0 B0/0 P0/0 F0/0 B0/0 P1/0 F1/0 B1/0");
}

// A one-stage pipeline needs no gradient buffers between stages.
TEST(PipelineExecutor, OneStageReservesNoGradientBuffers) {
  LocalCommunicator pp("pp");
  PipelineExecutor executor(pp, 1024, 512);
  EXPECT_LT(executor.buffer_bytes(), size_t{1024} * 512 * sizeof(float));
}

// The first of two stages sends its output after the first forward; a
// LocalCommunicator posing as rank 0 of 2 has no peer, so that send throws.
class SendingStage final : public PipelineStage {
 public:
  SendingStage() : buffer_(2 * 4 * 8, 0.0f) {}
  int64_t rows(int) const override { return 4; }
  void prepare(int i, int, int) override { calls += "P" + std::to_string(i) + " "; }
  void forward(int i, int) override { calls += "F" + std::to_string(i) + " "; }
  void backward(int i, int) override { calls += "B" + std::to_string(i) + " "; }
  Tensor input_activation(int slot) override { return tensor(slot); }
  Tensor output_activation(int slot) override { return tensor(slot); }
  Tensor output_gradient(int slot) override { return tensor(slot); }
  Tensor input_gradient(int slot) override { return tensor(slot); }
  std::string calls;

 private:
  Tensor tensor(int slot) { return Tensor(buffer_.data() + slot * 4 * 8, {4, 8}); }
  std::vector<float> buffer_;
};

TEST(PipelineExecutor, FirstOfTwoStagesSendsAfterItsFirstForward) {
  LocalCommunicator pp("pp", 0, 2);
  PipelineExecutor executor(pp, 4, 8);
  EXPECT_EQ(executor.slots(), 2);
  SendingStage stage;
  EXPECT_THROW(executor.run(stage, 2), std::logic_error);
  EXPECT_EQ(stage.calls, "P0 F0 ");
}

// ---- PipelineExecutor with model chunks (interleaved 1F1B) over threads ------

// Virtual stage v maps its input x to x (v + 2) + 1, element by element; its
// backward multiplies the gradient by v + 2. Virtual stage 0's input is i + 1 for
// micro-batch i, and the last one's output gradient is 1: after every virtual
// stage the value is a known composition, and the gradient reaching virtual stage 0
// is the product of all the factors. Each pair's slot must be free when prepared.
// Side values travel too, one per (virtual stage, micro-batch) each way.
class ChunkedStage final : public PipelineStage {
 public:
  static constexpr int64_t kRows = 2, kHidden = 3;
  ChunkedStage(int stage, int stages, int chunks, int slots)
      : stage_(stage), stages_(stages), chunks_(chunks), buffers_(4 * slots * kRows * kHidden, 0.0f),
        side_(3 * static_cast<size_t>(slots), 0.0f), pairs_(static_cast<size_t>(slots), {-1, -1}) {}

  // The side value virtual stage v sends on with micro-batch i, forward and back (as
  // Mixtral's routing statistics travel): one per (v, i), so a side message that
  // reaches another micro-batch's slot, tag or edge shows.
  static float side_forward_value(int v, int i) { return static_cast<float>(1000 * (v + 1) + i); }
  static float side_backward_value(int v, int i) { return static_cast<float>(-1000 * (v + 1) - i); }

  // The value every element holds on entering virtual stage v with micro-batch i.
  static double input_value(int v, int i) {
    double x = i + 1;
    for (int u = 0; u < v; ++u) x = x * (u + 2) + 1;
    return x;
  }

  int64_t rows(int) const override { return kRows; }
  void prepare(int i, int chunk, int slot) override {
    EXPECT_EQ(pairs_[slot].first, -1) << "slot " << slot << " prepared for micro-batch " << i << " chunk " << chunk
                                      << " while in use";
    pairs_[slot] = {i, chunk};
    if (virtual_stage(chunk) == 0) fill(tensor(kInput, slot), static_cast<float>(i + 1));
  }
  void forward(int i, int slot) override {
    const int v = record('F', i, slot);
    const Tensor x = tensor(kInput, slot), y = tensor(kOutput, slot);
    for (int64_t e = 0; e < x.numel(); ++e) {
      EXPECT_EQ(x.f32()[e], static_cast<float>(input_value(v, i))) << "virtual stage " << v << " micro-batch " << i;
      y.f32()[e] = x.f32()[e] * static_cast<float>(v + 2) + 1;
    }
    if (v == stages_ * chunks_ - 1) outputs[i] = y.f32()[0];
    if (v > 0) {
      EXPECT_EQ(side(kSideIn, slot)[0], side_forward_value(v - 1, i)) << "virtual stage " << v;
    }
    side(kSideOut, slot)[0] = side_forward_value(v, i);
  }
  void backward(int i, int slot) override {
    const int v = record('B', i, slot);
    const Tensor g_out = tensor(kOutputGradient, slot), g_in = tensor(kInputGradient, slot);
    for (int64_t e = 0; e < g_in.numel(); ++e) {
      // The last virtual stage seeds micro-batch i's gradient with i + 1, so gradients
      // that travel to another micro-batch's slot or tag show.
      const float g = v == stages_ * chunks_ - 1 ? static_cast<float>(i + 1) : g_out.f32()[e];
      g_in.f32()[e] = g * static_cast<float>(v + 2);
    }
    if (v == 0) gradients[i] = g_in.f32()[0];
    if (v < stages_ * chunks_ - 1) {
      EXPECT_EQ(side(kSideBack, slot)[0], side_backward_value(v + 1, i)) << "virtual stage " << v;
    }
    side(kSideBack, slot)[0] = side_backward_value(v, i);
    pairs_[slot] = {-1, -1};
  }
  Tensor input_activation(int slot) override { return tensor(kInput, slot); }
  Tensor output_activation(int slot) override { return tensor(kOutput, slot); }
  Tensor output_gradient(int slot) override { return tensor(kOutputGradient, slot); }
  Tensor input_gradient(int slot) override { return tensor(kInputGradient, slot); }
  Tensor side_input(int slot) override { return Tensor(side(kSideIn, slot), {1}); }
  Tensor side_output(int slot) override { return Tensor(side(kSideOut, slot), {1}); }
  Tensor side_backward(int slot) override { return Tensor(side(kSideBack, slot), {1}); }

  std::string calls;
  std::map<int, float> outputs, gradients;  // of the last virtual stage / virtual stage 0, per micro-batch

 private:
  enum Buffer { kInput, kOutput, kOutputGradient, kInputGradient };
  enum Side { kSideIn, kSideOut, kSideBack };
  float* side(Side what, int slot) { return side_.data() + static_cast<size_t>(what) * pairs_.size() + slot; }
  int virtual_stage(int chunk) const { return chunk * stages_ + stage_; }
  // Appends "F0.1 " (what, micro-batch, the slot's chunk) to calls; the slot's virtual stage.
  int record(char what, int i, int slot) {
    const auto [mb, chunk] = pairs_[slot];
    EXPECT_EQ(mb, i);
    calls += what + std::to_string(i) + "." + std::to_string(chunk) + " ";
    return virtual_stage(chunk);
  }
  Tensor tensor(Buffer b, int slot) {
    const size_t slots = pairs_.size();
    return Tensor(buffers_.data() + (b * slots + static_cast<size_t>(slot)) * kRows * kHidden, {kRows, kHidden});
  }
  static void fill(Tensor t, float value) { std::fill(t.f32(), t.f32() + t.numel(), value); }
  int stage_, stages_, chunks_;
  std::vector<float> buffers_;
  std::vector<float> side_;                 // side values in, out and back, one per slot each
  std::vector<std::pair<int, int>> pairs_;  // (micro-batch, chunk) per slot; -1: free
};

// "F0.0 F1.0 B0.1 ..." (micro-batch.chunk) for a schedule.
std::string chunk_ops_string(const std::vector<PipelineOp>& ops) {
  std::string s;
  for (const PipelineOp& op : ops)
    s += (op.forward ? "F" : "B") + std::to_string(op.micro_batch) + "." + std::to_string(op.chunk) + " ";
  return s;
}

// Runs `m` micro-batches through stages x chunks virtual stages over threads whose
// tags end at `max_tag`: every micro-batch passes them all in order forward and
// back, and each stage runs pipeline_schedule's order within pipeline_slots slots.
void expect_pipeline_composes(int stages, int chunks, int m, int max_tag = INT_MAX) {
  std::vector<std::string> calls(static_cast<size_t>(stages));
  std::map<int, float> outputs, gradients;
  testing::run_ranks(
      stages,
      [&](testing::ThreadCommunicator& pp) {
        PipelineExecutor executor(pp, ChunkedStage::kRows, ChunkedStage::kHidden, Device::CPU, chunks);
        EXPECT_EQ(executor.slots(), pipeline_slots(pp.rank(), stages, chunks));
        ChunkedStage stage(pp.rank(), stages, chunks, executor.slots());
        executor.run(stage, m);
        calls[static_cast<size_t>(pp.rank())] = stage.calls;
        if (pp.rank() == stages - 1) outputs = stage.outputs;
        if (pp.rank() == 0) gradients = stage.gradients;
      },
      max_tag);
  const std::string what = std::to_string(stages) + " stages x " + std::to_string(chunks) + " chunks, " +
                           std::to_string(m) + " micro-batches";
  for (int s = 0; s < stages; ++s)
    EXPECT_EQ(calls[static_cast<size_t>(s)], chunk_ops_string(pipeline_schedule(s, stages, chunks, m)))
        << what << ", stage " << s;
  double product = 1;
  for (int v = 0; v < stages * chunks; ++v) product *= v + 2;
  ASSERT_EQ(outputs.size(), static_cast<size_t>(m)) << what;
  ASSERT_EQ(gradients.size(), static_cast<size_t>(m)) << what;
  for (int i = 0; i < m; ++i) {
    EXPECT_EQ(outputs[i], static_cast<float>(ChunkedStage::input_value(stages * chunks, i))) << what;
    EXPECT_EQ(gradients[i], static_cast<float>((i + 1) * product)) << what;
  }
}

// Micro-batch counts that are not a multiple of the stages included.
TEST(PipelineExecutor, InterleavedChunksPassEveryVirtualStageInOrder) {
  for (int stages : {2, 3}) {
    for (int chunks : {2, 3}) {
      for (int m : {1, 2, 3, 4, 5, 7}) expect_pipeline_composes(stages, chunks, m);
    }
  }
}

// A pipeline's message tags do not grow with the micro-batches: over a transport
// whose largest tag is just what pp x vpp virtual stages need (4 per edge between
// them: 4 (pp vpp - 1) - 1), 64 micro-batches run (a tag per micro-batch passed
// that bound from the second one on), each still meeting its own activations and
// gradients (the k-th message of an edge is micro-batch k's).
TEST(PipelineExecutor, ManyMicroBatchesKeepTheTagsWithinASmallLargestTag) {
  for (int stages : {2, 3}) {
    for (int chunks : {1, 2}) {
      SCOPED_TRACE(std::to_string(stages) + " stages x " + std::to_string(chunks) + " chunks");
      expect_pipeline_composes(stages, chunks, 64, 4 * (stages * chunks - 1) - 1);
    }
  }
}

// A communicator whose largest tag is below what the virtual stages need is
// refused when the executor is made, naming both numbers, not deep in a step.
TEST(PipelineExecutor, ATransportWithTooFewTagsIsRefusedUpFront) {
  testing::ThreadGroup group(3, 4 * (3 * 2 - 1) - 2);
  testing::ThreadCommunicator pp(group, 1, "pp");
  try {
    PipelineExecutor executor(pp, 4, 8, Device::CPU, 2);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "pipeline stage 1: 3 stages x 2 model chunks need message tags up to 19, above pp's "
                           "largest, 18 (MPI_TAG_UB)");
  }
}

// The schedule and the slots of a micro-batch count are derived once, and kept
// while that count recurs (a count between keeps its own).
TEST(PipelineExecutor, DerivesThePlanOfAMicroBatchCountOnce) {
  LocalCommunicator pp("pp");
  PipelineExecutor executor(pp, 4, 8);
  RecordingStage stage;
  for (int step = 0; step < 3; ++step) executor.run(stage, 3);
  EXPECT_EQ(executor.plans_built(), 1);
  for (int m : {5, 3, 5, 3}) executor.run(stage, m);
  EXPECT_EQ(executor.plans_built(), 2);
  // The plans drive the runs as a fresh one would: the last run's calls.
  stage.calls.clear();
  executor.run(stage, 3);
  EXPECT_EQ(stage.calls, "P0/0 F0/0 B0/0 P1/0 F1/0 B1/0 P2/0 F2/0 B2/0");
}

// One stage has nothing to interleave: the executor refuses chunks there.
TEST(PipelineExecutor, ChunksOnOneStageThrow) {
  LocalCommunicator pp("pp");
  EXPECT_THROW(PipelineExecutor(pp, 4, 8, Device::CPU, 2), std::invalid_argument);
}

}  // namespace
}  // namespace hdp

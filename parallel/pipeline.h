#pragma once
// Pipeline parallelism: the executor that runs a stage's 1F1B schedule, or with
// several model chunks per stage the interleaved one (planning/pipeline_schedule.h;
// the split of the layers into (virtual) stages is planning/stage_split.h's), with
// non-blocking sends and receives of activations (forward) and their gradients
// (backward).
//
// Under interleaved 1F1B chunk c of stage s is virtual stage v = c x stages + s: a
// forward of (micro-batch, chunk) takes its input from virtual stage v - 1 (stage
// s - 1's same chunk; for s = 0 stage stages - 1's chunk c - 1, a wrap-around
// transfer) and sends its output to v + 1; backward the converse. The embedding is
// virtual stage 0's, the head and loss the last virtual stage's.
//
// A pipeline runs the micro-batches of its own plan; pipelines of one step may
// run different numbers of micro-batches. With one stage the executor is the
// plain loop forward(i), backward(i).

#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "kernels/allocator.h"
#include "parallel/communicator.h"
#include "planning/pipeline_schedule.h"

namespace hdp {

// What the executor drives: one stage of the model. Activations are [rows, hidden].
// A slot holds one (micro-batch, chunk) pair from its prepare to its backward; the
// tensors of a slot are those of the chunk it was prepared for.
class PipelineStage {
 public:
  virtual ~PipelineStage() = default;
  virtual int64_t rows(int micro_batch) const = 0;
  // Loads the micro-batch's inputs into `slot` for model chunk `chunk` (before its
  // input arrives).
  virtual void prepare(int micro_batch, int chunk, int slot) = 0;
  virtual void forward(int micro_batch, int slot) = 0;
  virtual void backward(int micro_batch, int slot) = 0;
  virtual Tensor input_activation(int slot) = 0;
  virtual Tensor output_activation(int slot) = 0;
  virtual Tensor output_gradient(int slot) = 0;
  virtual Tensor input_gradient(int slot) = 0;
  // Small per-micro-batch values that travel beside the activations and their
  // gradients, in the same order (Mixtral's routing statistics, which pool over the
  // layers of every stage). A tensor without data: nothing travels.
  virtual Tensor side_input(int /*slot*/) { return {}; }     // received with the input activation
  virtual Tensor side_output(int /*slot*/) { return {}; }    // sent with the output activation
  virtual Tensor side_backward(int /*slot*/) { return {}; }  // received before backward, sent on after it
};

class PipelineExecutor {
 public:
  // pp: this pipeline's stages in order (size 1 = no pipeline). chunks: model chunks
  // per stage (parallel.vpp; > 1 needs two stages or more, pipeline_schedule).
  PipelineExecutor(Communicator& pp, int64_t capacity_rows, int64_t hidden, Device device = Device::CPU,
                   int chunks = 1);

  // Runs this stage's schedule, pipeline_schedule(stage, stages, chunks, m), over
  // m = `micro_batches` micro-batches.
  void run(PipelineStage& stage, int micro_batches);
  // How many times run() derived a plan from a schedule: once per micro-batch count
  // while that count recurs (the last few counts are kept).
  int64_t plans_built() const { return plans_built_; }
  int chunks() const { return chunks_; }
  int slots() const { return slots_; }
  size_t buffer_bytes() const { return arena_.capacity(); }

 private:
  // What run() derives from the schedule of m micro-batches, in time and memory
  // linear in m: kept for the steps that follow with the same m.
  struct Plan {
    std::vector<PipelineOp> ops;       // pipeline_schedule(stage, stages, chunks, m)
    std::vector<PipelineOp> forwards;  // its forwards, in order
    std::vector<int> slot_of;          // per (micro-batch i, chunk c), at c x m + i: its slot
    std::vector<int> needed;           // per forward: the backwards done before its slot is free
  };
  const Plan& plan(int micro_batches);

  Communicator& pp_;
  int stage_, stages_, chunks_, slots_;
  int64_t capacity_, hidden_;
  Arena arena_;
  std::vector<Tensor> grad_in_, grad_out_;  // per slot: received output gradients, sent input gradients
  std::vector<std::pair<int, Plan>> plans_;  // by micro-batch count, the most recently used first
  int64_t plans_built_ = 0;
};

}  // namespace hdp

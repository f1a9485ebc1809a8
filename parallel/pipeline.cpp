#include "parallel/pipeline.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/ops.h"
#include "parallel/op_tracer.h"
#include "parallel/progress.h"

namespace hdp {
namespace {

// What a message between virtual stages carries. Edge v joins virtual stage v to
// v + 1: forward its activation and the side values that travel with it, backward
// the gradient and the side values going back.
enum class Carries { Activation, Gradient, SideForward, SideBackward };
constexpr int kCarried = 4;

// The tag of a message: its edge and what it carries, not its micro-batch, so tags
// stay below 4 x pp x vpp however many micro-batches a step runs (with a tag per
// micro-batch, thousands of them at a 1M-token batch of short sequences would pass
// MPI_TAG_UB, which MPI guarantees only up to 32767). The messages of one edge and
// kind between two ranks then share a tag, and the communicator matches them in
// order (its non-overtaking contract, parallel/communicator.h): the k-th receive
// posted gets the k-th message sent. Both ends take an edge's micro-batches in
// increasing order (the sender as it runs its chunk's forwards or backwards, the
// receiver as it posts the receives of its chunk's forwards), which plan() checks
// of every schedule, so the k-th message of an edge is micro-batch k's.
int message_tag(int edge, Carries what) { return kCarried * edge + static_cast<int>(what); }

// Plans kept for micro-batch counts seen lately (a step's count varies with its data).
constexpr size_t kCachedPlans = 8;

}  // namespace

PipelineExecutor::PipelineExecutor(Communicator& pp, int64_t capacity_rows, int64_t hidden, Device device,
                                   int chunks)
    : pp_(pp),
      stage_(pp.rank()),
      stages_(pp.size()),
      chunks_(chunks),
      slots_(pipeline_slots(pp.rank(), pp.size(), chunks)),
      capacity_(capacity_rows),
      hidden_(hidden),
      arena_(Arena::counting(device, "pipeline")) {
  // Throws for chunks the schedule cannot interleave (one stage, no chunk).
  pipeline_schedule(stage_, stages_, chunks_, 0);
  const int virtual_stages = stages_ * chunks_;
  if (virtual_stages > 1 && message_tag(virtual_stages - 2, Carries::SideBackward) > pp.max_tag())
    throw std::invalid_argument("pipeline stage " + std::to_string(stage_) + ": " + std::to_string(stages_) +
                                " stages x " + std::to_string(chunks_) + " model chunks need message tags up to " +
                                std::to_string(message_tag(virtual_stages - 2, Carries::SideBackward)) + ", above " +
                                pp.name() + "'s largest, " + std::to_string(pp.max_tag()) + " (MPI_TAG_UB)");
  // Gradient buffers are needed only between (virtual) stages.
  const bool needs_in = stage_ < stages_ - 1 || chunks_ > 1, needs_out = stage_ > 0 || chunks_ > 1;
  const size_t per_slot = static_cast<size_t>(capacity_ * hidden_) * sizeof(float) + Arena::kAlignment;
  arena_ = Arena(device, per_slot * slots_ * (needs_in + needs_out) + Arena::kAlignment, "pipeline");
  for (int s = 0; s < slots_; ++s) {
    grad_in_.push_back(needs_in ? arena_.tensor({capacity_, hidden_}) : Tensor());
    grad_out_.push_back(needs_out ? arena_.tensor({capacity_, hidden_}) : Tensor());
  }
}

const PipelineExecutor::Plan& PipelineExecutor::plan(int m) {
  const auto cached = std::find_if(plans_.begin(), plans_.end(), [m](const auto& p) { return p.first == m; });
  if (cached != plans_.end()) {
    std::rotate(plans_.begin(), cached, cached + 1);  // most recently used first
    return plans_.front().second;
  }
  Plan plan;
  plan.ops = pipeline_schedule(stage_, stages_, chunks_, m);
  // Slots: a forward takes the lowest free slot, its backward frees it. needed[k]:
  // the backwards done before the k-th forward's slot is free (its previous holder's
  // backward). With one chunk this is slot i % slots, needed i - slots + 1.
  plan.slot_of.assign(static_cast<size_t>(chunks_ * m), -1);
  std::vector<int> freed_after(static_cast<size_t>(slots_), 0);  // backwards done when the slot became free
  std::vector<bool> busy(static_cast<size_t>(slots_), false);
  // The next micro-batch of each chunk forward and backward: message_tag's order.
  std::vector<int> next_forward(static_cast<size_t>(chunks_), 0), next_backward(static_cast<size_t>(chunks_), 0);
  int backwards = 0;
  for (const PipelineOp& op : plan.ops) {
    int& next = (op.forward ? next_forward : next_backward)[static_cast<size_t>(op.chunk)];
    if (op.micro_batch != next++)
      throw std::logic_error("pipeline: the schedule runs chunk " + std::to_string(op.chunk) + "'s micro-batches " +
                             (op.forward ? "forward" : "backward") + " out of order, which message_tag needs");
    int& slot = plan.slot_of[static_cast<size_t>(op.chunk * m + op.micro_batch)];
    if (op.forward) {
      slot = static_cast<int>(std::find(busy.begin(), busy.end(), false) - busy.begin());
      if (slot == slots_) throw std::logic_error("pipeline: more pairs in flight than pipeline_slots");
      busy[static_cast<size_t>(slot)] = true;
      plan.forwards.push_back(op);
      plan.needed.push_back(freed_after[static_cast<size_t>(slot)]);
    } else {
      busy[static_cast<size_t>(slot)] = false;
      freed_after[static_cast<size_t>(slot)] = ++backwards;
    }
  }
  ++plans_built_;
  if (plans_.size() == kCachedPlans) plans_.pop_back();
  plans_.insert(plans_.begin(), {m, std::move(plan)});
  return plans_.front().second;
}

void PipelineExecutor::run(PipelineStage& stage, int micro_batches) {
  progress::Context context("pipeline");
  const int m = micro_batches, virtual_stages = stages_ * chunks_;
  const Plan& plan = this->plan(m);
  const std::vector<PipelineOp>& forwards = plan.forwards;
  const std::vector<int>& slot_of = plan.slot_of;
  const std::vector<int>& needed = plan.needed;
  // The ranks of the previous and next virtual stage (around the ring of stages).
  const int previous_rank = (stage_ + stages_ - 1) % stages_, next_rank = (stage_ + 1) % stages_;
  auto virtual_stage = [&](int chunk) { return chunk * stages_ + stage_; };
  // One index per (micro-batch, chunk) pair.
  auto pair = [&](int i, int chunk) { return chunk * m + i; };
  auto has = [](const Tensor& t) { return t.data != nullptr; };
  const int total_forwards = static_cast<int>(forwards.size());

  std::vector<CommRequest> activation_in(slot_of.size()), gradient_in(slot_of.size());
  std::vector<CommRequest> activation_out(slots_), gradient_out(slots_);
  std::vector<CommRequest> side_in(slot_of.size()), side_back_in(slot_of.size());
  std::vector<CommRequest> side_out(slots_), side_back_out(slots_);
  int prepared = 0;       // forwards [0, prepared) have their inputs loaded / receives posted
  int backwards_done = 0;

  // Loads the next forwards' pairs as far as their slots are free (the slot's previous
  // pair finished backward) and posts the receives of their activations, so transfers
  // run while this stage computes.
  auto prepare_ahead = [&](int limit) {
    while (prepared < std::min(limit, total_forwards) && needed[static_cast<size_t>(prepared)] <= backwards_done) {
      const PipelineOp& op = forwards[static_cast<size_t>(prepared++)];
      const int i = op.micro_batch, v = virtual_stage(op.chunk), p = pair(i, op.chunk);
      const int slot = slot_of[static_cast<size_t>(p)];
      activation_out[slot].wait();
      side_out[slot].wait();
      // The slot's side values going back (sent after its last backward) may be
      // rewritten by the next forward in the slot (the last stage's routing totals).
      side_back_out[slot].wait();
      stage.prepare(i, op.chunk, slot);
      if (v == 0) continue;
      activation_in[p] = pp_.recv_async(stage.input_activation(slot), previous_rank,
                                        message_tag(v - 1, Carries::Activation));
      if (has(stage.side_input(slot)))
        side_in[p] = pp_.recv_async(stage.side_input(slot), previous_rank, message_tag(v - 1, Carries::SideForward));
    }
  };

  // Tracing (parallel/op_tracer.h): a receive is recorded as the wait for it (the
  // transfer the stage sees), a send as its non-blocking post (sends never wait);
  // the analysis pairs them by group name, which names the sending virtual stage.
  OpTracer* const tracer = OpTracer::active();
  auto wait_recv = [&](CommRequest& request, bool forward, int sender, int i) {
    if (!tracer) return request.wait();
    const double t0 = tracer->now_us();
    request.wait();
    tracer->record((forward ? trace_ops::kForwardRecv : trace_ops::kBackwardRecv).data(), i, t0, tracer->now_us(),
                   tracer->pipeline_group(forward, sender, i));
  };
  auto traced_send = [&](bool forward, int sender, int i) {
    if (!tracer) return;
    const double t = tracer->now_us();
    tracer->record((forward ? trace_ops::kForwardSend : trace_ops::kBackwardSend).data(), i, t, t,
                   tracer->pipeline_group(forward, sender, i));
  };

  int forwards_done = 0;
  for (const PipelineOp& op : plan.ops) {
    const int i = op.micro_batch, v = virtual_stage(op.chunk), p = pair(i, op.chunk);
    const int slot = slot_of[static_cast<size_t>(p)];
    const bool first = v == 0, last = v == virtual_stages - 1;
    const int64_t rows = stage.rows(i);
    if (op.forward) {
      prepare_ahead(forwards_done + 1);
      if (!first) {
        wait_recv(activation_in[p], true, v - 1, i);
        side_in[p].wait();
      }
      stage.forward(i, slot);
      ++forwards_done;
      if (!last) {
        activation_out[slot] = pp_.send_async(stage.output_activation(slot), next_rank,
                                              message_tag(v, Carries::Activation));
        if (has(stage.side_output(slot)))
          side_out[slot] = pp_.send_async(stage.side_output(slot), next_rank, message_tag(v, Carries::SideForward));
        side_back_out[slot].wait();
        if (has(stage.side_backward(slot)))
          side_back_in[p] = pp_.recv_async(stage.side_backward(slot), next_rank,
                                           message_tag(v, Carries::SideBackward));
        traced_send(true, v, i);
        gradient_in[p] = pp_.recv_async(grad_in_[slot].rows(0, rows), next_rank,
                                        message_tag(v, Carries::Gradient));
      }
      prepare_ahead(forwards_done + 1);
    } else {
      if (!last) {
        wait_recv(gradient_in[p], false, v + 1, i);
        side_back_in[p].wait();
        copy(stage.output_gradient(slot), grad_in_[slot].rows(0, rows));
      }
      stage.backward(i, slot);
      if (!first) {
        if (has(stage.side_backward(slot)))
          side_back_out[slot] =
              pp_.send_async(stage.side_backward(slot), previous_rank, message_tag(v - 1, Carries::SideBackward));
        gradient_out[slot].wait();
        copy(grad_out_[slot].rows(0, rows), stage.input_gradient(slot));
        gradient_out[slot] = pp_.send_async(grad_out_[slot].rows(0, rows), previous_rank,
                                            message_tag(v - 1, Carries::Gradient));
        traced_send(false, v, i);
      }
      ++backwards_done;
      prepare_ahead(total_forwards);
    }
  }
  for (CommRequest& r : activation_out) r.wait();
  for (CommRequest& r : gradient_out) r.wait();
  for (CommRequest& r : side_out) r.wait();
  for (CommRequest& r : side_back_out) r.wait();
}

}  // namespace hdp

#include "parallel/pipeline.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/ops.h"
#include "parallel/op_tracer.h"
#include "parallel/progress.h"

namespace hdp {

PipelineExecutor::PipelineExecutor(Communicator& pp, int64_t capacity_rows, int64_t hidden, Device device)
    : pp_(pp),
      stage_(pp.rank()),
      stages_(pp.size()),
      slots_(pipeline_slots(pp.rank(), pp.size())),
      capacity_(capacity_rows),
      hidden_(hidden),
      arena_(Arena::counting(device, "pipeline")) {
  // Gradient buffers are needed only between stages.
  const bool needs_in = stage_ < stages_ - 1, needs_out = stage_ > 0;
  const size_t per_slot = static_cast<size_t>(capacity_ * hidden_) * sizeof(float) + Arena::kAlignment;
  arena_ = Arena(device, per_slot * slots_ * (needs_in + needs_out) + Arena::kAlignment, "pipeline");
  for (int s = 0; s < slots_; ++s) {
    grad_in_.push_back(needs_in ? arena_.tensor({capacity_, hidden_}) : Tensor());
    grad_out_.push_back(needs_out ? arena_.tensor({capacity_, hidden_}) : Tensor());
  }
}

void PipelineExecutor::run(PipelineStage& stage, int micro_batches) {
  progress::Context context("pipeline");
  const bool first = stage_ == 0, last = stage_ == stages_ - 1;
  const std::vector<PipelineOp> ops = one_f_one_b(stage_, stages_, micro_batches);
  auto slot_of = [&](int i) { return i % slots_; };
  auto activation_tag = [](int i) { return 2 * i; };
  auto gradient_tag = [](int i) { return 2 * i + 1; };
  // The side values' tags follow all micro-batches' activation and gradient tags.
  auto side_tag = [&](int tag) { return 2 * micro_batches + tag; };
  auto has = [](const Tensor& t) { return t.data != nullptr; };

  std::vector<CommRequest> activation_in(micro_batches), gradient_in(micro_batches);
  std::vector<CommRequest> activation_out(slots_), gradient_out(slots_);
  std::vector<CommRequest> side_in(micro_batches), side_back_in(micro_batches);
  std::vector<CommRequest> side_out(slots_), side_back_out(slots_);
  int prepared = 0;       // micro-batches [0, prepared) have their inputs loaded / receives posted
  int backwards_done = 0;

  // Loads the next micro-batches as far as their slots are free (the slot's previous
  // micro-batch finished backward) and posts the receives of their activations, so
  // transfers run while this stage computes.
  auto prepare_ahead = [&](int limit) {
    while (prepared < std::min(limit, micro_batches) && prepared - slots_ < backwards_done) {
      const int i = prepared++, slot = slot_of(i);
      activation_out[slot].wait();
      side_out[slot].wait();
      // The slot's side values going back (sent after its last backward) may be
      // rewritten by the next forward in the slot (the last stage's routing totals).
      side_back_out[slot].wait();
      stage.prepare(i, slot);
      if (!first) activation_in[i] = pp_.recv_async(stage.input_activation(slot), stage_ - 1, activation_tag(i));
      if (!first && has(stage.side_input(slot)))
        side_in[i] = pp_.recv_async(stage.side_input(slot), stage_ - 1, side_tag(activation_tag(i)));
    }
  };

  // Tracing (parallel/op_tracer.h): a receive is recorded as the wait for it (the
  // transfer the stage sees), a send as its non-blocking post (sends never wait);
  // the analysis pairs them by group name.
  OpTracer* const tracer = OpTracer::active();
  auto wait_recv = [&](CommRequest& request, bool forward, int i) {
    if (!tracer) return request.wait();
    const double t0 = tracer->now_us();
    request.wait();
    tracer->record((forward ? trace_ops::kForwardRecv : trace_ops::kBackwardRecv).data(), i, t0, tracer->now_us(),
                   tracer->pipeline_group(forward, forward ? stage_ - 1 : stage_ + 1, i));
  };
  auto traced_send = [&](bool forward, int i) {
    if (!tracer) return;
    const double t = tracer->now_us();
    tracer->record((forward ? trace_ops::kForwardSend : trace_ops::kBackwardSend).data(), i, t, t,
                   tracer->pipeline_group(forward, stage_, i));
  };

  for (const PipelineOp& op : ops) {
    const int i = op.micro_batch, slot = slot_of(i);
    const int64_t rows = stage.rows(i);
    if (op.forward) {
      prepare_ahead(i + 1);
      if (first) {
        activation_in[i].wait();
      } else {
        wait_recv(activation_in[i], true, i);
        side_in[i].wait();
      }
      stage.forward(i, slot);
      if (!last) {
        activation_out[slot] = pp_.send_async(stage.output_activation(slot), stage_ + 1, activation_tag(i));
        if (has(stage.side_output(slot)))
          side_out[slot] = pp_.send_async(stage.side_output(slot), stage_ + 1, side_tag(activation_tag(i)));
        side_back_out[slot].wait();
        if (has(stage.side_backward(slot)))
          side_back_in[i] = pp_.recv_async(stage.side_backward(slot), stage_ + 1, side_tag(gradient_tag(i)));
        traced_send(true, i);
        gradient_in[i] = pp_.recv_async(grad_in_[slot].rows(0, rows), stage_ + 1, gradient_tag(i));
      }
      prepare_ahead(i + 2);
    } else {
      if (!last) {
        wait_recv(gradient_in[i], false, i);
        side_back_in[i].wait();
        copy(stage.output_gradient(slot), grad_in_[slot].rows(0, rows));
      }
      stage.backward(i, slot);
      if (!first) {
        if (has(stage.side_backward(slot)))
          side_back_out[slot] = pp_.send_async(stage.side_backward(slot), stage_ - 1, side_tag(gradient_tag(i)));
        gradient_out[slot].wait();
        copy(grad_out_[slot].rows(0, rows), stage.input_gradient(slot));
        gradient_out[slot] = pp_.send_async(grad_out_[slot].rows(0, rows), stage_ - 1, gradient_tag(i));
        traced_send(false, i);
      }
      ++backwards_done;
      prepare_ahead(i + slots_ + 1);
    }
  }
  for (CommRequest& r : activation_out) r.wait();
  for (CommRequest& r : gradient_out) r.wait();
  for (CommRequest& r : side_out) r.wait();
  for (CommRequest& r : side_back_out) r.wait();
}

}  // namespace hdp

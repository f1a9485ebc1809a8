#include "parallel/zero_optimizer.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>

#include "parallel/op_tracer.h"
#include "parallel/phase.h"

namespace hdp {
namespace {

// Buckets of about bucket_floats, cut at parameter boundaries and wherever the
// parameters' group changes (expert or not), in flat order. Cutting walks backwards
// because backward finalises gradients from the end.
std::vector<std::pair<int64_t, int64_t>> cut_buckets(std::vector<FlatParameter> params, int64_t flat_numel,
                                                     int64_t bucket_floats) {
  std::sort(params.begin(), params.end(),
            [](const FlatParameter& a, const FlatParameter& b) { return a.offset < b.offset; });
  std::vector<std::pair<int64_t, int64_t>> buckets;
  int64_t end = flat_numel;
  for (size_t i = params.size(); i-- > 0;) {
    const int64_t begin = i == 0 ? 0 : params[i].offset;
    const bool group_changes = i > 0 && params[i - 1].expert != params[i].expert;
    if (end - begin >= bucket_floats || begin == 0 || group_changes) {
      if (end > begin) buckets.emplace_back(begin, end);
      end = begin;
    }
  }
  if (end > 0) buckets.emplace_back(0, end);
  std::reverse(buckets.begin(), buckets.end());
  return buckets;
}

}  // namespace

AdamWStep adamw_step(const AdamWHyperparameters& adamw, double lr, int64_t step, float grad_scale) {
  AdamWStep s;
  s.lr = static_cast<float>(lr);
  s.beta1 = static_cast<float>(adamw.beta1);
  s.beta2 = static_cast<float>(adamw.beta2);
  s.eps = static_cast<float>(adamw.eps);
  s.weight_decay = static_cast<float>(adamw.weight_decay);
  s.step = step;
  s.grad_scale = grad_scale;
  return s;
}

ZeroAdamW::ZeroAdamW(std::vector<FlatParameter> parameters, int64_t flat_numel, const AdamWHyperparameters& adamw,
                     Communicator& hdp, Communicator& norm_group, int64_t bucket_floats, Device device,
                     Communicator* expert_dp)
    : parameters_(std::move(parameters)),
      adamw_(adamw),
      norm_group_(norm_group),
      arena_(Arena::counting(device, "optimizer")) {
  if (bucket_floats <= 0) throw std::invalid_argument("ZeRO: bucket size must be positive");
  sharded_ = false;
  for (auto [begin, end] : cut_buckets(parameters_, flat_numel, bucket_floats)) {
    Bucket b;
    b.begin = begin;
    b.end = end;
    // A bucket holds parameters of one group (cut_buckets): any of them tells which.
    bool expert = false;
    for (const FlatParameter& p : parameters_) {
      if (p.offset >= begin && p.offset < end) expert = p.expert;
    }
    b.group = expert && expert_dp != nullptr ? expert_dp : &hdp;
    const int r = b.group->rank(), n = b.group->size();
    sharded_ = sharded_ || n > 1;
    b.part_begin = begin + part_begin(end - begin, r, n);
    b.part_end = begin + part_begin(end - begin, r + 1, n);
    b.shard_offset = shard_numel_;
    shard_numel_ += b.part_end - b.part_begin;
    for (const FlatParameter& p : parameters_) {
      if (p.synced_later && p.offset < end && p.offset + p.numel > begin) b.synced_later = true;
    }
    // The pieces of parameters inside this rank's part.
    for (size_t i = 0; i < parameters_.size(); ++i) {
      const int64_t lo = std::max(b.part_begin, parameters_[i].offset);
      const int64_t hi = std::min(b.part_end, parameters_[i].offset + parameters_[i].numel);
      if (lo < hi) segments_.push_back(Segment{i, lo, hi - lo, b.shard_offset + (lo - b.part_begin)});
    }
    buckets_.push_back(std::move(b));
  }
  // Without sharding the reduced gradient is the gradient buffer itself (the
  // buckets tile it in order), so only the moments need memory.
  auto layout = [&](Arena& arena) {
    if (sharded_) grad_shard_ = arena.tensor({shard_numel_});
    m_ = arena.tensor({shard_numel_});
    v_ = arena.tensor({shard_numel_});
  };
  Arena sizing = Arena::counting(device, "optimizer");
  layout(sizing);
  arena_ = Arena(device, sizing.used(), "optimizer");
  layout(arena_);
  fill(m_, 0.0f);
  fill(v_, 0.0f);
}

void ZeroAdamW::start(Bucket& b) {
  if (b.started) return;
  b.started = true;
  if (!sharded_) return;
  b.request = b.group->reduce_scatter_async(Tensor(grads_.data + b.begin, {b.end - b.begin}, grads_.device),
                                        grad_shard_.rows(b.shard_offset, b.shard_offset + (b.part_end - b.part_begin)));
}

void ZeroAdamW::begin_reduction(const Tensor& grads) {
  grads_ = grads;
  if (!sharded_) grad_shard_ = Tensor(grads.data, {shard_numel_}, grads.device);
  for (Bucket& b : buckets_) b.started = false;
  next_to_start_ = buckets_.size();
}

void ZeroAdamW::gradients_ready(int64_t offset) {
  if (grads_.data == nullptr) throw std::logic_error("ZeRO: gradients_ready before begin_reduction");
  // Every rank of the group starts the buckets in the same order: from the end of
  // the buffer backwards, skipping those that wait for another collective.
  while (next_to_start_ > 0 && buckets_[next_to_start_ - 1].begin >= offset) {
    Bucket& b = buckets_[--next_to_start_];
    if (!b.synced_later) start(b);
  }
}

void ZeroAdamW::finish_gradients(DoubleTensor squared_norm) {
  if (grads_.data == nullptr) throw std::logic_error("ZeRO: finish_gradients before begin_reduction");
  {
    // Traced as the exposed part: the buckets started during backward overlap it.
    Phase phase(trace_ops::kGradsSync.data(), "grads-sync");
    if (phase.tracer()) phase.set_group(phase.tracer()->stage_group("grads"));
    for (auto it = buckets_.rbegin(); it != buckets_.rend(); ++it) start(*it);
    for (Bucket& b : buckets_) b.request.wait();
  }
  for (const Segment& s : segments_) {
    if (parameters_[s.parameter].counts_in_norm)
      sum_squares(grad_shard_.rows(s.state_offset, s.state_offset + s.length), squared_norm);
  }
}

double ZeroAdamW::gradient_norm(double local_sum_squares) {
  Phase phase(trace_ops::kGradNorm.data(), "gradient norm all-reduce");
  if (phase.tracer()) phase.set_group(phase.tracer()->world_group("norm"));
  return std::sqrt(norm_group_.all_reduce_sum(local_sum_squares));
}

void ZeroAdamW::step(Tensor params, double lr, float grad_scale, int64_t step, Tensor compute_params) {
  AdamWStep s = adamw_step(adamw_, lr, step, grad_scale);
  const float weight_decay = s.weight_decay;
  const bool refresh = compute_params.data != nullptr;
  std::optional<TraceSpan> update(std::in_place, trace_ops::kOptimizer.data());
  for (const Segment& seg : segments_) {
    s.weight_decay = parameters_[seg.parameter].weight_decay ? weight_decay : 0.0f;
    const int64_t a = seg.state_offset, b = seg.state_offset + seg.length;
    const int64_t begin = seg.flat_offset, end = seg.flat_offset + seg.length;
    adamw_update(params.rows(begin, end), grad_shard_.rows(a, b), m_.rows(a, b), v_.rows(a, b), s,
                 refresh ? compute_params.rows(begin, end) : Tensor());
  }
  update.reset();
  Phase phase(trace_ops::kParamsSync.data(), "parameter all-gather");
  if (phase.tracer()) phase.set_group(phase.tracer()->stage_group("params"));
  std::vector<CommRequest> gathers;
  gathers.reserve(buckets_.size());
  for (const Bucket& b : buckets_) {
    gathers.push_back(b.group->all_gather_async(Tensor(params.data + b.begin, {b.end - b.begin}, params.device)));
  }
  for (CommRequest& r : gathers) r.wait();
  // The other ranks' parts came in fp32: their compute copy is rounded here.
  if (refresh && sharded_) {
    for (const Bucket& b : buckets_) {
      copy(compute_params.rows(b.begin, b.part_begin), params.rows(b.begin, b.part_begin));
      copy(compute_params.rows(b.part_end, b.end), params.rows(b.part_end, b.end));
    }
  }
  grads_ = Tensor();
}

}  // namespace hdp

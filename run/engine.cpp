#include "run/engine.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>

#include "base/errors.h"
#include "kernels/ops.h"
#include "parallel/op_tracer.h"
#include "parallel/phase.h"
#include "parallel/progress.h"
#include "planning/activation_mix.h"
#include "planning/hdp_planner.h"
#include "planning/plan.h"
#include "model/lr_schedule.h"
#include "config/pipeline_layers.h"
#include "run/step_planner.h"
#include "planning/stage_split.h"

namespace hdp {

double slow_rank_factor(int rank) {
  const char* text = std::getenv("HDP_SLOW_RANK");
  if (text == nullptr || *text == '\0') return 1.0;
  int slow_rank = -1;
  double factor = 0;
  char rest = 0;
  if (std::sscanf(text, "%d:%lf%c", &slow_rank, &factor, &rest) != 2 || slow_rank < 0 || !(factor >= 1)) {
    throw InputError(std::string("HDP_SLOW_RANK=") + text +
                     ": expected RANK:FACTOR, a world rank and a slowdown of at least 1 (e.g. 3:2.5)");
  }
  return rank == slow_rank ? factor : 1.0;
}

int64_t largest_micro_batch(const Config& config) {
  const int64_t capacity = config.data.micro_batch_tokens;
  if (!may_offload(config) && !may_plan_recompute(config)) return capacity;
  // An offloaded (or recomputing) micro-batch holds pieces of one long sequence
  // (whole, or its ring chunks): at most the longest sequence, and at most what the
  // memory formula allows at the forced ratio, or for any mix the planners may choose,
  // under the step planner's settings. Their cost enters only as the recomputed
  // layer's share of a whole layer's a2 (recomputed_layer_share): a2 x share / a2,
  // recomputed_bytes_share for any a2 up to its rounding, and exactly so for an a2 of 1.
  CostModel layer;
  layer.a2 = 1;
  const int64_t mix_limit = largest_mix_tokens(activation_mix_settings(memory_planner_settings(config, layer, 0)));
  return std::max(largest_offloaded_micro_batch(config), std::min(mix_limit, config.data.max_seq_len));
}

int64_t largest_offloaded_micro_batch(const Config& config) {
  const int64_t capacity = config.data.micro_batch_tokens;
  if (!may_offload(config)) return capacity;
  const double ratio = config.offload.ratio >= 0 ? config.offload.ratio : 1.0;
  const int64_t memory_limit = max_micro_batch_tokens(capacity, smallest_stage_layers(config), ratio);
  return std::max(capacity, std::min(memory_limit, config.data.max_seq_len));
}

namespace {

// The model's recomputation: train.recompute_layers in every micro-batch, or planned
// per micro-batch up to most_planned_recompute_layers (none when the plans never
// recompute).
RecomputeOptions recompute_options(const Config& config) {
  const TrainConfig& t = config.train;
  if (!t.recompute_per_micro_batch) return {t.recompute, t.recompute_layers};
  return {t.recompute, most_planned_recompute_layers(config), true};
}

// A micro-batch without tokens (expert parallelism's padding, TrainingEngine::forward_backward).
PackedMicroBatch no_tokens() {
  PackedMicroBatch b;
  b.cu_seqlens = {0};
  return b;
}

}  // namespace

// The model stage as the pipeline executor sees it.
class TrainingEngine::Stage final : public PipelineStage {
 public:
  // count >= batches.size(): micro-batches past the pipeline's own are empty (expert
  // parallelism's padding, TrainingEngine::forward_backward). The micro-batches' losses
  // are added into loss_sum[0] on the device, in micro-batch order.
  // Forward and backward are timed on `busy` (device time, read at the step's end).
  Stage(LlamaModel& model, ZeroAdamW& optimizer, std::span<const PackedMicroBatch> batches, int count,
        float loss_scale, int poisoned, double slow_factor, DoubleTensor loss_sum, DeviceTimer& busy)
      : model_(model),
        optimizer_(optimizer),
        batches_(batches),
        count_(count),
        loss_scale_(loss_scale),
        poisoned_(poisoned),
        slow_factor_(slow_factor),
        loss_sum_(loss_sum),
        busy_(busy) {}

  int64_t rows(int i) const override { return model_.residual_rows(batch(i).num_tokens()); }
  void prepare(int i, int chunk, int slot) override {
    const PackedMicroBatch& b = batch(i);
    model_.set_batch(slot,
                     MicroBatchView{b.tokens, b.targets, b.positions, b.cu_seqlens,
                                    b.ring >= 0 ? &b.ring_layout : nullptr, b.offload_ratio, b.recompute_layers},
                     chunk);
  }
  // The stage's layers and, on the last stage, the loss together with its gradient
  // through the LM head: a fused linear cross-entropy (as Liger Kernel's, Hsu et al.
  // 2024), chunk by chunk over tokens, each chunk's logits turned into their gradient
  // in place, so the [tokens, vocab] logits never exist. backward() then starts at the
  // final norm.
  void forward(int i, int slot) override {
    Phase phase(trace_ops::kForwardCompute.data(), "forward", i);
    busy_.start();
    const auto t0 = Clock::now();
    constexpr bool with_loss_gradient = true;
    // Only a chunk holding the head has a loss to add (stages before it launch nothing here).
    if (i == poisoned_) {
      // A NaN loss scale seeds backward with NaN, as an overflow in the loss would, and
      // the loss is NaN too.
      constexpr float nan = std::numeric_limits<float>::quiet_NaN();
      if (const auto loss = model_.forward(slot, nan, with_loss_gradient)) add_inplace(loss_sum_, *loss);
      add_scalar(loss_sum_, nan);
    } else if (const auto loss = model_.forward(slot, loss_scale_, with_loss_gradient)) {
      add_inplace(loss_sum_, *loss);
    }
    if (model_.config().moe() && model_.partition().has_head) {
      // The last stage's statistics cover every layer of the micro-batch.
      int64_t predictions = 0;
      for (int32_t target : batch(i).targets) predictions += target >= 0;
      aux_sum_ += model_.aux_loss() * static_cast<double>(predictions);
      expert_tokens_.resize(model_.expert_tokens().size(), 0);
      for (size_t e = 0; e < expert_tokens_.size(); ++e) expert_tokens_[e] += model_.expert_tokens()[e];
    }
    stretch(t0);
    busy_.stop();
  }
  void backward(int i, int slot) override {
    Phase phase(trace_ops::kBackwardCompute.data(), "backward", i);
    busy_.start();
    const auto t0 = Clock::now();
    // Gradients become final during the last micro-batch's backward: reduce them
    // bucket by bucket while the rest of backward runs. With model chunks, each
    // chunk's: the last micro-batches' backwards run the chunks from the last down
    // (planning/pipeline_schedule.h), and the chunks' layers lie in the flat buffer
    // in chunk order, so the offsets reported only fall.
    if (i + 1 == count_) {
      model_.backward(slot, [this](int64_t offset) { optimizer_.gradients_ready(offset); });
    } else {
      model_.backward(slot);
    }
    stretch(t0);
    busy_.stop();
  }
  Tensor input_activation(int slot) override { return model_.input_activation(slot); }
  Tensor output_activation(int slot) override { return model_.output_activation(slot); }
  Tensor output_gradient(int slot) override { return model_.output_gradient(slot); }
  Tensor input_gradient(int slot) override { return model_.input_gradient(slot); }
  Tensor side_input(int slot) override { return model_.routing_input(slot); }
  Tensor side_output(int slot) override { return model_.routing_output(slot); }
  Tensor side_backward(int slot) override { return model_.routing_totals(slot); }
  double aux_sum() const { return aux_sum_; }
  const std::vector<int64_t>& expert_tokens() const { return expert_tokens_; }

 private:
  using Clock = std::chrono::steady_clock;
  const PackedMicroBatch& batch(int i) const {
    return i < static_cast<int>(batches_.size()) ? batches_[static_cast<size_t>(i)] : empty_;
  }
  // HDP_SLOW_RANK: this rank computes slow_factor_ times slower, as a slow GPU would.
  // A test knob, so it may wait: the sleep is a multiple of the device's time since t0.
  void stretch(Clock::time_point t0) const {
    if (slow_factor_ <= 1) return;
    synchronize(model_.device());
    std::this_thread::sleep_for((Clock::now() - t0) * (slow_factor_ - 1));
  }
  LlamaModel& model_;
  ZeroAdamW& optimizer_;
  std::span<const PackedMicroBatch> batches_;
  int count_;
  PackedMicroBatch empty_ = no_tokens();
  float loss_scale_;
  int poisoned_;  // forward_backward's poisoned_micro_batch
  double slow_factor_;  // slow_rank_factor()
  DoubleTensor loss_sum_;  // on the device: the step's sums (TrainingEngine::step_sums_)
  DeviceTimer& busy_;      // TrainingEngine::busy_timer_
  double aux_sum_ = 0;                  // Mixtral: aux loss x predictions, summed over micro-batches
  std::vector<int64_t> expert_tokens_;  // Mixtral: per expert, over layers and micro-batches
};

TrainingEngine::TrainingEngine(const Config& config, ProcessGroups& groups)
    : config_(config),
      groups_(groups),
      sums_arena_(config.train.device, Arena::kAlignment, "step sums"),
      step_sums_(sums_arena_.double_tensor({2})),
      busy_timer_(config.train.device) {
  const GridCoords& c = groups.coords();
  const int pp = config.parallel.pp, chunks = config.parallel.vpp;
  const std::vector<int64_t> virtual_layers = virtual_stage_layers(config);
  stage_layers_ = layers_per_stage(virtual_layers, pp);
  ModelPartition partition;
  partition.tp_rank = c.tp_rank;
  partition.tp_size = config.parallel.tp;
  // Chunk k of this stage is virtual stage k x pp + its stage (interleaved 1F1B).
  for (int k = 0; k < chunks; ++k) {
    const auto v = virtual_layers.begin() + k * pp + c.pp_rank;
    partition.chunks.push_back({std::accumulate(virtual_layers.begin(), v, int64_t{0}), *v});
  }
  partition.has_embedding = groups.first_stage();
  partition.has_head = groups.last_stage();
  partition.ep_rank = config.parallel.ep_rank(c);
  partition.ep_size = config.parallel.ep;
  partition.sequence_parallel = config.parallel.sequence_parallel;

  const int64_t capacity = config.data.micro_batch_tokens;
  LongSequenceOptions long_sequences;
  long_sequences.max_tokens = largest_micro_batch(config);
  long_sequences.offload = may_offload(config);
  long_sequences.offloaded_tokens = largest_offloaded_micro_batch(config);
  long_sequences.hdp = &groups.hdp();
  const Device device = config.train.device;
  pipeline_ = std::make_unique<PipelineExecutor>(groups.pp(), long_sequences.max_tokens, config.model.hidden_size,
                                                 device, chunks);
  model_ = std::make_unique<LlamaModel>(config.model, capacity, partition, pipeline_->slots(), &groups.tp(),
                                        long_sequences, device, config.train.precision, groups.ep(),
                                        recompute_options(config));
  const int64_t bucket_floats = std::max<int64_t>(1, config.parallel.bucket_mb * (1 << 20) / 4);
  optimizer_ = std::make_unique<ZeroAdamW>(flat_parameters(model_->parameter_table()),
                                           model_->flat_parameters().numel(), config.optim, groups.gradients(),
                                           groups.world(), bucket_floats, device, &groups.expert_dp());
  slow_factor_ = slow_rank_factor(groups.world().rank());
}

TrainingEngine::~TrainingEngine() = default;

StepResult TrainingEngine::forward_backward(std::span<const PackedMicroBatch> micro_batches, int poisoned_micro_batch) {
  StepResult result;
  int64_t local_predictions = 0;
  for (const PackedMicroBatch& mb : micro_batches) local_predictions += mb.num_predictions();
  // Token-level loss: every rank scales its gradients by the global count, so the
  // sum over ranks and micro-batches is the gradient of the global mean.
  {
    Phase phase(trace_ops::kTokenCount.data(), "token count all-reduce");
    if (phase.tracer()) phase.set_group(phase.tracer()->stage_group("count"));
    result.predictions = groups_.hdp().all_reduce_sum(local_predictions);
  }
  const float loss_scale = result.predictions > 0 ? 1.0f / static_cast<float>(result.predictions) : 0.0f;

  // Mixed precision: forward and backward read the bf16 copy of the fp32 master
  // weights, rounded here where anything but the last update changed them (a
  // checkpoint load); the update rounds what it writes itself (apply_update).
  model_->refresh_compute_weights();
  model_->zero_grad();
  optimizer_->begin_reduction(model_->flat_gradients());
  // Expert parallelism: the ranks of an expert-parallel group exchange tokens in every
  // MoE layer of every micro-batch (model/moe.h), so they run equally many; a pipeline
  // with fewer than its group's most pads with empty micro-batches, which only take
  // part in those exchanges. The group's pipelines all have the same stages, so every
  // stage pads alike.
  int64_t count = static_cast<int64_t>(micro_batches.size());
  if (Communicator* ep = groups_.ep()) {
    progress::Context context("micro-batch count all-reduce (expert parallelism)");
    ep->all_reduce(std::span<int64_t>(&count, 1), ReduceOp::Max);
  }
  fill(step_sums_, 0.0);
  busy_timer_.discard();  // what a step that ended in an exception left
  Stage stage(*model_, *optimizer_, micro_batches, static_cast<int>(count), loss_scale, poisoned_micro_batch,
              slow_factor_, step_sums_.rows(0, 1), busy_timer_);
  pipeline_->run(stage, static_cast<int>(count));

  // Tied embeddings split over the first and last stage: their two gradient parts
  // are summed before the data-parallel reduction.
  if (Communicator* tied = groups_.tied()) {
    // The group of this pipeline's first and last stage: a name no pipeline transfer uses.
    Phase phase(trace_ops::kTiedEmbedding.data(), "tied-embedding sync");
    if (phase.tracer()) phase.set_group(phase.tracer()->pipeline_group(true, -1, -1));
    const ParameterInfo& p = model_->parameter("model.embed_tokens.weight");
    tied->all_reduce(model_->gradient_tensor(p), ReduceOp::Sum);
  }
  optimizer_->finish_gradients(step_sums_.rows(1, 2));
  // The step's one host read (kernels/ops.h): its loss and its gradient's squared norm
  // together, which the finite check (run/numerical_guard.h) then reads on the host.
  // Their all-reduces follow on the host as before, in the same order.
  std::array<double, 2> host_sums{};  // loss, squared gradient norm
  read_back(step_sums_, host_sums);
  // The forward and backward timings' events have run by now: reading them waits for nothing.
  result.busy_ms = busy_timer_.take_ms();
  result.grad_norm = optimizer_->gradient_norm(host_sums[1]);

  // The loss is known on the last stage; tp ranks hold identical copies.
  const bool counts_loss = groups_.last_stage() && groups_.coords().tp_rank == 0;
  double loss_sum = 0;
  {
    Phase phase(trace_ops::kLoss.data(), "loss all-reduce");
    if (phase.tracer()) phase.set_group(phase.tracer()->world_group("loss"));
    loss_sum = groups_.world().all_reduce_sum(counts_loss ? host_sums[0] : 0.0);
  }
  result.loss = result.predictions > 0 ? loss_sum / static_cast<double>(result.predictions) : 0.0;
  if (config_.model.moe()) {
    // Each pipeline's last stage holds its micro-batches' whole statistics (tp ranks
    // identical copies, counted once): summed over the world, aux_loss is the mean of
    // the micro-batches' losses weighted by their predictions and expert_tokens the
    // step's choices per expert, whatever the layout.
    const int64_t E = config_.model.num_experts;
    std::vector<double> sums(E + 1, 0.0);
    if (counts_loss) {
      sums[0] = stage.aux_sum();
      for (int64_t e = 0; e < E && e < static_cast<int64_t>(stage.expert_tokens().size()); ++e)
        sums[e + 1] = static_cast<double>(stage.expert_tokens()[e]);
    }
    {
      progress::Context context("MoE statistics all-reduce");
      groups_.world().all_reduce(std::span<double>(sums), ReduceOp::Sum);
    }
    result.aux_loss = result.predictions > 0 ? sums[0] / static_cast<double>(result.predictions) : 0.0;
    result.expert_tokens.resize(E);
    for (int64_t e = 0; e < E; ++e) result.expert_tokens[e] = static_cast<int64_t>(std::llround(sums[e + 1]));
  }
  pending_grad_norm_ = result.grad_norm;
  return result;
}

void TrainingEngine::apply_update(double lr, int64_t update_number) {
  if (!pending_grad_norm_) throw std::logic_error("TrainingEngine: apply_update without a forward_backward before it");
  const float clip = clip_factor(*pending_grad_norm_, config_.optim.grad_clip);
  pending_grad_norm_.reset();
  // Mixed precision: the update also rounds what it writes into the bf16 copy, so the
  // next step's refresh has nothing to do.
  const bool mixed = config_.train.precision == DType::BF16;
  optimizer_->step(model_->flat_parameters(), lr, clip, update_number,
                   mixed ? model_->compute_parameters() : Tensor());
  if (mixed) model_->compute_parameters_written();
}

MemoryReport TrainingEngine::memory() const {
  MemoryReport m;
  m.parameters = model_->parameter_bytes();
  m.gradients = model_->gradient_bytes();
  m.optimizer = optimizer_->state_bytes();
  m.activations = model_->activation_bytes();
  m.pipeline = pipeline_->buffer_bytes();
  m.ring = model_->ring_buffer_bytes();
  m.host_pool = model_->activation_usage().host_pool_bytes;
  return m;
}

}  // namespace hdp

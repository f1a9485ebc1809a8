#include "whatif/step_simulation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "planning/pipeline_schedule.h"
#include "planning/ring_layout.h"
#include "planning/stage_split.h"
#include "spec/model_checks.h"

namespace hdp {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

}  // namespace

ModelCosts model_costs(const ModelShape& m, int tp, int pp, RecomputeMode recompute, bool sequence_parallel) {
  validate_model_shape(m);
  validate_split(m, tp, pp);
  ModelCosts c;
  c.layer_parameters = layer_parameters(m);
  c.embedding_parameters = embedding_parameters(m);
  c.head_parameters = head_parameters(m, pp);
  c.layer_matmul_flops_per_token = layer_matmul_flops_per_token(m, tp);
  c.attention_flops_per_token_pair = attention_flops_per_token_pair(m, tp);
  c.head_flops_per_token = head_flops_per_token(m, tp);
  c.saved_bytes_per_token = saved_bytes_per_token(m, tp, kActivationBytes, recompute, true, sequence_parallel);
  c.kv_bytes_per_token = kv_bytes_per_token(m, tp, kActivationBytes);
  c.boundary_bytes_per_token = boundary_bytes_per_token(m, kActivationBytes) / (sequence_parallel ? tp : 1);
  c.expert_parameters = expert_parameters(m);
  if (m.experts > 1) {
    c.all_to_all_bytes_per_token =
        static_cast<double>(m.hidden) * kActivationBytes * static_cast<double>(m.experts_per_token);
    c.all_to_all_count_bytes = 4.0 * static_cast<double>(m.experts);  // fp32 counts, as model/moe.h sends them
  }
  return c;
}

void validate_expert_parallel(const ModelShape& m, int hdp, int ep) {
  if (const std::optional<ModelIssue> issue = layout_issue(m, ParallelDegrees{1, 1, hdp, ep}))
    throw std::invalid_argument(describe_issue(*issue));
}

std::vector<int> expert_parallel_candidates(const ModelShape& m, int hdp) {
  std::vector<int> eps;
  for (int ep = 1; ep <= hdp; ++ep)
    if (hdp % ep == 0 && m.experts % ep == 0) eps.push_back(ep);
  return eps;
}

namespace {

// One stage's parameters on one GPU: outside the experts (its layers' share of
// 1 / tp, the embedding on the first stage, the head on the last) and in its experts
// (a further 1 / ep).
struct StageParameters {
  double dense = 0, experts = 0;
  double total() const { return dense + experts; }
};

StageParameters stage_parameters_per_gpu(const ModelCosts& c, int tp, int ep, int stage, int pp, int64_t layers) {
  const double l = static_cast<double>(layers);
  StageParameters p;
  p.dense = l * (c.layer_parameters - c.expert_parameters);
  if (stage == 0) p.dense += c.embedding_parameters;
  if (stage == pp - 1) p.dense += c.head_parameters;
  p.dense /= tp;
  p.experts = l * c.expert_parameters / tp / ep;
  return p;
}

// The link of a collective over GPUs first ... last: NVLink when one node holds them all.
struct GroupLink {
  double bytes_per_s = 0, latency_s = 0;
};
GroupLink group_link(const HardwareProfile& hw, long first, long last) {
  return {hw.link_bytes_per_s(first, last), hw.link_latency_s(first, last)};
}

// The layers of each stage from those of each virtual stage (pp x vpp of them; pp with
// one chunk per stage). Throws std::invalid_argument unless the count matches.
std::vector<int64_t> checked_stage_layers(const char* what, const ParallelDegrees& d,
                                          std::span<const int64_t> virtual_stage_layers) {
  if (d.pp < 1 || d.vpp < 1 || (d.vpp > 1 && d.pp < 2) ||
      static_cast<int64_t>(virtual_stage_layers.size()) != int64_t{d.pp} * d.vpp)
    throw std::invalid_argument(std::string(what) + ": " + str(static_cast<int64_t>(virtual_stage_layers.size())) +
                                " virtual stage layer counts for pp " + str(d.pp) + " x vpp " + str(d.vpp));
  return layers_per_stage(virtual_stage_layers, d.pp);
}

}  // namespace

MemoryBudget memory_budget(const ModelShape& model, const HardwareProfile& hw, const ParallelDegrees& degrees,
                           std::span<const int64_t> virtual_stage_layers, int ep, RecomputeMode recompute,
                           bool sequence_parallel) {
  validate_hardware(hw);
  const int pp = degrees.pp;
  const std::vector<int64_t> stage_layers = checked_stage_layers("memory_budget", degrees, virtual_stage_layers);
  if (degrees.hdp < 1) throw std::invalid_argument("hdp must be at least 1");
  validate_expert_parallel(model, degrees.hdp, ep);
  const ModelCosts c = model_costs(model, degrees.tp, pp, recompute, sequence_parallel);
  MemoryBudget b;
  double best = std::numeric_limits<double>::infinity();
  for (int s = 0; s < pp; ++s) {
    // Weights and gradients of this GPU's experts; the optimizer state of all
    // parameters / tp over hdp (an expert's over the hdp / ep ranks holding its 1 / ep).
    const double p = stage_parameters_per_gpu(c, degrees.tp, ep, s, pp, stage_layers[s]).total();
    const double all = stage_parameters_per_gpu(c, degrees.tp, 1, s, pp, stage_layers[s]).total();
    const double fixed = p * (2 + 4) + all * 12 / degrees.hdp;
    const double free = hw.hbm_bytes - hw.reserved_bytes - fixed;
    b.parameters_per_gpu.push_back(p);
    b.static_bytes.push_back(fixed);
    b.free_bytes.push_back(free);
    // In flight: pipeline_slots (micro-batch, chunk) pairs, each at most the stage's
    // largest chunk (its whole range with one chunk).
    int64_t chunk = 0;
    for (int v = s; v < pp * degrees.vpp; v += pp) chunk = std::max(chunk, virtual_stage_layers[v]);
    const double tokens = free / (static_cast<double>(pipeline_slots(s, pp, degrees.vpp)) *
                                  static_cast<double>(chunk) * c.saved_bytes_per_token);
    if (!(tokens >= 1)) {
      throw std::invalid_argument(
          "the model does not fit: stage " + str(s) + "'s weights, gradients and optimizer shard take " +
          std::to_string(fixed / 1e9) + " GB per GPU of " + std::to_string(hw.hbm_bytes / 1e9) + " GB (" +
          std::to_string(hw.reserved_bytes / 1e9) + " GB reserved), leaving no room for activations");
    }
    if (tokens < best) {
      best = tokens;
      b.limiting_stage = s;
    }
  }
  b.capacity = static_cast<int64_t>(std::floor(best));
  return b;
}

StepCosts make_step_costs(const ModelShape& model, const HardwareProfile& hw, const ParallelDegrees& degrees,
                          std::span<const int64_t> virtual_stage_layers, int ep, RecomputeMode recompute,
                          bool sequence_parallel) {
  validate_hardware(hw);
  const int pp = degrees.pp;
  const std::vector<int64_t> stage_layers = checked_stage_layers("make_step_costs", degrees, virtual_stage_layers);
  validate_expert_parallel(model, degrees.hdp, ep);
  const ModelCosts c = model_costs(model, degrees.tp, pp, recompute, sequence_parallel);
  const double rate = hw.flops_per_second();
  StepCosts k;
  k.cost = analytic_cost_model(model, degrees.tp, c.saved_bytes_per_token, rate, hw.pcie_bytes_per_s, recompute);
  k.embedding_seconds_per_token = 0;  // a table lookup and its scatter-add: negligible
  k.head_seconds_per_token = c.head_flops_per_token / rate;
  k.stage_layers = stage_layers;
  if (degrees.vpp > 1) k.chunk_layers.assign(virtual_stage_layers.begin(), virtual_stage_layers.end());
  k.tp = degrees.tp;
  k.hdp = degrees.hdp;
  k.hardware = hw;
  k.kv_bytes_per_token = c.kv_bytes_per_token;
  k.boundary_bytes_per_token = c.boundary_bytes_per_token;
  k.ep = ep;
  k.all_to_all_bytes_per_token = c.all_to_all_bytes_per_token;
  k.all_to_all_count_bytes = c.all_to_all_count_bytes;
  // An ep group is ep consecutive hdp ranks of one stage: tp x ep consecutive GPUs
  // from a multiple of tp x ep, so every group sits alike; group 0 of stage 0 stands for all.
  const GroupLink a2a = group_link(hw, 0, static_cast<long>(degrees.tp) * ep - 1);
  k.all_to_all_bytes_per_s = a2a.bytes_per_s;
  k.all_to_all_latency_s = a2a.latency_s;
  for (int s = 0; s < pp; ++s) {
    const StageParameters p = stage_parameters_per_gpu(c, degrees.tp, ep, s, pp, stage_layers[s]);
    // With ep = 1 every parameter is synchronised over all hdp ranks.
    const double together = ep > 1 ? p.dense : p.total();
    k.gradient_bytes.push_back(4 * together);
    k.parameter_bytes.push_back(2 * together);
    if (ep > 1) {
      k.expert_gradient_bytes.push_back(4 * p.experts);
      k.expert_parameter_bytes.push_back(2 * p.experts);
    }
    // The shard: 1 / hdp of the dense part, 1 / (hdp / ep) of this GPU's experts.
    const double shard = p.dense / degrees.hdp + p.experts * ep / degrees.hdp;
    k.optimizer_seconds.push_back(32 * shard / hw.hbm_bytes_per_s);
  }
  return k;
}

double all_to_all_seconds_per_token(const StepCosts& k) {
  if (k.ep <= 1 || k.all_to_all_bytes_per_token <= 0) return 0;
  return 4 * k.all_to_all_bytes_per_token * (k.ep - 1) / k.ep / k.all_to_all_bytes_per_s;
}

GradientSync gradient_sync(const StepCosts& k, int s) {
  const HardwareProfile& hw = k.hardware;
  const int hdp = k.hdp, tp = k.tp, ep = k.ep;
  const ParallelDegrees grid{tp, k.pp(), hdp};
  // The GPU of tp rank 0 of hdp rank r at stage s, in the trainer's rank order.
  auto gpu = [&](int r) { return static_cast<long>(grid.rank({0, s, r})); };
  GradientSync g;
  const GroupLink all = group_link(hw, gpu(0), gpu(hdp - 1) + tp - 1);
  g.reduce_scatter = sim::ring_reduce_scatter_seconds(k.gradient_bytes[s], hdp, all.bytes_per_s, all.latency_s);
  g.all_gather = sim::ring_all_gather_seconds(k.parameter_bytes[s], hdp, all.bytes_per_s, all.latency_s);
  g.optimizer = k.optimizer_seconds[s];
  if (ep > 1) {
    // Every ep-group position's ranks span the same GPUs (but for an offset of j x
    // tp): position 0 stands for all.
    const GroupLink link = group_link(hw, gpu(0), gpu(hdp - ep) + tp - 1);
    g.expert_reduce_scatter =
        sim::ring_reduce_scatter_seconds(k.expert_gradient_bytes[s], hdp / ep, link.bytes_per_s, link.latency_s);
    g.expert_all_gather =
        sim::ring_all_gather_seconds(k.expert_parameter_bytes[s], hdp / ep, link.bytes_per_s, link.latency_s);
  }
  return g;
}

namespace {

constexpr int kCompute = 0, kFwdSend = 1, kFwdRecv = 2, kBwdSend = 3, kBwdRecv = 4, kDp = 5, kD2h = 6, kH2d = 7;
const char* const kStreamNames[] = {"compute", "pp-fwd-send", "pp-fwd-recv", "pp-bwd-send",
                                    "pp-bwd-recv", "dp", "d2h", "h2d"};
constexpr int kStreams = 8;
constexpr sim::OpId kNone = std::numeric_limits<sim::OpId>::max();

// One micro-batch's work on one GPU per layer, split into forward and backward.
struct LayerWork {
  double forward = 0, backward = 0;  // seconds, communication stalls of ring steps included
  double pure = 0;                   // forward + backward compute alone, every kernel at the large-kernel rate (MFU)
  double attention_bytes = 0;        // ring traffic sent by this GPU
};

// Throws std::invalid_argument unless the plan and the costs describe one step.
void check_step_inputs(const StepPlan& plan, std::span<const int64_t> lengths, const StepCosts& k) {
  const int pp = k.pp();
  if (pp < 1) throw std::invalid_argument("simulate_step: no pipeline stages");
  if (!k.chunk_layers.empty() &&
      (pp < 2 || k.chunk_layers.size() % pp != 0 || layers_per_stage(k.chunk_layers, pp) != k.stage_layers))
    throw std::invalid_argument("simulate_step: the chunks' layers must be vpp per stage, over at least two stages, "
                                "and sum to each stage's layers");
  if (static_cast<int>(plan.ranks.size()) != k.hdp)
    throw std::invalid_argument("simulate_step: the plan has " + str(static_cast<int64_t>(plan.ranks.size())) +
                                " ranks, the costs " + str(k.hdp));
  if (k.gradient_bytes.size() != static_cast<size_t>(pp) || k.parameter_bytes.size() != static_cast<size_t>(pp) ||
      k.optimizer_seconds.size() != static_cast<size_t>(pp))
    throw std::invalid_argument("simulate_step: per-stage gradient, parameter and optimizer figures must have pp entries");
  if (k.ep < 1 || k.hdp % k.ep != 0)
    throw std::invalid_argument("simulate_step: ep " + str(k.ep) + " does not divide hdp " + str(k.hdp));
  const size_t expert_stages = k.ep > 1 ? static_cast<size_t>(pp) : 0;
  if (k.expert_gradient_bytes.size() != expert_stages || k.expert_parameter_bytes.size() != expert_stages)
    throw std::invalid_argument("simulate_step: per-stage expert gradient and parameter figures must have pp entries "
                                "with ep > 1 and none with ep 1");
  if (k.ep > 1 && k.all_to_all_bytes_per_token > 0 && !(k.all_to_all_bytes_per_s > 0))
    throw std::invalid_argument("simulate_step: the all-to-all bandwidth must be positive");
  if (!(k.forward_fraction > 0 && k.forward_fraction < 1))
    throw std::invalid_argument("simulate_step: forward_fraction must be in (0, 1)");
  for (const auto& mbs : plan.ranks)
    for (const PlannedMicroBatch& mb : mbs)
      for (const PlannedPiece& p : mb.pieces)
        if (p.sequence < 0 || static_cast<size_t>(p.sequence) >= lengths.size() ||
            (p.ring >= 0 && static_cast<size_t>(p.ring) >= plan.rings.size()))
          throw std::invalid_argument("simulate_step: a piece names sequence " + str(p.sequence) + " / ring " +
                                      str(p.ring) + " outside the batch");
}

// The operation graph of one step, built in the order simulate_step adds its
// parts: every process's compute (with offload copies), the pipeline transfers,
// the gradient synchronisation; then replayed.
class StepGraphBuilder {
 public:
  StepGraphBuilder(const StepPlan& plan, std::span<const int64_t> lengths, const StepCosts& costs)
      : plan_(plan), lengths_(lengths), k_(costs), grid_{costs.tp, costs.pp(), costs.hdp},
        vpp_(costs.vpp()),
        virtual_stages_(grid_.pp * vpp_),
        f_(costs.forward_fraction) {
    for (int r = 0; r < grid_.hdp; ++r) first_.push_back(first_.back() + plan.ranks[r].size());
    const size_t slots = first_.back() * virtual_stages_;
    forward_ops_.assign(slots, kNone);
    backward_ops_.assign(slots, kNone);
    forward_end_ops_.assign(slots, kNone);
    backward_end_ops_.assign(slots, kNone);
    d2h_ops_.assign(slots, kNone);
    h2d_ops_.assign(slots, kNone);
    const size_t processes = static_cast<size_t>(grid_.hdp) * grid_.pp;
    last_compute_.assign(processes, kNone);
    last_copy_.assign(processes, kNone);
    ring_group_.assign(plan.rings.size() * virtual_stages_ * 2, -1);
    sum_pieces();
    measure_rings();
    time_ring_groups();
    add_streams();
  }

  // Compute operations of hdp rank r at stage s in its pipeline order (1F1B, or
  // interleaved over its chunks), with offload copies beside them.
  void add_compute(int r, int s);
  // The activation sends of stage s to the next (forward, in s's order; under
  // interleaving stage pp - 1 sends to stage 0) and the gradient sends back to s
  // (backward, in the next stage's order): each stream's operations in the order
  // its stage runs them.
  void add_pipeline_transfers(int r, int s);
  // Stage s's gradient reduce-scatter, optimizer and parameter all-gather (ZeRO-1 over
  // hdp; with ep > 1 the experts' over the hdp / ep ranks that hold them).
  void add_gradient_sync(int s);
  StepSimulation replay(bool keep_graph);

 private:
  // The GPU of tp rank 0 of hdp rank r at stage s, in the trainer's rank order.
  long gpu(int r, int s) const { return static_cast<long>(grid_.rank({0, s, r})); }
  int stream(int r, int s, int t) const {
    return streams_[(static_cast<size_t>(r) + static_cast<size_t>(grid_.hdp) * s) * kStreams + t];
  }
  // Index of (hdp rank r, micro-batch i, virtual stage v) in the per-operation tables.
  size_t at(int r, int v, int i) const { return (first_[r] + static_cast<size_t>(i)) * virtual_stages_ + v; }
  // Per ring and stage (its members' GPUs), and per ring and virtual stage (its layers).
  size_t ring_at(size_t g, int s) const { return g * grid_.pp + s; }
  size_t ring_chunk_at(size_t g, int v) const { return g * virtual_stages_ + v; }
  int stage_of(int v) const { return v % grid_.pp; }
  double layers_of(int v) const {
    return static_cast<double>(k_.chunk_layers.empty() ? k_.stage_layers[v] : k_.chunk_layers[v]);
  }

  // What a micro-batch's pieces add up to, per layer: summed once (sum_pieces), since
  // every stage and both directions of a micro-batch read them, and a static plan at
  // thousands of GPUs holds millions of pieces.
  struct PieceSums {
    double tokens = 0;
    double linear = 0;        // GEMMs and local attention at the large-kernel rate
    double small = 0;         // what small kernels add to it
    double rerun = 0;         // recomputation of the costs' mode, in backward
    double mixed_rerun = 0;   // one layer's rerun under StepCosts::recomputed
  };
  void sum_pieces();
  const PieceSums& sums(int r, int i) const { return sums_[first_[r] + static_cast<size_t>(i)]; }
  double tokens(int r, int i) const { return sums(r, i).tokens; }
  void measure_rings();
  void time_ring_groups();
  void add_streams();
  LayerWork layer_work(int r, int i, int s) const;
  // The rerun of micro-batch i's recomputed layers among `layers` (StepCosts::recomputed), in backward.
  double mix_rerun(int r, int i, double layers) const;
  // What ring g adds to a member's layer at a stage whose ring steps transfer for x[t].
  LayerWork ring_work(size_t g, const std::vector<double>& x) const;
  // Forward + backward seconds of the embedding (first virtual stage) and the head (last).
  double extra_seconds(int r, int i, int v) const;
  int ring_group_of(size_t g, int v, bool forward);
  // The expert all-to-alls of micro-batch op after its compute on the dp stream
  // (two per layer forward, four backward); kNone for a dense model, ep 1 or no tokens.
  sim::OpId add_all_to_all(int r, int s, const PipelineOp& op, sim::OpId compute);
  // Offload copy of micro-batch i beside its forward (d2h) or backward (h2d);
  // kNone when it offloads nothing.
  sim::OpId add_offload_copy(int r, int s, const PipelineOp& op, sim::OpId previous_compute);

  const StepPlan& plan_;
  std::span<const int64_t> lengths_;
  const StepCosts& k_;
  const ParallelDegrees grid_;
  const int vpp_, virtual_stages_;  // model chunks per stage; pp x vpp
  const double f_;  // forward's share of compute
  std::vector<size_t> first_{0};  // micro-batch offsets: (rank r, micro-batch i) is first_[r] + i
  std::vector<PieceSums> sums_;   // per micro-batch, at first_[r] + i
  // Per ring and stage (ring_at): what the ring adds to a member's layer (measure_rings); per
  // ring and virtual stage (ring_chunk_at): its forward and backward time (its slowest member's).
  std::vector<LayerWork> ring_work_;
  std::vector<double> ring_fwd_, ring_bwd_;
  std::vector<double> ring_step_;       // per ring: one member's one computing ring step
  // per ring: the same step at the rate of its attention blocks' size (HardwareProfile::attention_seconds)
  std::vector<double> ring_step_busy_;
  std::vector<double> ring_sent_rows_;  // per ring: key rows a member sends per pass, on average
  StepSimulation out_;
  sim::OpGraph graph_;
  const uint32_t L_fwd = graph_.label("forward"), L_bwd = graph_.label("backward");
  const uint32_t L_ring_fwd = graph_.label("ring forward"), L_ring_bwd = graph_.label("ring backward");
  const uint32_t L_send_act = graph_.label("send activation"), L_recv_act = graph_.label("recv activation");
  const uint32_t L_send_grad = graph_.label("send gradient"), L_recv_grad = graph_.label("recv gradient");
  const uint32_t L_d2h = graph_.label("offload d2h"), L_h2d = graph_.label("offload h2d");
  const uint32_t L_rs = graph_.label("grad reduce-scatter"), L_opt = graph_.label("optimizer");
  const uint32_t L_ag = graph_.label("param all-gather");
  const uint32_t L_a2a_fwd = graph_.label("expert all-to-all forward");
  const uint32_t L_a2a_bwd = graph_.label("expert all-to-all backward");
  const uint32_t L_ers = graph_.label("expert grad reduce-scatter"), L_eag = graph_.label("expert param all-gather");
  std::vector<int> streams_;
  std::vector<int> ring_group_;
  std::vector<sim::OpId> forward_ops_, backward_ops_, d2h_ops_, h2d_ops_;  // at(r, v, i)
  // The last operation of each forward and backward: its all-to-all, else its compute.
  std::vector<sim::OpId> forward_end_ops_, backward_end_ops_;
  std::vector<sim::OpId> last_compute_, last_copy_;                        // per process
  std::vector<sim::OpId> reduce_scatter_ops_;
};

void StepGraphBuilder::measure_rings() {
  const int pp = grid_.pp;
  const HardwareProfile& hw = k_.hardware;
  const size_t R = plan_.rings.size();
  ring_work_.assign(R * pp, {});
  ring_step_.resize(R);
  ring_step_busy_.resize(R);
  ring_sent_rows_.resize(R);
  for (size_t g = 0; g < R; ++g) {
    const Ring& ring = plan_.rings[g];
    const int n = static_cast<int>(ring.ranks.size());
    double attention = 0, attention_busy = 0;
    std::vector<int64_t> ring_lengths;
    for (int64_t q : ring.sequences) {
      const double a = k_.cost.a1 * k_.cost.attention_term(lengths_[q]);
      attention += a;
      // A member's block holds its 1 / n of the sequence's rows.
      attention_busy += hw.attention_seconds(a, static_cast<double>(lengths_[q]) / std::max(n, 1));
      ring_lengths.push_back(lengths_[q]);
    }
    // What the trainer's ring sends (parallel/ring_attention.h): at step t member p
    // receives from member p - t the key rows it reads (planning/ring_layout.h), none
    // under a window that does not reach. Members run in lock step: a step moves the
    // most any member receives, over the slowest of its links.
    const RingStepRows traffic = ring_step_rows(ring_lengths, n, k_.cost.window);
    const std::vector<int64_t>& rows = traffic.most;  // per step t: the most rows a member receives
    int active = 1;  // steps that compute: step 0 (own rows) and every step with rows
    for (int t = 1; t < n; ++t)
      if (rows[t] > 0) ++active;
    ring_step_[g] = n > 0 ? attention / (static_cast<double>(n) * active) : 0;
    ring_step_busy_[g] = n > 0 ? attention_busy / (static_cast<double>(n) * active) : 0;
    ring_sent_rows_[g] = n > 0 ? static_cast<double>(traffic.total) / n : 0;
    std::vector<long> gpus(static_cast<size_t>(n)), nodes(static_cast<size_t>(n));
    for (int s = 0; s < pp; ++s) {
      for (int p = 0; p < n; ++p) {
        gpus[p] = gpu(ring.ranks[p], s);
        nodes[p] = gpus[p] / hw.gpus_per_node;
      }
      // Members on nodes of their own (a tp group fills a node) link across nodes only.
      std::vector<long> sorted = nodes;
      std::sort(sorted.begin(), sorted.end());
      const bool own_nodes = std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
      std::vector<double> xfer(n + 1, 0.0);  // xfer[t]: step t's transfer; 0 at t = 0 and t = n
      for (int t = 1; t < n; ++t) {
        if (rows[t] == 0) continue;
        // A link is within a node or across nodes: the step's slowest link and
        // longest latency are those of the kinds its pairs use (a pair of each).
        int within = -1, across = own_nodes ? 0 : -1;
        for (int p = 0; !own_nodes && p < n && (within < 0 || across < 0); ++p)
          (nodes[p >= t ? p - t : p - t + n] == nodes[p] ? within : across) = p;
        double bw = std::numeric_limits<double>::infinity(), lat = 0;
        for (int p : {within, across}) {
          if (p < 0) continue;
          const long a = gpus[(p - t + n) % n], b = gpus[p];
          bw = std::min(bw, hw.link_bytes_per_s(a, b));
          lat = std::max(lat, hw.link_latency_s(a, b));
        }
        xfer[t] = lat + k_.kv_bytes_per_token * static_cast<double>(rows[t]) / bw;
      }
      ring_work_[ring_at(g, s)] = ring_work(g, xfer);
    }
  }
}

// Ring attention (Liu et al., 2023) as the trainer runs it: n steps of one member's
// rows against each member's key rows, the next step's rows arriving during the
// current step's compute, so a step takes the longer of the two; a step without rows
// neither computes nor waits. Backward sends each step's key/value gradients back
// to their owner after that step's compute. xfer[t]: step t's transfer.
LayerWork StepGraphBuilder::ring_work(size_t g, const std::vector<double>& x) const {
  const int n = static_cast<int>(plan_.rings[g].ranks.size());
  const double step = ring_step_[g], busy = ring_step_busy_[g];
  const double sequences = static_cast<double>(plan_.rings[g].sequences.size());
  LayerWork w;
  w.forward = f_ * k_.cost.g * sequences;
  w.backward = (1 - f_) * k_.cost.g * sequences;
  w.pure = k_.cost.g * sequences;
  for (int t = 0; t < n; ++t) {
    if (t > 0 && x[t] == 0) continue;  // nothing to read at this step
    w.pure += step;
    w.forward += std::max(f_ * busy, x[t + 1]);
    w.backward += std::max((1 - f_) * busy + x[t], x[t + 1]);
  }
  // Forward K/V, backward K/V and backward K/V gradients: the same rows three times.
  w.attention_bytes = 3 * k_.kv_bytes_per_token * ring_sent_rows_[g];
  return w;
}

// A ring's members run in lock step: each ring operation takes the slowest member's time.
void StepGraphBuilder::time_ring_groups() {
  ring_fwd_.assign(plan_.rings.size() * virtual_stages_, 0.0);
  ring_bwd_.assign(plan_.rings.size() * virtual_stages_, 0.0);
  for (int v = 0; v < virtual_stages_; ++v) {
    const double l = layers_of(v);
    for (int r = 0; r < grid_.hdp; ++r)
      for (int i = 0; i < static_cast<int>(plan_.ranks[r].size()); ++i) {
        const PlannedMicroBatch& mb = plan_.ranks[r][i];
        if (mb.ring < 0) continue;
        const LayerWork w = layer_work(r, i, stage_of(v));
        const double e = extra_seconds(r, i, v);
        const size_t g = ring_chunk_at(static_cast<size_t>(mb.ring), v);
        ring_fwd_[g] = std::max(ring_fwd_[g], l * w.forward + f_ * e);
        ring_bwd_[g] = std::max(ring_bwd_[g], l * w.backward + (1 - f_) * e + mix_rerun(r, i, l));
      }
  }
}

void StepGraphBuilder::add_streams() {
  out_.processes = grid_.hdp * grid_.pp;
  streams_.resize(static_cast<size_t>(grid_.hdp) * grid_.pp * kStreams);
  for (int s = 0; s < grid_.pp; ++s)
    for (int r = 0; r < grid_.hdp; ++r) {
      const int proc = r + grid_.hdp * s;
      for (int t = 0; t < kStreams; ++t)
        streams_[static_cast<size_t>(proc) * kStreams + t] = graph_.add_stream(proc, kStreamNames[t]);
      out_.process_names.push_back("stage " + std::to_string(s) + " hdp " + std::to_string(r) + " (GPUs " +
                                   std::to_string(gpu(r, s)) + "-" + std::to_string(gpu(r, s) + grid_.tp - 1) + ")");
    }
}

void StepGraphBuilder::sum_pieces() {
  const HardwareProfile& hw = k_.hardware;
  sums_.reserve(first_.back());
  for (const auto& mbs : plan_.ranks)
    for (const PlannedMicroBatch& mb : mbs) {
      // The layer's GEMMs run over the micro-batch's tokens, a local sequence's
      // attention over its own rows.
      PieceSums sum;
      for (const PlannedPiece& p : mb.pieces) {
        sum.tokens += static_cast<double>(p.length);
        if (mb.recompute_layers > 0) sum.mixed_rerun += k_.recomputed.recompute_seconds(p.length, p.ring >= 0);
        if (p.ring < 0) {
          sum.linear += k_.cost.compute_seconds(p.length);
          sum.rerun += k_.cost.recompute_seconds(p.length, false);
          const double attention = k_.cost.a1 * k_.cost.attention_term(p.length);
          sum.small += hw.attention_seconds(attention, static_cast<double>(p.length)) - attention;
        } else {
          sum.linear += k_.cost.b1 * static_cast<double>(p.length);
          sum.rerun += k_.cost.recompute_seconds(p.length, true);
        }
      }
      sum.small += hw.gemm_seconds(k_.cost.b1 * sum.tokens, sum.tokens) - k_.cost.b1 * sum.tokens;
      sums_.push_back(sum);
    }
}

LayerWork StepGraphBuilder::layer_work(int r, int i, int s) const {
  const PieceSums& sum = sums(r, i);
  LayerWork w;
  w.forward = f_ * (sum.linear + sum.small);
  w.backward = (1 - f_) * (sum.linear + sum.small) + sum.rerun;
  w.pure = sum.linear + sum.rerun;
  const int ring = plan_.ranks[r][i].ring;
  if (ring < 0) return w;
  const LayerWork& x = ring_work_[ring_at(static_cast<size_t>(ring), s)];
  w.forward += x.forward;
  w.backward += x.backward;
  w.pure += x.pure;
  w.attention_bytes = x.attention_bytes;
  return w;
}

double StepGraphBuilder::mix_rerun(int r, int i, double layers) const {
  const int recomputed = plan_.ranks[r][i].recompute_layers;
  if (recomputed <= 0) return 0;
  return std::min(layers, static_cast<double>(recomputed)) * sums(r, i).mixed_rerun;
}

double StepGraphBuilder::extra_seconds(int r, int i, int v) const {
  double e = 0;
  const double t = tokens(r, i);
  if (v == 0) e += k_.embedding_seconds_per_token * t;
  if (v == virtual_stages_ - 1) e += k_.head_seconds_per_token * t;
  return e;
}

int StepGraphBuilder::ring_group_of(size_t g, int v, bool forward) {
  int& id = ring_group_[ring_chunk_at(g, v) * 2 + (forward ? 0 : 1)];
  if (id < 0) id = graph_.new_group();
  return id;
}

void StepGraphBuilder::add_compute(int r, int s) {
  const auto& mbs = plan_.ranks[r];
  sim::OpId prev = kNone, pending_copy = kNone;
  for (const PipelineOp& op : pipeline_schedule(s, grid_.pp, vpp_, static_cast<int>(mbs.size()), plan_.forward_limits)) {
    const int v = op.chunk * grid_.pp + s;
    const double l = layers_of(v);
    const PlannedMicroBatch& mb = mbs[op.micro_batch];
    const LayerWork w = layer_work(r, op.micro_batch, s);
    const double e = extra_seconds(r, op.micro_batch, v);
    double seconds;
    int group = -1;
    if (mb.ring >= 0) {
      const size_t g = ring_chunk_at(static_cast<size_t>(mb.ring), v);
      seconds = op.forward ? ring_fwd_[g] : ring_bwd_[g];
      group = ring_group_of(static_cast<size_t>(mb.ring), v, op.forward);
    } else {
      seconds = op.forward ? l * w.forward + f_ * e : l * w.backward + (1 - f_) * e + mix_rerun(r, op.micro_batch, l);
    }
    if (op.forward) {
      out_.compute_seconds += l * w.pure + e + mix_rerun(r, op.micro_batch, l);
      out_.attention_bytes += l * w.attention_bytes * grid_.tp;
    }
    const uint32_t label = mb.ring >= 0 ? (op.forward ? L_ring_fwd : L_ring_bwd) : (op.forward ? L_fwd : L_bwd);
    std::vector<sim::OpId> deps;
    if (pending_copy != kNone) deps.push_back(pending_copy);
    // The previous micro-batch's all-to-all blocks this compute.
    if (prev != kNone && graph_.stream(prev) != stream(r, s, kCompute)) deps.push_back(prev);
    const sim::OpId id = graph_.add_op(stream(r, s, kCompute), seconds, label, deps, group, op.micro_batch);
    const sim::OpId a2a = add_all_to_all(r, s, op, id);
    const sim::OpId end = a2a != kNone ? a2a : id;
    (op.forward ? forward_ops_ : backward_ops_)[at(r, v, op.micro_batch)] = id;
    (op.forward ? forward_end_ops_ : backward_end_ops_)[at(r, v, op.micro_batch)] = end;
    pending_copy = add_offload_copy(r, s, op, prev);
    prev = end;
  }
  last_compute_[r + static_cast<size_t>(grid_.hdp) * s] = prev;
  last_copy_[r + static_cast<size_t>(grid_.hdp) * s] = pending_copy;
}

sim::OpId StepGraphBuilder::add_all_to_all(int r, int s, const PipelineOp& op, sim::OpId compute) {
  const int ep = k_.ep;
  const double tokens = this->tokens(r, op.micro_batch);
  if (ep <= 1 || !(k_.all_to_all_bytes_per_token > 0) || !(tokens > 0)) return kNone;
  const double l = layers_of(op.chunk * grid_.pp + s);
  // What model/moe.h runs per layer: forward the count exchange, then dispatch and
  // combine; backward the output gradients out and the input gradients back (the
  // forward's counts are reused). The count exchange is a few bytes: its time is
  // almost all latency.
  const double buffer = k_.all_to_all_bytes_per_token * tokens;
  const double counts = op.forward ? k_.all_to_all_count_bytes : 0.0;
  auto exchange = [&](double bytes) {
    return sim::all_to_all_seconds(bytes, ep, k_.all_to_all_bytes_per_s, k_.all_to_all_latency_s);
  };
  const double seconds = l * (2 * exchange(buffer) + (counts > 0 ? exchange(counts) : 0.0));
  out_.all_to_all_bytes += l * (2 * buffer + counts) * (ep - 1) / ep * grid_.tp;
  out_.all_to_all_seconds += seconds;
  return graph_.add_op(stream(r, s, kDp), seconds, op.forward ? L_a2a_fwd : L_a2a_bwd, {compute}, -1, op.micro_batch);
}

// A fraction of the saved activations of all but two layers goes to host memory
// during forward and comes back during backward, beside the compute; the next
// compute operation waits for the copy.
sim::OpId StepGraphBuilder::add_offload_copy(int r, int s, const PipelineOp& op, sim::OpId previous_compute) {
  const PlannedMicroBatch& mb = plan_.ranks[r][op.micro_batch];
  // Under interleaving each chunk keeps its last two layers.
  const int v = op.chunk * grid_.pp + s;
  const double layers = layers_of(v);
  const double ratio = mb.offload_ratio;
  // Its recomputed layers offload nothing.
  const double offloaded = layers - 2 - std::min(layers, static_cast<double>(mb.recompute_layers));
  const int64_t mb_tokens = static_cast<int64_t>(tokens(r, op.micro_batch));
  if (!(ratio > 0 && offloaded > 0 && mb_tokens > 0)) return kNone;
  const size_t idx = at(r, v, op.micro_batch);
  const double bytes = ratio * offloaded * k_.cost.activation_bytes(mb_tokens);
  std::vector<sim::OpId> deps;
  if (previous_compute != kNone) deps.push_back(previous_compute);
  if (op.forward) {
    const sim::OpId c =
        graph_.add_op(stream(r, s, kD2h), bytes / k_.cost.d2h_bytes_per_s, L_d2h, deps, -1, op.micro_batch);
    d2h_ops_[idx] = c;
    out_.offloaded_bytes += bytes * grid_.tp;
    out_.max_offloaded_bytes_per_gpu = std::max(out_.max_offloaded_bytes_per_gpu, bytes);
    return c;
  }
  if (d2h_ops_[idx] != kNone) deps.push_back(d2h_ops_[idx]);
  const sim::OpId c =
      graph_.add_op(stream(r, s, kH2d), bytes / k_.cost.h2d_bytes_per_s, L_h2d, deps, -1, op.micro_batch);
  h2d_ops_[idx] = c;
  return c;
}

// A pair per micro-batch, virtual stage boundary and direction: the transfer starts
// when both the send and the receive have started (a group).
void StepGraphBuilder::add_pipeline_transfers(int r, int s) {
  const HardwareProfile& hw = k_.hardware;
  const int next = (s + 1) % grid_.pp;
  const long a = gpu(r, s), b = gpu(r, next);
  const double bw = hw.link_bytes_per_s(a, b), lat = hw.link_latency_s(a, b);
  const auto& mbs = plan_.ranks[r];
  const int m = static_cast<int>(mbs.size());
  for (const PipelineOp& op : pipeline_schedule(s, grid_.pp, vpp_, m, plan_.forward_limits)) {
    const int v = op.chunk * grid_.pp + s, i = op.micro_batch;
    if (!op.forward || v + 1 == virtual_stages_) continue;
    const double bytes = k_.boundary_bytes_per_token * tokens(r, i);
    const double seconds = sim::p2p_seconds(bytes, bw, lat);
    out_.pipeline_bytes += 2 * bytes * grid_.tp;
    const size_t lo = at(r, v, i), hi = at(r, v + 1, i);
    // Forward: virtual stage v sends its output, v + 1 (on the next stage) receives it.
    const int g = graph_.new_group();
    std::vector<sim::OpId> deps{forward_end_ops_[lo]};
    if (d2h_ops_[lo] != kNone) deps.push_back(d2h_ops_[lo]);
    graph_.add_op(stream(r, s, kFwdSend), seconds, L_send_act, deps, g, i);
    const sim::OpId recv = graph_.add_op(stream(r, next, kFwdRecv), seconds, L_recv_act, {}, g, i);
    graph_.add_dependency(forward_ops_[hi], recv);
    if (d2h_ops_[hi] != kNone) graph_.add_dependency(d2h_ops_[hi], recv);
  }
  for (const PipelineOp& op : pipeline_schedule(next, grid_.pp, vpp_, m, plan_.forward_limits)) {
    const int v = op.chunk * grid_.pp + next, i = op.micro_batch;
    if (op.forward || v == 0) continue;
    const double bytes = k_.boundary_bytes_per_token * tokens(r, i);
    const double seconds = sim::p2p_seconds(bytes, bw, lat);
    const size_t lo = at(r, v - 1, i), hi = at(r, v, i);
    // Backward: virtual stage v sends the input gradient, v - 1 (on stage s) receives it.
    const int g = graph_.new_group();
    std::vector<sim::OpId> deps{backward_end_ops_[hi]};
    if (h2d_ops_[hi] != kNone) deps.push_back(h2d_ops_[hi]);
    graph_.add_op(stream(r, next, kBwdSend), seconds, L_send_grad, deps, g, i);
    const sim::OpId recv = graph_.add_op(stream(r, s, kBwdRecv), seconds, L_recv_grad, {}, g, i);
    graph_.add_dependency(backward_ops_[lo], recv);
    if (h2d_ops_[lo] != kNone) graph_.add_dependency(h2d_ops_[lo], recv);
  }
}

void StepGraphBuilder::add_gradient_sync(int s) {
  const int hdp = grid_.hdp, tp = grid_.tp, ep = k_.ep;
  const GradientSync sync = gradient_sync(k_, s);
  const double rs = sync.reduce_scatter, ag = sync.all_gather;
  const double ers = sync.expert_reduce_scatter, eag = sync.expert_all_gather;
  out_.gradient_bytes += (k_.gradient_bytes[s] + k_.parameter_bytes[s]) * tp * hdp;
  const int g_rs = graph_.new_group(), g_ag = graph_.new_group();
  // With ep > 1 the experts of ep-group position j live on ranks j, j + ep, ...: one
  // reduce-scatter and one all-gather per position.
  const bool experts = ep > 1;
  std::vector<int> g_ers, g_eag;
  if (experts) {
    for (int j = 0; j < ep; ++j) g_ers.push_back(graph_.new_group()), g_eag.push_back(graph_.new_group());
    out_.gradient_bytes += (k_.expert_gradient_bytes[s] + k_.expert_parameter_bytes[s]) * tp * hdp;
  }
  for (int r = 0; r < hdp; ++r) {
    std::vector<sim::OpId> deps;
    const size_t p = r + static_cast<size_t>(hdp) * s;
    if (last_compute_[p] != kNone) deps.push_back(last_compute_[p]);
    if (last_copy_[p] != kNone) deps.push_back(last_copy_[p]);
    const sim::OpId a = graph_.add_op(stream(r, s, kDp), rs, L_rs, deps, g_rs);
    reduce_scatter_ops_.push_back(a);
    std::vector<sim::OpId> reduced{a};
    if (experts) reduced.push_back(graph_.add_op(stream(r, s, kDp), ers, L_ers, deps, g_ers[r % ep]));
    const sim::OpId o = graph_.add_op(stream(r, s, kCompute), sync.optimizer, L_opt, reduced);
    graph_.add_op(stream(r, s, kDp), ag, L_ag, {o}, g_ag);
    if (experts) graph_.add_op(stream(r, s, kDp), eag, L_eag, {o}, g_eag[r % ep]);
  }
}

StepSimulation StepGraphBuilder::replay(bool keep_graph) {
  sim::Replay result = sim::replay(graph_);
  StepSimulation out = std::move(out_);
  out.step_seconds = result.makespan;
  out.operations = graph_.size();
  out.dependencies = graph_.dependencies();
  double busy_min = std::numeric_limits<double>::infinity(), busy_max = 0;
  for (int s = 0; s < grid_.pp; ++s)
    for (int r = 0; r < grid_.hdp; ++r) {
      const double busy = result.stream_busy[stream(r, s, kCompute)];
      out.compute_busy_seconds += busy;
      out.ring_wait_seconds += std::max(0.0, result.stream_occupied[stream(r, s, kCompute)] - busy);
      busy_min = std::min(busy_min, busy);
      busy_max = std::max(busy_max, busy);
    }
  out.min_busy_seconds = out.processes > 0 ? busy_min : 0;
  out.max_busy_seconds = busy_max;
  out.idle_fraction = out.step_seconds > 0 ? 1 - out.compute_busy_seconds / (out.processes * out.step_seconds) : 0;
  double rs_start = 0;
  for (sim::OpId a : reduce_scatter_ops_) rs_start = std::max(rs_start, result.start[a]);
  out.gradient_sync_seconds = out.step_seconds - rs_start;
  out.micro_batch_seconds.resize(grid_.hdp);
  for (int r = 0; r < grid_.hdp; ++r) {
    const int n = static_cast<int>(plan_.ranks[r].size());
    out.micro_batch_seconds[r].assign(n, 0.0);
    for (int i = 0; i < n; ++i)
      for (int v = 0; v < virtual_stages_; ++v)
        for (sim::OpId op : {forward_ops_[at(r, v, i)], backward_ops_[at(r, v, i)]})
          if (op != kNone) out.micro_batch_seconds[r][i] += graph_.duration(op);
  }
  if (keep_graph) {
    out.graph = std::move(graph_);
    out.replay = std::move(result);
  }
  return out;
}

}  // namespace

StepSimulation simulate_step(const StepPlan& plan, std::span<const int64_t> lengths, const StepCosts& k,
                             bool keep_graph) {
  check_step_inputs(plan, lengths, k);
  StepGraphBuilder builder(plan, lengths, k);
  const int hdp = k.hdp, pp = k.pp();
  for (int s = 0; s < pp; ++s)
    for (int r = 0; r < hdp; ++r) builder.add_compute(r, s);
  // Under interleaving the last stage sends on to the first (its next chunk).
  const int senders = k.vpp() > 1 ? pp : pp - 1;
  for (int s = 0; s < senders; ++s)
    for (int r = 0; r < hdp; ++r) builder.add_pipeline_transfers(r, s);
  for (int s = 0; s < pp; ++s) builder.add_gradient_sync(s);
  return builder.replay(keep_graph);
}

RingStats ring_stats(const StepPlan& plan, std::span<const int64_t> lengths) {
  RingStats st;
  st.rings = static_cast<int64_t>(plan.rings.size());
  double sum = 0;
  for (const Ring& ring : plan.rings) {
    const int n = static_cast<int>(ring.ranks.size());
    if (n <= 1) continue;
    for (int64_t q : ring.sequences) {
      // A sequence shorter than 2n leaves some members without a chunk.
      const int holders = static_cast<int>(std::min<int64_t>(n, lengths[q]));
      ++st.spread_sequences;
      st.spread_tokens += lengths[q];
      sum += holders;
      st.max_ranks = std::max(st.max_ranks, holders);
      int b = 0;
      while ((1 << b) < holders) ++b;
      if (st.histogram.size() <= static_cast<size_t>(b)) st.histogram.resize(b + 1, 0);
      ++st.histogram[b];
    }
  }
  st.mean_ranks = st.spread_sequences > 0 ? sum / static_cast<double>(st.spread_sequences) : 0;
  st.min_micro_batches_per_rank = plan.ranks.empty() ? 0 : std::numeric_limits<int64_t>::max();
  for (const auto& mbs : plan.ranks) {
    const int64_t n = static_cast<int64_t>(mbs.size());
    st.micro_batches += n;
    st.max_micro_batches_per_rank = std::max(st.max_micro_batches_per_rank, n);
    st.min_micro_batches_per_rank = std::min(st.min_micro_batches_per_rank, n);
  }
  return st;
}

}  // namespace hdp

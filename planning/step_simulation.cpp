#include "planning/step_simulation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "parallel/pipeline.h"

namespace hdp {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

}  // namespace

ModelCosts model_costs(const ModelShape& m, int tp, int pp) {
  validate_model_shape(m);
  validate_split(m, tp, pp);
  ModelCosts c;
  c.layer_parameters = layer_parameters(m);
  c.embedding_parameters = embedding_parameters(m);
  c.head_parameters = head_parameters(m, pp);
  c.layer_matmul_flops_per_token = layer_matmul_flops_per_token(m, tp);
  c.attention_flops_per_token_pair = attention_flops_per_token_pair(m, tp);
  c.head_flops_per_token = head_flops_per_token(m, tp);
  c.saved_bytes_per_token = saved_bytes_per_token(m, tp, kActivationBytes);
  c.kv_bytes_per_token = kv_bytes_per_token(m, tp, kActivationBytes);
  c.boundary_bytes_per_token = boundary_bytes_per_token(m, kActivationBytes);
  return c;
}

namespace {

double stage_parameters_per_gpu(const ModelCosts& c, int tp, int stage, int pp, int64_t layers) {
  double p = static_cast<double>(layers) * c.layer_parameters;
  if (stage == 0) p += c.embedding_parameters;
  if (stage == pp - 1) p += c.head_parameters;
  return p / tp;
}

}  // namespace

MemoryBudget memory_budget(const ModelShape& model, const HardwareProfile& hw, const ParallelDegrees& degrees,
                           std::span<const int64_t> stage_layers) {
  validate_hardware(hw);
  const int pp = degrees.pp;
  if (static_cast<int>(stage_layers.size()) != pp)
    throw std::invalid_argument("memory_budget: " + str(static_cast<int64_t>(stage_layers.size())) +
                                " stage layer counts for pp " + str(pp));
  if (degrees.hdp < 1) throw std::invalid_argument("hdp must be at least 1");
  const ModelCosts c = model_costs(model, degrees.tp, pp);
  MemoryBudget b;
  double best = std::numeric_limits<double>::infinity();
  for (int s = 0; s < pp; ++s) {
    const double p = stage_parameters_per_gpu(c, degrees.tp, s, pp, stage_layers[s]);
    const double fixed = p * (2 + 4) + p * 12 / degrees.hdp;
    const double free = hw.hbm_bytes - hw.reserved_bytes - fixed;
    b.parameters_per_gpu.push_back(p);
    b.static_bytes.push_back(fixed);
    b.free_bytes.push_back(free);
    const double tokens =
        free / (static_cast<double>(pp - s) * static_cast<double>(stage_layers[s]) * c.saved_bytes_per_token);
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
                          std::span<const int64_t> stage_layers) {
  validate_hardware(hw);
  const int pp = degrees.pp;
  if (static_cast<int>(stage_layers.size()) != pp)
    throw std::invalid_argument("make_step_costs: " + str(static_cast<int64_t>(stage_layers.size())) +
                                " stage layer counts for pp " + str(pp));
  const ModelCosts c = model_costs(model, degrees.tp, pp);
  const double rate = hw.flops_per_second();
  StepCosts k;
  k.cost = analytic_cost_model(model, degrees.tp, c.saved_bytes_per_token, rate, hw.pcie_bytes_per_s);
  k.embedding_seconds_per_token = 0;  // a table lookup and its scatter-add: negligible
  k.head_seconds_per_token = c.head_flops_per_token / rate;
  k.stage_layers.assign(stage_layers.begin(), stage_layers.end());
  k.tp = degrees.tp;
  k.hdp = degrees.hdp;
  k.hardware = hw;
  k.kv_bytes_per_token = c.kv_bytes_per_token;
  k.boundary_bytes_per_token = c.boundary_bytes_per_token;
  for (int s = 0; s < pp; ++s) {
    const double p = stage_parameters_per_gpu(c, degrees.tp, s, pp, stage_layers[s]);
    k.gradient_bytes.push_back(4 * p);
    k.parameter_bytes.push_back(2 * p);
    k.optimizer_seconds.push_back(32 * p / degrees.hdp / hw.hbm_bytes_per_s);
  }
  return k;
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
  double pure = 0;                   // forward + backward compute alone
  double attention_bytes = 0;        // ring traffic sent by this GPU
};

}  // namespace

StepSimulation simulate_step(const StepPlan& plan, std::span<const int64_t> lengths, const StepCosts& k,
                             bool keep_graph) {
  const int hdp = k.hdp, pp = k.pp(), tp = k.tp;
  if (pp < 1) throw std::invalid_argument("simulate_step: no pipeline stages");
  if (static_cast<int>(plan.ranks.size()) != hdp)
    throw std::invalid_argument("simulate_step: the plan has " + str(static_cast<int64_t>(plan.ranks.size())) +
                                " ranks, the costs " + str(hdp));
  if (k.gradient_bytes.size() != static_cast<size_t>(pp) || k.parameter_bytes.size() != static_cast<size_t>(pp) ||
      k.optimizer_seconds.size() != static_cast<size_t>(pp))
    throw std::invalid_argument("simulate_step: per-stage gradient, parameter and optimizer figures must have pp entries");
  if (!(k.forward_fraction > 0 && k.forward_fraction < 1))
    throw std::invalid_argument("simulate_step: forward_fraction must be in (0, 1)");
  const double f = k.forward_fraction;
  const HardwareProfile& hw = k.hardware;
  const CostModel& cm = k.cost;
  // The GPU of tp rank 0 of hdp rank r at stage s, in the trainer's rank order.
  const ParallelDegrees grid{tp, pp, hdp};
  auto gpu = [&](int r, int s) { return static_cast<long>(grid.rank({0, s, r})); };
  for (const auto& mbs : plan.ranks)
    for (const PlannedMicroBatch& mb : mbs)
      for (const PlannedPiece& p : mb.pieces)
        if (p.sequence < 0 || static_cast<size_t>(p.sequence) >= lengths.size() ||
            (p.ring >= 0 && static_cast<size_t>(p.ring) >= plan.rings.size()))
          throw std::invalid_argument("simulate_step: a piece names sequence " + str(p.sequence) + " / ring " +
                                      str(p.ring) + " outside the batch");

  // Ring links per stage: the slowest link between consecutive members.
  const size_t R = plan.rings.size();
  std::vector<double> ring_bw(R * pp), ring_lat(R * pp), ring_step(R);
  for (size_t g = 0; g < R; ++g) {
    const Ring& ring = plan.rings[g];
    const int n = static_cast<int>(ring.ranks.size());
    double attention = 0;
    for (int64_t q : ring.sequences) attention += cm.a1 * static_cast<double>(lengths[q]) * static_cast<double>(lengths[q]);
    ring_step[g] = n > 0 ? attention / (static_cast<double>(n) * n) : 0;  // one member's one ring step
    for (int s = 0; s < pp; ++s) {
      double bw = std::numeric_limits<double>::infinity(), lat = 0;
      for (int j = 0; j < n && n > 1; ++j) {
        const long a = gpu(ring.ranks[j], s), b = gpu(ring.ranks[(j + 1) % n], s);
        bw = std::min(bw, hw.link_bytes_per_s(a, b));
        lat = std::max(lat, hw.link_latency_s(a, b));
      }
      ring_bw[g * pp + s] = bw;
      ring_lat[g * pp + s] = lat;
    }
  }
  auto layer_work = [&](const PlannedMicroBatch& mb, int s) {
    LayerWork w;
    double linear = 0, ring_tokens = 0;
    for (const PlannedPiece& p : mb.pieces) {
      if (p.ring < 0) {
        linear += cm.compute_seconds(p.length);
      } else {
        ring_tokens += static_cast<double>(p.length);
      }
    }
    linear += cm.b1 * ring_tokens;
    w.forward = f * linear;
    w.backward = (1 - f) * linear;
    w.pure = linear;
    if (mb.ring >= 0) {
      const size_t g = static_cast<size_t>(mb.ring);
      const int n = static_cast<int>(plan.rings[g].ranks.size());
      const double step = ring_step[g];
      w.pure += step * n + cm.g * static_cast<double>(plan.rings[g].sequences.size());
      w.forward += f * cm.g * static_cast<double>(plan.rings[g].sequences.size());
      w.backward += (1 - f) * cm.g * static_cast<double>(plan.rings[g].sequences.size());
      if (n <= 1) {
        w.forward += f * step;
        w.backward += (1 - f) * step;
      } else {
        const double bytes = k.kv_bytes_per_token * ring_tokens;
        const double xf = ring_lat[g * pp + s] + bytes / ring_bw[g * pp + s];
        const double xb = ring_lat[g * pp + s] + 2 * bytes / ring_bw[g * pp + s];
        w.forward += f * step + (n - 1) * std::max(f * step, xf);
        w.backward += (1 - f) * step + (n - 1) * std::max((1 - f) * step, xb) + xb;
        w.attention_bytes = bytes * (n - 1) + 2 * bytes * n;
      }
    }
    return w;
  };
  auto extra_seconds = [&](const PlannedMicroBatch& mb, int s) {
    double e = 0;
    const double tokens = static_cast<double>(mb.tokens());
    if (s == 0) e += k.embedding_seconds_per_token * tokens;
    if (s == pp - 1) e += k.head_seconds_per_token * tokens;
    return e;
  };

  // Micro-batch offsets: index of (rank r, micro-batch i) = first[r] + i.
  std::vector<size_t> first(hdp + 1, 0);
  for (int r = 0; r < hdp; ++r) first[r + 1] = first[r] + plan.ranks[r].size();
  const size_t M = first[hdp];

  // Ring groups run for their slowest member's time.
  std::vector<double> ring_fwd(R * pp, 0.0), ring_bwd(R * pp, 0.0);
  for (int s = 0; s < pp; ++s) {
    const double l = static_cast<double>(k.stage_layers[s]);
    for (int r = 0; r < hdp; ++r)
      for (const PlannedMicroBatch& mb : plan.ranks[r]) {
        if (mb.ring < 0) continue;
        const LayerWork w = layer_work(mb, s);
        const double e = extra_seconds(mb, s);
        const size_t g = static_cast<size_t>(mb.ring) * pp + s;
        ring_fwd[g] = std::max(ring_fwd[g], l * w.forward + f * e);
        ring_bwd[g] = std::max(ring_bwd[g], l * w.backward + (1 - f) * e);
      }
  }

  StepSimulation out;
  out.processes = hdp * pp;
  sim::OpGraph graph;
  const uint32_t L_fwd = graph.label("forward"), L_bwd = graph.label("backward");
  const uint32_t L_ring_fwd = graph.label("ring forward"), L_ring_bwd = graph.label("ring backward");
  const uint32_t L_send_act = graph.label("send activation"), L_recv_act = graph.label("recv activation");
  const uint32_t L_send_grad = graph.label("send gradient"), L_recv_grad = graph.label("recv gradient");
  const uint32_t L_d2h = graph.label("offload d2h"), L_h2d = graph.label("offload h2d");
  const uint32_t L_rs = graph.label("grad reduce-scatter"), L_opt = graph.label("optimizer");
  const uint32_t L_ag = graph.label("param all-gather");
  std::vector<int> streams(static_cast<size_t>(hdp) * pp * kStreams);
  for (int s = 0; s < pp; ++s)
    for (int r = 0; r < hdp; ++r) {
      const int proc = r + hdp * s;
      for (int t = 0; t < kStreams; ++t) streams[static_cast<size_t>(proc) * kStreams + t] = graph.add_stream(proc, kStreamNames[t]);
      out.process_names.push_back("stage " + std::to_string(s) + " hdp " + std::to_string(r) + " (GPUs " +
                                  std::to_string(gpu(r, s)) + "-" + std::to_string(gpu(r, s) + tp - 1) + ")");
    }
  auto stream = [&](int r, int s, int t) { return streams[(static_cast<size_t>(r) + static_cast<size_t>(hdp) * s) * kStreams + t]; };
  std::vector<int> ring_group(R * pp * 2, -1);
  auto ring_group_of = [&](size_t g, int s, bool forward) {
    int& id = ring_group[(g * pp + s) * 2 + (forward ? 0 : 1)];
    if (id < 0) id = graph.new_group();
    return id;
  };

  // Compute operations in 1F1B order, with offload copies beside them.
  std::vector<sim::OpId> F(M * pp, kNone), B(M * pp, kNone), D(M * pp, kNone), Hc(M * pp, kNone);
  std::vector<sim::OpId> last_compute(static_cast<size_t>(hdp) * pp, kNone), last_copy(static_cast<size_t>(hdp) * pp, kNone);
  auto at = [&](int r, int s, int i) { return (first[r] + static_cast<size_t>(i)) * pp + s; };
  for (int s = 0; s < pp; ++s) {
    const int64_t layers = k.stage_layers[s];
    const double l = static_cast<double>(layers);
    for (int r = 0; r < hdp; ++r) {
      const auto& mbs = plan.ranks[r];
      sim::OpId prev = kNone, pending_copy = kNone;
      for (const PipelineOp& op : one_f_one_b(s, pp, static_cast<int>(mbs.size()))) {
        const PlannedMicroBatch& mb = mbs[op.micro_batch];
        const LayerWork w = layer_work(mb, s);
        const double e = extra_seconds(mb, s);
        double seconds;
        int group = -1;
        if (mb.ring >= 0) {
          const size_t g = static_cast<size_t>(mb.ring) * pp + s;
          seconds = op.forward ? ring_fwd[g] : ring_bwd[g];
          group = ring_group_of(static_cast<size_t>(mb.ring), s, op.forward);
        } else {
          seconds = op.forward ? l * w.forward + f * e : l * w.backward + (1 - f) * e;
        }
        if (op.forward) {
          out.compute_seconds += l * w.pure + e;
          out.attention_bytes += l * w.attention_bytes * tp;
        }
        const uint32_t label = mb.ring >= 0 ? (op.forward ? L_ring_fwd : L_ring_bwd) : (op.forward ? L_fwd : L_bwd);
        const size_t idx = at(r, s, op.micro_batch);
        std::vector<sim::OpId> deps;
        if (pending_copy != kNone) deps.push_back(pending_copy);
        const sim::OpId id = graph.add_op(stream(r, s, kCompute), seconds, label, deps, group, op.micro_batch);
        (op.forward ? F : B)[idx] = id;
        pending_copy = kNone;
        // Offload: a fraction of the saved activations of all but two layers goes to host memory
        // during forward and comes back during backward, beside the compute.
        const double ratio = mb.offload_ratio;
        if (ratio > 0 && layers > 2 && mb.tokens() > 0) {
          const double bytes = ratio * static_cast<double>(layers - 2) * cm.activation_bytes(mb.tokens());
          std::vector<sim::OpId> copy_deps;
          if (prev != kNone) copy_deps.push_back(prev);
          if (op.forward) {
            const sim::OpId c = graph.add_op(stream(r, s, kD2h), bytes / cm.d2h_bytes_per_s, L_d2h, copy_deps, -1,
                                             op.micro_batch);
            D[idx] = c;
            pending_copy = c;
            out.offloaded_bytes += bytes * tp;
            out.max_offloaded_bytes_per_gpu = std::max(out.max_offloaded_bytes_per_gpu, bytes);
          } else {
            if (D[idx] != kNone) copy_deps.push_back(D[idx]);
            const sim::OpId c = graph.add_op(stream(r, s, kH2d), bytes / cm.h2d_bytes_per_s, L_h2d, copy_deps, -1,
                                             op.micro_batch);
            Hc[idx] = c;
            pending_copy = c;
          }
        }
        prev = id;
      }
      last_compute[r + static_cast<size_t>(hdp) * s] = prev;
      last_copy[r + static_cast<size_t>(hdp) * s] = pending_copy;
    }
  }

  // Pipeline sends and receives: a pair per micro-batch and stage boundary.
  for (int s = 0; s + 1 < pp; ++s) {
    for (int r = 0; r < hdp; ++r) {
      const long a = gpu(r, s), b = gpu(r, s + 1);
      const double bw = hw.link_bytes_per_s(a, b), lat = hw.link_latency_s(a, b);
      for (size_t i = 0; i < plan.ranks[r].size(); ++i) {
        const double bytes = k.boundary_bytes_per_token * static_cast<double>(plan.ranks[r][i].tokens());
        const double seconds = sim::p2p_seconds(bytes, bw, lat);
        out.pipeline_bytes += 2 * bytes * tp;
        const size_t lo = at(r, s, static_cast<int>(i)), hi = at(r, s + 1, static_cast<int>(i));
        // Forward: stage s sends its output, stage s + 1 receives it.
        int g = graph.new_group();
        std::vector<sim::OpId> deps{F[lo]};
        if (D[lo] != kNone) deps.push_back(D[lo]);
        graph.add_op(stream(r, s, kFwdSend), seconds, L_send_act, deps, g, static_cast<int64_t>(i));
        sim::OpId recv = graph.add_op(stream(r, s + 1, kFwdRecv), seconds, L_recv_act, {}, g, static_cast<int64_t>(i));
        graph.add_dependency(F[hi], recv);
        if (D[hi] != kNone) graph.add_dependency(D[hi], recv);
      }
      for (size_t i = 0; i < plan.ranks[r].size(); ++i) {
        const double bytes = k.boundary_bytes_per_token * static_cast<double>(plan.ranks[r][i].tokens());
        const double seconds = sim::p2p_seconds(bytes, bw, lat);
        const size_t lo = at(r, s, static_cast<int>(i)), hi = at(r, s + 1, static_cast<int>(i));
        // Backward: stage s + 1 sends the input gradient, stage s receives it.
        int g = graph.new_group();
        std::vector<sim::OpId> deps{B[hi]};
        if (Hc[hi] != kNone) deps.push_back(Hc[hi]);
        graph.add_op(stream(r, s + 1, kBwdSend), seconds, L_send_grad, deps, g, static_cast<int64_t>(i));
        sim::OpId recv = graph.add_op(stream(r, s, kBwdRecv), seconds, L_recv_grad, {}, g, static_cast<int64_t>(i));
        graph.add_dependency(B[lo], recv);
        if (Hc[lo] != kNone) graph.add_dependency(Hc[lo], recv);
      }
    }
  }

  // Gradient reduce-scatter, optimizer, parameter all-gather per stage (ZeRO-1 over hdp).
  std::vector<sim::OpId> rs_ops;
  for (int s = 0; s < pp; ++s) {
    const bool one_node = hw.same_node(gpu(0, s), gpu(hdp - 1, s) + tp - 1);
    const double bw = one_node ? hw.nvlink_bytes_per_s : hw.internode_bytes_per_s;
    const double lat = one_node ? hw.intranode_latency_s : hw.internode_latency_s;
    const double rs = sim::ring_reduce_scatter_seconds(k.gradient_bytes[s], hdp, bw, lat);
    const double ag = sim::ring_all_gather_seconds(k.parameter_bytes[s], hdp, bw, lat);
    out.gradient_bytes += (k.gradient_bytes[s] + k.parameter_bytes[s]) * tp * hdp;
    const int g_rs = graph.new_group(), g_ag = graph.new_group();
    for (int r = 0; r < hdp; ++r) {
      std::vector<sim::OpId> deps;
      const size_t p = r + static_cast<size_t>(hdp) * s;
      if (last_compute[p] != kNone) deps.push_back(last_compute[p]);
      if (last_copy[p] != kNone) deps.push_back(last_copy[p]);
      const sim::OpId a = graph.add_op(stream(r, s, kDp), rs, L_rs, deps, g_rs);
      rs_ops.push_back(a);
      const sim::OpId o = graph.add_op(stream(r, s, kCompute), k.optimizer_seconds[s], L_opt, {a});
      graph.add_op(stream(r, s, kDp), ag, L_ag, {o}, g_ag);
    }
  }

  sim::Replay result = sim::replay(graph);
  out.step_seconds = result.makespan;
  out.operations = graph.size();
  out.dependencies = graph.dependencies();
  double busy_min = std::numeric_limits<double>::infinity(), busy_max = 0;
  for (int s = 0; s < pp; ++s)
    for (int r = 0; r < hdp; ++r) {
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
  for (sim::OpId a : rs_ops) rs_start = std::max(rs_start, result.start[a]);
  out.gradient_sync_seconds = out.step_seconds - rs_start;
  if (keep_graph) {
    out.graph = std::move(graph);
    out.replay = std::move(result);
  }
  return out;
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

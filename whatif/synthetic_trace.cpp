#include "whatif/synthetic_trace.h"

#include <cmath>
#include <stdexcept>
#include <vector>

#include "base/rng.h"
#include "planning/pipeline_schedule.h"
#include "whatif/simulator.h"

namespace hdp {
namespace {

double uniform(Rng& rng) { return static_cast<double>(rng.next() >> 11) * 0x1.0p-53; }

double normal(Rng& rng) {  // Irwin-Hall: close enough to N(0, 1) for a test's skew
  double s = 0;
  for (int i = 0; i < 12; ++i) s += uniform(rng);
  return s - 6.0;
}

}  // namespace

Trace synthesize_trace(const SyntheticJob& job) {
  if (job.pp < 1 || job.dp < 1 || job.micro_batches < 1 || job.steps < 1)
    throw std::invalid_argument("synthesize_trace: pp, dp, micro_batches and steps must be positive");
  Trace trace;
  const uint32_t fwd = trace.op_type(trace_ops::kForwardCompute), bwd = trace.op_type(trace_ops::kBackwardCompute);
  const uint32_t fsend = trace.op_type(trace_ops::kForwardSend), frecv = trace.op_type(trace_ops::kForwardRecv);
  const uint32_t bsend = trace.op_type(trace_ops::kBackwardSend), brecv = trace.op_type(trace_ops::kBackwardRecv);
  const uint32_t grads = trace.op_type(trace_ops::kGradsSync), optim = trace.op_type(trace_ops::kOptimizer);
  const uint32_t params = trace.op_type(trace_ops::kParamsSync);
  Rng rng(job.seed, 0x7472616365ull);
  auto jitter = [&] { return job.noise > 0 ? 1.0 + job.noise * (2.0 * uniform(rng) - 1.0) : 1.0; };
  const int pp = job.pp, dp = job.dp, m = job.micro_batches;
  const int workers = pp * dp;
  struct Meta { uint32_t op; int worker; int mb; int64_t group; };

  for (int64_t step = 0; step < job.steps; ++step) {
    sim::OpGraph g;
    const uint32_t label = g.label("op");
    std::vector<Meta> meta;
    std::vector<int64_t> names;  // graph group -> trace group id
    auto group = [&] {
      names.push_back(trace.new_group());
      return g.new_group();
    };
    // Streams per worker: compute, dp, fsend, frecv, bsend, brecv.
    std::vector<int> streams(workers * 6);
    for (int w = 0; w < workers; ++w)
      for (int k = 0; k < 6; ++k) streams[w * 6 + k] = g.add_stream(w, "s");
    std::vector<double> length(static_cast<size_t>(dp) * m, 1.0);
    if (job.sequence_skew > 0)
      for (double& l : length) l = std::exp(job.sequence_skew * normal(rng));
    // Pairs: fgroup[dp][stage][mb] joins stage s's send with stage s+1's receive.
    std::vector<int> fgroup(workers * m, -1), bgroup(workers * m, -1);
    for (int w = 0; w < workers; ++w)
      for (int i = 0; i < m; ++i) {
        fgroup[w * m + i] = group();
        bgroup[w * m + i] = group();
      }
    auto add = [&](int w, int k, double dur, uint32_t op, std::initializer_list<sim::OpId> deps, int grp, int mb) {
      const sim::OpId id = g.add_op(streams[w * 6 + k], dur, label, deps, grp, mb);
      meta.push_back({op, w, mb, grp >= 0 ? names[grp] : -1});
      return id;
    };
    std::vector<int> grads_group(pp), params_group(pp);
    for (int s = 0; s < pp; ++s) {
      grads_group[s] = group();
      params_group[s] = group();
    }
    for (int d = 0; d < dp; ++d) {
      for (int s = 0; s < pp; ++s) {
        const int w = s * dp + d;
        const bool slow = s == job.slow_pp && d == job.slow_dp;
        const double factor = (s == pp - 1 ? job.last_stage_factor : 1.0) * (slow ? job.slow_factor : 1.0);
        // The worker of stage s, DP rank d sends forward to (s + 1, d).
        auto pair_index = [&](int stage, int mb) { return (stage * dp + d) * m + mb; };
        for (const PipelineOp& p : one_f_one_b(s, pp, m)) {
          const int i = p.micro_batch;
          const double work = factor * length[d * m + i];
          if (p.forward) {
            std::vector<sim::OpId> deps;
            if (s > 0) deps.push_back(add(w, 3, job.transfer_us * jitter(), frecv, {}, fgroup[pair_index(s - 1, i)], i));
            const sim::OpId c = g.add_op(streams[w * 6], job.forward_us * work * jitter(), label, deps, -1, i);
            meta.push_back({fwd, w, i, -1});
            if (s + 1 < pp) add(w, 2, job.transfer_us * jitter(), fsend, {c}, fgroup[pair_index(s, i)], i);
          } else {
            std::vector<sim::OpId> deps;
            if (s + 1 < pp) deps.push_back(add(w, 5, job.transfer_us * jitter(), brecv, {}, bgroup[pair_index(s, i)], i));
            const sim::OpId c = g.add_op(streams[w * 6], job.backward_us * work * jitter(), label, deps, -1, i);
            meta.push_back({bwd, w, i, -1});
            if (s > 0) add(w, 4, job.transfer_us * jitter(), bsend, {c}, bgroup[pair_index(s - 1, i)], i);
          }
        }
        const sim::OpId last = static_cast<sim::OpId>(g.size() - 1);
        // The last op added is the last backward or its send; the tail waits for the compute.
        sim::OpId last_compute = last;
        while (meta[last_compute].op != bwd) --last_compute;
        const sim::OpId rs = add(w, 1, job.grads_sync_us * jitter(), grads, {last_compute}, grads_group[s], -1);
        const sim::OpId opt = add(w, 0, job.optimizer_us * (slow ? job.slow_factor : 1.0) * jitter(), optim, {rs}, -1, -1);
        add(w, 1, job.params_sync_us * jitter(), params, {opt}, params_group[s], -1);
      }
    }
    const sim::Replay r = sim::replay(g);
    for (size_t k = 0; k < g.size(); ++k) {
      TraceOp op;
      op.step = step;
      op.microbatch = meta[k].mb;
      op.pp_rank = meta[k].worker / dp;
      op.dp_rank = meta[k].worker % dp;
      op.op = meta[k].op;
      op.group = meta[k].group;
      op.start_us = r.start[k];
      op.end_us = r.end[k];
      trace.ops.push_back(op);
    }
  }
  return trace;
}

}  // namespace hdp

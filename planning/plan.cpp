#include "planning/plan.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>

#include "planning/pipeline_schedule.h"

namespace hdp {

int64_t PlannedMicroBatch::tokens() const {
  int64_t n = 0;
  for (const PlannedPiece& p : pieces) n += p.length;
  return n;
}

std::vector<std::vector<size_t>> best_fit_decreasing(std::span<const int64_t> lengths, int64_t capacity) {
  std::vector<size_t> idx(lengths.size());
  std::iota(idx.begin(), idx.end(), size_t{0});
  for (size_t i : idx)
    if (lengths[i] < 1 || lengths[i] > capacity)
      throw std::invalid_argument("best_fit_decreasing: item " + std::to_string(i) + " has length " +
                                  std::to_string(lengths[i]) + ", capacity is " + std::to_string(capacity));
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return lengths[a] > lengths[b]; });
  std::vector<std::vector<size_t>> bins;
  std::set<std::pair<int64_t, size_t>> open;  // (remaining room, bin index)
  for (size_t i : idx) {
    int64_t len = lengths[i];
    auto it = open.lower_bound({len, 0});
    size_t bin;
    int64_t room;
    if (it == open.end()) {
      bin = bins.size();
      bins.emplace_back();
      room = capacity;
    } else {
      bin = it->second;
      room = it->first;
      open.erase(it);
    }
    bins[bin].push_back(i);
    room -= len;
    if (room > 0) open.insert({room, bin});
  }
  return bins;
}

namespace {

// f(piece) for each of zigzag_ring_pieces' pieces in order, without a vector of them
// (check_plan compares millions at scale).
template <class F>
void for_each_zigzag_ring_piece(const Ring& ring, int ring_index, int position, std::span<const int64_t> lengths,
                                F&& f) {
  const int k = static_cast<int>(ring.ranks.size());
  for (int64_t q : ring.sequences) {
    for (int c : {position, 2 * k - 1 - position}) {
      const int64_t begin = zigzag_chunk_begin(lengths[q], c, k), end = zigzag_chunk_begin(lengths[q], c + 1, k);
      if (end > begin) f(PlannedPiece{q, begin, end - begin, ring_index});
    }
  }
}

}  // namespace

std::vector<PlannedPiece> zigzag_ring_pieces(const Ring& ring, int ring_index, int position,
                                             std::span<const int64_t> lengths) {
  std::vector<PlannedPiece> pieces;
  for_each_zigzag_ring_piece(ring, ring_index, position, lengths, [&](const PlannedPiece& p) { pieces.push_back(p); });
  return pieces;
}

std::vector<std::vector<PlannedPiece>> zigzag_ring_pieces_by_member(const Ring& ring, int ring_index,
                                                                    std::span<const int64_t> lengths) {
  const int k = static_cast<int>(ring.ranks.size());
  std::vector<std::vector<PlannedPiece>> pieces(static_cast<size_t>(k));
  for (std::vector<PlannedPiece>& mine : pieces) mine.reserve(2 * ring.sequences.size());  // two chunks each at most
  std::vector<int64_t> bounds(2 * static_cast<size_t>(k) + 1);
  for (int64_t q : ring.sequences) {
    zigzag_chunk_bounds(lengths[q], k, bounds);
    for (int position = 0; position < k; ++position)
      for (int c : {position, 2 * k - 1 - position})
        if (bounds[c + 1] > bounds[c]) pieces[position].push_back({q, bounds[c], bounds[c + 1] - bounds[c], ring_index});
  }
  return pieces;
}

std::vector<RankMicroBatch> rank_work(const StepPlan& plan, std::span<const int64_t> lengths, int hdp_rank) {
  if (hdp_rank < 0 || hdp_rank >= static_cast<int>(plan.ranks.size())) {
    throw std::invalid_argument("rank_work: hdp rank " + std::to_string(hdp_rank) + " outside a plan of " +
                                std::to_string(plan.ranks.size()) + " ranks");
  }
  if (!plan.forward_limits.empty()) {
    throw std::invalid_argument(
        "rank_work: the plan runs forwards ahead of 1F1B (StepPlan::forward_limits), which only the step simulator "
        "runs; the trainer's executor runs 1F1B");
  }
  std::vector<RankMicroBatch> work;
  work.reserve(plan.ranks[hdp_rank].size());
  std::vector<int64_t> ring_lengths;
  for (const PlannedMicroBatch& planned : plan.ranks[hdp_rank]) {
    RankMicroBatch mb{planned, {}};
    if (planned.ring >= 0) {
      const Ring& ring = plan.rings.at(planned.ring);
      const auto self = std::find(ring.ranks.begin(), ring.ranks.end(), hdp_rank);
      if (self == ring.ranks.end()) {
        throw std::invalid_argument("rank_work: hdp rank " + std::to_string(hdp_rank) + " has a micro-batch of ring " +
                                    std::to_string(planned.ring) + ", which it is not a member of");
      }
      ring_lengths.clear();
      for (int64_t s : ring.sequences) ring_lengths.push_back(lengths[s]);
      mb.ring_layout = zigzag_ring_layout(ring.ranks, ring_lengths, static_cast<int>(self - ring.ranks.begin()));
    }
    work.push_back(std::move(mb));
  }
  return work;
}

int64_t offloaded_layers(int64_t layers, int64_t recompute_layers) {
  return std::max<int64_t>(0, layers - recompute_layers - 2);
}

namespace {

// The whole layers a micro-batch's token keeps on the device: k rho + h + m (1 - r).
double held_layers(int64_t layers, double offload_ratio, int64_t recompute_layers, double recomputed_share) {
  const int64_t k = recompute_layers;
  const int64_t whole = std::min<int64_t>(2, layers - k), offloaded = offloaded_layers(layers, k);
  return static_cast<double>(k) * recomputed_share + static_cast<double>(whole) +
         static_cast<double>(offloaded) * (1.0 - offload_ratio);
}

}  // namespace

int64_t max_micro_batch_tokens(int64_t capacity, int64_t layers, double offload_ratio, int64_t recompute_layers,
                               double recomputed_share) {
  if (capacity < 1 || layers < 1 || !(offload_ratio >= 0.0 && offload_ratio <= 1.0) || recompute_layers < 0 ||
      recompute_layers > layers || !(recomputed_share > 0.0 && recomputed_share <= 1.0)) {
    throw std::invalid_argument("max_micro_batch_tokens: capacity " + std::to_string(capacity) + ", layers " +
                                std::to_string(layers) + ", offload ratio " + std::to_string(offload_ratio) +
                                ", recompute layers " + std::to_string(recompute_layers) + ", recomputed share " +
                                std::to_string(recomputed_share));
  }
  const double held = held_layers(layers, offload_ratio, recompute_layers, recomputed_share);
  if (held >= static_cast<double>(layers)) return capacity;  // nothing freed
  const double limit = static_cast<double>(layers) * static_cast<double>(capacity) / held;
  // The relative nudge keeps an exact integer quotient from flooring one below after rounding.
  return std::max(capacity, static_cast<int64_t>(std::floor(limit * (1.0 + 1e-12))));
}

double micro_batch_device_share(const PlannedMicroBatch& mb, int64_t capacity, int64_t layers,
                                double recomputed_share) {
  const double held = held_layers(layers, mb.offload_ratio, std::min(mb.recompute_layers, layers), recomputed_share);
  return static_cast<double>(mb.tokens()) * held / (static_cast<double>(layers) * static_cast<double>(capacity));
}

bool micro_batch_offloads(const PlannedMicroBatch& mb, int64_t layers) {
  return mb.tokens() > 0 && mb.offload_ratio > 0 && offloaded_layers(layers, std::min(mb.recompute_layers, layers)) > 0;
}

namespace {

// What every micro-batch keeps in flight, per rank: micro_batch_device_share and
// micro_batch_offloads (1 or 0), as deepest_forward_limits takes them.
struct KeptInFlight {
  std::vector<std::vector<double>> device_shares;
  std::vector<std::vector<int>> offloads;
};

KeptInFlight kept_in_flight(const StepPlan& plan, int64_t layers) {
  KeptInFlight kept;
  for (const auto& mbs : plan.ranks) {
    kept.device_shares.emplace_back();
    kept.offloads.emplace_back();
    for (const PlannedMicroBatch& mb : mbs) {
      kept.device_shares.back().push_back(
          micro_batch_device_share(mb, plan.capacity, layers, plan.recomputed_layer_share));
      kept.offloads.back().push_back(micro_batch_offloads(mb, layers) ? 1 : 0);
    }
  }
  return kept;
}

}  // namespace

std::vector<std::vector<int>> plan_deepest_forward_limits(const StepPlan& plan, int64_t layers_per_stage,
                                                          int pipeline_stages) {
  const KeptInFlight kept = kept_in_flight(plan, layers_per_stage);
  return deepest_forward_limits(kept.device_shares, kept.offloads, pipeline_stages);
}

namespace {

std::string piece_string(const PlannedPiece& p) {
  return "(sequence " + std::to_string(p.sequence) + ", offset " + std::to_string(p.offset) + ", length " +
         std::to_string(p.length) + ", ring " + std::to_string(p.ring) + ")";
}


bool same_piece(const PlannedPiece& a, const PlannedPiece& b) {
  return a.sequence == b.sequence && a.offset == b.offset && a.length == b.length && a.ring == b.ring;
}

[[noreturn]] void fail(const std::string& what) { throw std::invalid_argument("plan: " + what); }

std::string str(int64_t v) { return std::to_string(v); }

// One forward or backward of a micro-batch on one (virtual) stage of one hdp rank.
struct ScheduledOp {
  int rank = 0, stage = 0, micro_batch = 0;  // stage: virtual stage chunk x stages + stage
  bool forward = true;
  int ring = -1;
};

std::string op_string(const ScheduledOp& op, int stages) {
  std::string s;
  if (op.ring >= 0) {
    s = std::string(op.forward ? "forward" : "backward") + " of ring " + str(op.ring) + " (rank " + str(op.rank) +
        " micro-batch " + str(op.micro_batch) + ")";
  } else {
    s = "rank " + str(op.rank) + " " + (op.forward ? "forward" : "backward") + " of micro-batch " +
        str(op.micro_batch);
  }
  if (stages > 1) s += " on stage " + str(op.stage);
  return s;
}

// Pairwise order: every two ranks meet their shared rings in the same order
// (with pipelines: the same sequence of ring forwards and backwards on every stage).
// Two ranks that disagree close a cycle of deadlock_cycle's graph through their two
// shared ring rendezvous, so a plan without a cycle passes; the check costs the
// square of the ring sizes and runs only to name the two ranks of a cycle found.
void check_ring_order(const StepPlan& plan, const std::vector<std::set<int>>& members, int stages, int chunks) {
  const int hdp = static_cast<int>(plan.ranks.size());
  for (int s = 0; s < stages; ++s) {
    // Ring ops of every rank on stage s, in schedule order (one stage: forwards only,
    // each backward follows its forward at once).
    std::vector<std::vector<ScheduledOp>> ops(hdp);
    for (int r = 0; r < hdp; ++r) {
      const int m = static_cast<int>(plan.ranks[r].size());
      for (const PipelineOp& op : pipeline_schedule(s, stages, chunks, m, plan.forward_limits)) {
        const int ring = plan.ranks[r][op.micro_batch].ring;
        if (ring < 0 || (stages == 1 && !op.forward)) continue;
        ops[r].push_back({r, op.chunk * stages + s, op.micro_batch, op.forward, ring});
      }
    }
    std::set<std::pair<int, int>> pairs;
    for (int a = 0; a < hdp; ++a)
      for (const ScheduledOp& op : ops[a])
        for (int b : members[op.ring])
          if (b > a) pairs.insert({a, b});
    for (auto [a, b] : pairs) {
      std::vector<const ScheduledOp*> on_a, on_b;
      for (const ScheduledOp& op : ops[a])
        if (members[op.ring].count(b)) on_a.push_back(&op);
      for (const ScheduledOp& op : ops[b])
        if (members[op.ring].count(a)) on_b.push_back(&op);
      // Each shared ring occurs once per rank, so both lists hold the same ops.
      for (size_t i = 0; i < on_a.size() && i < on_b.size(); ++i) {
        if (on_a[i]->ring == on_b[i]->ring && on_a[i]->forward == on_b[i]->forward) continue;
        if (stages == 1) {
          fail("ranks " + str(a) + " and " + str(b) + " meet their shared rings in different orders: shared ring " +
               str(static_cast<int64_t>(i)) + " is ring " + str(on_a[i]->ring) + " (micro-batch " +
               str(on_a[i]->micro_batch) + ") on rank " + str(a) + " but ring " + str(on_b[i]->ring) +
               " (micro-batch " + str(on_b[i]->micro_batch) + ") on rank " + str(b));
        }
        fail("stage " + str(s) + ": ranks " + str(a) + " and " + str(b) + " meet their shared rings in different " +
             (chunks > 1 ? "interleaved 1F1B" : "1F1B") + " orders: shared ring op " + str(static_cast<int64_t>(i)) +
             " is the " + op_string(*on_a[i], chunks) + " on rank " + str(a) + " but the " +
             op_string(*on_b[i], chunks) + " on rank " + str(b));
      }
    }
  }
}

// Deadlock freedom of the whole step: every op of every (rank, stage) in schedule
// order, a ring op being one rendezvous of all the ring's members on that stage,
// a forward waiting for the previous stage's forward and a backward for the next
// stage's backward of the same micro-batch. The plan can run iff this graph is
// acyclic: nothing when it is, else the ops of one cycle. O(ops log ops): edges
// are the schedule order and one per ring member, never pairs of members.
std::optional<std::string> deadlock_cycle(const StepPlan& plan, int stages, int chunks) {
  const int hdp = static_cast<int>(plan.ranks.size());
  const int virtual_stages = stages * chunks;
  std::vector<ScheduledOp> nodes;
  std::map<std::tuple<int, int, bool>, int> ring_node;  // (stage, ring, forward) -> node
  std::vector<std::vector<int>> preds;
  auto node_of = [&](const ScheduledOp& op) {
    if (op.ring >= 0) {
      auto [it, added] = ring_node.try_emplace({op.stage, op.ring, op.forward}, static_cast<int>(nodes.size()));
      if (!added) return it->second;
    }
    nodes.push_back(op);
    preds.emplace_back();
    return static_cast<int>(nodes.size()) - 1;
  };
  // node_at[r][v][{micro_batch, forward}] on virtual stage v
  std::vector<std::vector<std::map<std::pair<int, bool>, int>>> node_at(
      hdp, std::vector<std::map<std::pair<int, bool>, int>>(virtual_stages));
  for (int r = 0; r < hdp; ++r) {
    const int m = static_cast<int>(plan.ranks[r].size());
    for (int s = 0; s < stages; ++s) {
      int previous = -1;
      for (const PipelineOp& op : pipeline_schedule(s, stages, chunks, m, plan.forward_limits)) {
        const int v = op.chunk * stages + s;
        const int node = node_of({r, v, op.micro_batch, op.forward, plan.ranks[r][op.micro_batch].ring});
        node_at[r][v][{op.micro_batch, op.forward}] = node;
        if (previous >= 0) preds[node].push_back(previous);
        previous = node;
      }
    }
    for (int s = 0; s + 1 < virtual_stages; ++s) {
      for (int mb = 0; mb < m; ++mb) {
        preds[node_at[r][s + 1][{mb, true}]].push_back(node_at[r][s][{mb, true}]);
        preds[node_at[r][s][{mb, false}]].push_back(node_at[r][s + 1][{mb, false}]);
      }
    }
  }
  const size_t n = nodes.size();
  std::vector<std::vector<int>> succs(n);
  std::vector<int> indegree(n, 0);
  for (size_t v = 0; v < n; ++v) {
    for (int u : preds[v]) succs[u].push_back(static_cast<int>(v));
    indegree[v] = static_cast<int>(preds[v].size());
  }
  std::vector<int> ready;
  for (size_t v = 0; v < n; ++v)
    if (indegree[v] == 0) ready.push_back(static_cast<int>(v));
  std::vector<bool> done(n, false);
  size_t finished = 0;
  while (!ready.empty()) {
    const int v = ready.back();
    ready.pop_back();
    done[v] = true;
    ++finished;
    for (int w : succs[v])
      if (--indegree[w] == 0) ready.push_back(w);
  }
  if (finished == n) return std::nullopt;
  // Every op left waits for another op left: walk back along waits until one repeats.
  int v = 0;
  while (done[v]) ++v;
  std::vector<int> walk;
  std::map<int, size_t> seen;
  while (!seen.count(v)) {
    seen[v] = walk.size();
    walk.push_back(v);
    for (int u : preds[v]) {
      if (!done[u]) {
        v = u;
        break;
      }
    }
  }
  std::string cycle;
  for (size_t i = walk.size(); i-- > seen[v];) {
    cycle += op_string(nodes[walk[i]], virtual_stages);
    cycle += i > seen[v] ? " -> " : " -> (again) " + op_string(nodes[walk.back()], virtual_stages);
  }
  return cycle;
}

}  // namespace

void check_plan(const StepPlan& plan, std::span<const int64_t> lengths, int64_t layers_per_stage,
                int pipeline_stages, int chunks) {
  if (plan.capacity < 1) fail("capacity is " + str(plan.capacity));
  if (layers_per_stage < 1) fail("layers per stage is " + str(layers_per_stage));
  if (pipeline_stages < 1) fail("pipeline stages is " + str(pipeline_stages));
  if (chunks < 1 || (chunks > 1 && pipeline_stages < 2))
    fail(str(chunks) + " model chunks per stage over " + str(pipeline_stages) + " stages");
  const int hdp = static_cast<int>(plan.ranks.size());
  const int num_rings = static_cast<int>(plan.rings.size());
  const int64_t num_sequences = static_cast<int64_t>(lengths.size());
  for (int64_t q = 0; q < num_sequences; ++q)
    if (lengths[q] < 0) fail("sequence " + str(q) + " has length " + str(lengths[q]));

  // Rings: distinct valid ranks, distinct valid sequences.
  std::vector<std::map<int, int>> position(num_rings);  // member rank -> ring position
  std::vector<std::set<int>> members(num_rings);
  for (int R = 0; R < num_rings; ++R) {
    const Ring& ring = plan.rings[R];
    const std::string where = "ring " + str(R);
    if (ring.ranks.empty()) fail(where + " has no ranks");
    for (size_t j = 0; j < ring.ranks.size(); ++j) {
      const int rank = ring.ranks[j];
      if (rank < 0 || rank >= hdp) fail(where + " names rank " + str(rank) + ", hdp is " + str(hdp));
      if (!position[R].emplace(rank, static_cast<int>(j)).second) fail(where + " names rank " + str(rank) + " twice");
      members[R].insert(rank);
    }
    if (ring.sequences.empty()) fail(where + " has no sequences");
    std::set<int64_t> seen;
    for (int64_t q : ring.sequences) {
      if (q < 0 || q >= num_sequences)
        fail(where + " names sequence " + str(q) + ", the batch has " + str(num_sequences));
      if (!seen.insert(q).second) fail(where + " names sequence " + str(q) + " twice");
    }
  }

  // Micro-batches: limits, pieces, row order, ring chunks.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> covered(num_sequences);
  std::vector<std::vector<int>> ring_micro_batch(num_rings);  // [ring][position] -> micro-batch index
  if (!(plan.recomputed_layer_share > 0.0 && plan.recomputed_layer_share <= 1.0))
    fail("the recomputed layer share " + std::to_string(plan.recomputed_layer_share) + " is outside (0, 1]");
  for (int R = 0; R < num_rings; ++R) ring_micro_batch[R].assign(plan.rings[R].ranks.size(), -1);
  for (int r = 0; r < hdp; ++r) {
    for (size_t m = 0; m < plan.ranks[r].size(); ++m) {
      const PlannedMicroBatch& mb = plan.ranks[r][m];
      // Built only for a failure: a plan has a micro-batch per rank and a piece per ring sequence.
      const auto where = [&] { return "rank " + str(r) + " micro-batch " + str(static_cast<int64_t>(m)); };
      if (!(mb.offload_ratio >= 0.0 && mb.offload_ratio <= 1.0))
        fail(where() + " has offload ratio " + std::to_string(mb.offload_ratio) + ", outside [0, 1]");
      if (mb.recompute_layers < 0 || mb.recompute_layers > layers_per_stage)
        fail(where() + " recomputes " + str(mb.recompute_layers) + " layers, outside [0, " + str(layers_per_stage) + "]");
      const int64_t limit = max_micro_batch_tokens(plan.capacity, layers_per_stage, mb.offload_ratio,
                                                   mb.recompute_layers, plan.recomputed_layer_share);
      if (mb.tokens() > limit) {
        fail(where() + " holds " + str(mb.tokens()) + " tokens, its limit is " + str(limit) + " (capacity " +
             str(plan.capacity) + ", " + str(layers_per_stage) + " layers per stage, offload ratio " +
             std::to_string(mb.offload_ratio) + ", " + str(mb.recompute_layers) + " layers recompute)");
      }
      int ring_position = -1;
      if (mb.ring != -1) {
        if (mb.ring < 0 || mb.ring >= num_rings)
          fail(where() + " takes part in ring " + str(mb.ring) + ", the plan has " + str(num_rings) + " rings");
        auto it = position[mb.ring].find(r);
        if (it == position[mb.ring].end())
          fail(where() + " takes part in ring " + str(mb.ring) + ", which rank " + str(r) + " is not a member of");
        ring_position = it->second;
        int& earlier = ring_micro_batch[mb.ring][ring_position];
        if (earlier != -1) {
          fail("rank " + str(r) + " takes part in ring " + str(mb.ring) + " in micro-batches " + str(earlier) +
               " and " + str(static_cast<int64_t>(m)) + ", exactly one is allowed");
        }
        earlier = static_cast<int>(m);
      }
      size_t ring_pieces = 0;  // the last ones: mb.pieces[first_ring + j] is ring piece j
      for (size_t i = 0; i < mb.pieces.size(); ++i) {
        const PlannedPiece& p = mb.pieces[i];
        const auto at = [&] { return where() + " piece " + str(static_cast<int64_t>(i)); };
        if (p.sequence < 0 || p.sequence >= num_sequences)
          fail(at() + " names sequence " + str(p.sequence) + ", the batch has " + str(num_sequences));
        if (p.length < 1) fail(at() + " (sequence " + str(p.sequence) + ") has length " + str(p.length));
        if (p.offset < 0 || p.offset > lengths[p.sequence] - p.length) {
          fail(at() + " covers tokens [" + str(p.offset) + ", " + str(p.offset + p.length) + ") of sequence " +
               str(p.sequence) + ", which has " + str(lengths[p.sequence]) + " tokens");
        }
        if (p.ring == -1) {
          if (ring_pieces > 0)
            fail(at() + " (sequence " + str(p.sequence) + ") is local but follows ring pieces; local pieces come first");
        } else {
          if (p.ring != mb.ring) {
            fail(at() + " (sequence " + str(p.sequence) + ") names ring " + str(p.ring) + " but the micro-batch " +
                 (mb.ring == -1 ? std::string("takes part in no ring") : "takes part in ring " + str(mb.ring)));
          }
          ++ring_pieces;
        }
        // A ring's pieces are its zig-zag chunks exactly (checked below): they count as
        // their whole sequence once, after every member is known to hold its chunks.
        if (p.ring == -1) covered[p.sequence].push_back({p.offset, p.offset + p.length});
      }
      if (mb.ring != -1) {
        const size_t first_ring = mb.pieces.size() - ring_pieces;
        const auto member = [&] {
          return "position " + str(ring_position) + " of ring " + str(mb.ring) + " (" +
                 str(static_cast<int64_t>(plan.rings[mb.ring].ranks.size())) + " ranks)";
        };
        size_t i = 0;  // ring pieces compared
        for_each_zigzag_ring_piece(plan.rings[mb.ring], mb.ring, ring_position, lengths,
                                   [&](const PlannedPiece& expected) {
          if (i >= ring_pieces) fail(where() + " lacks ring piece " + piece_string(expected) + " of " + member());
          const PlannedPiece& piece = mb.pieces[first_ring + i];
          if (!same_piece(expected, piece)) {
            fail(where() + " ring piece " + str(static_cast<int64_t>(i)) + " is " + piece_string(piece) + ", " +
                 member() + " needs " + piece_string(expected) + " there");
          }
          ++i;
        });
        if (i < ring_pieces)
          fail(where() + " has ring piece " + piece_string(mb.pieces[first_ring + i]) + " beyond the chunks of " +
               member());
      }
    }
  }
  for (int R = 0; R < num_rings; ++R) {
    for (size_t j = 0; j < ring_micro_batch[R].size(); ++j) {
      if (ring_micro_batch[R][j] == -1) {
        fail("rank " + str(plan.rings[R].ranks[j]) + " (position " + str(static_cast<int64_t>(j)) + " of ring " +
             str(R) + ") has no micro-batch in ring " + str(R));
      }
    }
  }

  // Every member of every ring holds exactly its zig-zag chunks, which together are
  // each of the ring's sequences once: whole sequences, not 2n chunks each to sort
  // (a static plan at 12,288 GPUs has rings of 256 members).
  for (const Ring& ring : plan.rings)
    for (int64_t q : ring.sequences) covered[q].push_back({0, lengths[q]});

  // Every token exactly once.
  for (int64_t q = 0; q < num_sequences; ++q) {
    std::sort(covered[q].begin(), covered[q].end());
    int64_t next = 0;
    for (auto [begin, end] : covered[q]) {
      if (begin != next) {
        fail("sequence " + str(q) + " tokens from " + str(std::min(begin, next)) +
             (begin < next ? " are assigned twice" : " are missing"));
      }
      next = end;
    }
    if (next != lengths[q]) fail("sequence " + str(q) + " tokens from " + str(next) + " are missing");
  }

  if (!plan.forward_limits.empty()) {
    if (chunks != 1) fail("forward limits are for one model chunk per stage, the plan runs " + str(chunks));
    int most = 0;
    for (const auto& mbs : plan.ranks) most = std::max(most, static_cast<int>(mbs.size()));
    try {
      validate_forward_limits(plan.forward_limits, pipeline_stages, most);
    } catch (const std::invalid_argument& e) {
      fail(e.what());
    }
    const KeptInFlight kept = kept_in_flight(plan, layers_per_stage);
    for (int s = 0; s < pipeline_stages; ++s)
      if (!forward_limits_fit(kept.device_shares, kept.offloads, s, pipeline_stages, plan.forward_limits[s]))
        fail("stage " + str(s) + "'s forward limits keep more in flight than its " + str(pipeline_stages - s) +
             " micro-batches of capacity " + str(plan.capacity) + " (" + str(layers_per_stage) +
             " layers per stage) on the device, or more than " + str(pipeline_stages - s) +
             " micro-batches that offload rows to host memory");
  }
  if (const std::optional<std::string> cycle = deadlock_cycle(plan, pipeline_stages, chunks)) {
    check_ring_order(plan, members, pipeline_stages, chunks);
    fail("the step deadlocks, each of these ops must run before the next: " + *cycle);
  }
}

}  // namespace hdp

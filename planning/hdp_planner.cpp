#include "planning/hdp_planner.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <numeric>
#include <functional>
#include <optional>
#include <queue>
#include <set>
#include <tuple>
#include <utility>
#include <vector>
#include <stdexcept>
#include <string>

namespace hdp {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

void validate(const PlannerSettings& s, const std::string& who) {
  if (s.hdp < 1) throw std::invalid_argument(who + ": hdp must be at least 1, got " + str(s.hdp));
  if (s.capacity < 1) throw std::invalid_argument(who + ": capacity must be at least 1, got " + str(s.capacity));
  if (s.layers_per_stage < 1)
    throw std::invalid_argument(who + ": layers per stage must be at least 1, got " + str(s.layers_per_stage));
  if (s.pipeline_stages < 1)
    throw std::invalid_argument(who + ": pipeline stages must be at least 1, got " + str(s.pipeline_stages));
  if (s.ep < 1 || s.hdp % s.ep != 0)
    throw std::invalid_argument(who + ": ep " + str(s.ep) + " does not divide hdp " + str(s.hdp));
}

void validate_lengths(std::span<const int64_t> lengths, const std::string& who) {
  for (size_t q = 0; q < lengths.size(); ++q)
    if (lengths[q] < 1)
      throw std::invalid_argument(who + ": sequence " + str(static_cast<int64_t>(q)) + " has length " + str(lengths[q]));
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Fewest ranks for a sequence of s tokens at offload ratio r (see choose_ranks).
int64_t ranks_needed(int64_t s, double r, const PlannerSettings& st) {
  const int64_t C = st.capacity, l = st.layers_per_stage;
  const int64_t limit = max_micro_batch_tokens(C, l, r);
  int64_t d = ceil_div(s, limit);
  const double act_c = st.cost.activation_bytes(C);
  if (act_c > 0) {
    const double act_s = st.cost.activation_bytes(s);
    const double resident = l > 2 ? (2.0 + (1.0 - r) * static_cast<double>(l - 2)) * act_s / (static_cast<double>(l) * act_c)
                                  : act_s / act_c;
    // The nudge keeps an exact integer quotient from rounding up to the next count.
    d = std::max(d, static_cast<int64_t>(std::ceil(resident * (1.0 - 1e-12))));
  }
  d = std::max<int64_t>(d, 1);
  // Rounding of the chunk boundaries may leave a member a few tokens above s / d.
  while (d < INT_MAX && zigzag_max_member_tokens(s, static_cast<int>(d)) > limit) ++d;
  return d;
}

}  // namespace

int64_t zigzag_max_member_tokens(int64_t length, int ring_size) {
  if (ring_size < 1) return 0;
  std::vector<int64_t> bounds;
  zigzag_chunk_bounds(length, ring_size, bounds);
  const size_t last = bounds.size() - 1;  // 2 ring_size: member j holds chunks j and last - 1 - j
  int64_t most = 0;
  for (size_t j = 0; j < static_cast<size_t>(ring_size); ++j)
    most = std::max(most, bounds[j + 1] - bounds[j] + bounds[last - j] - bounds[last - 1 - j]);
  return most;
}

ActivationMixSettings activation_mix_settings(const PlannerSettings& st) {
  ActivationMixSettings m;
  m.capacity = st.capacity;
  m.layers = st.layers_per_stage;
  m.cost = st.cost;
  m.recompute = st.recompute;
  m.offload = st.offload.enabled && st.offload.forced_ratio < 0;
  m.host_bytes = st.offload.host_bytes_per_rank / static_cast<double>(st.pipeline_stages);
  return m;
}

namespace {

bool mixes_recomputation(const PlannerSettings& st) {
  return st.recompute.max_layers > 0 && !(st.offload.enabled && st.offload.forced_ratio >= 0);
}

// The cheapest mix of the members of a ring of d ranks over a sequence of `length`
// tokens (d = 1: the sequence alone on one rank), each member's layer computing T(s) / d.
std::optional<ActivationMix> ring_mix(int64_t length, int d, const PlannerSettings& st, const ActivationMixSettings& ms) {
  const int64_t member = d == 1 ? length : zigzag_max_member_tokens(length, d);
  return choose_activation_mix(member, d > 1, st.cost.compute_seconds(length) / d, ms);
}

// choose_ranks with recomputation as offload's alternative.
LongSequenceChoice choose_mixed_ranks(int64_t length, const PlannerSettings& st) {
  const ActivationMixSettings ms = activation_mix_settings(st);
  // No mix holds more than `most` tokens, so fewer ranks than length / most cannot.
  const int64_t most = largest_mix_tokens(ms);
  for (int64_t d = std::max<int64_t>(1, ceil_div(length, most)); d <= st.hdp; ++d) {
    const std::optional<ActivationMix> mix = ring_mix(length, static_cast<int>(d), st, ms);
    if (mix && mix->seconds <= 0) return {mix->offload_ratio, static_cast<int>(d), mix->recompute_layers};
  }
  const std::optional<ActivationMix> mix = ring_mix(length, st.hdp, st, ms);
  if (!mix) {
    throw std::invalid_argument("a sequence of " + str(length) + " tokens does not fit " + str(st.hdp) +
                                " ranks (capacity " + str(st.capacity) + " tokens, " + str(st.layers_per_stage) +
                                " layers per stage, with offload " + (ms.offload ? "on" : "off") + " and up to " +
                                str(st.recompute.max_layers) + " layers recomputing)");
  }
  return {mix->offload_ratio, st.hdp, mix->recompute_layers};
}

}  // namespace

LongSequenceChoice choose_ranks(int64_t length, const PlannerSettings& st) {
  validate(st, "choose_ranks");
  if (length < 1) throw std::invalid_argument("choose_ranks: a sequence of " + str(length) + " tokens");
  if (mixes_recomputation(st)) return choose_mixed_ranks(length, st);
  double r = 0;
  if (st.offload.enabled && st.layers_per_stage > 2) {
    if (st.offload.forced_ratio >= 0) {
      if (st.offload.forced_ratio > 1)
        throw std::invalid_argument("choose_ranks: forced offload ratio " + std::to_string(st.offload.forced_ratio) +
                                    " is above 1");
      r = st.offload.forced_ratio;
    } else {
      // The largest ratio whose copies hide under the layer's compute.
      const double bandwidth = std::min(st.cost.d2h_bytes_per_s, st.cost.h2d_bytes_per_s);
      const double act = st.cost.activation_bytes(length);
      double hidden;
      if (!(bandwidth > 0)) {
        hidden = 0;
      } else if (!(act > 0)) {
        hidden = 1;
      } else {
        hidden = std::clamp(st.cost.compute_seconds(length) * bandwidth / act, 0.0, 1.0);
      }
      // Then the smallest ratio with as few ranks (D does not grow with r).
      const int64_t best = ranks_needed(length, hidden, st);
      if (ranks_needed(length, 0, st) > best) {
        double lo = 0, hi = hidden;
        for (int i = 0; i < 64 && hi - lo > 1e-12; ++i) {
          const double mid = 0.5 * (lo + hi);
          (ranks_needed(length, mid, st) <= best ? hi : lo) = mid;
        }
        r = hi;
      }
    }
  }
  int64_t d = ranks_needed(length, r, st);
  // Host memory: the first l - 2 layers park r of every member's rows, for each
  // micro-batch a stage keeps in flight (the first stage holds one per stage).
  const auto host_bytes = [&](int64_t ranks, double ratio) {
    const double rows = ratio * static_cast<double>(zigzag_max_member_tokens(length, static_cast<int>(ranks)));
    return static_cast<double>(st.layers_per_stage - 2) * st.cost.a2 * rows * st.pipeline_stages;
  };
  if (r > 0 && st.offload.host_bytes_per_rank > 0 && host_bytes(d, r) > st.offload.host_bytes_per_rank) {
    // More ranks, each with the smallest ratio that still fits them, until the host holds it.
    for (++d; d <= st.hdp; ++d) {
      double lo = 0, hi = r;
      if (ranks_needed(length, 0, st) <= d) {
        hi = 0;
      } else {
        for (int i = 0; i < 64 && hi - lo > 1e-12; ++i) {
          const double mid = 0.5 * (lo + hi);
          (ranks_needed(length, mid, st) <= d ? hi : lo) = mid;
        }
      }
      if (ranks_needed(length, hi, st) <= d && host_bytes(d, hi) <= st.offload.host_bytes_per_rank) {
        r = hi;
        break;
      }
    }
  }
  if (d > st.hdp) {
    throw std::invalid_argument("a sequence of " + str(length) + " tokens needs " + str(d) + " ranks (capacity " +
                                str(st.capacity) + " tokens, " + str(st.layers_per_stage) +
                                " layers per stage, offload ratio " + std::to_string(r) + ") but hdp is " + str(st.hdp));
  }
  return {r, static_cast<int>(d), 0};
}

namespace {

// A sequence of more than C tokens and the ranks and offload ratio it runs with.
struct LongSequence {
  int64_t sequence;
  LongSequenceChoice choice;
};

// A batch as Algorithm 1 splits it (Ge et al., 2025): the sequences of at most C
// tokens packed best-fit decreasing into micro-batches of C tokens, which run on
// one rank with no communication, and the longer ones, in batch order, with
// choose_ranks's ranks and ratio. plan_naive and plan_balance start from it.
struct SplitBatch {
  std::vector<PlannedMicroBatch> packed;
  std::vector<LongSequence> longs;
};

// The sequences of at most C tokens packed best-fit decreasing into micro-batches
// of `target` tokens (at most C); one longer than the target fills a micro-batch of
// its own (it still fits C).
std::vector<PlannedMicroBatch> pack_short(std::span<const int64_t> lengths, int64_t capacity, int64_t target) {
  std::vector<int64_t> bin_lengths, short_sequence;
  for (size_t q = 0; q < lengths.size(); ++q)
    if (lengths[q] <= capacity) {
      bin_lengths.push_back(std::min(lengths[q], target));
      short_sequence.push_back(static_cast<int64_t>(q));
    }
  std::vector<PlannedMicroBatch> packed;
  for (const std::vector<size_t>& bin : best_fit_decreasing(bin_lengths, target)) {
    PlannedMicroBatch mb;
    for (size_t i : bin) mb.pieces.push_back({short_sequence[i], 0, lengths[short_sequence[i]], -1});
    packed.push_back(std::move(mb));
  }
  return packed;
}

SplitBatch split_batch(std::span<const int64_t> lengths, const PlannerSettings& st) {
  SplitBatch split;
  split.packed = pack_short(lengths, st.capacity, st.capacity);
  for (size_t q = 0; q < lengths.size(); ++q)
    if (lengths[q] > st.capacity) split.longs.push_back({static_cast<int64_t>(q), choose_ranks(lengths[q], st)});
  return split;
}

// A long sequence as a micro-batch of its own on one rank, at its offload ratio
// (offload is what lets it fit there when choose_ranks gives it one rank).
PlannedMicroBatch one_rank_micro_batch(const LongSequence& ls, std::span<const int64_t> lengths) {
  PlannedMicroBatch mb;
  mb.pieces.push_back({ls.sequence, 0, lengths[ls.sequence], -1});
  mb.offload_ratio = ls.choice.ratio;
  mb.recompute_layers = ls.choice.recompute_layers;
  return mb;
}

// What a micro-batch's recomputed layers rerun (predicted_rank_seconds).
double rerun_seconds(const PlannedMicroBatch& mb, const PlannerSettings& st) {
  if (mb.recompute_layers <= 0) return 0;
  double per_layer = 0;
  for (const PlannedPiece& p : mb.pieces) per_layer += st.recompute.recomputed.recompute_seconds(p.length, p.ring >= 0);
  return static_cast<double>(std::min(mb.recompute_layers, st.layers_per_stage)) * per_layer;
}

}  // namespace

StepPlan plan_naive(std::span<const int64_t> lengths, const PlannerSettings& st) {
  validate(st, "plan_naive");
  validate_lengths(lengths, "plan_naive");
  const int hdp = st.hdp;
  StepPlan plan;
  plan.capacity = st.capacity;
  plan.recomputed_layer_share = recomputed_layer_share(activation_mix_settings(st));
  plan.ranks.resize(hdp);

  // Long sequences that need one rank join the packed micro-batches; the others are sharded.
  SplitBatch split = split_batch(lengths, st);
  std::vector<LongSequence> sharded;
  std::vector<PlannedMicroBatch> pool;  // micro-batches of one rank each
  for (const LongSequence& ls : split.longs) {
    if (ls.choice.ranks == 1) {
      pool.push_back(one_rank_micro_batch(ls, lengths));
    } else {
      sharded.push_back(ls);
    }
  }
  for (PlannedMicroBatch& mb : split.packed) pool.push_back(std::move(mb));

  // Slots: long sequences, longest first, each in the first slot with enough free ranks.
  std::stable_sort(sharded.begin(), sharded.end(), [&](const LongSequence& a, const LongSequence& b) {
    return lengths[a.sequence] > lengths[b.sequence];
  });
  std::vector<std::vector<std::optional<PlannedMicroBatch>>> grid;  // [slot][rank]
  std::vector<int> free_ranks;                                      // per slot
  std::vector<int64_t> load(hdp, 0);
  for (const LongSequence& ls : sharded) {
    const int d = ls.choice.ranks;
    size_t t = 0;
    while (t < grid.size() && free_ranks[t] < d) ++t;
    if (t == grid.size()) {
      grid.emplace_back(hdp);
      free_ranks.push_back(hdp);
    }
    Ring ring;
    for (int r = 0; r < hdp && static_cast<int>(ring.ranks.size()) < d; ++r)
      if (!grid[t][r]) ring.ranks.push_back(r);
    ring.sequences = {ls.sequence};
    const int ring_index = static_cast<int>(plan.rings.size());
    for (int j = 0; j < d; ++j) {
      PlannedMicroBatch mb;
      mb.pieces = zigzag_ring_pieces(ring, ring_index, j, lengths);
      mb.ring = ring_index;
      mb.offload_ratio = ls.choice.ratio;
      mb.recompute_layers = ls.choice.recompute_layers;
      load[ring.ranks[j]] += mb.tokens();
      grid[t][ring.ranks[j]] = std::move(mb);
    }
    free_ranks[t] -= d;
    plan.rings.push_back(std::move(ring));
  }

  // Packed micro-batches, largest first: free cells of the least loaded rank, then after the slots.
  std::stable_sort(pool.begin(), pool.end(),
                   [](const PlannedMicroBatch& a, const PlannedMicroBatch& b) { return a.tokens() > b.tokens(); });
  std::vector<std::vector<size_t>> free_cells(hdp);  // per rank, slots in decreasing order (earliest at the back)
  for (size_t t = grid.size(); t-- > 0;)
    for (int r = 0; r < hdp; ++r)
      if (!grid[t][r]) free_cells[r].push_back(t);
  std::vector<std::vector<PlannedMicroBatch>> after(hdp);
  for (PlannedMicroBatch& mb : pool) {
    int best = -1;
    for (int r = 0; r < hdp; ++r)
      if (!free_cells[r].empty() && (best < 0 || load[r] < load[best])) best = r;
    if (best >= 0) {
      const size_t t = free_cells[best].back();
      free_cells[best].pop_back();
      load[best] += mb.tokens();
      grid[t][best] = std::move(mb);
    } else {
      best = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
      load[best] += mb.tokens();
      after[best].push_back(std::move(mb));
    }
  }

  // Assemble. Several stages: ranks in rings keep their free cells as empty
  // micro-batches, so ring micro-batches sit at their slot index everywhere.
  const bool aligned = st.pipeline_stages > 1;
  std::vector<bool> in_ring(hdp, false);
  for (const Ring& ring : plan.rings)
    for (int r : ring.ranks) in_ring[r] = true;
  for (int r = 0; r < hdp; ++r) {
    for (size_t t = 0; t < grid.size(); ++t) {
      if (grid[t][r]) {
        plan.ranks[r].push_back(std::move(*grid[t][r]));
      } else if (aligned && in_ring[r]) {
        plan.ranks[r].emplace_back();
      }
    }
    for (PlannedMicroBatch& mb : after[r]) plan.ranks[r].push_back(std::move(mb));
  }
  if (aligned) {
    // Ranks connected through rings run one micro-batch count.
    std::vector<int> parent(hdp);
    std::iota(parent.begin(), parent.end(), 0);
    auto find = [&](int x) {
      while (parent[x] != x) x = parent[x] = parent[parent[x]];
      return x;
    };
    for (const Ring& ring : plan.rings)
      for (int r : ring.ranks) parent[find(r)] = find(ring.ranks.front());
    std::vector<size_t> count(hdp, 0);
    for (int r = 0; r < hdp; ++r)
      if (in_ring[r]) count[find(r)] = std::max(count[find(r)], plan.ranks[r].size());
    for (int r = 0; r < hdp; ++r)
      if (in_ring[r]) plan.ranks[r].resize(count[find(r)]);
  }
  return plan;
}

StepPlan plan_static(std::span<const int64_t> lengths, const PlannerSettings& st, int cp) {
  validate(st, "plan_static");
  validate_lengths(lengths, "plan_static");
  const int hdp = st.hdp;
  const int64_t C = st.capacity;
  const int64_t longest = lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
  auto fits = [&](int64_t length, int k) { return zigzag_max_member_tokens(length, k) <= C; };
  if (cp == 0) {
    for (int d = 1; d <= hdp && cp == 0; ++d)
      if (hdp % d == 0 && fits(longest, d)) cp = d;
    if (cp == 0) {
      throw std::invalid_argument("plan_static: the longest sequence, " + str(longest) + " tokens, does not fit " +
                                  str(hdp) + " ranks of " + str(C) + " tokens");
    }
  } else if (cp < 1 || hdp % cp != 0) {
    throw std::invalid_argument("plan_static: cp " + str(cp) + " does not divide hdp " + str(hdp));
  }
  for (size_t q = 0; q < lengths.size(); ++q) {
    if (!fits(lengths[q], cp)) {
      throw std::invalid_argument("plan_static: sequence " + str(static_cast<int64_t>(q)) + " of " + str(lengths[q]) +
                                  " tokens does not fit cp = " + str(cp) + " ranks of " + str(C) + " tokens");
    }
  }

  // Rows: best-fit decreasing with every member's tokens counted exactly.
  struct Row {
    std::vector<int64_t> sequences;
    std::vector<int64_t> member;
    int64_t tokens = 0;
  };
  std::vector<Row> rows;
  std::vector<size_t> order(lengths.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return lengths[a] > lengths[b]; });
  const int64_t row_capacity = static_cast<int64_t>(cp) * C;
  std::set<std::pair<int64_t, size_t>> open;  // (room, row)
  std::vector<int64_t> share(cp), bounds(2 * static_cast<size_t>(cp) + 1);  // member_tokens, from one set of bounds
  for (size_t q : order) {
    const int64_t len = lengths[q];
    zigzag_chunk_bounds(len, cp, bounds);
    for (int j = 0; j < cp; ++j) share[j] = bounds[j + 1] - bounds[j] + bounds[2 * cp - j] - bounds[2 * cp - 1 - j];
    size_t chosen = rows.size();
    for (auto it = open.lower_bound({len, 0}); it != open.end(); ++it) {
      const Row& row = rows[it->second];
      bool ok = true;
      for (int j = 0; j < cp && ok; ++j) ok = row.member[j] + share[j] <= C;
      if (ok) {
        chosen = it->second;
        open.erase(it);
        break;
      }
    }
    if (chosen == rows.size()) {
      rows.emplace_back();
      rows.back().member.assign(cp, 0);
    }
    Row& row = rows[chosen];
    row.sequences.push_back(static_cast<int64_t>(q));
    for (int j = 0; j < cp; ++j) row.member[j] += share[j];
    row.tokens += len;
    if (row.tokens < row_capacity) open.insert({row_capacity - row.tokens, chosen});
  }

  // Rows to dp groups, largest first, each to the group with the fewest tokens.
  std::vector<size_t> row_order(rows.size());
  std::iota(row_order.begin(), row_order.end(), size_t{0});
  std::stable_sort(row_order.begin(), row_order.end(),
                   [&](size_t a, size_t b) { return rows[a].tokens > rows[b].tokens; });
  const int groups = hdp / cp;
  std::vector<int64_t> load(groups, 0);
  StepPlan plan;
  plan.capacity = C;
  plan.ranks.resize(hdp);
  for (size_t i : row_order) {
    const Row& row = rows[i];
    const int g = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    load[g] += row.tokens;
    if (cp == 1) {
      PlannedMicroBatch mb;
      for (int64_t q : row.sequences) mb.pieces.push_back({q, 0, lengths[q], -1});
      plan.ranks[g].push_back(std::move(mb));
      continue;
    }
    Ring ring;
    for (int j = 0; j < cp; ++j) ring.ranks.push_back(g * cp + j);
    ring.sequences = row.sequences;
    const int ring_index = static_cast<int>(plan.rings.size());
    std::vector<std::vector<PlannedPiece>> pieces = zigzag_ring_pieces_by_member(ring, ring_index, lengths);
    for (int j = 0; j < cp; ++j) {
      PlannedMicroBatch mb;
      mb.pieces = std::move(pieces[j]);
      mb.ring = ring_index;
      plan.ranks[ring.ranks[j]].push_back(std::move(mb));
    }
    plan.rings.push_back(std::move(ring));
  }
  return plan;
}

// ---- the balance scheduler ----

namespace {

// What an offloaded micro-batch's copies add beyond the compute they run beside: its
// `tokens`, whose layers each compute for `layer_seconds` (a ring member: its share
// of the ring's), at `ratio` with `recompute_layers` recomputed (activation_copy_seconds).
// choose_ranks's ratio rule (ByteScale's) hides the copies under forward and backward
// together, but the copy out runs beside the forward alone: the step simulator, like
// the trainer, stalls the micro-batch by the difference.
double copy_stall_seconds(int64_t tokens, double layer_seconds, double ratio, int64_t recompute_layers,
                          const PlannerSettings& st) {
  if (!(ratio > 0)) return 0;
  const ActivationMix mix{std::min(recompute_layers, st.layers_per_stage), ratio, 0};
  return activation_copy_seconds(tokens, layer_seconds, mix, activation_mix_settings(st));
}

// Forward and backward seconds of a whole sequence of s tokens on one rank: the
// stage's layers, plus the embedding and head per token when the rank holds the
// whole model (one pipeline stage). ring: the sequence runs in a ring, whose
// recomputed layers keep their attention output (CostModel::recompute_seconds).
double sequence_seconds(int64_t s, const PlannerSettings& st, bool ring = false) {
  const double extra =
      st.pipeline_stages == 1 ? st.cost.embedding_seconds_per_token + st.cost.head_seconds_per_token : 0.0;
  return static_cast<double>(st.layers_per_stage) * (st.cost.compute_seconds(s) + st.cost.recompute_seconds(s, ring)) +
         extra * static_cast<double>(s);
}

// The smallest offload ratio in [0, most] (only `most` if `fixed`) at which
// `ranks` ranks hold a sequence of `length` tokens: the memory model needs no more
// ranks and every member's two zig-zag chunks fit the token limit. -1 if not even
// `most` does.
double ratio_for_ranks(int64_t length, int ranks, double most, bool fixed, const PlannerSettings& st) {
  const int64_t member = zigzag_max_member_tokens(length, ranks);
  auto fits = [&](double r) {
    return member <= max_micro_batch_tokens(st.capacity, st.layers_per_stage, r) && ranks_needed(length, r, st) <= ranks;
  };
  if (!fits(most)) return -1.0;
  if (fixed) return most;
  if (fits(0.0)) return 0.0;
  double lo = 0, hi = most;  // fits(hi), not fits(lo); fitting only gets easier as r grows
  for (int i = 0; i < 64 && hi - lo > 1e-12; ++i) {
    const double mid = 0.5 * (lo + hi);
    (fits(mid) ? hi : lo) = mid;
  }
  return hi;
}

// One unit of work: a micro-batch for one rank, or a long sequence for a ring of
// `ranks` ranks at once.
struct WorkItem {
  double cost = 0;                 // seconds on each rank it occupies
  int ranks = 1;
  int64_t sequence = -1;           // ring items: the long sequence
  double ratio = 0;                // ring items: its offload ratio
  size_t micro_batch = SIZE_MAX;   // one-rank items: index into the pool of micro-batches
  int64_t recompute_layers = 0;    // ring items: its recomputed layers
};

// The items' order: most expensive first; ties: wider rings first (then, stably sorted,
// the given order).
bool costlier(const WorkItem& a, const WorkItem& b) {
  if (a.cost != b.cost) return a.cost > b.cost;
  return a.ranks > b.ranks;
}
void sort_items(std::vector<WorkItem>& items) { std::stable_sort(items.begin(), items.end(), costlier); }

// Ranks by accumulated seconds: a binary min-heap of (seconds, rank), ties to the lower rank.
class RankHeap {
 public:
  explicit RankHeap(int ranks) {
    heap_.reserve(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) heap_.push_back({0.0, r});  // already a heap
  }
  bool empty() const { return heap_.empty(); }
  const std::pair<double, int>& top() const { return heap_.front(); }
  std::pair<double, int> pop() {
    std::pop_heap(heap_.begin(), heap_.end(), std::greater<>());
    const std::pair<double, int> e = heap_.back();
    heap_.pop_back();
    return e;
  }
  void push(std::pair<double, int> e) {
    heap_.push_back(e);
    std::push_heap(heap_.begin(), heap_.end(), std::greater<>());
  }

 private:
  std::vector<std::pair<double, int>> heap_;
};

// Which rank runs what (before the lists are laid out).
struct Assignment {
  std::vector<double> seconds;               // per rank
  std::vector<std::vector<size_t>> local;    // per rank: its one-rank items
  std::vector<size_t> ring_item;             // per ring, in ring order: its item
  std::vector<std::vector<int>> ring_ranks;  // per ring: its members, increasing
  explicit Assignment(int hdp) : seconds(static_cast<size_t>(hdp), 0.0), local(static_cast<size_t>(hdp)) {}
  double busiest() const { return seconds.empty() ? 0.0 : *std::max_element(seconds.begin(), seconds.end()); }
};

// Buckets of consecutive items (in cost order) of about equal total work (cost x
// ranks), ceil(items / hdp) of them (about one item per rank each): an item goes
// to the bucket holding its midpoint on the cumulative-work axis (by count when
// there is no work). Empty buckets are left out. Returns [begin, end) ranges.
std::vector<std::pair<size_t, size_t>> cut_buckets(const std::vector<WorkItem>& items, int hdp) {
  const size_t n = items.size();
  std::vector<std::pair<size_t, size_t>> buckets;
  if (n == 0) return buckets;
  const size_t wanted = std::min(n, (n + static_cast<size_t>(hdp) - 1) / static_cast<size_t>(hdp));
  double total = 0;
  for (const WorkItem& it : items) total += it.cost * it.ranks;
  double before = 0;
  size_t current = SIZE_MAX;
  for (size_t i = 0; i < n; ++i) {
    const double work = items[i].cost * items[i].ranks;
    const double x =
        total > 0 ? (before + 0.5 * work) / total : (static_cast<double>(i) + 0.5) / static_cast<double>(n);
    const size_t b = std::min(wanted - 1, static_cast<size_t>(x * static_cast<double>(wanted)));
    before += work;
    if (b != current) {
      buckets.push_back({i, i});
      current = b;
    }
    buckets.back().second = i + 1;
  }
  return buckets;
}

// Algorithm 2's rounds. A round serves the ranks more than `threshold` x max
// below the busiest (all ranks when there are none), in increasing order of their
// seconds, each once: the round's items, most expensive first, go to them in that
// order, a ring to as many consecutive ranks as it needs. Items are drawn from the
// first non-empty bucket (DataParallel: simply in cost order) or from the buckets
// in turn (Pipeline); a round ends when its eligible ranks or the items run out.
// A ring wider than the eligible ranks, drawn first in its round, takes the least
// loaded ranks whatever their load. Rings are numbered in the order they are placed.
Assignment assign_rounds(const std::vector<WorkItem>& items, int hdp, const BalanceSettings& balance) {
  Assignment a(hdp);
  const size_t n = items.size();
  const std::vector<std::pair<size_t, size_t>> ranges = cut_buckets(items, hdp);
  const bool pipeline_mode = balance.mode == BalanceMode::Pipeline;
  // Pipeline mode: the non-empty buckets as a circular list, and where each stands.
  std::vector<size_t> head(ranges.size()), next_bucket(ranges.size()), previous_bucket(ranges.size());
  for (size_t b = 0; b < ranges.size(); ++b) {
    head[b] = ranges[b].first;
    next_bucket[b] = (b + 1) % ranges.size();
    previous_bucket[b] = (b + ranges.size() - 1) % ranges.size();
  }
  size_t cursor = 0, dp_next = 0;
  auto peek = [&]() { return pipeline_mode ? head[cursor] : dp_next; };
  auto consume = [&]() {
    if (!pipeline_mode) {
      ++dp_next;
      return;
    }
    const size_t b = cursor;
    cursor = next_bucket[b];
    if (++head[b] == ranges[b].second) {
      next_bucket[previous_bucket[b]] = next_bucket[b];
      previous_bucket[next_bucket[b]] = previous_bucket[b];
    }
  };

  RankHeap heap(hdp);
  double busiest = 0;
  size_t remaining = n;
  std::vector<std::pair<double, int>> served;
  std::vector<size_t> drawn;
  while (remaining > 0) {
    const double limit = (1.0 - balance.threshold) * busiest;
    const bool everyone = !(heap.top().first < limit);
    served.clear();
    drawn.clear();
    size_t used = 0;
    while (remaining > 0) {
      const size_t d = static_cast<size_t>(items[peek()].ranks);
      while (served.size() < used + d && !heap.empty() && (everyone || drawn.empty() || heap.top().first < limit))
        served.push_back(heap.pop());
      if (served.size() < used + d) break;
      drawn.push_back(peek());
      consume();
      used += d;
      --remaining;
    }
    // Most expensive first (drawn in that order already under DataParallel).
    if (pipeline_mode) std::sort(drawn.begin(), drawn.end());
    size_t at = 0;
    for (size_t i : drawn) {
      const WorkItem& item = items[i];
      std::vector<int> members;
      for (size_t j = at; j < at + static_cast<size_t>(item.ranks); ++j) {
        const int r = served[j].second;
        served[j].first += item.cost;
        a.seconds[r] = served[j].first;
        busiest = std::max(busiest, a.seconds[r]);
        if (item.ranks == 1) a.local[r].push_back(i);
        members.push_back(r);
      }
      at += static_cast<size_t>(item.ranks);
      if (item.ranks > 1) {
        std::sort(members.begin(), members.end());
        a.ring_item.push_back(i);
        a.ring_ranks.push_back(std::move(members));
      }
    }
    for (const std::pair<double, int>& e : served) heap.push(e);
  }
  return a;
}

// Refinement of the busiest rank, while one of these lowers it and leaves every
// rank it touches below its old load: move one of its micro-batches to one of the
// least loaded ranks, or swap it for a cheaper one there; or move one of its rings
// to the least loaded ranks (counting the ring's members without it). The busiest
// load never grows and the count of ranks at it falls with every move, so this
// ends; a budget caps its time.
void refine(const std::vector<WorkItem>& items, Assignment& a) {
  const int hdp = static_cast<int>(a.seconds.size());
  if (hdp < 2 || items.empty()) return;
  std::set<std::pair<double, int>> by_load;
  for (int r = 0; r < hdp; ++r) by_load.insert({a.seconds[r], r});
  std::vector<std::set<std::pair<double, size_t>>> owned(hdp);  // per rank: (cost, item)
  for (int r = 0; r < hdp; ++r)
    for (size_t i : a.local[r]) owned[r].insert({items[i].cost, i});
  std::vector<std::vector<int>> rings_of(hdp);
  for (size_t X = 0; X < a.ring_ranks.size(); ++X)
    for (int r : a.ring_ranks[X]) rings_of[r].push_back(static_cast<int>(X));
  std::vector<char> member(hdp, 0);
  std::vector<std::pair<double, int>> choice;
  std::vector<int> best_ranks;
  const int candidates = std::min(hdp - 1, 4);
  size_t budget = std::min<size_t>(2 * items.size() + 2 * static_cast<size_t>(hdp) + 64, 100000);
  auto set_load = [&](int r, double v) {
    by_load.erase({a.seconds[r], r});
    a.seconds[r] = v;
    by_load.insert({v, r});
  };
  while (budget-- > 0) {
    // Named apart, not a structured binding: the lambda below captures `top`, which
    // C++20 allows but Clang 14 (the fuzzing build, docs/fuzzing.md) does not.
    const double top = by_load.rbegin()->first;
    const int R = by_load.rbegin()->second;
    double best = top * (1 - 1e-12);
    int best_q = -1, best_ring = -1;
    size_t give = SIZE_MAX, take = SIZE_MAX;
    auto consider = [&](double moved, int q, double low, size_t i, size_t j) {
      const double after = std::max(top - moved, low + moved);
      if (moved > 0 && after < best) {
        best = after;
        best_q = q;
        best_ring = -1;
        give = i;
        take = j;
      }
    };
    int seen = 0;
    for (auto it = by_load.begin(); it != by_load.end() && seen < candidates && !owned[R].empty(); ++it) {
      const auto [low, q] = *it;
      if (q == R) continue;
      ++seen;
      const double half = 0.5 * (top - low);  // the ideal amount to shift
      // Move: the micro-batch of R closest to half the gap, from either side.
      auto m = owned[R].lower_bound({half, 0});
      if (m != owned[R].end()) consider(m->first, q, low, m->second, SIZE_MAX);
      if (m != owned[R].begin()) consider(std::prev(m)->first, q, low, std::prev(m)->second, SIZE_MAX);
      // Swap: for each micro-batch of R, the one of q closest to (its cost - half).
      if (owned[q].empty()) continue;
      for (const auto& [c, i] : owned[R]) {
        auto w = owned[q].lower_bound({c - half, 0});
        if (w != owned[q].end()) consider(c - w->first, q, low, i, w->second);
        if (w != owned[q].begin()) consider(c - std::prev(w)->first, q, low, i, std::prev(w)->second);
      }
    }
    for (int X : rings_of[R]) {
      // The least loaded ranks once the ring's members are relieved of it: among
      // its members and the overall least loaded.
      const std::vector<int>& old = a.ring_ranks[X];
      const double c = items[a.ring_item[X]].cost;
      const size_t d = old.size();
      choice.clear();
      for (int r : old) {
        member[r] = 1;
        choice.push_back({a.seconds[r] - c, r});
      }
      size_t taken = 0;
      for (auto it = by_load.begin(); it != by_load.end() && taken < d; ++it, ++taken)
        if (!member[it->second]) choice.push_back(*it);
      for (int r : old) member[r] = 0;
      std::nth_element(choice.begin(), choice.begin() + static_cast<std::ptrdiff_t>(d - 1), choice.end());
      double after = 0;
      for (size_t j = 0; j < d; ++j) after = std::max(after, choice[j].first + c);
      if (after < best) {
        best = after;
        best_q = -1;
        best_ring = X;
        best_ranks.clear();
        for (size_t j = 0; j < d; ++j) best_ranks.push_back(choice[j].second);
      }
    }
    if (best_ring >= 0) {
      const int X = best_ring;
      const double c = items[a.ring_item[X]].cost;
      std::vector<int>& old = a.ring_ranks[X];
      std::sort(best_ranks.begin(), best_ranks.end());
      for (int r : old) {
        if (std::binary_search(best_ranks.begin(), best_ranks.end(), r)) continue;
        set_load(r, a.seconds[r] - c);
        rings_of[r].erase(std::find(rings_of[r].begin(), rings_of[r].end(), X));
      }
      for (int r : best_ranks) {
        if (std::binary_search(old.begin(), old.end(), r)) continue;
        set_load(r, a.seconds[r] + c);
        rings_of[r].push_back(X);
      }
      old = best_ranks;
      continue;
    }
    if (best_q < 0) break;
    const int q = best_q;
    const double moved = items[give].cost - (take == SIZE_MAX ? 0.0 : items[take].cost);
    owned[R].erase({items[give].cost, give});
    owned[q].insert({items[give].cost, give});
    if (take != SIZE_MAX) {
      owned[q].erase({items[take].cost, take});
      owned[R].insert({items[take].cost, take});
    }
    set_load(R, a.seconds[R] - moved);
    set_load(q, a.seconds[q] + moved);
  }
  for (int r = 0; r < hdp; ++r) {
    a.local[r].clear();
    for (const auto& e : owned[r]) a.local[r].push_back(e.second);
  }
}

// plan_naive's choices as an assignment of the same items (its packed
// micro-batches and rings are the same); nullopt if they are not.
std::optional<Assignment> naive_assignment(const StepPlan& naive, const std::vector<WorkItem>& items,
                                           const std::vector<PlannedMicroBatch>& pool, size_t sequences, int hdp) {
  std::vector<size_t> item_of(sequences, SIZE_MAX);
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].ranks > 1) {
      item_of[items[i].sequence] = i;
    } else {
      for (const PlannedPiece& p : pool[items[i].micro_batch].pieces) item_of[p.sequence] = i;
    }
  }
  Assignment a(hdp);
  std::vector<char> used(items.size(), 0);
  if (naive.ranks.size() != static_cast<size_t>(hdp)) return std::nullopt;
  for (int r = 0; r < hdp; ++r) {
    for (const PlannedMicroBatch& mb : naive.ranks[r]) {
      if (mb.ring >= 0 || mb.pieces.empty()) continue;
      const size_t i = item_of[mb.pieces.front().sequence];
      if (i == SIZE_MAX || items[i].ranks != 1 || used[i] || pool[items[i].micro_batch].pieces.size() != mb.pieces.size())
        return std::nullopt;
      used[i] = 1;
      a.local[r].push_back(i);
      a.seconds[r] += items[i].cost;
    }
  }
  for (const Ring& ring : naive.rings) {
    if (ring.sequences.size() != 1) return std::nullopt;
    const size_t i = item_of[ring.sequences.front()];
    if (i == SIZE_MAX || items[i].ranks != static_cast<int>(ring.ranks.size()) || used[i]) return std::nullopt;
    used[i] = 1;
    std::vector<int> members = ring.ranks;
    std::sort(members.begin(), members.end());
    for (int r : members) a.seconds[r] += items[i].cost;
    a.ring_item.push_back(i);
    a.ring_ranks.push_back(std::move(members));
  }
  for (char u : used)
    if (!u) return std::nullopt;
  return a;
}

// Expert parallelism's lock step (lock_step_seconds) as an assignment: the items,
// all of one rank (nullopt if a ring is among them), most expensive first, cut into
// rows of ep consecutive items, each row costing its first (its most expensive);
// rows in that order go to the ep group with the least summed row cost (ties: the
// lower group), its member m taking the row's m-th item. The i-th micro-batches of a
// group's members are then neighbours in cost order, so the lock step wastes little.
std::optional<Assignment> lock_step_rows(const std::vector<WorkItem>& items, int hdp, int ep) {
  for (const WorkItem& item : items)
    if (item.ranks != 1) return std::nullopt;
  Assignment a(hdp);
  RankHeap groups(hdp / ep);
  for (size_t first = 0; first < items.size(); first += static_cast<size_t>(ep)) {
    auto [load, g] = groups.pop();
    const size_t end = std::min(items.size(), first + static_cast<size_t>(ep));
    for (size_t i = first; i < end; ++i) {
      const int r = g * ep + static_cast<int>(i - first);
      a.local[r].push_back(i);
      a.seconds[r] += items[i].cost;
    }
    groups.push({load + items[first].cost, g});
  }
  return a;
}

// The batch as the balance scheduler's work: split (split_batch, as plan_naive splits it),
// and a pool of micro-batches holding every long sequence's micro-batch of its own
// (long sequence i at index i, used while it runs on one rank), then the packed
// micro-batches, which `packed` prices as one-rank items.
struct BalanceWork {
  SplitBatch split;
  std::vector<PlannedMicroBatch> pool;
  std::vector<WorkItem> packed;
};

BalanceWork balance_work(SplitBatch split, std::span<const int64_t> lengths, const PlannerSettings& st) {
  BalanceWork work;
  work.split = std::move(split);
  for (const LongSequence& ls : work.split.longs) work.pool.push_back(one_rank_micro_batch(ls, lengths));
  for (PlannedMicroBatch& mb : work.split.packed) {
    double seconds = 0;  // packed micro-batches fit the capacity: nothing recomputes
    for (const PlannedPiece& p : mb.pieces) seconds += sequence_seconds(p.length, st);
    work.packed.push_back({seconds, 1, -1, 0.0, work.pool.size()});
    work.pool.push_back(std::move(mb));
  }
  work.split.packed.clear();  // moved into the pool
  return work;
}

// The items of the long sequences with these choices (in work.split.longs's order)
// and the packed micro-batches, sorted (sort_items). With price_copies an offloaded
// item also costs its copy stall (copy_stall_seconds), which predicted_rank_seconds
// leaves out.
std::vector<WorkItem> work_items(const std::vector<LongSequence>& chosen, const BalanceWork& work,
                                 std::span<const int64_t> lengths, const PlannerSettings& st,
                                 bool price_copies = false) {
  std::vector<WorkItem> items;
  for (size_t i = 0; i < chosen.size(); ++i) {
    const LongSequence& ls = chosen[i];
    const int64_t length = lengths[ls.sequence];
    const int ranks = ls.choice.ranks;
    const double seconds = sequence_seconds(length, st, ranks > 1);
    // The busiest member's tokens (the ring runs in lock step).
    const int64_t tokens = ranks == 1 ? length : zigzag_max_member_tokens(length, ranks);
    const double stall =
        price_copies ? copy_stall_seconds(tokens, st.cost.compute_seconds(length) / ranks, ls.choice.ratio,
                                          ls.choice.recompute_layers, st)
                     : 0.0;
    if (ranks == 1) {
      items.push_back({seconds + rerun_seconds(work.pool[i], st) + stall, 1, -1, 0.0, i});
    } else {
      PlannedMicroBatch member;
      member.pieces.push_back({ls.sequence, 0, tokens, 0});
      member.recompute_layers = ls.choice.recompute_layers;
      items.push_back({seconds / ranks + rerun_seconds(member, st) + stall, ranks, ls.sequence, ls.choice.ratio,
                       SIZE_MAX, ls.choice.recompute_layers});
    }
  }
  items.insert(items.end(), work.packed.begin(), work.packed.end());
  sort_items(items);
  return items;
}

// A long sequence on d ranks instead of its own count (more than it): the offload
// ratio and recomputed layers those ranks need, the smallest ratio as choose_ranks
// takes (a forced ratio stays what it is, plan_naive's rule for every long
// sequence). False, and the choice unchanged, if they do not hold it.
bool widen_ring(LongSequence& ls, int d, std::span<const int64_t> lengths, const PlannerSettings& st) {
  if (mixes_recomputation(st)) {
    const std::optional<ActivationMix> mix = ring_mix(lengths[ls.sequence], d, st, activation_mix_settings(st));
    if (!mix) return false;
    ls.choice = {mix->offload_ratio, d, mix->recompute_layers};
    return true;
  }
  const bool forced = st.offload.enabled && st.offload.forced_ratio >= 0;
  const double r = ratio_for_ranks(lengths[ls.sequence], d, ls.choice.ratio, forced, st);
  if (r < 0) return false;
  ls.choice = {r, d, 0};
  return true;
}

// The most ranks widening gives a ring of this length: hdp, and no member below
// widen_min_fill of the capacity (each member keeps length / ranks tokens).
int widest_ring(int64_t length, const PlannerSettings& st, const BalanceSettings& balance) {
  const double fill = std::max(1.0, balance.widen_min_fill * static_cast<double>(st.capacity));
  return static_cast<int>(std::min(static_cast<double>(st.hdp), std::floor(static_cast<double>(length) / fill)));
}

// ByteScale's PP-Balance for rings (Ge et al., 2025): under pipelines a ring is a
// synchronisation point between its members' pipelines, each of which 1F1B brings
// to it when its own earlier micro-batches are done, so a member that comes late
// stalls its partners and then their other stages. Waves make the pipelines run the
// same costs up to their last rings where every wave holds every rank: the
// sequences that need rings, longest first, are packed first-fit by their ranks
// (choose_ranks's count) into waves of at most hdp ranks; in each wave the ring
// whose members cost most, sequence_seconds / D, takes one more rank at a time
// (widen_ring) while the wave has ranks left and the ring is below its most
// (widest_ring, whether or not widen is set). A wave's rings then cost their
// members about one amount, the wave's; a wave whose rings all reach their most
// before it holds every rank stays partial. Returns the waves in
// order, each the indices into `longs` of its sequences, whose choices it sets.
std::vector<std::vector<size_t>> ring_waves(std::vector<LongSequence>& longs, std::span<const int64_t> lengths,
                                            const PlannerSettings& st, const BalanceSettings& balance) {
  const int hdp = st.hdp;
  std::vector<size_t> order;
  for (size_t i = 0; i < longs.size(); ++i)
    if (longs[i].choice.ranks > 1) order.push_back(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return lengths[longs[a].sequence] > lengths[longs[b].sequence]; });
  std::vector<std::vector<size_t>> waves;
  std::vector<int> used;  // per wave: its rings' ranks
  for (size_t i : order) {
    const int d = longs[i].choice.ranks;
    size_t w = 0;
    while (w < waves.size() && used[w] + d > hdp) ++w;
    if (w == waves.size()) {
      waves.emplace_back();
      used.push_back(0);
    }
    waves[w].push_back(i);
    used[w] += d;
  }
  std::vector<double> wave_cost(waves.size(), 0.0);  // its costliest ring's member seconds
  for (size_t w = 0; w < waves.size(); ++w) {
    const std::vector<size_t>& wave = waves[w];
    std::vector<int> width(wave.size()), most(wave.size());
    std::vector<double> work(wave.size());
    std::priority_queue<std::pair<double, size_t>> costliest;  // (member seconds, position in the wave)
    for (size_t j = 0; j < wave.size(); ++j) {
      const LongSequence& ls = longs[wave[j]];
      const int64_t length = lengths[ls.sequence];
      width[j] = ls.choice.ranks;
      work[j] = sequence_seconds(length, st, true);
      most[j] = std::max(width[j], widest_ring(length, st, balance));
      if (width[j] < most[j]) costliest.push({work[j] / width[j], j});
    }
    for (int spare = hdp - used[w]; spare > 0 && !costliest.empty(); --spare) {
      const size_t j = costliest.top().second;
      costliest.pop();
      if (++width[j] < most[j]) costliest.push({work[j] / width[j], j});
    }
    for (size_t j = 0; j < wave.size(); ++j) {
      if (width[j] != longs[wave[j]].choice.ranks && !widen_ring(longs[wave[j]], width[j], lengths, st))
        width[j] = longs[wave[j]].choice.ranks;
      wave_cost[w] = std::max(wave_cost[w], work[j] / width[j]);
    }
  }
  // Costliest first, then the first pp waves reversed: stage 0 runs pp - 1 other
  // micro-batches' forwards and as many backwards while the costliest wave's
  // micro-batch passes the later stages and comes back (one_f_one_b), and these
  // are then the next costliest waves; the pipeline fills on the cheapest of them.
  std::vector<size_t> by_cost(waves.size());
  std::iota(by_cost.begin(), by_cost.end(), size_t{0});
  std::stable_sort(by_cost.begin(), by_cost.end(), [&](size_t a, size_t b) { return wave_cost[a] > wave_cost[b]; });
  const size_t k = std::min(static_cast<size_t>(st.pipeline_stages), by_cost.size());
  std::reverse(by_cost.begin(), by_cost.begin() + static_cast<std::ptrdiff_t>(k));
  std::vector<std::vector<size_t>> ordered;
  for (size_t w : by_cost) ordered.push_back(std::move(waves[w]));
  return ordered;
}

// The waves as an assignment: each wave's rings on consecutive ranks from rank 0
// (a partial wave leaves its last ranks out, and lay_out a hole there),
// numbered wave by wave; then the one-rank items, most expensive first, each to the
// least loaded rank (ties: the lower), so pipelines with less ring work take more
// micro-batches.
Assignment wave_assignment(const std::vector<WorkItem>& items, const std::vector<std::vector<size_t>>& waves,
                           const std::vector<LongSequence>& longs, size_t sequences, int hdp) {
  Assignment a(hdp);
  std::vector<size_t> item_of(sequences, SIZE_MAX);
  for (size_t i = 0; i < items.size(); ++i)
    if (items[i].ranks > 1) item_of[items[i].sequence] = i;
  for (const std::vector<size_t>& wave : waves) {
    int next = 0;
    for (size_t j : wave) {
      const size_t i = item_of[longs[j].sequence];
      std::vector<int> members;
      for (int k = 0; k < items[i].ranks; ++k, ++next) {
        members.push_back(next);
        a.seconds[next] += items[i].cost;
      }
      a.ring_item.push_back(i);
      a.ring_ranks.push_back(std::move(members));
    }
  }
  std::priority_queue<std::pair<double, int>, std::vector<std::pair<double, int>>, std::greater<>> least;
  for (int r = 0; r < hdp; ++r) least.push({a.seconds[r], r});
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].ranks != 1) continue;
    const int r = least.top().second;
    least.pop();
    a.local[r].push_back(i);
    a.seconds[r] += items[i].cost;
    least.push({a.seconds[r], r});
  }
  return a;
}

// Where a ring sits in a rank's list: its slot index and the ring.
struct RingCell {
  size_t slot;
  int ring;
};

// How lay_out orders a rank's list.
enum class Layout {
  // Rings in their order, each at one slot on all its members: the first after every
  // member's earlier rings. The rank's own micro-batches, most expensive first, fill
  // the holes before its rings and then follow them. Holes left over stay as empty
  // micro-batches with several pipeline stages (a ring then sits at the same index on
  // every member, so its members' 1F1B schedules meet it together) and are dropped
  // with one (rings keep their order).
  HolesFilled,
  // The same slots, the holes left empty: every own micro-batch follows the rank's
  // last ring (long sequences first, as ByteScale's PP-Balance orders them).
  RingsFirst,
  // One stage: by predicted time instead of slots. Each rank keeps a clock of the
  // seconds of what its list holds so far; a ring starts at the latest of its
  // members' clocks, and each member first fills its wait with its own micro-batches
  // that fit in it (most expensive first), so that the members reach the ring
  // together; the rest follow the rank's last ring. Slot-aligned lists leave a member
  // whose earlier rings were cheaper waiting: LLaMA-70B, pp 1, Byted 1M
  // (docs/performance.md), where Algorithm 2 balances the predicted busy time to
  // 111-118 s and the step simulated 150 s.
  Timed,
  // Timed, with the rings taken in the order they can start (the one whose last
  // member is free first) instead of the assignment's: a ring then no longer waits
  // for earlier rings of its members' that could have run later.
  TimedEarliest,
};

// The layouts a candidate is scored in: with pipeline stages holes filled and rings
// first; with one timed, both ways (holes filled never simulated shorter than both:
// LLaMA-7B and LLaMA-70B, docs/performance.md's tables).
std::vector<Layout> layouts(const PlannerSettings& st) {
  if (st.pipeline_stages > 1) return {Layout::HolesFilled, Layout::RingsFirst};
  return {Layout::Timed, Layout::TimedEarliest};
}

// Rank `r`'s micro-batch of ring X (its zig-zag chunks of the ring's sequence).
PlannedMicroBatch ring_micro_batch(const std::vector<WorkItem>& items, const Assignment& a, const StepPlan& plan,
                                   int X, int r, std::span<const int64_t> lengths) {
  const Ring& ring = plan.rings[X];
  const int position = static_cast<int>(std::lower_bound(ring.ranks.begin(), ring.ranks.end(), r) - ring.ranks.begin());
  PlannedMicroBatch mb;
  mb.pieces = zigzag_ring_pieces(ring, X, position, lengths);
  mb.ring = X;
  mb.offload_ratio = items[a.ring_item[X]].ratio;
  mb.recompute_layers = items[a.ring_item[X]].recompute_layers;
  return mb;
}

// The order a timed layout takes the rings in: the assignment's, or (earliest) the
// ring that can start first next. Own micro-batches only fill waits, so the rings
// alone decide when each starts: at the latest of its members' ends of their earlier
// rings. A ring's start only grows as its members' rings are placed, so a heap entry
// whose start has grown goes back in.
std::vector<size_t> timed_ring_order(const std::vector<WorkItem>& items, const Assignment& a, bool earliest) {
  std::vector<size_t> order(a.ring_ranks.size());
  std::iota(order.begin(), order.end(), size_t{0});
  if (!earliest) return order;
  std::vector<double> end(a.seconds.size(), 0.0);
  auto start_of = [&](size_t X) {
    double start = 0;
    for (int r : a.ring_ranks[X]) start = std::max(start, end[r]);
    return start;
  };
  using Entry = std::tuple<double, size_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> ready;
  for (size_t X = 0; X < a.ring_ranks.size(); ++X) ready.push({0.0, X});
  for (size_t& next : order) {
    for (;;) {
      const auto [known, X] = ready.top();
      ready.pop();
      const double start = start_of(X);
      if (start > known) {
        ready.push({start, X});
        continue;
      }
      next = X;
      for (int r : a.ring_ranks[X]) end[r] = start + items[a.ring_item[X]].cost;
      break;
    }
  }
  return order;
}

// Whether `layout` would lay this assignment out as another of layouts(st) does:
// TimedEarliest where the rings can start in the assignment's order (Timed's plan).
bool repeats_a_layout(Layout layout, const std::vector<WorkItem>& items, const Assignment& a) {
  if (layout != Layout::TimedEarliest) return false;
  const std::vector<size_t> order = timed_ring_order(items, a, true);
  for (size_t n = 0; n < order.size(); ++n)
    if (order[n] != n) return false;
  return true;
}

// Each rank's list, as `layout` says (Timed needs one pipeline stage).
StepPlan lay_out(const std::vector<WorkItem>& items, std::vector<PlannedMicroBatch>& pool, Assignment& a,
                 std::span<const int64_t> lengths, const PlannerSettings& st, Layout layout = Layout::HolesFilled) {
  const int hdp = static_cast<int>(a.seconds.size());
  StepPlan plan;
  plan.capacity = st.capacity;
  plan.recomputed_layer_share = recomputed_layer_share(activation_mix_settings(st));
  plan.ranks.resize(hdp);
  for (size_t X = 0; X < a.ring_ranks.size(); ++X)
    plan.rings.push_back(Ring{a.ring_ranks[X], {items[a.ring_item[X]].sequence}});
  for (std::vector<size_t>& mine : a.local) std::sort(mine.begin(), mine.end());  // item order: most expensive first

  if (layout == Layout::Timed || layout == Layout::TimedEarliest) {
    if (st.pipeline_stages != 1) throw std::logic_error("lay_out: a timed layout needs one pipeline stage");
    std::vector<double> clock(hdp, 0.0);
    std::vector<std::vector<bool>> used(hdp);
    for (int r = 0; r < hdp; ++r) used[r].assign(a.local[r].size(), false);
    for (const size_t X : timed_ring_order(items, a, layout == Layout::TimedEarliest)) {
      double start = 0;
      for (int r : a.ring_ranks[X]) start = std::max(start, clock[r]);
      for (int r : a.ring_ranks[X]) {
        const std::vector<size_t>& mine = a.local[r];
        for (size_t j = 0; j < mine.size() && clock[r] < start; ++j) {
          if (used[r][j] || clock[r] + items[mine[j]].cost > start) continue;
          used[r][j] = true;
          clock[r] += items[mine[j]].cost;
          plan.ranks[r].push_back(std::move(pool[items[mine[j]].micro_batch]));
        }
        plan.ranks[r].push_back(ring_micro_batch(items, a, plan, static_cast<int>(X), r, lengths));
        clock[r] = start + items[a.ring_item[X]].cost;
      }
    }
    for (int r = 0; r < hdp; ++r)
      for (size_t j = 0; j < a.local[r].size(); ++j)
        if (!used[r][j]) plan.ranks[r].push_back(std::move(pool[items[a.local[r][j]].micro_batch]));
    return plan;
  }

  std::vector<size_t> slots(hdp, 0);
  std::vector<std::vector<RingCell>> cells(hdp);  // per rank: its rings, slots increasing
  for (size_t X = 0; X < a.ring_ranks.size(); ++X) {
    size_t slot = 0;
    for (int r : a.ring_ranks[X]) slot = std::max(slot, slots[r]);
    for (int r : a.ring_ranks[X]) {
      cells[r].push_back({slot, static_cast<int>(X)});
      slots[r] = slot + 1;
    }
  }
  const bool aligned = st.pipeline_stages > 1;
  for (int r = 0; r < hdp; ++r) {
    const std::vector<size_t>& mine = a.local[r];
    std::vector<PlannedMicroBatch>& out = plan.ranks[r];
    out.reserve(slots[r] + mine.size());
    size_t next_local = 0, next_ring = 0;
    for (size_t t = 0; t < slots[r]; ++t) {
      if (next_ring < cells[r].size() && cells[r][next_ring].slot == t) {
        out.push_back(ring_micro_batch(items, a, plan, cells[r][next_ring++].ring, r, lengths));
      } else if (layout == Layout::HolesFilled && next_local < mine.size()) {
        out.push_back(std::move(pool[items[mine[next_local++]].micro_batch]));
      } else if (aligned) {
        out.emplace_back();
      }
    }
    while (next_local < mine.size()) out.push_back(std::move(pool[items[mine[next_local++]].micro_batch]));
  }
  return plan;
}

// A one-stage plan's work as items that cost what `seconds` says (per rank and list
// index: BalanceSettings::micro_batch_seconds) plus, where offloaded, their copy
// stall (copy_stall_seconds, which the simulator charges beside the compute): a ring
// its slowest member's, a one-rank micro-batch its own; with the plan's assignment of
// them (its rings in its order). Empty micro-batches are left out.
struct MeasuredWork {
  std::vector<PlannedMicroBatch> pool;
  std::vector<WorkItem> items;  // sorted (sort_items)
  Assignment assignment;
};
MeasuredWork measured_work(const StepPlan& plan, const std::vector<std::vector<double>>& seconds,
                           const PlannerSettings& st) {
  const int hdp = static_cast<int>(plan.ranks.size());
  bool shaped = seconds.size() == plan.ranks.size();
  for (size_t r = 0; shaped && r < seconds.size(); ++r) shaped = seconds[r].size() == plan.ranks[r].size();
  if (!shaped) throw std::invalid_argument("BalanceSettings::micro_batch_seconds gave no time for every micro-batch of the plan");
  MeasuredWork w{{}, {}, Assignment(hdp)};
  const double layers = static_cast<double>(st.layers_per_stage);
  auto cost = [&](const PlannedMicroBatch& mb, double measured) {
    int64_t tokens = 0;
    for (const PlannedPiece& p : mb.pieces) tokens += p.length;
    return measured + copy_stall_seconds(tokens, measured / layers, mb.offload_ratio, mb.recompute_layers, st);
  };
  std::vector<WorkItem> items(plan.rings.size());
  std::vector<int> owner(plan.rings.size(), -1);  // per item: the rank of a one-rank one
  for (size_t X = 0; X < plan.rings.size(); ++X) {
    items[X].ranks = static_cast<int>(plan.rings[X].ranks.size());
    items[X].sequence = plan.rings[X].sequences.front();
  }
  for (int r = 0; r < hdp; ++r)
    for (size_t i = 0; i < plan.ranks[r].size(); ++i) {
      const PlannedMicroBatch& mb = plan.ranks[r][i];
      if (mb.ring >= 0) {
        WorkItem& ring = items[static_cast<size_t>(mb.ring)];
        ring.cost = std::max(ring.cost, cost(mb, seconds[r][i]));
        ring.ratio = mb.offload_ratio;
        ring.recompute_layers = mb.recompute_layers;
      } else if (!mb.pieces.empty()) {
        items.push_back({cost(mb, seconds[r][i]), 1, -1, 0.0, w.pool.size()});
        owner.push_back(r);
        w.pool.push_back(mb);
      }
    }
  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return costlier(items[a], items[b]); });
  std::vector<size_t> sorted_at(items.size());
  for (size_t n = 0; n < order.size(); ++n) {
    sorted_at[order[n]] = n;
    w.items.push_back(items[order[n]]);
  }
  Assignment& a = w.assignment;
  for (size_t X = 0; X < plan.rings.size(); ++X) {
    std::vector<int> members = plan.rings[X].ranks;
    std::sort(members.begin(), members.end());
    for (int r : members) a.seconds[r] += items[X].cost;
    a.ring_item.push_back(sorted_at[X]);
    a.ring_ranks.push_back(std::move(members));
  }
  for (size_t j = plan.rings.size(); j < items.size(); ++j) {
    a.seconds[owner[j]] += items[j].cost;
    a.local[owner[j]].push_back(sorted_at[j]);
  }
  return w;
}

// The plans a one-stage plan re-timed by measured seconds (measured_work) becomes:
// its own assignment, then refined, then its items balanced anew (assign_rounds and
// refine), each laid out by time both ways (layouts).
std::vector<StepPlan> retimed_plans(const StepPlan& plan, const std::vector<std::vector<double>>& seconds,
                                    std::span<const int64_t> lengths, const PlannerSettings& st,
                                    const BalanceSettings& balance) {
  // Balance's rings each hold one long sequence, which the items carry; a plan with
  // a ring of several (none of balance's candidates) is left as it is.
  for (const Ring& ring : plan.rings)
    if (ring.sequences.size() != 1) return {};
  MeasuredWork w = measured_work(plan, seconds, st);
  const int hdp = static_cast<int>(plan.ranks.size());
  Assignment refined = w.assignment;
  refine(w.items, refined);
  Assignment anew = assign_rounds(w.items, hdp, balance);
  refine(w.items, anew);
  std::vector<StepPlan> plans;
  for (Assignment* a : {&w.assignment, &refined, &anew})
    for (Layout layout : layouts(st)) {
      if (repeats_a_layout(layout, w.items, *a)) continue;
      std::vector<PlannedMicroBatch> copy = w.pool;
      plans.push_back(lay_out(w.items, copy, *a, lengths, st, layout));
    }
  return plans;
}

// PP-Balance's candidates (ring_waves, wave_assignment) for a batch under these
// settings (work: balance_work of the batch under them), in each of layouts(st)'s
// layouts, but rings first only where some wave leaves a rank out (where every wave
// holds every rank no rank has a hole before its last ring, and rings first is the
// holes-filled plan); price_copies: as work_items. None when no sequence needs a ring.
std::vector<StepPlan> wave_plans(const BalanceWork& work, std::span<const int64_t> lengths,
                                 const PlannerSettings& st, const BalanceSettings& balance,
                                 bool price_copies = false) {
  std::vector<LongSequence> longs = work.split.longs;
  const std::vector<std::vector<size_t>> waves = ring_waves(longs, lengths, st, balance);
  if (waves.empty()) return {};
  const std::vector<WorkItem> items = work_items(longs, work, lengths, st, price_copies);
  Assignment a = wave_assignment(items, waves, longs, lengths.size(), st.hdp);
  size_t ring_cells = 0;  // each wave holds at most hdp ranks: this many only if each holds all
  for (const std::vector<int>& members : a.ring_ranks) ring_cells += members.size();
  const bool holes = ring_cells < waves.size() * static_cast<size_t>(st.hdp);
  std::vector<StepPlan> plans;
  for (Layout layout : layouts(st)) {
    if ((layout == Layout::RingsFirst && !holes) || repeats_a_layout(layout, items, a)) continue;
    std::vector<PlannedMicroBatch> copy = work.pool;
    plans.push_back(lay_out(items, copy, a, lengths, st, layout));
  }
  return plans;
}

}  // namespace

std::vector<double> lock_step_seconds(const std::vector<std::vector<double>>& seconds, int ep) {
  const size_t ranks = seconds.size();
  if (ep < 1 || ranks % static_cast<size_t>(ep) != 0)
    throw std::invalid_argument("lock_step_seconds: ep " + str(ep) + " does not divide the " +
                                str(static_cast<int64_t>(ranks)) + " ranks");
  std::vector<double> out(ranks, 0.0);
  const size_t n = static_cast<size_t>(ep);
  for (size_t first = 0; first < ranks; first += n) {
    size_t longest = 0;
    for (size_t m = first; m < first + n; ++m) longest = std::max(longest, seconds[m].size());
    double group = 0;
    for (size_t i = 0; i < longest; ++i) {
      double slowest = 0;
      for (size_t m = first; m < first + n; ++m)
        if (i < seconds[m].size()) slowest = std::max(slowest, seconds[m][i]);
      group += slowest;
    }
    std::fill(out.begin() + static_cast<std::ptrdiff_t>(first), out.begin() + static_cast<std::ptrdiff_t>(first + n),
              group);
  }
  return out;
}

std::vector<double> predicted_rank_seconds(const StepPlan& plan, std::span<const int64_t> lengths,
                                           const PlannerSettings& st) {
  validate(st, "predicted_rank_seconds");
  const int64_t num_sequences = static_cast<int64_t>(lengths.size());
  auto length_of = [&](int64_t q) {
    if (q < 0 || q >= num_sequences)
      throw std::invalid_argument("predicted_rank_seconds: the plan names sequence " + str(q) + ", the batch has " +
                                  str(num_sequences));
    return lengths[q];
  };
  // Per rank, each micro-batch's seconds in list order.
  std::vector<std::vector<double>> seconds(plan.ranks.size());
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    for (const PlannedMicroBatch& mb : plan.ranks[r]) {
      double total = 0;
      for (const PlannedPiece& p : mb.pieces) {
        if (p.ring == -1) {
          length_of(p.sequence);
          total += sequence_seconds(p.length, st);
        }
      }
      if (mb.ring >= 0) {
        if (static_cast<size_t>(mb.ring) >= plan.rings.size())
          throw std::invalid_argument("predicted_rank_seconds: a micro-batch takes part in ring " + str(mb.ring) +
                                      ", the plan has " + str(static_cast<int64_t>(plan.rings.size())) + " rings");
        const Ring& ring = plan.rings[mb.ring];
        const double k = static_cast<double>(std::max<size_t>(ring.ranks.size(), 1));
        for (int64_t q : ring.sequences) total += sequence_seconds(length_of(q), st, true) / k;
      }
      seconds[r].push_back(total + rerun_seconds(mb, st));
    }
  }
  return lock_step_seconds(seconds, st.ep);
}

namespace {

// Sets plan.forward_limits to the deepest its memory allows (plan_deepest_forward_limits);
// whether they run ahead of 1F1B's anywhere (else it leaves them empty).
bool set_deepest_forward_limits(StepPlan& plan, const PlannerSettings& st) {
  const int pp = st.pipeline_stages;
  std::vector<std::vector<int>> limits = plan_deepest_forward_limits(plan, st.layers_per_stage, pp);
  const int most = limits.empty() ? 0 : static_cast<int>(limits[0].size());
  for (int s = 0; s < pp; ++s)
    for (int k = 0; k < most; ++k)
      if (limits[s][k] > std::min(k + pp - s - 1, most - 1)) {
        plan.forward_limits = std::move(limits);
        return true;
      }
  return false;
}

// The plan with up to `count` micro-batches after its costliest ring (per member, by
// sequence_seconds) on every rank recomputing all the layers recomputation may take,
// where that keeps less of them on the device and still fits max_micro_batch_tokens
// (their offload ratio stays, for the layers that do not recompute). Unchanged without
// rings.
StepPlan recompute_after_costliest_ring(StepPlan plan, std::span<const int64_t> lengths, const PlannerSettings& st,
                                        int count) {
  int costliest = -1;
  double most = 0;
  for (size_t g = 0; g < plan.rings.size(); ++g) {
    double seconds = 0;
    for (int64_t q : plan.rings[g].sequences) seconds += sequence_seconds(lengths[q], st, true);
    seconds /= static_cast<double>(plan.rings[g].ranks.size());
    if (seconds > most) most = seconds, costliest = static_cast<int>(g);
  }
  if (costliest < 0) return plan;
  const auto& first_member = plan.ranks[plan.rings[costliest].ranks.front()];
  size_t at = 0;
  while (first_member[at].ring != costliest) ++at;
  const int64_t layers = std::min(st.recompute.max_layers, st.layers_per_stage);
  for (auto& mbs : plan.ranks)
    for (size_t i = at + 1; i < mbs.size() && i <= at + static_cast<size_t>(count); ++i)
      if (mbs[i].tokens() > 0 && mbs[i].recompute_layers < layers) {
        PlannedMicroBatch mb = mbs[i];
        mb.recompute_layers = layers;
        const double share = micro_batch_device_share(mb, plan.capacity, st.layers_per_stage, plan.recomputed_layer_share);
        if (share <= 1 && share < micro_batch_device_share(mbs[i], plan.capacity, st.layers_per_stage,
                                                           plan.recomputed_layer_share))
          mbs[i] = std::move(mb);
      }
  return plan;
}

}  // namespace

StepPlan plan_balance(std::span<const int64_t> lengths, const PlannerSettings& st, const BalanceSettings& balance) {
  validate(st, "plan_balance");
  validate_lengths(lengths, "plan_balance");
  if (!(balance.threshold >= 0.0 && balance.threshold <= 1.0))
    throw std::invalid_argument("plan_balance: threshold must be in [0, 1], got " + std::to_string(balance.threshold));
  if (!(balance.widen_min_fill >= 0.0 && balance.widen_min_fill <= 1.0))
    throw std::invalid_argument("plan_balance: widen_min_fill must be in [0, 1], got " +
                                std::to_string(balance.widen_min_fill));
  const int hdp = st.hdp;

  BalanceWork work = balance_work(split_batch(lengths, st), lengths, st);
  const SplitBatch& split = work.split;
  std::vector<PlannedMicroBatch>& pool = work.pool;
  double total_seconds = 0;
  for (int64_t length : lengths) total_seconds += sequence_seconds(length, st);
  auto make_items = [&](const std::vector<LongSequence>& chosen) { return work_items(chosen, work, lengths, st); };

  // A candidate's predicted step: its busiest rank, or with expert parallelism the
  // busiest ep group in lock step, which needs the lists' order: lay_out of a copy
  // of the micro-batches (lay_out moves them out of the pool).
  auto predicted_max = [&](const std::vector<WorkItem>& candidate_items, Assignment& a) {
    if (st.ep == 1) return a.busiest();
    std::vector<PlannedMicroBatch> copy = pool;
    const std::vector<double> t = predicted_rank_seconds(lay_out(candidate_items, copy, a, lengths, st), lengths, st);
    return t.empty() ? 0.0 : *std::max_element(t.begin(), t.end());
  };

  // Candidate 1: Algorithm 2 on these items, refined.
  std::vector<WorkItem> items = make_items(split.longs);
  Assignment best = assign_rounds(items, hdp, balance);
  refine(items, best);
  double best_max = predicted_max(items, best);
  Assignment* winner = &best;
  const std::vector<WorkItem>* winner_items = &items;
  // A candidate refined, and the winner where it predicts a shorter step (ties: the earlier).
  auto refine_and_compare = [&](const std::vector<WorkItem>& candidate_items, Assignment& a) {
    refine(candidate_items, a);
    const double candidate_max = predicted_max(candidate_items, a);
    if (candidate_max < best_max * (1 - 1e-9)) {
      best_max = candidate_max;
      winner = &a;
      winner_items = &candidate_items;
    }
  };

  // Candidate 2 (widen): a long sequence whose share on each of its ranks would
  // cost more than `load` gets ceil(its seconds / load) ranks instead, at most hdp
  // and at most length / (widen_min_fill C), at the smallest offload ratio they
  // need; load is the mean rank's (all seconds / hdp). Returns the choices, or none
  // when no ring changes.
  auto widened_longs = [&](double load) -> std::optional<std::vector<LongSequence>> {
    std::vector<LongSequence> widened = split.longs;
    bool changed = false;
    for (LongSequence& ls : widened) {
      const double seconds = sequence_seconds(lengths[ls.sequence], st);
      if (!(load > 0) || !(seconds / ls.choice.ranks > load) || ls.choice.ranks >= hdp) continue;
      const double most = widest_ring(lengths[ls.sequence], st, balance);
      const int d = std::max(ls.choice.ranks, static_cast<int>(std::min(most, std::ceil(seconds / load))));
      if (d == ls.choice.ranks) continue;
      if (widen_ring(ls, d, lengths, st)) changed = true;
    }
    if (!changed) return std::nullopt;
    return widened;
  };
  const double mean_load = total_seconds / hdp;
  std::vector<WorkItem> wide_items;
  std::optional<Assignment> wide;
  std::optional<std::vector<LongSequence>> widened;
  if (balance.widen) widened = widened_longs(mean_load);
  if (widened) {
    wide_items = make_items(*widened);
    wide = assign_rounds(wide_items, hdp, balance);
    refine_and_compare(wide_items, *wide);
  }

  // Candidate 3: plan_naive's assignment of the same items, refined, so that the
  // result never predicts a slower step than Algorithm 1. Skipped when it cannot
  // win: no assignment of these items beats the mean load or the costliest item.
  const double floor_of_items = std::max(total_seconds / hdp, items.empty() ? 0.0 : items.front().cost);
  std::optional<Assignment> naive;
  if (best_max > floor_of_items * (1 + 1e-9))
    naive = naive_assignment(plan_naive(lengths, st), items, pool, lengths.size(), hdp);
  if (naive) refine_and_compare(items, *naive);
  // Candidate 4, with expert parallelism: lock_step_rows, for a batch without rings.
  std::optional<Assignment> rows;
  if (st.ep > 1) rows = lock_step_rows(items, hdp, st.ep);
  if (rows && predicted_max(items, *rows) < best_max * (1 - 1e-9)) {
    winner = &*rows;
    winner_items = &items;
  }
  // Without a step measure (the trainer with one stage): timed with one stage, where
  // ring members then reach their rings together by the predicted times; with expert
  // parallelism the lists stay most expensive first, which lock_step_seconds assumes.
  if (!balance.step_seconds)
    return lay_out(*winner_items, pool, *winner, lengths, st,
                   st.pipeline_stages == 1 && st.ep == 1 ? Layout::Timed : Layout::HolesFilled);

  // Every candidate laid out (each from a copy of the pool), scored by the given step.
  std::vector<std::pair<const std::vector<WorkItem>*, Assignment*>> candidates = {{&items, &best}};
  if (wide) candidates.push_back({&wide_items, &*wide});
  if (naive) candidates.push_back({&items, &*naive});
  if (rows) candidates.push_back({&items, &*rows});
  // Where offload's copies stall (copy_stall_seconds), Algorithm 2 and plan_naive's
  // assignment once more with the offloaded items costing their stall too, and the
  // waves below likewise: balanced by what the simulator charges them.
  const std::vector<WorkItem> priced_items = work_items(split.longs, work, lengths, st, true);
  double stalls = 0;
  for (const WorkItem& it : priced_items) stalls += it.cost;
  for (const WorkItem& it : items) stalls -= it.cost;
  std::optional<Assignment> priced, priced_naive;
  if (stalls > 0) {
    priced = assign_rounds(priced_items, hdp, balance);
    refine(priced_items, *priced);
    candidates.push_back({&priced_items, &*priced});
    priced_naive = naive_assignment(plan_naive(lengths, st), priced_items, pool, lengths.size(), hdp);
    if (priced_naive) {
      refine(priced_items, *priced_naive);
      candidates.push_back({&priced_items, &*priced_naive});
    }
  }
  std::optional<StepPlan> chosen;
  double chosen_seconds = 0;
  auto score = [&](StepPlan plan) {
    const double seconds = balance.step_seconds(plan);
    if (!chosen || seconds < chosen_seconds * (1 - 1e-9)) {
      chosen = std::move(plan);
      chosen_seconds = seconds;
    }
  };
  // Each candidate, and with deeper_warmup then the same candidate with the deepest
  // forward limits its memory allows where they run ahead of 1F1B's (ties keep 1F1B).
  auto consider = [&](StepPlan plan) {
    if (!balance.deeper_warmup || st.pipeline_stages == 1) return score(std::move(plan));
    StepPlan deep = plan;
    score(std::move(plan));
    if (set_deepest_forward_limits(deep, st)) score(std::move(deep));
  };
  for (const auto& [candidate_items, assignment] : candidates)
    for (Layout layout : layouts(st)) {
      if (repeats_a_layout(layout, *candidate_items, *assignment)) continue;
      std::vector<PlannedMicroBatch> copy = pool;
      consider(lay_out(*candidate_items, copy, *assignment, lengths, st, layout));
    }
  consider(plan_naive(lengths, st));
  // PP-Balance's waves; with one stage too, timed, where they keep a wave's rings
  // meeting together (docs/planning.md, "Reading the results").
  for (StepPlan& plan : wave_plans(work, lengths, st, balance)) consider(std::move(plan));
  if (stalls > 0)
    for (StepPlan& plan : wave_plans(work, lengths, st, balance, true)) consider(std::move(plan));
  // And without offload where it fits: wider rings that copy nothing can be faster.
  if (st.offload.enabled && st.offload.forced_ratio < 0) {
    PlannerSettings without = st;
    without.offload.enabled = false;
    try {
      consider(plan_naive(lengths, without));
      for (StepPlan& plan :
           wave_plans(balance_work(split_batch(lengths, without), lengths, without), lengths, without, balance))
        consider(std::move(plan));
    } catch (const std::invalid_argument&) {
      // a sequence needs offload to fit
    }
  }
  // With pipelines, candidate 2 once more against the mean load over pp: a ring's
  // micro-batch runs the pp stages' forwards and then their backwards one after
  // another (1F1B; Narayanan et al., 2021), so it spans pp times its members'
  // seconds per stage, and to stay within the mean rank's load it needs pp times
  // the ranks. Candidate 2's rule misses this: LLaMA-70B Byted 2M, 1,024 GPUs, pp 4
  // ran its 2M document on 12 of 32 ranks, 2.9 times the bound (docs/performance.md).
  // Laid out both ways, after the others, so ties keep them.
  std::optional<std::vector<LongSequence>> pipeline_widened;
  if (balance.widen && st.pipeline_stages > 1) pipeline_widened = widened_longs(mean_load / st.pipeline_stages);
  if (pipeline_widened) {
    const std::vector<WorkItem> pipeline_items = make_items(*pipeline_widened);
    Assignment a = assign_rounds(pipeline_items, hdp, balance);
    refine(pipeline_items, a);
    for (Layout layout : layouts(st)) {
      std::vector<PlannedMicroBatch> copy = pool;
      consider(lay_out(pipeline_items, copy, a, lengths, st, layout));
    }
  }
  // With pipelines, the short sequences also packed into smaller micro-batches: at
  // C a pipeline may get only a few huge ones, and 1F1B's bubble, (pp - 1) / (m +
  // pp - 1) of the step for m micro-batches (Narayanan et al., 2021), is then
  // large; smaller ones are more and shrink it, at some cost in per-micro-batch
  // efficiency, which the measure weighs. Targets C/2, C/4 and C/8 (a sequence
  // above the target runs alone; rings and memory keep the real C, which a smaller
  // micro-batch always fits), each scheduled like candidate 1 (holes filled) and as
  // waves; a target that adds no micro-batch is skipped. Only where the ranks
  // average fewer than pp micro-batches at C, so the bubble is about half the step
  // or more, and the packed ones are at least half of them (ring cells the rest), so
  // their size sets it: each target costs the measure up to three plans, and a looser
  // gate (fewer than 4 pp packed per rank) cost LLaMA-70B at 12,288 GPUs, pp 4, 40%
  // more planning time without winning a setup.
  size_t ring_cells = 0;
  for (const LongSequence& ls : split.longs) ring_cells += static_cast<size_t>(ls.choice.ranks);
  const size_t packed_cells = work.packed.size();
  if (st.pipeline_stages > 1 && packed_cells >= ring_cells &&
      packed_cells + ring_cells < static_cast<size_t>(st.pipeline_stages) * hdp) {
    size_t previous = work.packed.size();
    for (int64_t target = st.capacity / 2; target >= std::max<int64_t>(1, st.capacity / 8); target /= 2) {
      SplitBatch smaller{pack_short(lengths, st.capacity, target), split.longs};
      if (smaller.packed.size() == previous) continue;
      previous = smaller.packed.size();
      const BalanceWork small_work = balance_work(std::move(smaller), lengths, st);
      const std::vector<WorkItem> small_items = work_items(small_work.split.longs, small_work, lengths, st);
      Assignment a = assign_rounds(small_items, hdp, balance);
      refine(small_items, a);
      std::vector<PlannedMicroBatch> copy = small_work.pool;
      consider(lay_out(small_items, copy, a, lengths, st));
      for (StepPlan& plan : wave_plans(small_work, lengths, st, balance)) consider(std::move(plan));
    }
  }
  // With one stage, the chosen plan re-timed by what the simulator says its
  // micro-batches take (BalanceSettings::micro_batch_seconds, retimed_plans): LLaMA-70B,
  // pp 1, Byted 2M (docs/performance.md) had candidates that predicted 134-142 s on
  // every rank and simulated 160-175 s, rings waiting for members whose clocks the
  // cost model had put ahead. Once: a second round, re-timing its winner, shortened no
  // step of LLaMA-70B pp 1 at 1,024 or 12,288 GPUs (2M, Byted and GitHub, every setup).
  if (balance.micro_batch_seconds && st.pipeline_stages == 1 && st.ep == 1) {
    const std::vector<std::vector<double>> seconds = balance.micro_batch_seconds(*chosen);
    if (!seconds.empty())
      for (StepPlan& plan : retimed_plans(*chosen, seconds, lengths, st, balance)) score(std::move(plan));
  }
  // The winner with the micro-batches after its costliest ring recomputing every layer,
  // more of them each time, so that more fit in flight while that ring's micro-batch
  // travels: the rerun costs time, the simulated step decides.
  if (balance.deeper_warmup && st.pipeline_stages > 1 && st.recompute.max_layers > 0) {
    StepPlan base = *chosen;
    base.forward_limits.clear();
    for (int count = st.pipeline_stages; count <= 8 * st.pipeline_stages; count *= 2) {
      StepPlan plan = recompute_after_costliest_ring(base, lengths, st, count);
      if (set_deepest_forward_limits(plan, st)) score(std::move(plan));
    }
  }
  return std::move(*chosen);
}

}  // namespace hdp

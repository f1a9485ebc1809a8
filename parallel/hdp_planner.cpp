#include "parallel/hdp_planner.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <numeric>
#include <optional>
#include <set>
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
}

void validate_lengths(std::span<const int64_t> lengths, const std::string& who) {
  for (size_t q = 0; q < lengths.size(); ++q)
    if (lengths[q] < 1)
      throw std::invalid_argument(who + ": sequence " + str(static_cast<int64_t>(q)) + " has length " + str(lengths[q]));
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t chunk_size(int64_t length, int chunk, int ring_size) {
  return zigzag_chunk_begin(length, chunk + 1, ring_size) - zigzag_chunk_begin(length, chunk, ring_size);
}

int64_t member_tokens(int64_t length, int position, int ring_size) {
  return chunk_size(length, position, ring_size) + chunk_size(length, 2 * ring_size - 1 - position, ring_size);
}

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
  int64_t most = 0;
  for (int j = 0; j < ring_size; ++j) most = std::max(most, member_tokens(length, j, ring_size));
  return most;
}

LongSequenceChoice choose_ranks(int64_t length, const PlannerSettings& st) {
  validate(st, "choose_ranks");
  if (length < 1) throw std::invalid_argument("choose_ranks: a sequence of " + str(length) + " tokens");
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
  const int64_t d = ranks_needed(length, r, st);
  if (d > st.hdp) {
    throw std::invalid_argument("a sequence of " + str(length) + " tokens needs " + str(d) + " ranks (capacity " +
                                str(st.capacity) + " tokens, " + str(st.layers_per_stage) +
                                " layers per stage, offload ratio " + std::to_string(r) + ") but hdp is " + str(st.hdp));
  }
  return {r, static_cast<int>(d)};
}

StepPlan plan_naive(std::span<const int64_t> lengths, const PlannerSettings& st) {
  validate(st, "plan_naive");
  validate_lengths(lengths, "plan_naive");
  const int hdp = st.hdp;
  const int64_t C = st.capacity;
  StepPlan plan;
  plan.capacity = C;
  plan.ranks.resize(hdp);

  // Split: short sequences to pack, long ones to shard (or to offload on one rank).
  std::vector<int64_t> short_lengths, short_sequence;
  struct LongSequence {
    int64_t sequence;
    LongSequenceChoice choice;
  };
  std::vector<LongSequence> longs;
  std::vector<PlannedMicroBatch> pool;  // micro-batches of one rank each
  for (size_t q = 0; q < lengths.size(); ++q) {
    const int64_t seq = static_cast<int64_t>(q);
    if (lengths[q] <= C) {
      short_lengths.push_back(lengths[q]);
      short_sequence.push_back(seq);
      continue;
    }
    const LongSequenceChoice choice = choose_ranks(lengths[q], st);
    if (choice.ranks == 1) {
      PlannedMicroBatch mb;
      mb.pieces.push_back({seq, 0, lengths[q], -1});
      mb.offload_ratio = choice.ratio;
      pool.push_back(std::move(mb));
    } else {
      longs.push_back({seq, choice});
    }
  }
  for (const std::vector<size_t>& bin : best_fit_decreasing(short_lengths, C)) {
    PlannedMicroBatch mb;
    for (size_t i : bin) mb.pieces.push_back({short_sequence[i], 0, short_lengths[i], -1});
    pool.push_back(std::move(mb));
  }

  // Slots: long sequences, longest first, each in the first slot with enough free ranks.
  std::stable_sort(longs.begin(), longs.end(), [&](const LongSequence& a, const LongSequence& b) {
    return lengths[a.sequence] > lengths[b.sequence];
  });
  std::vector<std::vector<std::optional<PlannedMicroBatch>>> grid;  // [slot][rank]
  std::vector<int> free_ranks;                                      // per slot
  std::vector<int64_t> load(hdp, 0);
  for (const LongSequence& ls : longs) {
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
  std::vector<int64_t> share(cp);
  for (size_t q : order) {
    const int64_t len = lengths[q];
    for (int j = 0; j < cp; ++j) share[j] = member_tokens(len, j, cp);
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
    for (int j = 0; j < cp; ++j) {
      PlannedMicroBatch mb;
      mb.pieces = zigzag_ring_pieces(ring, ring_index, j, lengths);
      mb.ring = ring_index;
      plan.ranks[ring.ranks[j]].push_back(std::move(mb));
    }
    plan.rings.push_back(std::move(ring));
  }
  return plan;
}

}  // namespace hdp

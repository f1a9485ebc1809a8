#include "parallel/plan.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>

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

StepPlan plan_whole_sequences(std::span<const int64_t> sequence_lengths, int hdp, int64_t capacity) {
  if (hdp < 1) throw std::invalid_argument("plan: hdp must be at least 1");
  StepPlan plan;
  plan.capacity = capacity;
  plan.ranks.resize(hdp);
  std::vector<PlannedMicroBatch> micro_batches;
  for (const std::vector<size_t>& bin : best_fit_decreasing(sequence_lengths, capacity)) {
    PlannedMicroBatch mb;
    for (size_t i : bin) mb.pieces.push_back({static_cast<int64_t>(i), 0, sequence_lengths[i]});
    micro_batches.push_back(std::move(mb));
  }
  std::stable_sort(micro_batches.begin(), micro_batches.end(),
                   [](const PlannedMicroBatch& a, const PlannedMicroBatch& b) { return a.tokens() > b.tokens(); });
  std::vector<int64_t> load(hdp, 0);
  for (PlannedMicroBatch& mb : micro_batches) {
    const size_t r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[r] += mb.tokens();
    plan.ranks[r].push_back(std::move(mb));
  }
  return plan;
}

void check_plan(const StepPlan& plan, std::span<const int64_t> sequence_lengths) {
  std::vector<std::vector<std::pair<int64_t, int64_t>>> covered(sequence_lengths.size());
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    for (size_t m = 0; m < plan.ranks[r].size(); ++m) {
      const PlannedMicroBatch& mb = plan.ranks[r][m];
      const std::string where = "plan: rank " + std::to_string(r) + " micro-batch " + std::to_string(m);
      if (mb.pieces.empty()) throw std::invalid_argument(where + " is empty");
      if (mb.tokens() > plan.capacity) {
        throw std::invalid_argument(where + " holds " + std::to_string(mb.tokens()) + " tokens, capacity " +
                                    std::to_string(plan.capacity));
      }
      for (const PlannedPiece& p : mb.pieces) {
        if (p.sequence < 0 || p.sequence >= static_cast<int64_t>(sequence_lengths.size()) || p.length < 1 ||
            p.offset < 0 || p.offset + p.length > sequence_lengths[p.sequence]) {
          throw std::invalid_argument(where + " has a piece outside its sequence");
        }
        covered[p.sequence].push_back({p.offset, p.offset + p.length});
      }
    }
  }
  for (size_t s = 0; s < covered.size(); ++s) {
    std::sort(covered[s].begin(), covered[s].end());
    int64_t next = 0;
    for (auto [begin, end] : covered[s]) {
      if (begin != next) {
        throw std::invalid_argument("plan: sequence " + std::to_string(s) + " tokens from " + std::to_string(std::min(begin, next)) +
                                    (begin < next ? " are assigned twice" : " are missing"));
      }
      next = end;
    }
    if (next != sequence_lengths[s]) {
      throw std::invalid_argument("plan: sequence " + std::to_string(s) + " tokens from " + std::to_string(next) +
                                  " are missing");
    }
  }
}

}  // namespace hdp

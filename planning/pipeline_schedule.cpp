#include "planning/pipeline_schedule.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace hdp {

std::vector<PipelineOp> one_f_one_b(int stage, int stages, int micro_batches) {
  const int warmup = std::min(stages - stage - 1, micro_batches);
  std::vector<PipelineOp> ops;
  for (int i = 0; i < warmup; ++i) ops.push_back({true, i});
  for (int k = 0; k < micro_batches - warmup; ++k) {
    ops.push_back({true, warmup + k});
    ops.push_back({false, k});
  }
  for (int k = micro_batches - warmup; k < micro_batches; ++k) ops.push_back({false, k});
  return ops;
}

std::vector<PipelineOp> forwards_ahead_of_backwards(int micro_batches, std::span<const int> last_forward) {
  const int m = micro_batches;
  if (static_cast<int>(last_forward.size()) < m)
    throw std::invalid_argument("pipeline limits: " + std::to_string(last_forward.size()) + " entries for " +
                                std::to_string(m) + " micro-batches");
  for (int k = 0; k < m; ++k)
    if (last_forward[k] < k || (k > 0 && last_forward[k] < last_forward[k - 1]))
      throw std::invalid_argument("pipeline limits: backward " + std::to_string(k) + " after forward " +
                                  std::to_string(last_forward[k]) +
                                  "; each must be at least its backward and none below the one before");
  std::vector<PipelineOp> ops;
  int forwards = 0;
  for (int k = 0; k < m; ++k) {
    for (; forwards <= std::min(last_forward[k], m - 1); ++forwards) ops.push_back({true, forwards});
    ops.push_back({false, k});
  }
  return ops;
}

namespace {

// Megatron-LM's warm-up: the last stage's first backward needs the first group's
// forward through every chunk ((chunks - 1) p forwards before its last chunk), and
// each earlier stage is two transfers further from it.
int interleaved_warmup(int stage, int stages, int chunks) { return 2 * (stages - stage - 1) + (chunks - 1) * stages; }

// The forwards (or backwards) of a stage in order: groups of `stages` micro-batches,
// each through every chunk in turn, backwards in reverse chunk order.
std::vector<PipelineOp> chunk_order(int stages, int chunks, int micro_batches, bool forward) {
  std::vector<PipelineOp> order;
  for (int first = 0; first < micro_batches; first += stages)
    for (int c = 0; c < chunks; ++c)
      for (int i = first; i < first + stages; ++i) order.push_back({forward, i, forward ? c : chunks - 1 - c});
  return order;
}

}  // namespace

int pipeline_slots(int stage, int stages, int chunks) {
  return chunks == 1 ? stages - stage : interleaved_warmup(stage, stages, chunks) + 1;
}

std::vector<PipelineOp> interleaved_one_f_one_b(int stage, int stages, int chunks, int micro_batches) {
  if (chunks < 1 || stages < 1 || (chunks > 1 && stages < 2))
    throw std::invalid_argument("interleaved 1F1B: " + std::to_string(chunks) + " model chunks per stage over " +
                                std::to_string(stages) + " stages: needs a chunk, and two stages to interleave more");
  // Megatron-LM runs whole groups of `stages` micro-batches only; a last, shorter group
  // can deadlock (pp 4, vpp 3, m 5). The order here is that of the next multiple of
  // `stages` with the missing micro-batches' operations left out: removing operations
  // from a deadlock-free order keeps every wait it had, so it stays deadlock-free.
  const int padded = (micro_batches + stages - 1) / stages * stages;
  const std::vector<PipelineOp> forwards = chunk_order(stages, chunks, padded, true);
  const std::vector<PipelineOp> backwards = chunk_order(stages, chunks, padded, false);
  const int total = chunks * padded;
  const int warmup = std::min(interleaved_warmup(stage, stages, chunks), total);
  std::vector<PipelineOp> ops(forwards.begin(), forwards.begin() + warmup);
  for (int k = 0; k < total - warmup; ++k) {
    ops.push_back(forwards[warmup + k]);
    ops.push_back(backwards[k]);
  }
  ops.insert(ops.end(), backwards.begin() + (total - warmup), backwards.end());
  std::erase_if(ops, [&](const PipelineOp& op) { return op.micro_batch >= micro_batches; });
  return ops;
}

void validate_forward_limits(const std::vector<std::vector<int>>& limits, int stages, int micro_batches) {
  if (static_cast<int>(limits.size()) != stages)
    throw std::invalid_argument("pipeline limits: " + std::to_string(limits.size()) + " stages' limits for " +
                                std::to_string(stages) + " stages");
  for (int s = 0; s < stages; ++s) {
    try {
      forwards_ahead_of_backwards(micro_batches, limits[s]);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("stage " + std::to_string(s) + ": " + e.what());
    }
    if (s == 0) continue;
    for (int k = 0; k < micro_batches; ++k)
      if (limits[s][k] > limits[s - 1][k])
        throw std::invalid_argument("pipeline limits: stage " + std::to_string(s) + " runs forward " +
                                    std::to_string(limits[s][k]) + " before backward " + std::to_string(k) +
                                    ", stage " + std::to_string(s - 1) + " only " +
                                    std::to_string(limits[s - 1][k]) + "; no stage may run ahead of the one before");
  }
}

namespace {

// Per rank the running sums of the values: micro-batches [a, b) hold sums[b] - sums[a].
template <typename T>
std::vector<std::vector<T>> running_sums(const std::vector<std::vector<T>>& values) {
  std::vector<std::vector<T>> sums;
  for (const std::vector<T>& rank : values) {
    sums.emplace_back(1, T{0});
    for (T value : rank) sums.back().push_back(sums.back().back() + value);
  }
  return sums;
}

// What windows of a stage's forwards in flight hold, per rank as running sums
// (running_sums) of the device shares and of the micro-batches that offload.
struct InFlight {
  std::vector<std::vector<double>> device;
  std::vector<std::vector<int>> offloading;

  InFlight(const std::vector<std::vector<double>>& kept, const std::vector<std::vector<int>>& offloads)
      : device(running_sums(kept)) {
    if (offloads.empty()) {
      for (const std::vector<double>& rank : kept) offloading.emplace_back(rank.size() + 1, 0);
      return;
    }
    bool same_shape = offloads.size() == kept.size();
    for (size_t r = 0; same_shape && r < kept.size(); ++r) same_shape = offloads[r].size() == kept[r].size();
    if (!same_shape)
      throw std::invalid_argument("pipeline limits: the offloading micro-batches' lists are not one per rank with one "
                                  "entry per micro-batch, as the device shares'");
    offloading = running_sums(offloads);
  }

  // Whether micro-batches k ... last (clamped to each rank's) keep at most `budget`
  // micro-batches' worth on the device, and at most `budget` of them offload, on every rank.
  bool fits(int k, int last, int budget) const {
    for (size_t r = 0; r < device.size(); ++r) {
      const int m = static_cast<int>(device[r].size()) - 1;
      if (k >= m) continue;
      const int end = std::min(last, m - 1) + 1;
      if (device[r][end] - device[r][k] > budget * (1 + 1e-9) || offloading[r][end] - offloading[r][k] > budget)
        return false;
    }
    return true;
  }
};

}  // namespace

bool forward_limits_fit(const std::vector<std::vector<double>>& kept, const std::vector<std::vector<int>>& offloads,
                        int stage, int stages, std::span<const int> last_forward) {
  const InFlight in_flight(kept, offloads);
  for (int k = 0; k < static_cast<int>(last_forward.size()); ++k)
    if (last_forward[k] > k + stages - stage - 1 && !in_flight.fits(k, last_forward[k], stages - stage))
      return false;
  return true;
}

std::vector<std::vector<int>> deepest_forward_limits(const std::vector<std::vector<double>>& kept,
                                                     const std::vector<std::vector<int>>& offloads, int stages) {
  int most = 0;
  for (const std::vector<double>& rank : kept) most = std::max(most, static_cast<int>(rank.size()));
  const InFlight in_flight(kept, offloads);
  std::vector<std::vector<int>> limits(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    const int budget = stages - s;
    int deepest = 0;  // the memory's W(k), non-decreasing in k: the search resumes where it stopped
    for (int k = 0; k < most; ++k) {
      const int least = std::min(k + stages - s - 1, most - 1);
      int w = least;
      if (s + 1 < stages && in_flight.fits(k, least, budget)) {
        deepest = std::max(deepest, least);
        while (deepest + 1 < most && in_flight.fits(k, deepest + 1, budget)) ++deepest;
        w = deepest;
        if (s > 0) w = std::max(least, std::min(w, limits[s - 1][k] - 1));
      }
      limits[s].push_back(w);
    }
  }
  return limits;
}

std::vector<PipelineOp> pipeline_schedule(int stage, int stages, int chunks, int micro_batches,
                                          const std::vector<std::vector<int>>& limits) {
  if (!limits.empty()) {
    if (chunks != 1)
      throw std::invalid_argument("pipeline limits: forwards ahead of 1F1B's are for one model chunk per stage, not " +
                                  std::to_string(chunks));
    validate_forward_limits(limits, stages, micro_batches);
    return forwards_ahead_of_backwards(micro_batches, limits[stage]);
  }
  return chunks == 1 ? one_f_one_b(stage, stages, micro_batches)
                     : interleaved_one_f_one_b(stage, stages, chunks, micro_batches);
}

double pipeline_bubble_fraction(int stages, int chunks, int micro_batches) {
  return static_cast<double>(stages - 1) / (static_cast<double>(chunks) * micro_batches);
}

}  // namespace hdp

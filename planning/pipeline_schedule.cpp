#include "planning/pipeline_schedule.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace hdp {

std::vector<PipelineOp> one_f_one_b(int stage, int stages, int micro_batches) {
  return one_f_one_b_with_warmup(micro_batches, stages - stage - 1);
}

std::vector<PipelineOp> one_f_one_b_with_warmup(int micro_batches, int warmup_forwards) {
  const int warmup = std::clamp(warmup_forwards, 0, std::max(micro_batches, 0));
  std::vector<PipelineOp> ops;
  for (int i = 0; i < warmup; ++i) ops.push_back({true, i});
  for (int k = 0; k < micro_batches - warmup; ++k) {
    ops.push_back({true, warmup + k});
    ops.push_back({false, k});
  }
  for (int k = micro_batches - warmup; k < micro_batches; ++k) ops.push_back({false, k});
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

void validate_warmups(std::span<const int> warmups, int stages) {
  if (static_cast<int>(warmups.size()) != stages)
    throw std::invalid_argument("pipeline warm-ups: " + std::to_string(warmups.size()) + " counts for " +
                                std::to_string(stages) + " stages");
  for (int s = 0; s < stages; ++s)
    if (warmups[s] < 0 || (s > 0 && warmups[s] > warmups[s - 1]))
      throw std::invalid_argument("pipeline warm-ups: stage " + std::to_string(s) + " runs " +
                                  std::to_string(warmups[s]) + " warm-up forwards" +
                                  (s > 0 ? ", stage " + std::to_string(s - 1) + " " + std::to_string(warmups[s - 1])
                                         : std::string()) +
                                  "; counts must be non-negative and non-increasing along the stages");
}

bool warmup_fits(const std::vector<std::vector<double>>& kept, int stage, int stages, int warmup) {
  const double budget = static_cast<double>(stages - stage) * (1 + 1e-9);
  for (const std::vector<double>& rank : kept) {
    const size_t window = std::min(rank.size(), static_cast<size_t>(std::max(warmup, 0)) + 1);
    double sum = 0;
    for (size_t i = 0; i < rank.size(); ++i) {
      sum += rank[i];
      if (i >= window) sum -= rank[i - window];
      if (i + 1 >= window && sum > budget) return false;
    }
  }
  return true;
}

std::vector<int> deepest_warmups(const std::vector<std::vector<double>>& kept, int stages) {
  int most = 0;
  for (const std::vector<double>& rank : kept) most = std::max(most, static_cast<int>(rank.size()));
  std::vector<int> warmups;
  for (int s = 0; s < stages; ++s) {
    const int least = stages - s - 1;
    int w = least;
    // Deeper warm-ups hold supersets of the shallower ones' windows: the first that
    // does not fit ends the search.
    // The last stage's backward needs only its own forward: a warm-up there would only
    // hold the gradients back from the earlier stages.
    if (s + 1 < stages && warmup_fits(kept, s, stages, least))
      while (w + 1 < most && warmup_fits(kept, s, stages, w + 1)) ++w;
    warmups.push_back(s > 0 ? std::min(w, warmups.back() - 1) : w);
  }
  return warmups;
}

std::vector<PipelineOp> pipeline_schedule(int stage, int stages, int chunks, int micro_batches,
                                          std::span<const int> warmups) {
  if (!warmups.empty()) {
    if (chunks != 1)
      throw std::invalid_argument("pipeline warm-ups: a deeper warm-up is for one model chunk per stage, not " +
                                  std::to_string(chunks));
    validate_warmups(warmups, stages);
    return one_f_one_b_with_warmup(micro_batches, warmups[stage]);
  }
  return chunks == 1 ? one_f_one_b(stage, stages, micro_batches)
                     : interleaved_one_f_one_b(stage, stages, chunks, micro_batches);
}

double pipeline_bubble_fraction(int stages, int chunks, int micro_batches) {
  return static_cast<double>(stages - 1) / (static_cast<double>(chunks) * micro_batches);
}

}  // namespace hdp

#pragma once
// A cost file: the planner's cost model (planning/cost_model.h) as `trainer
// profile` measured it, with where and how it was measured and how well the fit
// holds. The file format is in docs/cost-model.md.

#include <cstdint>
#include <string>
#include <vector>

#include "base/errors.h"
#include "planning/cost_model.h"

namespace hdp {

// What a cost file says about where its numbers come from.
struct CostProfileInfo {
  // The layer shape measured (always the whole layer, tensor-parallel degree 1).
  int64_t hidden_size = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0, ffn_hidden_size = 0, vocab_size = 0;
  int64_t tp = 1;                     // tensor-parallel degree of the measured layer
  int64_t saved_floats_per_token = 0; // LlamaModel::saved_floats_per_token() of the measured layer
  int64_t sliding_window = 0;         // the measured model's sliding window (Mistral); 0: none
  int64_t threads = 0;                // OpenMP threads while measuring
  int64_t repeats = 0;                // timed runs per measurement (median)
  // The GEMM library and its kernels, e.g. "oneDNN 2.6.3 sgemm, avx2 kernels".
  std::string gemm;
  std::string host;
  std::string date;                   // UTC, ISO 8601
  std::string config;                 // the config file profiled
  // Share of the machine's CPU time that other processes used while measuring
  // (from /proc/stat minus this process's own; -1: unknown).
  double other_cpu_fraction = -1;
};

// Held-out relative error above which the profile is reported as unreliable.
constexpr double kUnreliableHeldOutError = 0.10;
// Share of the CPU time used by other processes above which the machine counts as busy.
constexpr double kBusyOtherCpuFraction = 0.10;

// The measurements behind the coefficients and how well they fit.
struct CostFitReport {
  std::vector<int64_t> lengths;                 // document lengths measured, ascending
  std::vector<double> layer_seconds;            // median forward+backward of one layer at each length
  std::vector<double> activation_bytes;         // one layer's activation arena bytes at each length
  std::vector<int64_t> held_out_lengths;        // the odd-indexed lengths, not used by the held-out fit
  double held_out_max_relative_error = 0;       // of T, fitted on the even-indexed lengths
  double held_out_mean_relative_error = 0;
  double max_relative_error = 0;                // of the final fit (all lengths) on all lengths
  double activation_max_relative_error = 0;     // of Act(s) on all lengths
  int64_t head_tokens = 0, embedding_tokens = 0, copy_bytes = 0;
};

struct CostFile {
  CostModel cost;  // layer, embedding, head, copy bandwidths
  CostProfileInfo profiled;
  CostFitReport fit;
};

// Writes the YAML file (creating its directory). Throws std::runtime_error when it
// cannot be written.
void write_cost_file(const std::string& path, const CostFile& file);
// Reads and checks a cost file: throws ConfigError naming the file, line and key
// (missing, wrong type, not a positive / non-negative number, unknown format).
CostFile read_cost_file(const std::string& path);

}  // namespace hdp

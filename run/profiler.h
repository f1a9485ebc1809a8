#pragma once
// The cost-model profiler (`trainer profile`, scheduler.cost_file: profile): times
// one transformer layer's forward and backward over documents of several lengths,
// the embedding and the LM head with its loss per token, and the host<->device
// copy bandwidth; reads one layer's activation memory from the model's arena; and
// fits T(s) = a1 s^2 + b1 s + g and Act(s) = a2 s + b2 (docs/cost-model.md).

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "planning/cost_file.h"
#include "config/config.h"

namespace hdp {

// ---- fitting ----

// T(s) = a1 s^2 + b1 s + g; under a sliding window W (Mistral) s^2 is
// CostModel::attention_term(s) (planning/cost_model.h), linear in s past W.
struct CostFit {
  double a1 = 0, b1 = 0, g = 0;
  int64_t window = 0;  // 0: none
  double operator()(double s) const;
};
// Act(s) = a2 s + b2.
struct ActivationFit {
  double a2 = 0, b2 = 0;
  double operator()(double s) const { return a2 * s + b2; }
};

// Least squares in relative error (each point weighted by 1 / t, the right weights
// for multiplicative timing noise, and what the reported errors measure), with
// every coefficient constrained to be non-negative (a time or a byte count has no
// negative part); when the unconstrained optimum is non-negative, that is the
// answer. Computed in double with s scaled to [0, 1] and a Householder QR, so
// noise-free data gives its coefficients back to rounding. Needs at least 3 (2)
// points with distinct s, every s and t positive; throws std::invalid_argument
// otherwise.
CostFit fit_quadratic(std::span<const double> s, std::span<const double> t, int64_t window = 0);
ActivationFit fit_linear(std::span<const double> s, std::span<const double> t);

// |model(s) - t| / t over the points.
struct RelativeError {
  double max = 0, mean = 0;
  int64_t points = 0;
};
RelativeError relative_error(const std::function<double(double)>& model, std::span<const double> s,
                             std::span<const double> t);

// Held-out check: fit on the even-indexed points (0, 2, 4, ...), evaluate on the
// odd-indexed ones. With lengths sorted ascending this fits on every other length
// and tests the fit in between. Needs at least 5 points for the quadratic.
RelativeError held_out_quadratic(std::span<const double> s, std::span<const double> t, int64_t window = 0);

// ---- measuring ----

struct ProfileOptions {
  std::vector<int64_t> lengths;       // document lengths whose layer time is measured (sorted, distinct)
  int repeats = 5;                    // timed runs per measurement; the median counts
  int warmups = 1;                    // untimed runs before them
  int64_t head_tokens = 512;          // micro-batch size for the LM head and loss
  int64_t embedding_tokens = 4096;    // micro-batch size for the embedding
  int64_t copy_bytes = int64_t{64} << 20;  // size of one host<->device copy
  double min_sample_seconds = 2e-3;   // short operations are looped until one sample takes this long
};

// Powers of two from 128 (or top / 8, if lower) up to the largest power of two
// <= top = min(data.max_seq_len, 8192) (no document is longer than
// data.max_seq_len), with the geometric midpoints round(2^(k + 1/2)) between them:
// sorted, the powers of two sit at even indices (fitted in the held-out check) and
// the midpoints at odd ones (held out).
std::vector<int64_t> default_profile_lengths(const Config& config);
// What scheduler.cost_file: profile measures at start-up: the last 5 of those
// lengths with the top capped at 512, 3 repeats, no extra warm-up, 128 head
// tokens, 16 MiB copies; a few seconds for models of the bench-llama size.
ProfileOptions startup_profile_options(const Config& config);
// Throws std::invalid_argument unless the lengths are >= 2, distinct, at least 5.
void validate_profile_lengths(std::span<const int64_t> lengths);

// Progress messages while measuring (one line each), may be empty.
using ProfileLog = std::function<void(const std::string&)>;

// Measures one layer of config.model at tensor-parallel degree 1 (the shape the
// file records) with the OpenMP threads currently configured, and fits. The
// result's fit holds the held-out quality (fit on even-indexed lengths) and the
// final coefficients come from all lengths. `source` names the config in the file.
CostFile profile_cost_model(const Config& config, const ProfileOptions& options, const ProfileLog& log = {});

// A readable summary of a cost file: coefficients, measured points against the
// fit, held-out quality.
std::string describe_cost_file(const CostFile& file);

}  // namespace hdp

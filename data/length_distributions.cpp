#include "data/length_distributions.h"

#include <cmath>
#include <fstream>
#include <numeric>

#include "data/dataset.h"
#include "data/sampler.h"

namespace hdp {

namespace {

constexpr int64_t K = 1024;

LengthDistribution byted() {
  LengthDistribution d;
  d.name = "byted";
  d.description =
      "ByteScale production long-context data: 80% of documents <= 4K tokens; 0.05% of 2M tokens carry 12.1% of "
      "tokens; 1% >= 128K carry 44.3%; > 256K carry 37%";
  d.segments = {
      {32, 4 * K, 0.80, 0.140},
      {4 * K + 1, 128 * K - 1, 0.19, 0.417},
      {128 * K, 256 * K, 0.0045, 0.073},
      {256 * K + 1, 2048 * K - 1, 0.0050, 0.249},
      {2048 * K, 2048 * K, 0.0005, 0.121},
  };
  // The 2M point mass fixes the mean: 0.0005 x 2M / mu = 12.1% of tokens.
  d.mean_length = 0.0005 * static_cast<double>(2048 * K) / 0.121;
  return d;
}

LengthDistribution github() {
  LengthDistribution d;
  d.name = "github";
  d.description =
      "GitHub code: documents > 128K tokens carry 16.2% of tokens, > 256K carry 9.8% (published); bulk below 128K "
      "assumed (85% of files <= 4K, mean 3,000 tokens), longest 2M";
  d.segments = {
      {32, 4 * K, 0.85, 0.250},
      {4 * K + 1, 32 * K, 0.135, 0.338},
      {32 * K + 1, 128 * K, 0.0135, 0.250},
      {128 * K + 1, 256 * K, 0.0010, 0.064},
      {256 * K + 1, 2048 * K, 0.0005, 0.098},
  };
  d.mean_length = 3000;
  return d;
}

}  // namespace

std::vector<std::string> builtin_distribution_names() { return {"byted", "github"}; }

LengthDistribution builtin_distribution(const std::string& name) {
  if (name == "byted") return byted();
  if (name == "github") return github();
  std::string names;
  for (const std::string& n : builtin_distribution_names()) names += (names.empty() ? "" : ", ") + n;
  throw LengthsInputError("unknown length distribution '" + name + "' (built-in: " + names + ")");
}

double power_law_mean(double lo, double hi, double a) {
  if (!(lo > 0) || !(hi >= lo)) throw std::invalid_argument("power_law_mean: bad range");
  if (hi == lo) return lo;
  const double h = hi / lo;  // work in t = x / lo on [1, h]
  double mean_t;
  if (std::abs(a - 1) < 1e-9) {
    mean_t = (h - 1) / std::log(h);
  } else if (std::abs(a - 2) < 1e-9) {
    mean_t = std::log(h) / (1 - 1 / h);
  } else {
    const double num = (std::pow(h, 2 - a) - 1) / (2 - a);
    const double den = (std::pow(h, 1 - a) - 1) / (1 - a);
    mean_t = num / den;
  }
  return lo * mean_t;
}

double power_law_exponent_for_mean(double lo, double hi, double mean) {
  if (!(mean > lo && mean < hi)) {
    throw std::invalid_argument("a segment [" + std::to_string(lo) + ", " + std::to_string(hi) +
                                "] cannot have mean " + std::to_string(mean));
  }
  double a_lo = -80, a_hi = 80;  // the mean falls as a grows
  if (power_law_mean(lo, hi, a_lo) < mean || power_law_mean(lo, hi, a_hi) > mean)
    throw std::invalid_argument("a segment mean too close to its bounds: " + std::to_string(mean));
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (a_lo + a_hi);
    (power_law_mean(lo, hi, mid) > mean ? a_lo : a_hi) = mid;
  }
  return 0.5 * (a_lo + a_hi);
}

LengthSampler::LengthSampler(LengthDistribution d, uint64_t seed) : distribution_(std::move(d)), rng_(seed, 0x6c656e) {
  double p = 0, s = 0;
  int64_t previous_hi = 0;
  if (distribution_.segments.empty()) throw std::invalid_argument("distribution '" + distribution_.name + "' has no segments");
  if (!(distribution_.mean_length > 0)) throw std::invalid_argument("distribution '" + distribution_.name + "' has no mean length");
  for (const LengthSegment& seg : distribution_.segments) {
    if (seg.lo < 1 || seg.hi < seg.lo || seg.lo <= previous_hi || !(seg.probability > 0) || !(seg.token_share > 0))
      throw std::invalid_argument("distribution '" + distribution_.name + "': segment [" + std::to_string(seg.lo) +
                                  ", " + std::to_string(seg.hi) + "] is out of order or empty");
    previous_hi = seg.hi;
    p += seg.probability;
    s += seg.token_share;
    const double mean = seg.token_share * distribution_.mean_length / seg.probability;
    if (seg.lo == seg.hi) {
      if (std::abs(mean - static_cast<double>(seg.lo)) > 1e-6 * mean)
        throw std::invalid_argument("distribution '" + distribution_.name + "': the point mass at " +
                                    std::to_string(seg.lo) + " implies mean " + std::to_string(mean));
      exponents_.push_back(0);
    } else {
      exponents_.push_back(power_law_exponent_for_mean(static_cast<double>(seg.lo), static_cast<double>(seg.hi), mean));
    }
    cumulative_.push_back(p);
  }
  if (std::abs(p - 1) > 1e-9 || std::abs(s - 1) > 1e-9)
    throw std::invalid_argument("distribution '" + distribution_.name + "': probabilities sum to " + std::to_string(p) +
                                " and token shares to " + std::to_string(s) + ", not 1");
  cumulative_.back() = 1;
}

int64_t LengthSampler::next() {
  auto uniform = [&] { return static_cast<double>(rng_.next() >> 11) * 0x1.0p-53; };
  const double u = uniform();
  size_t k = 0;
  while (k + 1 < cumulative_.size() && u >= cumulative_[k]) ++k;
  const LengthSegment& seg = distribution_.segments[k];
  if (seg.lo == seg.hi) return seg.lo;
  const double lo = static_cast<double>(seg.lo), h = static_cast<double>(seg.hi) / lo, a = exponents_[k];
  const double v = uniform();
  double t;
  if (std::abs(a - 1) < 1e-9) {
    t = std::pow(h, v);
  } else {
    t = std::pow(1 + v * (std::pow(h, 1 - a) - 1), 1 / (1 - a));
  }
  const int64_t x = static_cast<int64_t>(std::llround(lo * t));
  return std::clamp(x, seg.lo, seg.hi);
}

std::vector<int64_t> sample_global_batch(const LengthDistribution& distribution, int64_t context,
                                         int64_t global_batch_tokens, uint64_t seed) {
  LengthSampler sampler(distribution, seed);
  return fill_global_batch([&] { return sampler.next(); }, context, global_batch_tokens);
}

std::vector<int64_t> read_length_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw LengthsInputError("cannot open lengths file '" + path + "'");
  std::vector<int64_t> lengths;
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    const size_t b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos || line[b] == '#') continue;
    const size_t e = line.find_last_not_of(" \t\r");
    const std::string text = line.substr(b, e - b + 1);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != text.size() || v < 1) {
      throw LengthsInputError(path + ":" + std::to_string(number) + ": expected a positive integer length, got '" +
                              text + "'");
    }
    lengths.push_back(v);
  }
  if (lengths.empty()) throw LengthsInputError("lengths file '" + path + "' holds no lengths");
  return lengths;
}

std::vector<int64_t> dataset_global_batch(const std::string& path, int64_t context, int64_t global_batch_tokens,
                                          uint64_t seed) {
  const TokenDataset dataset(path);
  SamplerOptions options;
  options.max_seq_len = context;
  options.global_batch_tokens = global_batch_tokens;
  options.shuffle = true;
  options.seed = seed;
  validate_sampler_options(options);
  BatchSampler sampler(dataset, options);
  return sequence_lengths(sampler.next().sequences);
}

double token_share_above(std::span<const int64_t> lengths, int64_t threshold, bool inclusive) {
  double total = 0, above = 0;
  for (int64_t x : lengths) {
    total += static_cast<double>(x);
    if (x > threshold || (inclusive && x == threshold)) above += static_cast<double>(x);
  }
  return total > 0 ? above / total : 0;
}

double fraction_at_most(std::span<const int64_t> lengths, int64_t threshold) {
  if (lengths.empty()) return 0;
  int64_t n = 0;
  for (int64_t x : lengths) n += x <= threshold;
  return static_cast<double>(n) / static_cast<double>(lengths.size());
}

}  // namespace hdp

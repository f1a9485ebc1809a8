#pragma once
// Inputs for the benchmarks: n floats uniform in [lo, hi) from a fixed seed.

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

inline std::vector<float> random_vector(size_t n, float lo, float hi, uint32_t seed) {
  std::vector<float> v(n);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  for (auto& x : v) x = u(rng);
  return v;
}

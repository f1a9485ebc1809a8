#pragma once
// A small portable PRNG (xoshiro256**, seeded through SplitMix64) with
// integer-only helpers, so that shuffles and the demo corpus are bit-identical
// on every platform and standard library (std:: distributions are not).

#include <cstdint>

namespace hdp {

inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class Rng {
 public:
  // Independent streams for each (seed, stream) pair, e.g. (data seed, epoch).
  explicit Rng(uint64_t seed, uint64_t stream = 0) {
    uint64_t sm = seed;
    uint64_t mixed = splitmix64(sm) ^ (stream * 0xD1B54A32D192ED03ull + 0x8CB92BA72F3D8DD7ull);
    for (auto& w : s_) w = splitmix64(mixed);
    if ((s_[0] | s_[1] | s_[2] | s_[3]) == 0) s_[0] = 1;
  }

  uint64_t next() {
    uint64_t result = rotl(s_[1] * 5, 7) * 9;
    uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, n), unbiased (rejection); n > 0.
  uint64_t below(uint64_t n) {
    uint64_t threshold = (0 - n) % n;  // 2^64 mod n
    while (true) {
      uint64_t r = next();
      if (r >= threshold) return r % n;
    }
  }
  // Uniform in [lo, hi] (inclusive), lo <= hi.
  int64_t range(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(below(static_cast<uint64_t>(hi - lo) + 1));
  }
  // True with probability num/den.
  bool chance(uint64_t num, uint64_t den) { return below(den) < num; }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace hdp

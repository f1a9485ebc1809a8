#pragma once
// Normal numbers for weight initialisation from the project's portable PRNG
// (base/rng.h): the same seed gives the same weights with any compiler or
// standard library (std:: distributions do not).

#include <cmath>
#include <cstdint>
#include <string_view>

#include "base/rng.h"

namespace hdp {

inline uint64_t hash_name(std::string_view s, uint64_t seed) {
  uint64_t h = 0xcbf29ce484222325ull ^ seed;  // FNV-1a, then mixed
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return splitmix64(h);
}

// Standard normal numbers by Box-Muller, from a splitmix64 stream.
class NormalStream {
 public:
  explicit NormalStream(uint64_t seed) : state_(seed) {}
  double next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = (static_cast<double>(splitmix64(state_) >> 11) + 0.5) * 0x1.0p-53;  // (0, 1)
    double u2 = static_cast<double>(splitmix64(state_) >> 11) * 0x1.0p-53;
    double r = std::sqrt(-2.0 * std::log(u1));
    double theta = 2.0 * M_PI * u2;
    spare_ = r * std::sin(theta);
    has_spare_ = true;
    return r * std::cos(theta);
  }

 private:
  uint64_t state_;
  double spare_ = 0;
  bool has_spare_ = false;
};

}  // namespace hdp

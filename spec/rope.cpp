#include "spec/rope.h"

#include <cmath>
#include <numbers>

namespace hdp {

std::vector<float> RopeSettings::inverse_frequencies(int64_t head_dim) const {
  const int64_t half = head_dim / 2;
  const float theta = static_cast<float>(rope_theta);
  std::vector<float> f(static_cast<size_t>(half));
  // transformers' default: 1.0 / (base ** (arange(0, d, 2).float() / d)), a float32 pow.
  for (int64_t j = 0; j < half; ++j)
    f[j] = 1.0f / std::pow(theta, static_cast<float>(2 * j) / static_cast<float>(head_dim));
  if (rope_scaling == RopeScaling::None) return f;

  // llama3 (transformers' _compute_llama3_parameters): the thresholds are Python
  // floats, which torch rounds to float32 against a float32 tensor; `a / tensor` is
  // torch's reciprocal(tensor) * a.
  const float factor = static_cast<float>(rope_scaling_factor);
  const float low = static_cast<float>(rope_low_freq_factor);
  const auto original = static_cast<double>(rope_original_max_positions);
  const float low_freq_wavelength = static_cast<float>(original / rope_low_freq_factor);
  const float high_freq_wavelength = static_cast<float>(original / rope_high_freq_factor);
  const float band = static_cast<float>(rope_high_freq_factor - rope_low_freq_factor);
  const float two_pi = static_cast<float>(2 * std::numbers::pi);
  for (float& x : f) {
    const float wavelength = (1.0f / x) * two_pi;
    if (wavelength > low_freq_wavelength) {
      x = x / factor;
    } else if (!(wavelength < high_freq_wavelength)) {
      const float smooth = ((1.0f / wavelength) * static_cast<float>(original) - low) / band;
      x = (1.0f - smooth) * x / factor + smooth * x;
    }
  }
  return f;
}

}  // namespace hdp

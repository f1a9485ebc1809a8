#pragma once
// Rotary position embedding's settings (Su et al. 2021, "RoFormer") and the one
// computation of its inverse frequencies, which the CPU and CUDA kernels rotate by
// (kernels/ops.h: rope_forward) and the tests check. Plain data and arithmetic,
// like model_config.h, whose ModelConfig derives from it (its members are the
// config's model.rope_* keys).

#include <cstdint>
#include <vector>

#include "base/enum_names.h"

namespace hdp {

// model.rope_scaling: how the inverse frequencies are stretched for a context longer
// than the one the model was first trained at. Hugging Face's rope_type "default"
// and "llama3" (LLaMA 3.1 and 3.2, Grattafiori et al. 2024, "The Llama 3 Herd of
// Models"); its others (linear, dynamic, yarn, longrope) are not implemented.
enum class RopeScaling { None, Llama3 };
inline constexpr EnumName<RopeScaling> kRopeScalingNames[] = {
    {RopeScaling::None, "none", "theta^(-2j/d), as LLaMA 1-3.0, Mistral and Mixtral"},
    {RopeScaling::Llama3, "llama3",
     "LLaMA 3.1's: long wavelengths divided by rope_scaling_factor, short ones kept, smooth in between"}};

struct RopeSettings {
  RopeSettings() = default;
  // Plain RoPE of base `theta` (the kernels' tests and benches).
  RopeSettings(double theta) : rope_theta(theta) {}  // NOLINT(google-explicit-constructor)

  double rope_theta = 10000.0;
  RopeScaling rope_scaling = RopeScaling::None;
  // llama3 only, Hugging Face's rope_scaling factor, low_freq_factor, high_freq_factor
  // and original_max_position_embeddings (LLaMA 3.1's values by default): a
  // wavelength 2 pi / f above original / low_freq_factor positions has f divided by
  // the factor, one below original / high_freq_factor keeps f, and in between f is
  // blended, s f + (1 - s) f / factor with s = (original / wavelength - low) / (high - low).
  double rope_scaling_factor = 8.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int64_t rope_original_max_positions = 8192;

  bool operator==(const RopeSettings&) const = default;

  // f_j for j in [0, head_dim / 2): element j of a head rotates with element
  // j + head_dim / 2 by the angle position x f_j. In float32, each operation as
  // transformers computes it (its torch float32 tensors), so that the angles, and
  // with them the logits, are those of Hugging Face's LlamaRotaryEmbedding.
  std::vector<float> inverse_frequencies(int64_t head_dim) const;
};

}  // namespace hdp

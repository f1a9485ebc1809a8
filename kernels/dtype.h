#pragma once
// Element types of tensors. Every tensor carries its dtype at run time
// (kernels/tensor.h) and every op checks the dtypes of its arguments before it
// dispatches (kernels/ops.cpp), so a bf16 buffer can never reach an fp32 kernel.
//
// BF16 (bfloat16) is the upper half of an IEEE-754 binary32: 1 sign bit, the same
// 8 exponent bits (so the same range as fp32) and 7 explicit mantissa bits. Its
// unit round-off is 2^-8 = 0.0039. Mixed-precision training keeps fp32 master
// weights and fp32 optimizer state and runs the forward and backward pass on bf16
// copies (Micikevicius et al. 2018, "Mixed Precision Training"; Kalamkar et al.
// 2019, "A Study of BFLOAT16 for Deep Learning Training": with bf16's fp32 range no
// loss scaling is needed).

#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "base/enum_names.h"

namespace hdp {

// I32 is the dtype of index tensors (tokens, positions, cu_seqlens); F64 that of the
// few sums a training step keeps on the device in double (its loss and its gradient's
// sum of squares, kernels/ops.h) until it reads them back once.
enum class DType { F32, BF16, I32, F64 };

// The names a config writes (train.precision names F32 and BF16).
inline constexpr EnumName<DType> kDTypeNames[] = {
    {DType::F32, "fp32"}, {DType::BF16, "bf16"}, {DType::I32, "int32"}, {DType::F64, "fp64"}};
// The two precisions training can run in (train.precision).
inline constexpr EnumName<DType> kPrecisionNames[] = {
    {DType::F32, "fp32", "fp32 everywhere"},
    {DType::BF16, "bf16", "bf16 weights copy and activations, fp32 master weights, gradients and moments"}};

inline const char* dtype_name(DType t) { return enum_name(kDTypeNames, t); }

constexpr size_t dtype_size(DType t) { return t == DType::BF16 ? 2 : t == DType::F64 ? 8 : 4; }

// A bfloat16 value as stored: the 16 high bits of the fp32 with the same sign and
// exponent. Trivially copyable, 2 bytes, no implicit conversions (a conversion is
// a rounding and should be visible).
struct bf16 {
  uint16_t bits;
};
static_assert(sizeof(bf16) == 2 && std::is_trivial_v<bf16>);

// fp32 -> bf16, rounding to nearest, ties to even (what CUDA's __float2bfloat16_rn
// does, so CPU and GPU round identically). Overflow rounds to +-Inf as IEEE
// rounding does; NaN stays NaN (quiet, sign kept) instead of rounding into Inf;
// denormals round like any other value (bf16 has fp32's denormal range).
constexpr bf16 to_bf16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x0040u)};
  const uint32_t lsb = (u >> 16) & 1u;
  return bf16{static_cast<uint16_t>((u + 0x7fffu + lsb) >> 16)};
}

// bf16 -> fp32: exact (every bf16 is an fp32).
constexpr float to_float(bf16 x) { return std::bit_cast<float>(static_cast<uint32_t>(x.bits) << 16); }

// x rounded to the nearest bf16, as an fp32.
constexpr float round_bf16(float x) { return to_float(to_bf16(x)); }

}  // namespace hdp

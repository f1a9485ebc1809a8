#pragma once
// Fast single-precision exp for the softmax, cross-entropy and SiLU kernels.
//
// glibc only uses its vector expf under -ffast-math, which this project does not
// use, so std::exp in a loop stays scalar. fast_expf is branch-free (GCC
// vectorises loops that call it) and simd::exp is the same algorithm on explicit
// vectors; both give bit-identical results for the same input.
//
// Algorithm (Cephes expf): n = round(x / ln2), r = x - n*ln2 in two parts
// (|r| <= ln2/2), exp(r) by a degree-7 polynomial, times 2^n built from the
// exponent bits. Relative error against exp in double over [-87.3, 88.37]:
// 8.1e-8 (about 1.4 ulp) on 3.6 million samples (tests/kernels_fast_math_test.cpp).
// Special inputs: x < -87.3365 (where exp(x) < 2^-126, i.e. would be subnormal)
// and -inf give exactly 0; x > 88.37 and +inf give +inf (a little early: exp
// overflows float only above 88.72); NaN gives NaN.
// The "softmax" variants skip the overflow test and are for arguments known to be
// <= 0 (x - max); they still map very negative and -inf to 0 and NaN to NaN.

#include <bit>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/simd.h"

namespace hdp::cpu {

namespace exp_detail {
constexpr float kLo = -87.33654475f;   // ln(2^-126)
constexpr float kHi = 88.37f;          // n = round(x/ln2) stays <= 127 (2^n representable)
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: x + kMagic rounds x to an integer (nearest even)
constexpr int32_t kMagicBits = 0x4B400000;
constexpr float kP0 = 1.9875691500e-4f;
constexpr float kP1 = 1.3981999507e-3f;
constexpr float kP2 = 8.3334519073e-3f;
constexpr float kP3 = 4.1665795894e-2f;
constexpr float kP4 = 1.6666665459e-1f;
constexpr float kP5 = 5.0000001201e-1f;

// Fused multiply-add where the hardware has it (as simd::fmadd), otherwise a
// multiply and an add, so the scalar and vector versions round identically and
// no build falls back to a slow software fma.
inline float fmadd(float a, float b, float c) {
#if defined(FP_FAST_FMAF) || defined(__FMA__)
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}
}  // namespace exp_detail

// exp(x) for x <= 0 (or -inf); larger x are clamped to kHi.
inline float fast_expf_softmax(float x) {
  using namespace exp_detail;
  float xc = x < kLo ? kLo : x;
  xc = xc > kHi ? kHi : xc;
  const float v = fmadd(xc, kLog2e, kMagic);  // n + kMagic
  const float n = v - kMagic;
  float r = fmadd(n, -kLn2Hi, xc);
  r = fmadd(n, -kLn2Lo, r);
  float p = kP0;
  p = fmadd(p, r, kP1);
  p = fmadd(p, r, kP2);
  p = fmadd(p, r, kP3);
  p = fmadd(p, r, kP4);
  p = fmadd(p, r, kP5);
  const float y = fmadd(p, r * r, r) + 1.0f;
  // 2^n: the low bits of v hold n + 0x400000; rebuild an exponent field n + 127.
  const uint32_t bits = (std::bit_cast<uint32_t>(v) + static_cast<uint32_t>(127 - kMagicBits)) << 23;
  const float e = y * std::bit_cast<float>(bits);
  return x < kLo ? 0.0f : e;
}

// exp(x) for any float x.
inline float fast_expf(float x) {
  using namespace exp_detail;
  const float e = fast_expf_softmax(x);
  return x > kHi ? INFINITY : e;
}

namespace simd {

inline vf exp_softmax(vf x) {
  using namespace exp_detail;
  // Operand order matters: max/min return the second operand when one is NaN, so NaN propagates.
  const vf xc = min(set1(kHi), max(set1(kLo), x));
  const vf magic = set1(kMagic);
  const vf v = fmadd(xc, set1(kLog2e), magic);
  const vf n = sub(v, magic);
  vf r = fmadd(n, set1(-kLn2Hi), xc);
  r = fmadd(n, set1(-kLn2Lo), r);
  vf p = set1(kP0);
  p = fmadd(p, r, set1(kP1));
  p = fmadd(p, r, set1(kP2));
  p = fmadd(p, r, set1(kP3));
  p = fmadd(p, r, set1(kP4));
  p = fmadd(p, r, set1(kP5));
  const vf y = add(fmadd(p, mul(r, r), r), set1(1.0f));
  const vf e = mul(y, bits_add_shl23(v, 127 - kMagicBits));
  return select(lt(x, set1(kLo)), zero(), e);
}

inline vf exp(vf x) {
  using namespace exp_detail;
  const vf e = exp_softmax(x);
  return select(gt(x, set1(kHi)), set1(INFINITY), e);
}

}  // namespace simd
}  // namespace hdp::cpu

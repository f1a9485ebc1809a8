#pragma once
// A thin SIMD layer for the CPU kernels: one float vector type `vf` of kW lanes and
// the handful of operations the kernels need. The widest instruction set the
// compiler targets is used (-march=native in this build):
//   AVX-512F        kW = 16 (__m512)
//   AVX2 + FMA      kW = 8  (__m256)
//   anything else   kW = 4  (GCC generic vectors; SSE2 on x86-64, NEON elsewhere)
// All operations are lane-wise and deterministic; reductions combine lanes in a
// fixed order, so results do not depend on anything but the build.

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || defined(__AVX2__)
// GCC 12 warns falsely about _mm512_undefined_* inside its own AVX-512 headers
// (GCC PR 105593); the diagnostic is tied to the header's lines, so silence it there.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

namespace hdp::cpu::simd {

#if defined(__AVX512F__)

constexpr int kW = 16;
using vf = __m512;
using vmask = __mmask16;
inline const char* isa_name() { return "avx512"; }

inline vf load(const float* p) { return _mm512_loadu_ps(p); }
inline void store(float* p, vf v) { _mm512_storeu_ps(p, v); }
inline vf set1(float x) { return _mm512_set1_ps(x); }
inline vf zero() { return _mm512_setzero_ps(); }
inline vf add(vf a, vf b) { return _mm512_add_ps(a, b); }
inline vf sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
inline vf mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline vf div(vf a, vf b) { return _mm512_div_ps(a, b); }
inline vf fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }  // a*b + c
inline vf max(vf a, vf b) { return _mm512_max_ps(a, b); }
inline vf min(vf a, vf b) { return _mm512_min_ps(a, b); }
inline vmask lt(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
inline vmask gt(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
inline vmask isnan(vf a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
// mask ? a : b
inline vf select(vmask m, vf a, vf b) { return _mm512_mask_blend_ps(m, b, a); }
// Reinterprets v's bits as int32, adds `add`, shifts left by 23, reinterprets back.
inline vf bits_add_shl23(vf v, int32_t add) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_castps_si512(v), _mm512_set1_epi32(add)), 23));
}

#elif defined(__AVX2__) && defined(__FMA__)

constexpr int kW = 8;
using vf = __m256;
using vmask = __m256;
inline const char* isa_name() { return "avx2"; }

inline vf load(const float* p) { return _mm256_loadu_ps(p); }
inline void store(float* p, vf v) { _mm256_storeu_ps(p, v); }
inline vf set1(float x) { return _mm256_set1_ps(x); }
inline vf zero() { return _mm256_setzero_ps(); }
inline vf add(vf a, vf b) { return _mm256_add_ps(a, b); }
inline vf sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
inline vf mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
inline vf div(vf a, vf b) { return _mm256_div_ps(a, b); }
inline vf fmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
inline vf max(vf a, vf b) { return _mm256_max_ps(a, b); }
inline vf min(vf a, vf b) { return _mm256_min_ps(a, b); }
inline vmask lt(vf a, vf b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
inline vmask gt(vf a, vf b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
inline vmask isnan(vf a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
inline vf select(vmask m, vf a, vf b) { return _mm256_blendv_ps(b, a, m); }
inline vf bits_add_shl23(vf v, int32_t add) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_castps_si256(v), _mm256_set1_epi32(add)), 23));
}

#else

constexpr int kW = 4;
typedef float vf __attribute__((vector_size(16)));
typedef int32_t vi_ __attribute__((vector_size(16)));
using vmask = vi_;
inline const char* isa_name() { return "generic"; }

inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof(v)); }
inline vf set1(float x) { return vf{x, x, x, x}; }
inline vf zero() { return vf{0, 0, 0, 0}; }
inline vf add(vf a, vf b) { return a + b; }
inline vf sub(vf a, vf b) { return a - b; }
inline vf mul(vf a, vf b) { return a * b; }
inline vf div(vf a, vf b) { return a / b; }
inline vf fmadd(vf a, vf b, vf c) { return a * b + c; }
inline vf max(vf a, vf b) { return a > b ? a : b; }
inline vf min(vf a, vf b) { return a < b ? a : b; }
inline vmask lt(vf a, vf b) { return a < b; }
inline vmask gt(vf a, vf b) { return a > b; }
inline vmask isnan(vf a) { return a != a; }
inline vf select(vmask m, vf a, vf b) { return m ? a : b; }
inline vf bits_add_shl23(vf v, int32_t add) {
  vi_ i;
  std::memcpy(&i, &v, sizeof(i));
  i = (vi_)((uint32_t __attribute__((vector_size(16))))(i + add) << 23);
  vf r;
  std::memcpy(&r, &i, sizeof(r));
  return r;
}

#endif

// Horizontal reductions in a fixed lane order.
inline float reduce_add(vf v) {
  alignas(64) float t[kW];
  store(t, v);
  float s = 0;
  for (int i = 0; i < kW; ++i) s += t[i];
  return s;
}
inline float reduce_max(vf v) {
  alignas(64) float t[kW];
  store(t, v);
  float m = t[0];
  for (int i = 1; i < kW; ++i) m = t[i] > m ? t[i] : m;
  return m;
}

}  // namespace hdp::cpu::simd

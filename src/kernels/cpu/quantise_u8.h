// QuantizeLinear to u8 storage for the int8 kernels (dnnl_conv_int8.cc, dnnl_matmul_int8.cc).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace osprey::cpu {

// n floats -> n quantised bytes (round half to even of x / s, plus zp, clamped to [0, 255]), 8 at a time with AVX2.
__attribute__((target("avx2"))) inline void Quantise8(const float* x, uint8_t* out, int64_t n, float s, float zp) {
  const __m256 vs = _mm256_set1_ps(s), vzp = _mm256_set1_ps(zp), vlo = _mm256_setzero_ps(), vhi = _mm256_set1_ps(255.f);
  int64_t j = 0;
  // x * (1 / s) instead of x / s: the two differ by an ulp or two of the quotient, which changes the rounding only
  // next to a half-integer; a vector with a quotient that close is divided instead, so the result is QuantizeLinear's.
  const __m256 vr = _mm256_set1_ps(1.f / s), half = _mm256_set1_ps(0.5f), near = _mm256_set1_ps(1.f / 4096.f),
               abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (; j + 8 <= n; j += 8) {
    const __m256 xv = _mm256_loadu_ps(x + j);
    __m256 y = _mm256_mul_ps(xv, vr);
    __m256 q = _mm256_round_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_and_ps(_mm256_sub_ps(y, q), abs_mask);
    const __m256 tie = _mm256_cmp_ps(_mm256_and_ps(_mm256_sub_ps(frac, half), abs_mask), near, _CMP_LT_OQ);
    if (_mm256_movemask_ps(tie) != 0)
      q = _mm256_round_ps(_mm256_div_ps(xv, vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(q, vzp), vlo), vhi);
    const __m256i i32 = _mm256_cvtps_epi32(q);
    const __m128i lo = _mm256_castsi256_si128(i32), hi = _mm256_extracti128_si256(i32, 1);
    const __m128i i16 = _mm_packs_epi32(lo, hi);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + j), _mm_packus_epi16(i16, i16));
  }
  for (; j < n; ++j) {
    const float q = std::nearbyint(x[j] / s) + zp;
    out[j] = static_cast<uint8_t>(std::min(std::max(q, 0.f), 255.f));
  }
}

// The same with or without AVX2 (the scalar tail of Quantise8 for all of it on a CPU without).
inline void QuantiseU8(const float* x, uint8_t* out, int64_t n, float s, float zp) {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) {
    Quantise8(x, out, n, s, zp);
    return;
  }
  for (int64_t j = 0; j < n; ++j)
    out[j] = static_cast<uint8_t>(std::min(std::max(std::nearbyint(x[j] / s) + zp, 0.f), 255.f));
}

}  // namespace osprey::cpu

#pragma once
// e^x, SiLU, x / (1 + e^-x), and the sigmoid on the floats of one vector register, AVX-512 (16) or AVX2 + FMA (8; the
// same functions overloaded on __m256): e^x also for the attention kernel's softmax, SiLU for the pass kernels run
// over their own outputs (SiluInPlace, elementwise_kernels.cc) and for kernels that apply it in registers before
// their store (activation_avx512.h).
// e^-x from a degree-5 polynomial and 2^n (scalef; on AVX2 built in the exponent bits), then x * 1 / (1 + e) with the
// reciprocal from rcp14 (AVX2: rcp) and one Newton step instead of a division: relative error < 4e-7 against
// x / (1 + std::exp(-x)) on either (the SiluInPlace test).
#include <immintrin.h>

#include "kernels/cpu/vector_math.h"

namespace osprey::cpu {

// GCC 12's AVX-512 intrinsics pass an "undefined" vector through and then warn that it may be uninitialised.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// e^r on |r| <= ln2 / 2 as 1 + r (1 + r (c2 + r (c3 + r (c4 + r c5)))): a degree-5 fit of the relative error
// (weighted least squares, 1.0e-7; 1.8e-7 in float arithmetic), two multiply-adds fewer than vmath::Exp's degree 7,
// which SiLU does not need.
inline constexpr float kSigmoidExpC[4] = {0.49999232f, 0.16667115f, 0.04189011f, 0.00831251f};

/// e^x on the 16 values of `x`: 12 vector operations. x is clamped to [-87.3, 88.3] (the result stays finite and
/// normal); n = round(x log2e) by adding and subtracting 1.5 * 2^23; r = x - n ln2 with ln2 split in two; e^r from the
/// polynomial above, times 2^n by scalef.
__attribute__((target("avx512f"), always_inline)) inline __m512 ExpVector(__m512 x) {
  using namespace vmath::exp_constants;
  const __m512 one = _mm512_set1_ps(1.f), round = _mm512_set1_ps(12582912.f);
  const __m512 a = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(kMinArg)), _mm512_set1_ps(kMaxArg));
  const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(a, _mm512_set1_ps(kLog2e), round), round);
  const __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(kLn2Lo), _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), a));
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(kSigmoidExpC[3]), r, _mm512_set1_ps(kSigmoidExpC[2]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kSigmoidExpC[1]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kSigmoidExpC[0]));
  p = _mm512_fmadd_ps(p, r, one);
  p = _mm512_fmadd_ps(p, r, one);  // e^r
  return _mm512_scalef_ps(p, n);
}

/// 1 / (1 + e^-v) on the 16 values of `v`: 16 vector operations (e^-v by ExpVector).
__attribute__((target("avx512f"), always_inline)) inline __m512 SigmoidVector(__m512 v) {
  const __m512 one = _mm512_set1_ps(1.f);
  const __m512 d = _mm512_add_ps(one, ExpVector(_mm512_sub_ps(_mm512_setzero_ps(), v)));  // 1 + e^-v
  const __m512 y = _mm512_rcp14_ps(d);
  return _mm512_mul_ps(y, _mm512_fnmadd_ps(d, y, _mm512_set1_ps(2.f)));  // one Newton step: y (2 - d y)
}

/// v / (1 + e^-v) on the 16 values of `v`.
__attribute__((target("avx512f"), always_inline)) inline __m512 SiluVector(__m512 v) {
  return _mm512_mul_ps(v, SigmoidVector(v));
}

/// e^x on the 8 values of `x`, as the AVX-512 ExpVector (the same clamp, reduction and polynomial); 2^n is built in
/// the exponent bits (n stays within [-126, 127] after the clamp).
__attribute__((target("avx2,fma"), always_inline)) inline __m256 ExpVector(__m256 x) {
  using namespace vmath::exp_constants;
  const __m256 one = _mm256_set1_ps(1.f), round = _mm256_set1_ps(12582912.f);
  const __m256 a = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kMinArg)), _mm256_set1_ps(kMaxArg));
  const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(a, _mm256_set1_ps(kLog2e), round), round);
  const __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(kLn2Lo), _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), a));
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(kSigmoidExpC[3]), r, _mm256_set1_ps(kSigmoidExpC[2]));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kSigmoidExpC[1]));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kSigmoidExpC[0]));
  p = _mm256_fmadd_ps(p, r, one);
  p = _mm256_fmadd_ps(p, r, one);  // e^r
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

/// 1 / (1 + e^-v) on the 8 values of `v` (rcp's 12 bits and one Newton step).
__attribute__((target("avx2,fma"), always_inline)) inline __m256 SigmoidVector(__m256 v) {
  const __m256 d = _mm256_add_ps(_mm256_set1_ps(1.f), ExpVector(_mm256_sub_ps(_mm256_setzero_ps(), v)));
  const __m256 y = _mm256_rcp_ps(d);
  return _mm256_mul_ps(y, _mm256_fnmadd_ps(d, y, _mm256_set1_ps(2.f)));
}

/// v / (1 + e^-v) on the 8 values of `v`.
__attribute__((target("avx2,fma"), always_inline)) inline __m256 SiluVector(__m256 v) {
  return _mm256_mul_ps(v, SigmoidVector(v));
}
#pragma GCC diagnostic pop

}  // namespace osprey::cpu

#pragma once
// SiLU, x / (1 + e^-x), on 16 floats in an AVX-512 register: the pass kernels run over their own outputs
// (SiluInPlace, elementwise_kernels.cc) and kernels that apply it in registers before their store (stem_conv.cc).
// e^-x as vmath::Exp (clamped argument, degree-6 polynomial, 2^n by scalef), then x * 1 / (1 + e) with the reciprocal
// from rcp14 and one Newton step instead of a division: relative error ~2e-7 against x / (1 + std::exp(-x)).
#include <immintrin.h>

#include "kernels/cpu/vector_math.h"

namespace osprey::cpu {

// GCC 12's AVX-512 intrinsics pass an "undefined" vector through and then warn that it may be uninitialised.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f"), always_inline)) inline __m512 SiluVector(__m512 v) {
  using namespace vmath::exp_constants;
  const __m512 one = _mm512_set1_ps(1.f);
  const __m512 a = _mm512_min_ps(_mm512_max_ps(_mm512_sub_ps(_mm512_setzero_ps(), v), _mm512_set1_ps(kMinArg)),
                                 _mm512_set1_ps(kMaxArg));  // -v, clamped
  const __m512 k =
      _mm512_roundscale_ps(_mm512_mul_ps(a, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fmadd_ps(k, _mm512_set1_ps(kLn2Lo), _mm512_fnmadd_ps(k, _mm512_set1_ps(kLn2Hi), a));
  __m512 p = _mm512_set1_ps(kP[0]);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP[1]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP[2]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP[3]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP[4]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP[5]));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, one));
  const __m512 d = _mm512_add_ps(one, _mm512_scalef_ps(p, k));  // 1 + e^-v
  __m512 y = _mm512_rcp14_ps(d);
  y = _mm512_mul_ps(y, _mm512_fnmadd_ps(d, y, _mm512_set1_ps(2.f)));  // one Newton step: y (2 - d y)
  return _mm512_mul_ps(v, y);
}
#pragma GCC diagnostic pop

}  // namespace osprey::cpu

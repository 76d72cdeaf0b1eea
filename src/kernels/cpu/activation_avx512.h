#pragma once
// A fused activation applied to 16 floats in an AVX-512 register (or 8 in an AVX2 one), before a kernel stores them:
// what osprey's own convolution kernels (stem_conv.cc, pointwise_conv.cc) do instead of a pass over their output. The
// formulas are ops/activation.h's; SiLU and Sigmoid share silu_vector.h's exponential.
#include <immintrin.h>

#include "kernels/cpu/silu_vector.h"
#include "ops/activation.h"

namespace osprey::cpu {

/// Whether ActivateVector computes `kind` (the others, Tanh and GELU, are left to a pass or to oneDNN).
inline bool ActivatesInRegisters(ActivationKind kind) {
  switch (kind) {
    case ActivationKind::kNone:
    case ActivationKind::kRelu:
    case ActivationKind::kClip:
    case ActivationKind::kLeakyRelu:
    case ActivationKind::kSigmoid:
    case ActivationKind::kHardSigmoid:
    case ActivationKind::kHardSwish:
    case ActivationKind::kSilu:
      return true;
    default:
      return false;
  }
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
/// `a` on the 16 values of `v` where ActivatesInRegisters(a.kind); `v` unchanged for any other kind.
__attribute__((target("avx512f"), always_inline)) inline __m512 ActivateVector(__m512 v, const Activation& a) {
  const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.f);
  switch (a.kind) {
    case ActivationKind::kRelu:
      return _mm512_max_ps(v, zero);
    case ActivationKind::kClip:
      return _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(a.alpha)), _mm512_set1_ps(a.beta));
    case ActivationKind::kLeakyRelu:
      return _mm512_mask_mul_ps(v, _mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ), v, _mm512_set1_ps(a.alpha));
    case ActivationKind::kSigmoid:
      return SigmoidVector(v);
    case ActivationKind::kHardSigmoid:
      return _mm512_min_ps(_mm512_max_ps(_mm512_fmadd_ps(v, _mm512_set1_ps(a.alpha), _mm512_set1_ps(a.beta)), zero),
                           one);
    case ActivationKind::kHardSwish:
      return _mm512_mul_ps(
          v,
          _mm512_min_ps(_mm512_max_ps(_mm512_fmadd_ps(v, _mm512_set1_ps(1.f / 6.f), _mm512_set1_ps(0.5f)), zero), one));
    case ActivationKind::kSilu:
      return SiluVector(v);
    default:
      return v;
  }
}

/// The same on the 8 values of an AVX2 register (stem_conv.cc on CPUs without AVX-512).
__attribute__((target("avx2,fma"), always_inline)) inline __m256 ActivateVector(__m256 v, const Activation& a) {
  const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.f);
  switch (a.kind) {
    case ActivationKind::kRelu:
      return _mm256_max_ps(v, zero);
    case ActivationKind::kClip:
      return _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(a.alpha)), _mm256_set1_ps(a.beta));
    case ActivationKind::kLeakyRelu:
      return _mm256_blendv_ps(v, _mm256_mul_ps(v, _mm256_set1_ps(a.alpha)), _mm256_cmp_ps(v, zero, _CMP_LT_OQ));
    case ActivationKind::kSigmoid:
      return SigmoidVector(v);
    case ActivationKind::kHardSigmoid:
      return _mm256_min_ps(_mm256_max_ps(_mm256_fmadd_ps(v, _mm256_set1_ps(a.alpha), _mm256_set1_ps(a.beta)), zero),
                           one);
    case ActivationKind::kHardSwish:
      return _mm256_mul_ps(
          v,
          _mm256_min_ps(_mm256_max_ps(_mm256_fmadd_ps(v, _mm256_set1_ps(1.f / 6.f), _mm256_set1_ps(0.5f)), zero), one));
    case ActivationKind::kSilu:
      return SiluVector(v);
    default:
      return v;
  }
}
#pragma GCC diagnostic pop

}  // namespace osprey::cpu

#pragma once
// Transcendental functions in plain float arithmetic, so that loops calling them vectorise (std::exp/erf/tanh do not
// without -ffast-math). Used by the elementwise kernels (elementwise_kernels.cc); each is checked against the
// reference kernel's libm result in tests/unit/kernels/elementwise_test.cc.
#include <algorithm>
#include <bit>
#include <cstdint>

namespace osprey::cpu::vmath {

// exp(x): x = n ln2 + r with |r| <= ln2 / 2 (ln2 split in two for an exact n ln2), a degree-6 polynomial for exp(r)
// (Taylor coefficients refined for the interval) and 2^n built in the exponent bits. Relative error about 2 ulp. The
// argument is clamped to [-87.3, 88.3], so results below 2^-126 are not produced (error < 1.2e-38) and large arguments
// give 2^127.4 rather than inf; ExpFull adds the overflow. The constants are shared with the intrinsics version in
// elementwise_kernels.cc (SiluInPlace).
namespace exp_constants {
inline constexpr float kMinArg = -87.3f, kMaxArg = 88.3f;
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f, kLn2Lo = 2.12194440e-4f;  // ln2 = kLn2Hi - kLn2Lo
// exp(r) ~ 1 + r + r^2 (kP[5] + r (kP[4] + ... r kP[0])): kP[0] is the highest power's coefficient.
inline constexpr float kP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
}  // namespace exp_constants

[[gnu::always_inline]] inline float Exp(float x) {
  using namespace exp_constants;
  x = std::min(std::max(x, kMinArg), kMaxArg);  // NaN passes through (std::max/min return their first argument)
  // Round to nearest by adding and subtracting 1.5 * 2^23 (no -ffast-math, so the compiler keeps both).
  const float n = (x * kLog2e + 12582912.f) - 12582912.f;
  const float r = (x - n * kLn2Hi) + n * kLn2Lo;
  // Written out, not a loop over kP: GCC -O2 does not unroll such a loop, and a loop left inside keeps every caller's
  // element loop from vectorising (Sigmoid, Tanh, Erf, GELU ran scalar, 3-5x slower, until the nineteenth session).
  float p = kP[0] * r + kP[1];
  p = p * r + kP[2];
  p = p * r + kP[3];
  p = p * r + kP[4];
  p = p * r + kP[5];
  p = p * r * r + r + 1.f;
  const float scale = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  return p * scale;
}

// exp(x) with +inf above the largest finite result, as std::exp.
[[gnu::always_inline]] inline float ExpFull(float x) {
  const float e = Exp(x);
  return x > 88.7228393f ? __builtin_inff() : e;
}

[[gnu::always_inline]] inline float Abs(float x) { return std::bit_cast<float>(std::bit_cast<uint32_t>(x) & 0x7fffffffu); }

// exp(x) - 1 without exp's cancellation near 0: the Maclaurin series to x^9 for |x| < 0.5 (truncation < 3e-10
// relative), else Exp(x) - 1 (the ELU family's negative side). NaN passes through; -inf gives -1.
[[gnu::always_inline]] inline float Expm1(float x) {
  const float s =
      x +
      x * x *
          (0.5f + x * (1.f / 6 +
                       x * (1.f / 24 +
                            x * (1.f / 120 + x * (1.f / 720 + x * (1.f / 5040 + x * (1.f / 40320 + x / 362880.f)))))));
  const float big = Exp(x) - 1.f;
  return Abs(x) < 0.5f ? s : big;
}

[[gnu::always_inline]] inline float CopySign(float magnitude, float sign) {
  return std::bit_cast<float>((std::bit_cast<uint32_t>(magnitude) & 0x7fffffffu) |
                              (std::bit_cast<uint32_t>(sign) & 0x80000000u));
}

// Sigmoid as the reference computes it: 1 / (1 + e^-x) for x >= 0 and e^x / (1 + e^x) below, both from e = e^-|x|,
// so neither side loses relative precision.
[[gnu::always_inline]] inline float Sigmoid(float x) {
  const float e = Exp(-Abs(x));
  const float r = 1.f / (1.f + e);
  const float er = e * r;  // computed unconditionally so the select if-converts (and the loop vectorises)
  return x >= 0.f ? r : er;
}

// tanh: the odd Maclaurin series to x^11 for |x| < 0.25 (truncation < 1e-9 relative), else 1 - 2 / (e^2|x| + 1) with
// the sign restored (absolute error ~1e-7 on a result >= 0.24).
[[gnu::always_inline]] inline float Tanh(float x) {
  const float x2 = x * x;
  float s = -1.f / 3.f + x2 * (2.f / 15.f + x2 * (-17.f / 315.f + x2 * (62.f / 2835.f + x2 * (-1382.f / 155925.f))));
  s = x + x * x2 * s;
  const float big = CopySign(1.f - 2.f / (Exp(2.f * Abs(x)) + 1.f), x);
  return Abs(x) < 0.25f ? s : big;
}

// erf: the odd Maclaurin series to x^15 for |x| < 0.5 (truncation < 1e-9 relative), else Abramowitz & Stegun 7.1.26,
// 1 - t (a1 + a2 t + ... + a5 t^4) e^-x^2 with t = 1 / (1 + p|x|) (absolute error <= 1.5e-7), with the sign restored.
[[gnu::always_inline]] inline float Erf(float x) {
  const float x2 = x * x;
  constexpr float k = 1.1283791670955126f;  // 2 / sqrt(pi)
  // erf(x) = k (x - x^3/3 + x^5/10 - x^7/42 + x^9/216 - x^11/1320 + x^13/9360 - x^15/75600 ...), by Horner in x^2.
  float s = k / 75600.f;
  s = -k / 9360.f + x2 * s;
  s = k / 1320.f + x2 * s;
  s = -k / 216.f + x2 * s;
  s = k / 42.f + x2 * s;
  s = -k / 10.f + x2 * s;
  s = k / 3.f + x2 * s;
  s = x * (k - x2 * s);
  const float ax = Abs(x);
  const float t = 1.f / (1.f + 0.3275911f * ax);
  const float poly =
      t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
  const float big = CopySign(1.f - poly * Exp(-x2), x);
  return ax < 0.5f ? s : big;
}

// log(x): x = m 2^e with m in [sqrt(1/2), sqrt(2)), log(m) = f - f^2 / 2 + f^3 P(f) with f = m - 1 (Cephes' logf
// polynomial, ~1 ulp), e ln2 added in two parts. Subnormal x is scaled by 2^23 first (zero where the CPU treats
// subnormals as zero: plans run with DAZ set, core/float_env.h). log(0) = -inf, log(x < 0) = NaN, log(inf) = inf,
// NaN stays NaN, as std::log.
[[gnu::always_inline]] inline float Log(float x) {
  constexpr float kMinNormal = 1.17549435e-38f;
  const bool tiny = x < kMinNormal;
  const float xs = tiny ? x * 8388608.f : x;  // 2^23
  const int32_t bits = std::bit_cast<int32_t>(xs);
  float e = static_cast<float>(((bits >> 23) & 0xff) - 126) - (tiny ? 23.f : 0.f);
  float m = std::bit_cast<float>((bits & 0x007fffff) | 0x3f000000);  // [0.5, 1)
  const bool low = m < 0.707106781186547524f;
  e = low ? e - 1.f : e;
  const float f = (low ? m + m : m) - 1.f;
  const float z = f * f;
  float p = 7.0376836292e-2f * f - 1.1514610310e-1f;
  p = p * f + 1.1676998740e-1f;
  p = p * f - 1.2420140846e-1f;
  p = p * f + 1.4249322787e-1f;
  p = p * f - 1.6668057665e-1f;
  p = p * f + 2.0000714765e-1f;
  p = p * f - 2.4999993993e-1f;
  p = p * f + 3.3333331174e-1f;
  float r = p * f * z;
  r += e * -2.12194440e-4f;
  r += -0.5f * z;
  r = (f + r) + e * 0.693359375f;
  constexpr float kInf = __builtin_inff();
  r = xs == 0.f ? -kInf : r;
  r = x == kInf ? kInf : r;
  return x < 0.f || x != x ? __builtin_nanf("") : r;
}

}  // namespace osprey::cpu::vmath

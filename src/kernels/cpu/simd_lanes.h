#pragma once
// The float vector operations that osprey's kernels written once over a vector type (attention_rows.inc,
// winograd_tiles.inc) are compiled with, one namespace per instruction set: simd::avx512 (16 lanes) and simd::avx2
// (8 lanes, with FMA). A kernel's namespace for a set pulls one in (`using namespace simd::avx2;`), adds what only it
// needs, and includes its loops, all under the same `#pragma GCC target`.
#include <immintrin.h>

namespace osprey::cpu::simd {

#pragma GCC push_options
#pragma GCC target("avx512f")
namespace avx512 {
using V = __m512;
constexpr int kLanes = 16;
inline V Zero() { return _mm512_setzero_ps(); }
inline V Load(const float* p) { return _mm512_loadu_ps(p); }
inline void Store(float* p, V v) { _mm512_storeu_ps(p, v); }
inline V Set1(float x) { return _mm512_set1_ps(x); }
inline V Add(V a, V b) { return _mm512_add_ps(a, b); }
inline V Sub(V a, V b) { return _mm512_sub_ps(a, b); }
inline V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
inline V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }    // a b + c
inline V Fnma(V a, V b, V c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a b
inline V Max(V a, V b) { return _mm512_max_ps(a, b); }
inline V Min(V a, V b) { return _mm512_min_ps(a, b); }
inline __mmask16 First(int n) { return static_cast<__mmask16>((1u << n) - 1); }  // the first n lanes, n in [0, 16]
inline V LoadFirst(const float* p, int n, float fill) { return _mm512_mask_loadu_ps(Set1(fill), First(n), p); }
inline void StoreFirst(float* p, V v, int n) { _mm512_mask_storeu_ps(p, First(n), v); }
}  // namespace avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
using V = __m256;
constexpr int kLanes = 8;
inline V Zero() { return _mm256_setzero_ps(); }
inline V Load(const float* p) { return _mm256_loadu_ps(p); }
inline void Store(float* p, V v) { _mm256_storeu_ps(p, v); }
inline V Set1(float x) { return _mm256_set1_ps(x); }
inline V Add(V a, V b) { return _mm256_add_ps(a, b); }
inline V Sub(V a, V b) { return _mm256_sub_ps(a, b); }
inline V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
inline V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }    // a b + c
inline V Fnma(V a, V b, V c) { return _mm256_fnmadd_ps(a, b, c); }  // c - a b
inline V Max(V a, V b) { return _mm256_max_ps(a, b); }
inline V Min(V a, V b) { return _mm256_min_ps(a, b); }
inline __m256i First(int n) {  // the first n lanes, n in [0, 8]
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline V LoadFirst(const float* p, int n, float fill) {  // the first n lanes from p (only they are read), the rest fill
  const __m256i m = First(n);
  return _mm256_blendv_ps(Set1(fill), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
}
inline void StoreFirst(float* p, V v, int n) { _mm256_maskstore_ps(p, First(n), v); }  // only the first n lanes
}  // namespace avx2
#pragma GCC pop_options

}  // namespace osprey::cpu::simd

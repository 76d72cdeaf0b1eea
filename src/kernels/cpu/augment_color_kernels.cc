// Fast kernels of the uint8 colour ops ShiftHSV, AdjustSaturation, AdjustContrast and of LookupTable
// (docs/augment.md). The reference kernels in src/kernels/reference/augment.cc state the arithmetic (OpenCV's integer
// RGB -> HSV, float HSV -> RGB, cv2.addWeighted, albucore's float32 tables); these kernels perform the same integer and
// IEEE float/double operations in the same order (ShiftHSV's one fused multiply-add aside, proven equal on every
// input it can see), 8 pixels at a time with AVX2 (LookupTable: 64 bytes with
// AVX512-VBMI) where the CPU has it (chosen at run time; the build targets x86-64-v2), so the results are
// bit-identical to the reference. No libm calls per pixel.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define OSPREY_AUGMENT_AVX2 1
#endif

#include "kernels/cpu/cpu_kernels.h"
#include "ops/op_registry.h"

namespace osprey {

namespace {

int64_t PixelsOf(const Shape& s) { return s.size() == 4 ? s[0] * s[1] * s[2] : s[0] * s[1]; }
int64_t ImagesOf(const Shape& s) { return s.size() == 4 ? s[0] : 1; }

void CheckShape(const KernelContext& ctx, const Shape& shape, const char* name) {
  if (ctx.In(0).shape() != shape || ctx.Out(0).shape() != shape)
    throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": " + name + " was built for " + ShapeToString(shape) +
                                          ", got " + ShapeToString(ctx.In(0).shape()) + " -> " +
                                          ShapeToString(ctx.Out(0).shape()));
}

// cv::cvtColor RGB -> GRAY for uint8 (15-bit coefficients), as the reference.
inline int GrayU8(int r, int g, int b) { return (r * 9798 + g * 19235 + b * 3735 + (1 << 14)) >> 15; }

#ifdef OSPREY_AUGMENT_AVX2
// 8 RGB pixels (24 bytes at p) as three vectors of 8 int32.
__attribute__((target("avx2"))) inline void LoadRgb8(const uint8_t* p, __m256i& r, __m256i& g, __m256i& b) {
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));      // bytes 0..15
  const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8));  // bytes 8..23
  const __m128i rg =
      _mm_or_si128(_mm_shuffle_epi8(lo, _mm_setr_epi8(0, 3, 6, 9, 12, 15, -1, -1, 1, 4, 7, 10, 13, -1, -1, -1)),
                   _mm_shuffle_epi8(hi, _mm_setr_epi8(-1, -1, -1, -1, -1, -1, 10, 13, -1, -1, -1, -1, -1, 8, 11, 14)));
  const __m128i bb =
      _mm_or_si128(_mm_shuffle_epi8(lo, _mm_setr_epi8(2, 5, 8, 11, 14, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1)),
                   _mm_shuffle_epi8(hi, _mm_setr_epi8(-1, -1, -1, -1, -1, 9, 12, 15, -1, -1, -1, -1, -1, -1, -1, -1)));
  r = _mm256_cvtepu8_epi32(rg);
  g = _mm256_cvtepu8_epi32(_mm_srli_si128(rg, 8));
  b = _mm256_cvtepu8_epi32(bb);
}

// Stores 8 pixels held as one int32 lane each, bytes (R, G, B, unused), as 24 bytes at p.
__attribute__((target("avx2"))) inline void StoreRgb8(uint8_t* p, __m256i px) {
  const __m256i packed =
      _mm256_shuffle_epi8(px, _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1, 0, 1, 2, 4, 5, 6,
                                               8, 9, 10, 12, 13, 14, -1, -1, -1, -1));
  const __m256i compact = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 3, 7));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(compact));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p + 16), _mm256_extracti128_si256(compact, 1));
}

__attribute__((target("avx2"))) inline __m256i Clamp255(__m256i v) {
  return _mm256_min_epi32(_mm256_max_epi32(v, _mm256_setzero_si256()), _mm256_set1_epi32(255));
}

// 8 pixels as one int32 lane each per channel (values 0..255): the form the per-pixel steps below work on.
struct Rgb8 {
  __m256i r, g, b;
};

// Lanes R | G << 8 | B << 16 (what StoreRgb8 stores).
__attribute__((target("avx2"), always_inline)) inline __m256i PackRgb8(const Rgb8& p) {
  return _mm256_or_si256(p.r, _mm256_or_si256(_mm256_slli_epi32(p.g, 8), _mm256_slli_epi32(p.b, 16)));
}

// GrayU8 of 8 pixels.
__attribute__((target("avx2"), always_inline)) inline __m256i Gray8(const Rgb8& p) {
  return _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(_mm256_mullo_epi32(p.r, _mm256_set1_epi32(9798)),
                                        _mm256_mullo_epi32(p.g, _mm256_set1_epi32(19235))),
                       _mm256_add_epi32(_mm256_mullo_epi32(p.b, _mm256_set1_epi32(3735)), _mm256_set1_epi32(1 << 14))),
      15);
}
#endif

// ---------------------------------------------------------------- ShiftHSV

// OpenCV's uint8 RGB -> HSV tables (hsv_shift = 12, hue range 180), as the reference.
struct HsvDivTables {
  alignas(32) int32_t sdiv[256], hdiv[256];
  HsvDivTables() {
    sdiv[0] = hdiv[0] = 0;
    for (int i = 1; i < 256; ++i) {
      sdiv[i] = static_cast<int32_t>(std::nearbyint((255 << 12) / (1.0 * i)));
      hdiv[i] = static_cast<int32_t>(std::nearbyint((180 << 12) / (6.0 * i)));
    }
  }
};

// Per input hue h (index < 256; RGB -> HSV gives h < 180): everything the HSV -> RGB step needs from the shifted hue.
// The reference builds tab = {v, v (1 - s), v t2, v t3} with t2 = 1 - s hh, t3 = 1 - s (1 - hh) and picks (b, g, r)
// by sector; exactly one of t2, t3 appears per sector, so a pixel needs v, p = v (1 - s) and t = v (1 - s frac) with
// frac = hh or 1 - hh (frac[h]), and a byte order (order[h]: bytes 0..2 = source of R, G, B among v = 0, p = 1, t = 2).
// When the shifted hue of every h < 180 is (h + hue_shift) mod 180 (always, short of rounding at the fmod), the SIMD
// kernels compute frac and order from the hue's sector (6 of them) with in-register permutes instead of gathers:
// sector_order and sector_t3 (all ones where the sector uses t3, so frac = 1 - hh) per sector.
struct HsvShiftTables {
  alignas(32) float frac[256];
  alignas(32) int32_t order[256];
  uint8_t order_bytes[256][3];
  int sat = 0, val = 0;
  int hue_shift = -1;  // -1: not a rotation; use the tables
  alignas(32) int32_t sector_order[8] = {}, sector_t3[8] = {};
};

HsvShiftTables MakeHsvShiftTables(double hue, float saturation, float value) {
  static const int kSector[6][3] = {{1, 3, 0}, {1, 0, 2}, {3, 0, 1}, {0, 2, 1}, {0, 1, 3}, {2, 1, 0}};
  static const int kSource[4] = {0, 1, 2, 2};  // tab index -> v, p, t
  HsvShiftTables t;
  // |shift| <= 1e6 (schema); clamping to +-512 keeps clamp(x + shift, 0, 255) unchanged for x in [0, 255].
  t.sat = std::clamp(static_cast<int>(std::trunc(saturation)), -512, 512);
  t.val = std::clamp(static_cast<int>(std::trunc(value)), -512, 512);
  int shifted[256];
  for (int v = 0; v < 256; ++v) {
    double h = std::fmod(v + hue, 180.0);
    if (h < 0) h += 180.0;
    shifted[v] = static_cast<uint8_t>(std::min(std::floor(h), 179.0));
    const float hf = static_cast<float>(shifted[v]);
    float hh = hf * (6.f / 180.f);
    int sector = static_cast<int>(std::floor(hh));
    hh -= static_cast<float>(sector);
    if (sector < 0 || sector >= 6) sector = 0, hh = 0.f;
    const int* tab = kSector[sector];  // b, g, r
    const bool uses_t3 = tab[0] == 3 || tab[1] == 3 || tab[2] == 3;
    t.frac[v] = uses_t3 ? 1.f - hh : hh;
    t.order_bytes[v][0] = static_cast<uint8_t>(kSource[tab[2]]);
    t.order_bytes[v][1] = static_cast<uint8_t>(kSource[tab[1]]);
    t.order_bytes[v][2] = static_cast<uint8_t>(kSource[tab[0]]);
    t.order[v] = t.order_bytes[v][0] | t.order_bytes[v][1] << 8 | t.order_bytes[v][2] << 16 | 0x80 << 24;
    t.sector_order[sector] = t.order[v];
    t.sector_t3[sector] = uses_t3 ? -1 : 0;
  }
  t.hue_shift = shifted[0];
  for (int v = 0; v < 180; ++v)
    if (shifted[v] != (v + shifted[0]) % 180) t.hue_shift = -1;
  return t;
}

inline uint8_t TruncU8(float x) { return static_cast<uint8_t>(std::clamp(static_cast<int>(x * 255.f), 0, 255)); }

void ShiftHsvScalar(const HsvDivTables& div, const HsvShiftTables& t, const uint8_t* src, uint8_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i, src += 3, dst += 3) {
    const int r = src[0], g = src[1], b = src[2];
    const int v = std::max({r, g, b}), diff = v - std::min({r, g, b});
    const int s = (diff * div.sdiv[v] + (1 << 11)) >> 12;
    int h = v == r ? g - b : v == g ? b - r + 2 * diff : r - g + 4 * diff;
    h = (h * div.hdiv[diff] + (1 << 11)) >> 12;
    if (h < 0) h += 180;
    const float vf = static_cast<float>(std::clamp(v + t.val, 0, 255)) * (1.f / 255.f);
    const float sf = static_cast<float>(std::clamp(s + t.sat, 0, 255)) * (1.f / 255.f);
    const float tf = static_cast<float>(1.0 - static_cast<double>(sf) * t.frac[h]);
    const uint8_t out[3] = {TruncU8(vf), TruncU8(vf * (1.f - sf)), TruncU8(vf * tf)};
    for (int ch = 0; ch < 3; ++ch) dst[ch] = out[t.order_bytes[h][ch]];
  }
}

#ifdef OSPREY_AUGMENT_AVX2
// One ShiftHSV step on 8 pixels; returns them packed (PackRgb8's form). kShifts: saturation or value shifts to add
// (false: both are 0, as for ColorJitter's hue). The rotation test is loop-invariant.
template <bool kShifts>
__attribute__((target("avx2,fma"), always_inline)) inline __m256i ShiftHsv8(const HsvShiftTables& t, __m256i r,
                                                                            __m256i g, __m256i b) {
  const __m256i round = _mm256_set1_epi32(1 << 11), c180 = _mm256_set1_epi32(180), zero = _mm256_setzero_si256();
  const __m256 inv255 = _mm256_set1_ps(1.f / 255.f), c255 = _mm256_set1_ps(255.f), one_f = _mm256_set1_ps(1.f);
  // pshufb works within 128-bit lanes: the order bytes of pixel k index bytes 4k..4k+2 of its lane.
  const __m256i lane_offsets =
      _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0c0c0c0c, 0, 0x04040404, 0x08080808, 0x0c0c0c0c);
  // The division tables by float division, rounded to nearest: equal to sdiv / hdiv for every index 1..255 (float
  // quotients are within 0.06 of the exact ones, and none of these lies within 0.06 of a rounding tie); index 0 (where
  // the product is 0 anyway) divides by 1. Divisions are cheaper than gathers.
  const __m256 sdiv_num = _mm256_set1_ps(255 << 12), hdiv_num = _mm256_set1_ps((180 << 12) / 6);
  const __m256i one_i = _mm256_set1_epi32(1);
  const __m256i v = _mm256_max_epi32(_mm256_max_epi32(r, g), b);
  const __m256i diff = _mm256_sub_epi32(v, _mm256_min_epi32(_mm256_min_epi32(r, g), b));
  const __m256i sdiv = _mm256_cvtps_epi32(_mm256_div_ps(sdiv_num, _mm256_cvtepi32_ps(_mm256_max_epi32(v, one_i))));
  const __m256i hdiv = _mm256_cvtps_epi32(_mm256_div_ps(hdiv_num, _mm256_cvtepi32_ps(_mm256_max_epi32(diff, one_i))));
  const __m256i s = _mm256_srai_epi32(_mm256_add_epi32(_mm256_mullo_epi32(diff, sdiv), round), 12);
  const __m256i h_r = _mm256_sub_epi32(g, b);
  const __m256i h_g = _mm256_add_epi32(_mm256_sub_epi32(b, r), _mm256_add_epi32(diff, diff));
  const __m256i h_b = _mm256_add_epi32(_mm256_sub_epi32(r, g), _mm256_slli_epi32(diff, 2));
  __m256i h = _mm256_blendv_epi8(_mm256_blendv_epi8(h_b, h_g, _mm256_cmpeq_epi32(v, g)), h_r, _mm256_cmpeq_epi32(v, r));
  h = _mm256_srai_epi32(_mm256_add_epi32(_mm256_mullo_epi32(h, hdiv), round), 12);
  h = _mm256_add_epi32(h, _mm256_and_si256(_mm256_cmpgt_epi32(zero, h), c180));
  const __m256 vf =
      _mm256_mul_ps(_mm256_cvtepi32_ps(kShifts ? Clamp255(_mm256_add_epi32(v, _mm256_set1_epi32(t.val))) : v), inv255);
  const __m256 sf =
      _mm256_mul_ps(_mm256_cvtepi32_ps(kShifts ? Clamp255(_mm256_add_epi32(s, _mm256_set1_epi32(t.sat))) : s), inv255);
  __m256 frac;
  __m256i order;
  // A rotation: the table entries' arithmetic (MakeHsvShiftTables) on the shifted hue, as lanes.
  if (t.hue_shift >= 0) {
    __m256i hs = _mm256_add_epi32(h, _mm256_set1_epi32(t.hue_shift));
    hs = _mm256_sub_epi32(hs, _mm256_and_si256(_mm256_cmpgt_epi32(hs, _mm256_set1_epi32(179)), c180));
    const __m256 hh = _mm256_mul_ps(_mm256_cvtepi32_ps(hs), _mm256_set1_ps(6.f / 180.f));
    const __m256i sector = _mm256_cvttps_epi32(hh);
    const __m256 within = _mm256_sub_ps(hh, _mm256_cvtepi32_ps(sector));
    const __m256i sector_t3 = _mm256_load_si256(reinterpret_cast<const __m256i*>(t.sector_t3));
    frac = _mm256_blendv_ps(within, _mm256_sub_ps(one_f, within),
                            _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(sector_t3, sector)));
    order = _mm256_permutevar8x32_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(t.sector_order)), sector);
  } else {
    frac = _mm256_i32gather_ps(t.frac, h, 4);
    order = _mm256_i32gather_epi32(t.order, h, 4);
  }
  // t = float(1 - double(s) * frac) is 1 - s * frac rounded once to float, which is what the fused multiply-add
  // gives: equal for every s (256 values) and frac (hh and 1 - hh of the 180 hues), 92,160 pairs, all checked
  // (AugmentOps.ShiftHsvFusedStepIsTheDoubleStep).
  const __m256 tf = _mm256_fnmadd_ps(sf, frac, one_f);
  // vf, sf, 1 - sf and tf lie in [0, 1] (k / 255 rounds to at most 1 + 2^-23), so each product times 255 truncates
  // to 0..255: the reference's clamp changes nothing.
  const __m256i cv = _mm256_cvttps_epi32(_mm256_mul_ps(vf, c255));
  const __m256i cp = _mm256_cvttps_epi32(_mm256_mul_ps(_mm256_mul_ps(vf, _mm256_sub_ps(one_f, sf)), c255));
  const __m256i ct = _mm256_cvttps_epi32(_mm256_mul_ps(_mm256_mul_ps(vf, tf), c255));
  const __m256i sources = _mm256_or_si256(cv, _mm256_or_si256(_mm256_slli_epi32(cp, 8), _mm256_slli_epi32(ct, 16)));
  return _mm256_shuffle_epi8(sources, _mm256_add_epi8(order, lane_offsets));
}

template <bool kShifts>
__attribute__((target("avx2,fma"))) int64_t ShiftHsvAvx2(const HsvShiftTables& t, const uint8_t* src, uint8_t* dst,
                                                         int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i r, g, b;
    LoadRgb8(src + i * 3, r, g, b);
    StoreRgb8(dst + i * 3, ShiftHsv8<kShifts>(t, r, g, b));
  }
  return i;
}

// 16 RGB pixels as the low 48 bytes of a zmm (the AVX-512 loops below): byte permutes move R, G, B of pixel k (bytes
// 3k, 3k + 1, 3k + 2) to byte 0 of 32-bit lane k (`pick`, with kLowBytes as the zeroing mask), and lanes
// R | G << 8 | B << 16 back to 48 bytes (`pack`).
struct Rgb16Index {
  alignas(64) uint8_t pick[3][64];
  alignas(64) uint8_t pack[64];
};
constexpr Rgb16Index MakeRgb16Index() {
  Rgb16Index t{};
  for (int k = 0; k < 16; ++k)
    for (int ch = 0; ch < 3; ++ch)
      t.pick[ch][4 * k] = static_cast<uint8_t>(3 * k + ch), t.pack[3 * k + ch] = static_cast<uint8_t>(4 * k + ch);
  return t;
}
alignas(64) constexpr Rgb16Index kRgb16 = MakeRgb16Index();
constexpr __mmask64 kLowBytes = 0x1111111111111111ULL, kBytes48 = (1ULL << 48) - 1;

// 16 pixels at p (48 bytes) as three vectors of 16 int32 lanes (LoadRgb8 with AVX-512).
__attribute__((target("avx512f,avx512bw,avx512vbmi"), always_inline)) inline void LoadRgb16(const uint8_t* p,
                                                                                           __m512i& r, __m512i& g,
                                                                                           __m512i& b) {
  const __m512i in = _mm512_maskz_loadu_epi8(kBytes48, p);
  r = _mm512_maskz_permutexvar_epi8(kLowBytes, _mm512_load_si512(kRgb16.pick[0]), in);
  g = _mm512_maskz_permutexvar_epi8(kLowBytes, _mm512_load_si512(kRgb16.pick[1]), in);
  b = _mm512_maskz_permutexvar_epi8(kLowBytes, _mm512_load_si512(kRgb16.pick[2]), in);
}

// Stores 16 pixels held as one int32 lane each, bytes (R, G, B, unused), as 48 bytes at p (StoreRgb8 with AVX-512).
__attribute__((target("avx512f,avx512bw,avx512vbmi"), always_inline)) inline void StoreRgb16(uint8_t* p,
                                                                                            __m512i px) {
  _mm512_mask_storeu_epi8(p, kBytes48, _mm512_permutexvar_epi8(_mm512_load_si512(kRgb16.pack), px));
}

// GrayU8 of 16 pixels (Gray8 with AVX-512).
__attribute__((target("avx512f,avx512bw,avx512vbmi"), always_inline)) inline __m512i Gray16(__m512i r, __m512i g,
                                                                                           __m512i b) {
  return _mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(_mm512_mullo_epi32(r, _mm512_set1_epi32(9798)),
                                        _mm512_mullo_epi32(g, _mm512_set1_epi32(19235))),
                       _mm512_add_epi32(_mm512_mullo_epi32(b, _mm512_set1_epi32(3735)), _mm512_set1_epi32(1 << 14))),
      15);
}

// ShiftHsvAvx2 with AVX-512 (BW, VBMI), 16 pixels per step: the same integer and IEEE operations lane by lane as
// ShiftHsv8 (divisions instead of table gathers, a hue rotation by arithmetic and permutes instead of gathers, the
// fused 1 - s * frac, no clamps where the values cannot leave 0..255).
// GCC 12's AVX-512 intrinsics pass an "undefined" vector that -Wmaybe-uninitialized reports once inlined (a known
// false positive).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
template <bool kShifts>
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) int64_t ShiftHsvAvx512(const HsvShiftTables& t,
                                                                              const uint8_t* src, uint8_t* dst,
                                                                              int64_t n) {
  const __m512i round = _mm512_set1_epi32(1 << 11), c180 = _mm512_set1_epi32(180), zero = _mm512_setzero_si512();
  const __m512i c255i = _mm512_set1_epi32(255), one_i = _mm512_set1_epi32(1), c179 = _mm512_set1_epi32(179);
  const __m512i sat = _mm512_set1_epi32(t.sat), val = _mm512_set1_epi32(t.val);
  const __m512 inv255 = _mm512_set1_ps(1.f / 255.f), c255 = _mm512_set1_ps(255.f), one_f = _mm512_set1_ps(1.f);
  const __m512 sdiv_num = _mm512_set1_ps(255 << 12), hdiv_num = _mm512_set1_ps((180 << 12) / 6);
  const __m512 to_sector = _mm512_set1_ps(6.f / 180.f);
  const __m512i lane_offsets = _mm512_broadcast_i32x4(_mm_setr_epi32(0, 0x04040404, 0x08080808, 0x0c0c0c0c));
  const bool rotation = t.hue_shift >= 0;
  const __m512i hue_shift = _mm512_set1_epi32(rotation ? t.hue_shift : 0);
  const __m512i sector_t3 = _mm512_zextsi256_si512(_mm256_load_si256(reinterpret_cast<const __m256i*>(t.sector_t3)));
  const __m512i sector_order =
      _mm512_zextsi256_si512(_mm256_load_si256(reinterpret_cast<const __m256i*>(t.sector_order)));
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512i r, g, b;
    LoadRgb16(src + i * 3, r, g, b);
    const __m512i v = _mm512_max_epi32(_mm512_max_epi32(r, g), b);
    const __m512i diff = _mm512_sub_epi32(v, _mm512_min_epi32(_mm512_min_epi32(r, g), b));
    const __m512i sdiv = _mm512_cvtps_epi32(_mm512_div_ps(sdiv_num, _mm512_cvtepi32_ps(_mm512_max_epi32(v, one_i))));
    const __m512i hdiv =
        _mm512_cvtps_epi32(_mm512_div_ps(hdiv_num, _mm512_cvtepi32_ps(_mm512_max_epi32(diff, one_i))));
    const __m512i s = _mm512_srai_epi32(_mm512_add_epi32(_mm512_mullo_epi32(diff, sdiv), round), 12);
    const __m512i h_r = _mm512_sub_epi32(g, b);
    const __m512i h_g = _mm512_add_epi32(_mm512_sub_epi32(b, r), _mm512_add_epi32(diff, diff));
    const __m512i h_b = _mm512_add_epi32(_mm512_sub_epi32(r, g), _mm512_slli_epi32(diff, 2));
    __m512i h = _mm512_mask_mov_epi32(_mm512_mask_mov_epi32(h_b, _mm512_cmpeq_epi32_mask(v, g), h_g),
                                      _mm512_cmpeq_epi32_mask(v, r), h_r);
    h = _mm512_srai_epi32(_mm512_add_epi32(_mm512_mullo_epi32(h, hdiv), round), 12);
    h = _mm512_mask_add_epi32(h, _mm512_cmpgt_epi32_mask(zero, h), h, c180);
    const __m512i vs = kShifts ? _mm512_min_epi32(_mm512_max_epi32(_mm512_add_epi32(v, val), zero), c255i) : v;
    const __m512i ss = kShifts ? _mm512_min_epi32(_mm512_max_epi32(_mm512_add_epi32(s, sat), zero), c255i) : s;
    const __m512 vf = _mm512_mul_ps(_mm512_cvtepi32_ps(vs), inv255);
    const __m512 sf = _mm512_mul_ps(_mm512_cvtepi32_ps(ss), inv255);
    __m512 frac;
    __m512i order;
    if (rotation) {  // MakeHsvShiftTables' arithmetic on the shifted hue, as lanes (ShiftHsv8)
      __m512i hs = _mm512_add_epi32(h, hue_shift);
      hs = _mm512_mask_sub_epi32(hs, _mm512_cmpgt_epi32_mask(hs, c179), hs, c180);
      const __m512 hh = _mm512_mul_ps(_mm512_cvtepi32_ps(hs), to_sector);
      const __m512i sector = _mm512_cvttps_epi32(hh);
      const __m512 within = _mm512_sub_ps(hh, _mm512_cvtepi32_ps(sector));
      const __mmask16 third = _mm512_test_epi32_mask(_mm512_permutexvar_epi32(sector, sector_t3), _mm512_set1_epi32(-1));
      frac = _mm512_mask_sub_ps(within, third, one_f, within);
      order = _mm512_permutexvar_epi32(sector, sector_order);
    } else {
      frac = _mm512_i32gather_ps(h, t.frac, 4);
      order = _mm512_i32gather_epi32(h, t.order, 4);
    }
    // 1 - s * frac rounded once (ShiftHsv8: equal to the reference's double step for every s and frac).
    const __m512 tf = _mm512_fnmadd_ps(sf, frac, one_f);
    const __m512i cv = _mm512_cvttps_epi32(_mm512_mul_ps(vf, c255));
    const __m512i cp = _mm512_cvttps_epi32(_mm512_mul_ps(_mm512_mul_ps(vf, _mm512_sub_ps(one_f, sf)), c255));
    const __m512i ct = _mm512_cvttps_epi32(_mm512_mul_ps(_mm512_mul_ps(vf, tf), c255));
    const __m512i sources = _mm512_or_si512(cv, _mm512_or_si512(_mm512_slli_epi32(cp, 8), _mm512_slli_epi32(ct, 16)));
    StoreRgb16(dst + i * 3, _mm512_shuffle_epi8(sources, _mm512_add_epi8(order, lane_offsets)));
  }
  return i;
}
#pragma GCC diagnostic pop
#endif

class ShiftHsvKernel final : public Kernel {
 public:
  explicit ShiftHsvKernel(const KernelBuildContext& ctx) : shape_(ctx.input_shapes[0]) {
    const float hue = ctx.node.GetFloat("hue", 0.f), sat = ctx.node.GetFloat("saturation", 0.f);
    const float val = ctx.node.GetFloat("value", 0.f);
    identity_ = hue == 0.f && sat == 0.f && val == 0.f;
    tables_ = MakeHsvShiftTables(hue, sat, val);
  }
  const char* Name() const override { return "ShiftHsvU8"; }

  void Run(KernelContext& ctx) override {
    CheckShape(ctx, shape_, Name());
    const uint8_t* src = ctx.In(0).data<uint8_t>();
    uint8_t* dst = ctx.Out(0).data<uint8_t>();
    const int64_t n = PixelsOf(shape_);
    if (identity_) {  // Albumentations returns the image untouched when every shift is 0
      std::memcpy(dst, src, n * 3);
      return;
    }
    static const HsvDivTables div;
    int64_t done = 0;
#ifdef OSPREY_AUGMENT_AVX2
    const bool shifts = tables_.sat != 0 || tables_.val != 0;
    if (simd_ >= kSimdAvx512 && fma_)
      done = shifts ? ShiftHsvAvx512<true>(tables_, src, dst, n) : ShiftHsvAvx512<false>(tables_, src, dst, n);
    else if (simd_ >= kSimdAvx2 && fma_)
      done = shifts ? ShiftHsvAvx2<true>(tables_, src, dst, n) : ShiftHsvAvx2<false>(tables_, src, dst, n);
#endif
    ShiftHsvScalar(div, tables_, src + done * 3, dst + done * 3, n - done);
  }

 private:
  Shape shape_;
  int simd_ = AugmentSimdLevel();
#ifdef OSPREY_AUGMENT_AVX2
  bool fma_ = __builtin_cpu_supports("fma");
#endif
  bool identity_ = false;
  HsvShiftTables tables_;
};

// ---------------------------------------------------------------- AdjustSaturation

// cv2.addWeighted(x, f, gray, 1 - f, 0) in float32, rounded half to even (the CPU's default rounding), saturated.
void AdjustSaturationScalar(float alpha, float beta, const uint8_t* src, uint8_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i, src += 3, dst += 3) {
    const float g = static_cast<float>(GrayU8(src[0], src[1], src[2])) * beta;
    for (int ch = 0; ch < 3; ++ch) {
      const float x = std::min(std::max(0.f, static_cast<float>(src[ch]) * alpha + g), 255.f);
#ifdef __SSE2__
      dst[ch] = static_cast<uint8_t>(_mm_cvtss_si32(_mm_set_ss(x)));
#else
      dst[ch] = static_cast<uint8_t>(std::nearbyint(x));
#endif
    }
  }
}

#ifdef OSPREY_AUGMENT_AVX2
// One channel: round(clamp(c * alpha + gray_part, 0, 255)). max(x, 0) first: a NaN gives 0, as the reference's
// saturating lrint does.
__attribute__((target("avx2"), always_inline)) inline __m256i SaturationChannel(__m256i c, __m256 alpha,
                                                                                __m256 gray_part) {
  const __m256 x = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(c), alpha), gray_part);
  return _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(x, _mm256_setzero_ps()), _mm256_set1_ps(255.f)));
}

// One AdjustSaturation step on 8 pixels.
__attribute__((target("avx2"), always_inline)) inline Rgb8 Saturation8(float alpha, float beta, const Rgb8& p) {
  const __m256 a = _mm256_set1_ps(alpha);
  const __m256 gp = _mm256_mul_ps(_mm256_cvtepi32_ps(Gray8(p)), _mm256_set1_ps(beta));
  return {SaturationChannel(p.r, a, gp), SaturationChannel(p.g, a, gp), SaturationChannel(p.b, a, gp)};
}

__attribute__((target("avx2"))) int64_t AdjustSaturationAvx2(float alpha, float beta, const uint8_t* src, uint8_t* dst,
                                                             int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    Rgb8 p;
    LoadRgb8(src + i * 3, p.r, p.g, p.b);
    StoreRgb8(dst + i * 3, PackRgb8(Saturation8(alpha, beta, p)));
  }
  return i;
}

// AdjustSaturationAvx2 with AVX-512 (BW, VBMI), 16 pixels per step: byte permutes in and out (as ShiftHsvAvx512) and
// Saturation8's float operations lane by lane, each rounded on its own (the _round_ forms are never contracted into
// a fused multiply-add).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
__attribute__((target("avx512f,avx512bw,avx512vbmi"), always_inline)) inline __m512i SaturationChannel16(
    __m512i c, __m512 alpha, __m512 gray_part) {
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m512 x =
      _mm512_add_round_ps(_mm512_mul_round_ps(_mm512_cvtepi32_ps(c), alpha, kNearest), gray_part, kNearest);
  return _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(x, _mm512_setzero_ps()), _mm512_set1_ps(255.f)));
}

__attribute__((target("avx512f,avx512bw,avx512vbmi"))) int64_t AdjustSaturationAvx512(float alpha, float beta,
                                                                                      const uint8_t* src,
                                                                                      uint8_t* dst, int64_t n) {
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m512 a = _mm512_set1_ps(alpha), bt = _mm512_set1_ps(beta);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512i r, g, b;
    LoadRgb16(src + i * 3, r, g, b);
    const __m512 gp = _mm512_mul_round_ps(_mm512_cvtepi32_ps(Gray16(r, g, b)), bt, kNearest);
    const __m512i packed =
        _mm512_or_si512(SaturationChannel16(r, a, gp), _mm512_or_si512(_mm512_slli_epi32(SaturationChannel16(g, a, gp), 8),
                                                                      _mm512_slli_epi32(SaturationChannel16(b, a, gp), 16)));
    StoreRgb16(dst + i * 3, packed);
  }
  return i;
}
#pragma GCC diagnostic pop
#endif

class AdjustSaturationKernel final : public Kernel {
 public:
  explicit AdjustSaturationKernel(const KernelBuildContext& ctx) : shape_(ctx.input_shapes[0]) {
    const double factor = ctx.node.GetFloat("factor", 1.f);
    alpha_ = static_cast<float>(factor);
    beta_ = static_cast<float>(1.0 - factor);
  }
  const char* Name() const override { return "AdjustSaturationU8"; }

  void Run(KernelContext& ctx) override {
    CheckShape(ctx, shape_, Name());
    const uint8_t* src = ctx.In(0).data<uint8_t>();
    uint8_t* dst = ctx.Out(0).data<uint8_t>();
    const int64_t n = PixelsOf(shape_);
    if (shape_.back() == 1) {
      std::memcpy(dst, src, n);
      return;
    }
    int64_t done = 0;
#ifdef OSPREY_AUGMENT_AVX2
    if (simd_ >= kSimdAvx512)
      done = AdjustSaturationAvx512(alpha_, beta_, src, dst, n);
    else if (simd_ >= kSimdAvx2)
      done = AdjustSaturationAvx2(alpha_, beta_, src, dst, n);
#endif
    AdjustSaturationScalar(alpha_, beta_, src + done * 3, dst + done * 3, n - done);
  }

 private:
  Shape shape_;
  int simd_ = AugmentSimdLevel();
  float alpha_ = 1.f, beta_ = 0.f;
};

// ---------------------------------------------------------------- Affine tables (LookupTable, AdjustContrast)

// A 256-entry uint8 table that is an affine map, clamped and floored: table[x] = clamp((x * m + b) >> shift, 0, 255)
// with int32 arithmetic that cannot overflow for x in 0..255 (what brightness, brightness/contrast and value-shift
// tables are). FitAffineLut finds such (m, b), or says there is none: every entry is checked, so a table that only
// looks affine keeps the table lookup.
struct AffineLut {
  int32_t m = 0, b = 0;
  int shift = 0;
};

bool FitAffineLutAt(const uint8_t* table, int shift, AffineLut& out) {
  const int64_t one = int64_t{1} << shift;
  // Bounds on x * m + b per entry: [lo, hi]. Entry 0 only says "at most 0" and 255 "at least 255" (the clamp).
  int64_t lo[256], hi[256];
  constexpr int64_t kInf = int64_t{1} << 40;
  for (int x = 0; x < 256; ++x) {
    lo[x] = table[x] == 0 ? -kInf : table[x] * one;
    hi[x] = table[x] == 255 ? kInf : table[x] * one + one - 1;
  }
  // For a slope m, b must lie in [max(lo - x m), min(hi - x m)]; the gap max - min is convex in m (a maximum of lines
  // minus a minimum of lines), so an integer ternary search finds its smallest value.
  const int64_t m_limit = (int64_t{1} << 30) / 255;  // |x m| < 2^30
  const int64_t b_limit = int64_t{1} << 30;          // |x m + b| < 2^31
  auto gap = [&](int64_t m, int64_t& b_lo, int64_t& b_hi) {
    b_lo = -kInf * 2, b_hi = kInf * 2;
    for (int x = 0; x < 256; ++x) b_lo = std::max(b_lo, lo[x] - x * m), b_hi = std::min(b_hi, hi[x] - x * m);
    return b_lo - b_hi;
  };
  int64_t a = -m_limit, z = m_limit, b_lo, b_hi;
  // Entries strictly inside (0, 255) bound the slope: floor is off by less than 1 at each end, so the slope is within
  // 2 / (last - first) of (table[last] - table[first]) / (last - first). A narrower search, not a different answer.
  int first = -1, last = -1;
  for (int x = 0; x < 256; ++x)
    if (table[x] > 0 && table[x] < 255) last = x, first = first < 0 ? x : first;
  if (last - first >= 8) {
    const double span = last - first, scale = static_cast<double>(one);
    const double estimate = (table[last] - table[first]) / span * scale, reach = 2.0 / span * scale + 2.0;
    a = std::max(a, static_cast<int64_t>(std::floor(estimate - reach)));
    z = std::min(z, static_cast<int64_t>(std::ceil(estimate + reach)));
    if (a > z) return false;
  }
  while (z - a > 2) {
    const int64_t m1 = a + (z - a) / 3, m2 = z - (z - a) / 3;
    if (gap(m1, b_lo, b_hi) <= gap(m2, b_lo, b_hi))
      z = m2;
    else
      a = m1;
  }
  for (int64_t m = a; m <= z; ++m) {
    if (gap(m, b_lo, b_hi) > 0) continue;
    // Any b in [b_lo, b_hi] fits; take the one nearest 0 so the sum stays small.
    const int64_t b = std::clamp<int64_t>(0, b_lo, b_hi);
    if (b < -b_limit || b > b_limit) continue;
    out.m = static_cast<int32_t>(m), out.b = static_cast<int32_t>(b), out.shift = shift;
    for (int x = 0; x < 256; ++x)  // the kernel's own arithmetic, entry by entry
      if (std::clamp((x * out.m + out.b) >> shift, 0, 255) != table[x]) return false;
    return true;
  }
  return false;
}

bool FitAffineLut(const uint8_t* table, AffineLut& out) {
  for (int shift : {20, 16})  // the finer grid first (slopes below 4), then slopes up to 64
    if (FitAffineLutAt(table, shift, out)) return true;
  return false;
}

#ifdef OSPREY_AUGMENT_AVX2
// The affine table computed, 32 bytes at a time (what FitAffineLut checked entry by entry).
__attribute__((target("avx2"))) int64_t LookupAffineAvx2(const AffineLut& f, const uint8_t* src, uint8_t* dst,
                                                         int64_t n) {
  const __m256i m = _mm256_set1_epi32(f.m), b = _mm256_set1_epi32(f.b);
  const __m128i shift = _mm_cvtsi32_si128(f.shift);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i q[4];
    for (int k = 0; k < 4; ++k) {
      const __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + i + 8 * k)));
      q[k] = _mm256_sra_epi32(_mm256_add_epi32(_mm256_mullo_epi32(x, m), b), shift);
    }
    // |q| < 2^15: the int16 pack is exact, the uint8 pack clamps to 0..255.
    const __m256i packed = _mm256_packus_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_permutevar8x32_epi32(packed, order));
  }
  return i;
}
#endif

// ---------------------------------------------------------------- AdjustContrast

// Sum of the uint8 gray values of n RGB pixels (C = 3), or of the n bytes (C = 1).
int64_t GraySumScalar(const uint8_t* src, int64_t n, int64_t c) {
  int64_t sum = 0;
  for (int64_t i = 0; i < n; ++i, src += c) sum += c == 3 ? GrayU8(src[0], src[1], src[2]) : src[0];
  return sum;
}

// albucore's contrast table entry, computed per element: trunc(clamp(float(v) * factor + offset, 0, 255)).
inline uint8_t ContrastValue(int v, float factor, float offset) {
  return static_cast<uint8_t>(std::clamp(static_cast<float>(v) * factor + offset, 0.f, 255.f));
}

#ifdef OSPREY_AUGMENT_AVX2
__attribute__((target("avx2"))) int64_t GraySumRgbAvx2(const uint8_t* src, int64_t n, int64_t& done) {
  int64_t total = 0, i = 0;
  while (i + 8 <= n) {
    // Blocks of up to 8 * 4096 pixels: an int32 lane sums at most 4096 values of 255.
    const int64_t end = std::min(n - n % 8, i + 8 * 4096);
    __m256i acc = _mm256_setzero_si256();
    for (; i < end; i += 8) {
      Rgb8 p;
      LoadRgb8(src + i * 3, p.r, p.g, p.b);
      acc = _mm256_add_epi32(acc, Gray8(p));
    }
    alignas(32) int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc);
    for (int32_t lane : lanes) total += lane;
  }
  done = i;
  return total;
}

// GraySumRgbAvx2 with AVX-512 (BW, VBMI): 16 pixels per step, byte permutes in (as AdjustSaturationAvx512).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) int64_t GraySumRgbAvx512(const uint8_t* src, int64_t n,
                                                                                int64_t& done) {
  int64_t total = 0, i = 0;
  while (i + 16 <= n) {
    // Blocks of up to 16 * 4096 pixels: an int32 lane sums at most 4096 values of 255.
    const int64_t end = std::min(n - n % 16, i + 16 * 4096);
    __m512i acc = _mm512_setzero_si512();
    for (; i < end; i += 16) {
      __m512i r, g, b;
      LoadRgb16(src + i * 3, r, g, b);
      acc = _mm512_add_epi32(acc, Gray16(r, g, b));
    }
    total += _mm512_reduce_add_epi32(acc);
  }
  done = i;
  return total;
}
#pragma GCC diagnostic pop

// The table applied as its formula, 32 bytes at a time: the same float operations as ContrastValue.
__attribute__((target("avx2"))) int64_t ApplyContrastAvx2(float factor, float offset, const uint8_t* src, uint8_t* dst,
                                                          int64_t n) {
  const __m256 f = _mm256_set1_ps(factor), o = _mm256_set1_ps(offset);
  const __m256 zero = _mm256_setzero_ps(), c255 = _mm256_set1_ps(255.f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i in = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    __m256i q[4];
    for (int k = 0; k < 4; ++k) {
      const __m128i bytes = k < 2 ? _mm256_castsi256_si128(in) : _mm256_extracti128_si256(in, 1);
      const __m128i part = (k & 1) ? _mm_unpackhi_epi64(bytes, bytes) : bytes;
      const __m256 x = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(part)), f), o);
      q[k] = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(x, zero), c255));
    }
    const __m256i packed = _mm256_packus_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_permutevar8x32_epi32(packed, order));
  }
  return i;
}
#endif

// ---------------------------------------------------------------- LookupTable

#ifdef OSPREY_AUGMENT_AVX2
// A 256-byte table in four registers; Lookup64 maps 64 bytes: vpermi2b looks up the low 7 bits in each 128-byte half
// and the top bit picks the half.
struct Lut512 {
  __m512i q[4];
};

__attribute__((target("avx512f,avx512bw,avx512vbmi"))) inline Lut512 LoadLut512(const uint8_t* table) {
  Lut512 t;
  for (int k = 0; k < 4; ++k) t.q[k] = _mm512_loadu_si512(table + 64 * k);
  return t;
}

__attribute__((target("avx512f,avx512bw,avx512vbmi"))) inline __m512i Lookup64(const Lut512& t, __m512i x) {
  const __m512i lo = _mm512_permutex2var_epi8(t.q[0], x, t.q[1]);
  const __m512i hi = _mm512_permutex2var_epi8(t.q[2], x, t.q[3]);
  return _mm512_mask_blend_epi8(_mm512_movepi8_mask(x), lo, hi);
}

// One table for every byte; the tail with masked loads and stores.
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) void LookupSharedVbmi(const uint8_t* table, const uint8_t* src,
                                                                             uint8_t* dst, int64_t n) {
  const Lut512 t = LoadLut512(table);
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) _mm512_storeu_si512(dst + i, Lookup64(t, _mm512_loadu_si512(src + i)));
  if (i < n) {
    const __mmask64 tail = (1ULL << (n - i)) - 1;  // n - i < 64
    _mm512_mask_storeu_epi8(dst + i, tail, Lookup64(t, _mm512_maskz_loadu_epi8(tail, src + i)));
  }
}

// One table per channel, C = 2, 3 or 4: every byte is looked up in each table and the channel masks pick the results.
// Byte j of the 64 at offset i belongs to channel (i + j) mod C, so the masks depend on the phase i mod C.
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) inline __m512i LookupChannels64(const Lut512* t, int64_t c,
                                                                                       const __mmask64* masks,
                                                                                       __m512i x) {
  __m512i y = Lookup64(t[0], x);
  for (int64_t ch = 1; ch < c; ++ch) y = _mm512_mask_blend_epi8(masks[ch], y, Lookup64(t[ch], x));
  return y;
}

__attribute__((target("avx512f,avx512bw,avx512vbmi"))) void LookupPerChannelVbmi(const uint8_t* tables, int64_t c,
                                                                                 const uint8_t* src, uint8_t* dst,
                                                                                 int64_t n) {
  Lut512 t[4];
  for (int64_t ch = 0; ch < c; ++ch) t[ch] = LoadLut512(tables + 256 * ch);
  __mmask64 masks[4][4] = {};  // [phase][channel]
  for (int64_t phase = 0; phase < c; ++phase)
    for (int j = 0; j < 64; ++j) masks[phase][(phase + j) % c] |= 1ULL << j;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64)
    _mm512_storeu_si512(dst + i, LookupChannels64(t, c, masks[i % c], _mm512_loadu_si512(src + i)));
  if (i < n) {
    const __mmask64 tail = (1ULL << (n - i)) - 1;  // n - i < 64
    _mm512_mask_storeu_epi8(dst + i, tail,
                            LookupChannels64(t, c, masks[i % c], _mm512_maskz_loadu_epi8(tail, src + i)));
  }
}
#endif

class AdjustContrastKernel final : public Kernel {
 public:
  explicit AdjustContrastKernel(const KernelBuildContext& ctx)
      : shape_(ctx.input_shapes[0]), factor_(ctx.node.GetFloat("factor", 1.f)) {}
  const char* Name() const override { return "AdjustContrastU8"; }

  void Run(KernelContext& ctx) override {
    CheckShape(ctx, shape_, Name());
    const int64_t images = ImagesOf(shape_), pixels = PixelsOf(shape_) / images, c = shape_.back();
    for (int64_t b = 0; b < images; ++b) {
      const uint8_t* src = ctx.In(0).data<uint8_t>() + b * pixels * c;
      uint8_t* dst = ctx.Out(0).data<uint8_t>() + b * pixels * c;
      int64_t sum = 0, summed = 0;
#ifdef OSPREY_AUGMENT_AVX2
      if (c == 3 && simd_ >= kSimdAvx512)
        sum = GraySumRgbAvx512(src, pixels, summed);
      else if (c == 3 && simd_ >= kSimdAvx2)
        sum = GraySumRgbAvx2(src, pixels, summed);
#endif
      sum += GraySumScalar(src + summed * c, pixels - summed, c);
      const double mean = static_cast<double>(sum) / static_cast<double>(pixels);
      if (factor_ == 0.0) {
        std::memset(dst, static_cast<int>(mean + 0.5), pixels * c);
        continue;
      }
      const float factor = static_cast<float>(factor_), offset = static_cast<float>(mean * (1.0 - factor_));
      int64_t done = 0;
#ifdef OSPREY_AUGMENT_AVX2
      if (simd_ >= kSimdAvx512) {  // the table itself, 64 bytes per pair of byte permutes
        uint8_t table[256];
        for (int v = 0; v < 256; ++v) table[v] = ContrastValue(v, factor, offset);
        LookupSharedVbmi(table, src, dst, pixels * c);
        continue;
      }
      if (simd_ >= kSimdAvx2) {
        // The table is almost always an affine map (FitAffineLut), computed in integers: cheaper than the float form.
        uint8_t table[256];
        for (int v = 0; v < 256; ++v) table[v] = ContrastValue(v, factor, offset);
        AffineLut affine;
        done = FitAffineLut(table, affine) ? LookupAffineAvx2(affine, src, dst, pixels * c)
                                           : ApplyContrastAvx2(factor, offset, src, dst, pixels * c);
      }
#endif
      uint8_t lut[256];
      for (int v = 0; v < 256; ++v) lut[v] = ContrastValue(v, factor, offset);
      for (int64_t i = done; i < pixels * c; ++i) dst[i] = lut[src[i]];
    }
  }

 private:
  Shape shape_;
  int simd_ = AugmentSimdLevel();
  double factor_ = 1.0;
};

// uint8 y = table[x] (one table, or one per channel when the table holds 256 * C values and C > 1, as the reference).
// AVX512-VBMI byte permutes when the CPU has them; else, for one table that is an affine map (FitAffineLut), the map
// computed with AVX2; else scalar loops.
class LookupTableU8Kernel final : public Kernel {
 public:
  explicit LookupTableU8Kernel(const KernelBuildContext& ctx) : shape_(ctx.input_shapes[0]) {
    const std::vector<int64_t> table = ctx.node.GetInts("table");
    c_ = shape_.back();
    per_channel_ = static_cast<int64_t>(table.size()) == 256 * c_ && c_ > 1;
    lut_.assign(table.begin(), table.end());
    affine_ = !per_channel_ && simd_ == kSimdAvx2 && FitAffineLut(lut_.data(), affine_lut_);
  }
  const char* Name() const override {
    return per_channel_ ? "LookupTableU8PerChannel" : affine_ ? "LookupTableU8Affine" : "LookupTableU8";
  }

  void Run(KernelContext& ctx) override {
    CheckShape(ctx, shape_, Name());
    const uint8_t* src = ctx.In(0).data<uint8_t>();
    uint8_t* dst = ctx.Out(0).data<uint8_t>();
    int64_t n = ctx.In(0).numel();
    const uint8_t* lut = lut_.data();
#ifdef OSPREY_AUGMENT_AVX2
    if (simd_ >= kSimdAvx512 && (!per_channel_ || c_ <= 4)) {
      if (per_channel_)
        LookupPerChannelVbmi(lut, c_, src, dst, n);
      else
        LookupSharedVbmi(lut, src, dst, n);
      return;
    }
    if (affine_) {
      const int64_t done = LookupAffineAvx2(affine_lut_, src, dst, n);
      src += done, dst += done, n -= done;  // the tail: the table
    }
#endif
    if (!per_channel_) {
      int64_t i = 0;
      for (; i + 4 <= n; i += 4) {
        const uint8_t a = lut[src[i]], b = lut[src[i + 1]], c = lut[src[i + 2]], d = lut[src[i + 3]];
        dst[i] = a, dst[i + 1] = b, dst[i + 2] = c, dst[i + 3] = d;
      }
      for (; i < n; ++i) dst[i] = lut[src[i]];
      return;
    }
    if (c_ == 3) {
      const uint8_t *l0 = lut, *l1 = lut + 256, *l2 = lut + 512;
      int64_t p = 0;
      for (; p + 6 <= n; p += 6) {
        dst[p] = l0[src[p]], dst[p + 1] = l1[src[p + 1]], dst[p + 2] = l2[src[p + 2]];
        dst[p + 3] = l0[src[p + 3]], dst[p + 4] = l1[src[p + 4]], dst[p + 5] = l2[src[p + 5]];
      }
      for (; p < n; p += 3) dst[p] = l0[src[p]], dst[p + 1] = l1[src[p + 1]], dst[p + 2] = l2[src[p + 2]];
      return;
    }
    for (int64_t p = 0; p < n; p += c_)
      for (int64_t ch = 0; ch < c_; ++ch) dst[p + ch] = lut[ch * 256 + src[p + ch]];
  }

 private:
  Shape shape_;
  int simd_ = AugmentSimdLevel();
  int64_t c_ = 1;
  bool per_channel_ = false;
  bool affine_ = false;
  AffineLut affine_lut_;
  std::vector<uint8_t> lut_;
};

}  // namespace

/// Fast kernels for the uint8 colour ops ShiftHSV, AdjustSaturation, AdjustContrast and LookupTable, or nullptr.
std::unique_ptr<Kernel> CreateAugmentColorKernel(const KernelBuildContext& ctx) {
  const std::string& op = ctx.node.op_type;
  if (op != "ShiftHSV" && op != "AdjustSaturation" && op != "AdjustContrast" && op != "LookupTable") return nullptr;
  // Other dtypes: the reference kernel reports the error.
  if (ctx.input_dtypes.empty() || ctx.input_dtypes[0] != DType::kU8 || ctx.input_shapes.empty()) return nullptr;
  const Shape& s = ctx.input_shapes[0];
  if (s.size() != 3 && s.size() != 4) return nullptr;
  for (Layout l : ctx.input_layouts)
    if (l != Layout::kPlain) return nullptr;
  for (Layout l : ctx.output_layouts)
    if (l != Layout::kPlain) return nullptr;
  if (op == "LookupTable") return std::make_unique<LookupTableU8Kernel>(ctx);
  if (s.back() != 3 && !(s.back() == 1 && op != "ShiftHSV")) return nullptr;
  if (op == "ShiftHSV") return std::make_unique<ShiftHsvKernel>(ctx);
  if (op == "AdjustSaturation") return std::make_unique<AdjustSaturationKernel>(ctx);
  return std::make_unique<AdjustContrastKernel>(ctx);
}

}  // namespace osprey

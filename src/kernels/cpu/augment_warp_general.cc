// Fast kernel of WarpPerspective for matrices that are not axis-aligned (rotation, shear, perspective; axis-aligned
// uint8 warps are in augment_warp_axis.cc). The reference kernel (src/kernels/reference/augment.cc) is the oracle and
// states the arithmetic; source positions and uint8 weights here are bit-identical to it:
//
// - Positions: per output row, the source position of every pixel (bilinear: in 1/32 pixels, nearest: in pixels), with
//   the reference's IEEE double operations in the same order (no FMA), clamped to int and rounded ties-to-even.
// - uint8 bilinear weights are products of the 5-bit fractions, so (32 - ax)(32 - ay) a + ... is an exact integer
//   in 1/1024 that the reference rounds half up: (v + 512) >> 10.
//
// uint8 RGB bilinear: 16 pixels per step with AVX-512 (BW, VBMI), 8 with AVX2, else 4 with SSE4.1 (chosen when the
// kernel is built, AugmentSimdLevel(); the build targets x86-64-v2); pixels whose taps reach outside the image take the
// scalar path (borders), except those entirely outside with a constant border. Affine warps prefetch the source rows
// a few output rows ahead: a rotated row reads a diagonal band of source rows that the hardware prefetcher misses.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#ifdef __SSE2__
#include <emmintrin.h>
#endif
#ifdef __SSE4_1__
#include <smmintrin.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define OSPREY_WARP_AVX2 1
#endif

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/image_common.h"
#include "kernels/cpu/thread_scratch.h"
#include "ops/op_registry.h"

namespace osprey {

namespace {

using namespace image_kernels;

// Round to nearest, ties to even (cvRound / std::nearbyint in the default rounding mode), after clamping to int.
inline int RoundToInt(double v) {
  v = std::min(std::max(v, static_cast<double>(INT_MIN)), static_cast<double>(INT_MAX));
#ifdef __SSE2__
  return _mm_cvtsd_si32(_mm_set_sd(v));
#else
  return static_cast<int>(std::nearbyint(v));
#endif
}

// ---------------------------------------------------------------- WarpPerspective

// 8 bytes at base + byte offset (unaligned).
inline long long Load64(const long long* base, int32_t offset) {
  long long v;
  std::memcpy(&v, reinterpret_cast<const char*>(base) + offset, sizeof v);
  return v;
}

#ifdef OSPREY_WARP_AVX2
// The 8-byte rows at four of the offsets, as one vector.
__attribute__((target("avx2"))) inline __m256i Rows4(const long long* base, const int32_t* offs, int a, int b, int c,
                                                     int e) {
  return _mm256_setr_epi64x(Load64(base, offs[a]), Load64(base, offs[b]), Load64(base, offs[c]), Load64(base, offs[e]));
}
// rows: per 32-bit lane a (top, bottom) pair of 16-bit horizontal blends; weights: per pixel the 16-bit pair
// (32 - ay, ay), spread to the lanes by `index`. Returns (top (32 - ay) + bottom ay + 512) >> 10 per lane.
__attribute__((target("avx2"))) inline __m256i BlendRowsAvx2(__m256i rows, __m256i weights, __m256i index) {
  const __m256i v = _mm256_madd_epi16(rows, _mm256_permutevar8x32_epi32(weights, index));
  return _mm256_srli_epi32(_mm256_add_epi32(v, _mm256_set1_epi32(512)), 10);
}
#endif

#ifdef __SSE4_1__
// Bilinear weights of the uint8 SIMD path, per 1/32-pixel fraction: wx for pmaddubsw on (left, right) byte pairs,
// wy for pmaddwd on (top, bottom) 16-bit pairs.
struct WarpU8Tables {
  __m128i wx[32], wy[32];
  static const WarpU8Tables& Get() {
    static const WarpU8Tables tables;
    return tables;
  }

 private:
  WarpU8Tables() {
    for (int a = 0; a < 32; ++a) {
      wx[a] = _mm_setr_epi8(32 - a, a, 32 - a, a, 32 - a, a, 32 - a, a, 32 - a, a, 32 - a, a, 0, 0, 0, 0);
      wy[a] = _mm_setr_epi16(32 - a, a, 32 - a, a, 32 - a, a, 0, 0);
    }
  }
};
#endif

// Per output row: source positions (bilinear: in 1/32 pixels, nearest: in pixels) of every output pixel, computed
// first so the sampling loop is a plain gather. Affine matrices (last row 0, 0, 1) need no division: the position is
// row_base + x * step with both scaled by 32 up front, which is exactly the reference's (m0 x + (m1 y + m2)) * 32.
template <class T>
class WarpPerspectiveKernel final : public Kernel {
 public:
  explicit WarpPerspectiveKernel(const KernelBuildContext& ctx)
      : in_shape_(ctx.input_shapes[0]), out_shape_(ctx.output_shapes[0]) {
    in_ = DimsOf(in_shape_);
    out_ = DimsOf(out_shape_);
    const std::vector<float> m = ctx.node.GetFloats("matrix");
    for (int i = 0; i < 9; ++i) m_[i] = m[i];
    nearest_ = ctx.node.GetString("mode", "bilinear") == "nearest";
    border_ = BorderOf(ctx.node.GetString("border_mode", "constant"));
    border_value_ = StoreAs<T>(ctx.node.GetFloat("border_value", 0.f));
    affine_ = m_[6] == 0.0 && m_[7] == 0.0 && m_[8] == 1.0;
    simd_ = AugmentSimdLevel();
    if (affine_ && std::abs(m_[1]) < 1e6 && std::abs(m_[4]) < 1e6) {
      const int64_t stride = in_.w * in_.c;
      const double rows = kPrefetchRows;
      prefetch_delta_ = static_cast<int64_t>(std::floor(rows * m_[4]) + 1) * stride +
                        static_cast<int64_t>(std::floor(rows * m_[1])) * in_.c;
      prefetch_rows_ = true;
    }
    name_ = std::string("WarpPerspective") + (std::is_same_v<T, uint8_t> ? "U8" : "F32") +
            (nearest_ ? "Nearest" : "Bilinear") + (affine_ ? "Affine" : "");
  }
  const char* Name() const override { return name_.c_str(); }

  void Run(KernelContext& ctx) override {
    CheckShapes(ctx, in_shape_, out_shape_, Name());
    int32_t* qx = reinterpret_cast<int32_t*>(cpu::ThreadScratch::Reserve(2 * out_.w * sizeof(int32_t)));
    int32_t* qy = qx + out_.w;
    for (int64_t b = 0; b < out_.n; ++b) {
      const T* image = ctx.In(0).data<T>() + b * in_.h * in_.w * in_.c;
      for (int64_t y = 0; y < out_.h; ++y) {
        RowPositions(y, qx, qy);
        T* d = ctx.Out(0).data<T>() + (b * out_.h + y) * out_.w * out_.c;
        switch (in_.c) {
          case 1:
            SampleRow<1>(image, qx, qy, d);
            break;
          case 3:
            if constexpr (std::is_same_v<T, uint8_t>) {
              if (!nearest_) {
                SampleRowU8C3(image, qx, qy, d);
                break;
              }
            }
            SampleRow<3>(image, qx, qy, d);
            break;
          case 4:
            SampleRow<4>(image, qx, qy, d);
            break;
          default:
            SampleRow<0>(image, qx, qy, d);
            break;
        }
      }
    }
  }

 private:
  // Two positions per step in SSE2 doubles (four in AVX2 doubles when the CPU has it): the same IEEE operations in the
  // same order as the scalar form (no FMA: neither this build nor the avx2 target enables it), clamped like
  // RoundToInt and converted with the current (ties-to-even) rounding mode.
  void RowPositions(int64_t y, int32_t* qx, int32_t* qy) const {
    const double unit = nearest_ ? 1.0 : 32.0;
    const double bx = m_[1] * y + m_[2], by = m_[4] * y + m_[5];
    const int64_t w = out_.w;
    int64_t x = 0;
#ifdef OSPREY_WARP_AVX2
    if (simd_ >= kSimdAvx2) x = RowPositionsAvx2(y, qx, qy);
#endif
#ifdef __SSE2__
    const __m128d lo = _mm_set1_pd(static_cast<double>(INT_MIN)), hi = _mm_set1_pd(static_cast<double>(INT_MAX));
    auto round2 = [&](__m128d v) { return _mm_cvtpd_epi32(_mm_min_pd(_mm_max_pd(v, lo), hi)); };
    __m128d xd = _mm_set_pd(static_cast<double>(x + 1), static_cast<double>(x));
    const __m128d two = _mm_set1_pd(2.0);
    if (affine_) {
      const __m128d sx = _mm_set1_pd(m_[0] * unit), sy = _mm_set1_pd(m_[3] * unit);
      const __m128d bxs = _mm_set1_pd(bx * unit), bys = _mm_set1_pd(by * unit);
      for (; x + 2 <= w; x += 2, xd = _mm_add_pd(xd, two)) {
        _mm_storel_epi64(reinterpret_cast<__m128i*>(qx + x), round2(_mm_add_pd(_mm_mul_pd(sx, xd), bxs)));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(qy + x), round2(_mm_add_pd(_mm_mul_pd(sy, xd), bys)));
      }
    } else {
      const __m128d m0 = _mm_set1_pd(m_[0]), m3 = _mm_set1_pd(m_[3]), m6 = _mm_set1_pd(m_[6]);
      const __m128d bxv = _mm_set1_pd(bx), byv = _mm_set1_pd(by), bwv = _mm_set1_pd(m_[7] * y + m_[8]);
      const __m128d unitv = _mm_set1_pd(unit), zero = _mm_setzero_pd();
      for (; x + 2 <= w; x += 2, xd = _mm_add_pd(xd, two)) {
        const __m128d wv = _mm_add_pd(_mm_mul_pd(m6, xd), bwv);
        const __m128d scale = _mm_and_pd(_mm_cmpneq_pd(wv, zero), _mm_div_pd(unitv, wv));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(qx + x),
                         round2(_mm_mul_pd(_mm_add_pd(_mm_mul_pd(m0, xd), bxv), scale)));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(qy + x),
                         round2(_mm_mul_pd(_mm_add_pd(_mm_mul_pd(m3, xd), byv), scale)));
      }
    }
#endif
    if (affine_) {
      const double sx = m_[0] * unit, sy = m_[3] * unit, bxs = bx * unit, bys = by * unit;
      for (; x < w; ++x) {
        qx[x] = RoundToInt(sx * x + bxs);
        qy[x] = RoundToInt(sy * x + bys);
      }
      return;
    }
    const double bw = m_[7] * y + m_[8];
    for (; x < w; ++x) {
      const double wx = m_[6] * x + bw;
      const double scale = wx != 0.0 ? unit / wx : 0.0;
      qx[x] = RoundToInt((m_[0] * x + bx) * scale);
      qy[x] = RoundToInt((m_[3] * x + by) * scale);
    }
  }

#ifdef OSPREY_WARP_AVX2
  // RowPositionsAvx2's affine loop for positions known to be inside the int range, eight per step (AVX-512 doubles,
  // the same IEEE multiply then add); returns how many it wrote (a multiple of 8). (GCC 12's -Wmaybe-uninitialized
  // false positive on AVX-512 intrinsics, as below.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
  __attribute__((target("avx512f"))) static int64_t RowPositionsAffineAvx512(double sx, double sy, double bxs,
                                                                            double bys, int64_t w, int32_t* qx,
                                                                            int32_t* qy) {
    const __m512d vsx = _mm512_set1_pd(sx), vsy = _mm512_set1_pd(sy), vbx = _mm512_set1_pd(bxs),
                  vby = _mm512_set1_pd(bys), eight = _mm512_set1_pd(8.0);
    __m512d xd = _mm512_setr_pd(0, 1, 2, 3, 4, 5, 6, 7);
    int64_t x = 0;
    // The _round_ forms are never contracted into a fused multiply-add (which the avx512f target would allow).
    constexpr int kCur = _MM_FROUND_CUR_DIRECTION;
    auto position = [&](__m512d s, __m512d b, __m512d v) __attribute__((target("avx512f"), always_inline)) {
      return _mm512_cvtpd_epi32(_mm512_add_round_pd(_mm512_mul_round_pd(s, v, kCur), b, kCur));
    };
    for (; x + 8 <= w; x += 8, xd = _mm512_add_pd(xd, eight)) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qx + x), position(vsx, vbx, xd));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qy + x), position(vsy, vby, xd));
    }
    return x;
  }
#pragma GCC diagnostic pop

  // RowPositions' SIMD loop, four positions per step; returns how many positions it wrote (a multiple of 4).
  __attribute__((target("avx2"))) int64_t RowPositionsAvx2(int64_t y, int32_t* qx, int32_t* qy) const {
    const double unit = nearest_ ? 1.0 : 32.0;
    const double bx = m_[1] * y + m_[2], by = m_[4] * y + m_[5];
    const int64_t w = out_.w;
    const __m256d lo = _mm256_set1_pd(static_cast<double>(INT_MIN)), hi = _mm256_set1_pd(static_cast<double>(INT_MAX));
    const __m256d four = _mm256_set1_pd(4.0);
    __m256d xd = _mm256_setr_pd(0.0, 1.0, 2.0, 3.0);
    int64_t x = 0;
    auto store = [](int32_t* p, __m128i v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v); };
    if (affine_) {
      const double sx = m_[0] * unit, sy = m_[3] * unit, bxs = bx * unit, bys = by * unit;
      const __m256d vsx = _mm256_set1_pd(sx), vsy = _mm256_set1_pd(sy);
      const __m256d vbx = _mm256_set1_pd(bxs), vby = _mm256_set1_pd(bys);
      // s * x + b is monotonic in x (each rounded IEEE operation is), so when the row's first and last positions are
      // inside the int range, every position is and clamping changes nothing.
      const double last = static_cast<double>(w - 1);
      const double ends[4] = {sx * 0.0 + bxs, sx * last + bxs, sy * 0.0 + bys, sy * last + bys};
      bool in_range = true;
      for (double v : ends)
        in_range = in_range && v >= static_cast<double>(INT_MIN) && v <= static_cast<double>(INT_MAX);
      if (in_range) {
        if (simd_ >= kSimdAvx512) {
          x = RowPositionsAffineAvx512(sx, sy, bxs, bys, w, qx, qy);
          xd = _mm256_add_pd(_mm256_set1_pd(static_cast<double>(x)), xd);
        }
        for (; x + 4 <= w; x += 4, xd = _mm256_add_pd(xd, four)) {
          store(qx + x, _mm256_cvtpd_epi32(_mm256_add_pd(_mm256_mul_pd(vsx, xd), vbx)));
          store(qy + x, _mm256_cvtpd_epi32(_mm256_add_pd(_mm256_mul_pd(vsy, xd), vby)));
        }
        return x;
      }
      for (; x + 4 <= w; x += 4, xd = _mm256_add_pd(xd, four)) {
        const __m256d vx = _mm256_add_pd(_mm256_mul_pd(vsx, xd), vbx);
        const __m256d vy = _mm256_add_pd(_mm256_mul_pd(vsy, xd), vby);
        store(qx + x, _mm256_cvtpd_epi32(_mm256_min_pd(_mm256_max_pd(vx, lo), hi)));
        store(qy + x, _mm256_cvtpd_epi32(_mm256_min_pd(_mm256_max_pd(vy, lo), hi)));
      }
      return x;
    }
    const __m256d m0 = _mm256_set1_pd(m_[0]), m3 = _mm256_set1_pd(m_[3]), m6 = _mm256_set1_pd(m_[6]);
    const __m256d bxv = _mm256_set1_pd(bx), byv = _mm256_set1_pd(by), bwv = _mm256_set1_pd(m_[7] * y + m_[8]);
    const __m256d unitv = _mm256_set1_pd(unit), zero = _mm256_setzero_pd();
    for (; x + 4 <= w; x += 4, xd = _mm256_add_pd(xd, four)) {
      const __m256d wv = _mm256_add_pd(_mm256_mul_pd(m6, xd), bwv);
      const __m256d scale = _mm256_and_pd(_mm256_cmp_pd(wv, zero, _CMP_NEQ_UQ), _mm256_div_pd(unitv, wv));
      const __m256d vx = _mm256_mul_pd(_mm256_add_pd(_mm256_mul_pd(m0, xd), bxv), scale);
      const __m256d vy = _mm256_mul_pd(_mm256_add_pd(_mm256_mul_pd(m3, xd), byv), scale);
      store(qx + x, _mm256_cvtpd_epi32(_mm256_min_pd(_mm256_max_pd(vx, lo), hi)));
      store(qy + x, _mm256_cvtpd_epi32(_mm256_min_pd(_mm256_max_pd(vy, lo), hi)));
    }
    return x;
  }

  // uint8 bilinear, 3 channels, 8 output pixels per step: the 8-byte rows (two RGB taps and 2 spare bytes) at the
  // top-left and bottom-left taps are gathered, pmaddubsw blends each row's two columns with (32 - ax, ax), pmaddwd
  // the two rows with (32 - ay, ay): the scalar form's exact integer sums. Lanes whose taps are all outside the image
  // with a constant border take the border value; lanes with some taps outside (or 8-byte loads that would leave the
  // image) read offset 0 and are then redone by the scalar path.
  __attribute__((target("avx2"))) void SampleRowU8C3Avx2(const uint8_t* image, const int32_t* qx, const int32_t* qy,
                                                         uint8_t* d) const {
    int64_t x = 0;
    const int64_t stride = in_.w * 3;
    // Last byte offset of a top-left tap whose two 8-byte row loads stay inside the image.
    const int64_t limit = (in_.h - 1) * stride - 8;
    if (in_.w >= 2 && in_.h >= 2 && limit >= 0 && (in_.h - 1) * stride <= INT32_MAX) {
      const __m256i max_x0 = _mm256_set1_epi32(static_cast<int32_t>(in_.w - 2));
      const __m256i max_y0 = _mm256_set1_epi32(static_cast<int32_t>(in_.h - 2));
      const __m256i last_x = _mm256_set1_epi32(static_cast<int32_t>(in_.w - 1));
      const __m256i last_y = _mm256_set1_epi32(static_cast<int32_t>(in_.h - 1));
      const __m256i minus1 = _mm256_set1_epi32(-1);
      const __m256i limit_v = _mm256_set1_epi32(static_cast<int32_t>(limit) + 1);
      const __m256i stride_v = _mm256_set1_epi32(static_cast<int32_t>(stride));
      const __m256i mask31 = _mm256_set1_epi32(31), c32 = _mm256_set1_epi32(32);
      const __m256i border_px = _mm256_set1_epi32(border_value_ * 0x010101);
      const bool constant = border_ == Border::kConstant;
      // Per 64-bit tap row (R G B R G B x x): the (left, right) byte pairs of R, G, B, then a zero pair.
      const __m256i pair_cols = _mm256_setr_epi8(0, 3, 1, 4, 2, 5, -1, -1, 8, 11, 9, 12, 10, 13, -1, -1, 0, 3, 1, 4, 2,
                                                 5, -1, -1, 8, 11, 9, 12, 10, 13, -1, -1);
      // Rows A hold pixels 0, 1 | 4, 5 (128-bit lanes), rows B 2, 3 | 6, 7, so that the final packs give 0..7.
      const __m256i wx_a = _mm256_setr_epi32(0, 0, 1, 1, 4, 4, 5, 5), wx_b = _mm256_setr_epi32(2, 2, 3, 3, 6, 6, 7, 7);
      const __m256i wy_a0 = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4),
                    wy_a1 = _mm256_setr_epi32(1, 1, 1, 1, 5, 5, 5, 5);
      const __m256i wy_b0 = _mm256_setr_epi32(2, 2, 2, 2, 6, 6, 6, 6),
                    wy_b1 = _mm256_setr_epi32(3, 3, 3, 3, 7, 7, 7, 7);
      const __m256i pack12 = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1, 0, 1, 2, 4, 5, 6,
                                              8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
      const __m256i pack24 = _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 3, 7);
      const long long* top = reinterpret_cast<const long long*>(image);
      const long long* bottom = reinterpret_cast<const long long*>(image + stride);
      for (; x + 8 <= out_.w; x += 8) {
        const __m256i vx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx + x));
        const __m256i vy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qy + x));
        const __m256i x0 = _mm256_srai_epi32(vx, 5), y0 = _mm256_srai_epi32(vy, 5);
        const __m256i o =
            _mm256_add_epi32(_mm256_mullo_epi32(y0, stride_v), _mm256_add_epi32(x0, _mm256_add_epi32(x0, x0)));
        const __m256i inside = _mm256_and_si256(_mm256_and_si256(_mm256_cmpeq_epi32(_mm256_min_epu32(x0, max_x0), x0),
                                                                 _mm256_cmpeq_epi32(_mm256_min_epu32(y0, max_y0), y0)),
                                                _mm256_cmpgt_epi32(limit_v, o));
        __m256i outside = _mm256_setzero_si256();
        if (constant)
          outside = _mm256_or_si256(_mm256_or_si256(_mm256_cmpgt_epi32(x0, last_x), _mm256_cmpgt_epi32(minus1, x0)),
                                    _mm256_or_si256(_mm256_cmpgt_epi32(y0, last_y), _mm256_cmpgt_epi32(minus1, y0)));
        const int inside_bits = _mm256_movemask_ps(_mm256_castsi256_ps(inside));
        const int outside_bits = _mm256_movemask_ps(_mm256_castsi256_ps(outside));
        uint8_t* out = d + x * 3;
        if (prefetch_rows_) {
          const uintptr_t base = reinterpret_cast<uintptr_t>(image) + prefetch_delta_;
          if (inside_bits & 1) _mm_prefetch(reinterpret_cast<const char*>(base + _mm256_cvtsi256_si32(o)), _MM_HINT_T0);
          if (inside_bits & 0x80)
            _mm_prefetch(reinterpret_cast<const char*>(base + _mm256_extract_epi32(o, 7)), _MM_HINT_T0);
        }
        if (outside_bits == 0xFF) {
          std::memset(out, border_value_, 24);
          continue;
        }
        int redo = ~(inside_bits | outside_bits) & 0xFF;
        if (redo == 0xFF) {
          for (int k = 0; k < 8; ++k) SamplePixel<3>(image, qx[x + k], qy[x + k], out + k * 3);
          continue;
        }
        // The taps' 8-byte rows by scalar loads: cheaper than vpgatherdq where gathers are microcoded (AMD Zen).
        alignas(32) int32_t offs[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(offs), _mm256_and_si256(o, inside));
        const __m256i ax = _mm256_and_si256(vx, mask31), ay = _mm256_and_si256(vy, mask31);
        // Bytes (32 - ax, ax) are the 16-bit value 32 + 255 ax, repeated in both halves of a lane; 16-bit halves
        // (32 - ay, ay) are the 32-bit value 32 + 65535 ay.
        const __m256i wx16 = _mm256_add_epi32(c32, _mm256_sub_epi32(_mm256_slli_epi32(ax, 8), ax));
        const __m256i wx = _mm256_or_si256(wx16, _mm256_slli_epi32(wx16, 16));
        const __m256i wy = _mm256_add_epi32(c32, _mm256_sub_epi32(_mm256_slli_epi32(ay, 16), ay));
        const __m256i wxa = _mm256_permutevar8x32_epi32(wx, wx_a), wxb = _mm256_permutevar8x32_epi32(wx, wx_b);
        const __m256i ha_top = _mm256_maddubs_epi16(_mm256_shuffle_epi8(Rows4(top, offs, 0, 1, 4, 5), pair_cols), wxa);
        const __m256i ha_bot = _mm256_maddubs_epi16(_mm256_shuffle_epi8(Rows4(bottom, offs, 0, 1, 4, 5), pair_cols), wxa);
        const __m256i hb_top = _mm256_maddubs_epi16(_mm256_shuffle_epi8(Rows4(top, offs, 2, 3, 6, 7), pair_cols), wxb);
        const __m256i hb_bot = _mm256_maddubs_epi16(_mm256_shuffle_epi8(Rows4(bottom, offs, 2, 3, 6, 7), pair_cols), wxb);
        const __m256i pa = _mm256_packs_epi32(BlendRowsAvx2(_mm256_unpacklo_epi16(ha_top, ha_bot), wy, wy_a0),
                                              BlendRowsAvx2(_mm256_unpackhi_epi16(ha_top, ha_bot), wy, wy_a1));
        const __m256i pb = _mm256_packs_epi32(BlendRowsAvx2(_mm256_unpacklo_epi16(hb_top, hb_bot), wy, wy_b0),
                                              BlendRowsAvx2(_mm256_unpackhi_epi16(hb_top, hb_bot), wy, wy_b1));
        __m256i px = _mm256_packus_epi16(pa, pb);  // pixel k in 32-bit lane k: R G B 0
        if (outside_bits) px = _mm256_blendv_epi8(px, border_px, outside);
        const __m256i packed = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(px, pack12), pack24);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(packed));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(out + 16), _mm256_extracti128_si256(packed, 1));
        for (; redo; redo &= redo - 1) {
          const int k = __builtin_ctz(static_cast<unsigned>(redo));
          SamplePixel<3>(image, qx[x + k], qy[x + k], out + k * 3);
        }
      }
    }
    for (; x < out_.w; ++x) SamplePixel<3>(image, qx[x], qy[x], d + x * 3);
  }

  // GCC 12's AVX-512 intrinsics pass an "undefined" vector that -Wmaybe-uninitialized reports once inlined (a known
  // false positive).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
  // Eight 8-byte loads at base + o[0..7] as one vector: scalar loads beat a gather on cores with slow gathers.
  __attribute__((target("avx512f,avx512bw,avx512vbmi"), always_inline)) static inline __m512i Load8Qwords(
      const uint8_t* base, const int32_t* o) {
    auto pair = [&](int k) __attribute__((always_inline)) {
      return _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(base + o[k])),
                                _mm_loadl_epi64(reinterpret_cast<const __m128i*>(base + o[k + 1])));
    };
    __m512i r = _mm512_castsi128_si512(pair(0));
    r = _mm512_inserti32x4(r, pair(2), 1);
    r = _mm512_inserti32x4(r, pair(4), 2);
    return _mm512_inserti32x4(r, pair(6), 3);
  }

  // The taps of 16 output pixels of an affine warp (all inside the image) without one load per pixel: their source
  // positions lie on a line, so their columns span few bytes and their rows few rows. Each row of the span is read as
  // 128 bytes from the leftmost column and byte-permuted into every pixel's (x0, x0 + 1) pairs; a pixel takes the
  // permuted row that is its top (y0) or bottom (y0 + 1) row: the bytes Load8Qwords + pair_cols give (bytes 6 and 7
  // of each pixel differ; they reach only the lanes the final pack drops). The caller checks that every pixel's taps
  // are inside the image. False (nothing written) when the 16 pixels span more than 40 columns or 4 rows (more rows
  // cost more than per-pixel loads), or the reads would leave the image.
  __attribute__((target("avx512f,avx512bw,avx512vbmi"), always_inline)) inline bool BlockTaps(
      const uint8_t* image, const int32_t* qx, const int32_t* qy, __m512i vx, __m512i vy, int64_t stride,
      __m512i gather_order, __m512i* ta_top, __m512i* ta_bot, __m512i* tb_top, __m512i* tb_bot) const {
    if (!affine_) return false;
    // Positions are monotonic along an affine row: the extremes are the first and the last pixel.
    const int32_t xa = qx[0] >> 5, xb = qx[15] >> 5, ya = qy[0] >> 5, yb = qy[15] >> 5;
    const int32_t x_lo = std::min(xa, xb), y_lo = std::min(ya, yb), y_hi = std::max(ya, yb);
    if (std::max(xa, xb) - x_lo > 40 || y_hi - y_lo > 3 ||
        (int64_t{y_hi} + 1) * stride + int64_t{x_lo} * 3 + 128 > in_.h * stride)
      return false;
    const __m512i rel = _mm512_permutexvar_epi32(
        gather_order, _mm512_mullo_epi32(_mm512_sub_epi32(_mm512_srai_epi32(vx, 5), _mm512_set1_epi32(x_lo)),
                                         _mm512_set1_epi32(3)));
    const __m512i y0 = _mm512_permutexvar_epi32(gather_order, _mm512_srai_epi32(vy, 5));
    // Byte i of pixel j's qword: rel[j] + (0, 3, 1, 4, 2, 5, 6, 7)[i].
    const __m512i spread = _mm512_set1_epi64(0x0706050204010300LL);
    const __m512i low_byte = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 8, 8, 8, 8, 8, 8, 8, 8));
    const __m512i bytes_a = _mm512_shuffle_epi8(_mm512_cvtepu32_epi64(_mm512_castsi512_si256(rel)), low_byte);
    const __m512i bytes_b = _mm512_shuffle_epi8(_mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(rel, 1)), low_byte);
    const __m512i idx_a = _mm512_add_epi8(bytes_a, spread), idx_b = _mm512_add_epi8(bytes_b, spread);
    const uint8_t* row = image + int64_t{y_lo} * stride + int64_t{x_lo} * 3;
    __m512i at = _mm512_setzero_si512(), ab = at, bt = at, bb = at;
    for (int32_t r = y_lo; r <= y_hi + 1; ++r, row += stride) {
      const __m512i lo = _mm512_loadu_si512(row), hi = _mm512_loadu_si512(row + 64);
      const __m512i pa = _mm512_permutex2var_epi8(lo, idx_a, hi), pb = _mm512_permutex2var_epi8(lo, idx_b, hi);
      const __mmask16 top = _mm512_cmpeq_epi32_mask(y0, _mm512_set1_epi32(r));
      const __mmask16 bot = _mm512_cmpeq_epi32_mask(y0, _mm512_set1_epi32(r - 1));
      at = _mm512_mask_mov_epi64(at, static_cast<__mmask8>(top), pa);
      bt = _mm512_mask_mov_epi64(bt, static_cast<__mmask8>(top >> 8), pb);
      ab = _mm512_mask_mov_epi64(ab, static_cast<__mmask8>(bot), pa);
      bb = _mm512_mask_mov_epi64(bb, static_cast<__mmask8>(bot >> 8), pb);
    }
    *ta_top = at, *ta_bot = ab, *tb_top = bt, *tb_bot = bb;
    return true;
  }

  // SampleRowU8C3Avx2 with AVX-512 (BW, VBMI), 16 output pixels per step, the same arithmetic; lane masks in mask
  // registers and one masked 48-byte store.
  __attribute__((target("avx512f,avx512bw,avx512vbmi"))) void SampleRowU8C3Avx512(const uint8_t* image,
                                                                                  const int32_t* qx, const int32_t* qy,
                                                                                  uint8_t* d) const {
    int64_t x = 0;
    const int64_t stride = in_.w * 3;
    const int64_t limit = (in_.h - 1) * stride - 8;
    if (in_.w >= 2 && in_.h >= 2 && limit >= 0 && (in_.h - 1) * stride <= INT32_MAX) {
      const __m512i max_x0 = _mm512_set1_epi32(static_cast<int32_t>(in_.w - 2));
      const __m512i max_y0 = _mm512_set1_epi32(static_cast<int32_t>(in_.h - 2));
      const __m512i last_x = _mm512_set1_epi32(static_cast<int32_t>(in_.w - 1));
      const __m512i last_y = _mm512_set1_epi32(static_cast<int32_t>(in_.h - 1));
      const __m512i minus1 = _mm512_set1_epi32(-1);
      const __m512i limit_v = _mm512_set1_epi32(static_cast<int32_t>(limit) + 1);
      const __m512i stride_v = _mm512_set1_epi32(static_cast<int32_t>(stride));
      const __m512i mask31 = _mm512_set1_epi32(31), c32 = _mm512_set1_epi32(32), round = _mm512_set1_epi32(512);
      const __m512i border_px = _mm512_set1_epi32(border_value_ * 0x010101);
      const bool constant = border_ == Border::kConstant;
      const __m512i pair_cols =
          _mm512_broadcast_i32x4(_mm_setr_epi8(0, 3, 1, 4, 2, 5, -1, -1, 8, 11, 9, 12, 10, 13, -1, -1));
      // Gather A holds pixels 0, 1 | 4, 5 | 8, 9 | 12, 13 (128-bit lanes), gather B 2, 3 | 6, 7 | ..., so that the
      // final packs give 0..15.
      const __m512i gather_order = _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
      const __m512i wx_a = _mm512_setr_epi32(0, 0, 1, 1, 4, 4, 5, 5, 8, 8, 9, 9, 12, 12, 13, 13);
      const __m512i wx_b = _mm512_add_epi32(wx_a, _mm512_set1_epi32(2));
      const __m512i wy_a0 = _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12);
      const __m512i wy_a1 = _mm512_add_epi32(wy_a0, _mm512_set1_epi32(1));
      const __m512i wy_b0 = _mm512_add_epi32(wy_a0, _mm512_set1_epi32(2));
      const __m512i wy_b1 = _mm512_add_epi32(wy_a0, _mm512_set1_epi32(3));
      alignas(64) uint8_t pack_bytes[64] = {};
      for (int k = 0; k < 48; ++k) pack_bytes[k] = static_cast<uint8_t>(k / 3 * 4 + k % 3);
      const __m512i pack48 = _mm512_load_si512(pack_bytes);
      const __mmask64 store48 = (1ULL << 48) - 1;
      for (; x + 16 <= out_.w; x += 16) {
        const __m512i vx = _mm512_loadu_si512(qx + x), vy = _mm512_loadu_si512(qy + x);
        const __m512i x0 = _mm512_srai_epi32(vx, 5), y0 = _mm512_srai_epi32(vy, 5);
        const __m512i o =
            _mm512_add_epi32(_mm512_mullo_epi32(y0, stride_v), _mm512_add_epi32(x0, _mm512_add_epi32(x0, x0)));
        const __mmask16 inside = _mm512_cmple_epu32_mask(x0, max_x0) & _mm512_cmple_epu32_mask(y0, max_y0) &
                                 _mm512_cmpgt_epi32_mask(limit_v, o);
        __mmask16 outside = 0;
        if (constant)
          outside = _mm512_cmpgt_epi32_mask(x0, last_x) | _mm512_cmpgt_epi32_mask(minus1, x0) |
                    _mm512_cmpgt_epi32_mask(y0, last_y) | _mm512_cmpgt_epi32_mask(minus1, y0);
        uint8_t* out = d + x * 3;
        if (prefetch_rows_) {
          const uintptr_t base = reinterpret_cast<uintptr_t>(image) + prefetch_delta_;
          if (inside & 1)
            _mm_prefetch(reinterpret_cast<const char*>(base + _mm_cvtsi128_si32(_mm512_castsi512_si128(o))),
                         _MM_HINT_T0);
          if (inside & 0x8000)
            _mm_prefetch(reinterpret_cast<const char*>(base + _mm_extract_epi32(_mm512_extracti32x4_epi32(o, 3), 3)),
                         _MM_HINT_T0);
        }
        if (outside == 0xFFFF) {
          std::memset(out, border_value_, 48);
          continue;
        }
        unsigned redo = ~static_cast<unsigned>(inside | outside) & 0xFFFF;
        if (redo == 0xFFFF) {
          for (int k = 0; k < 16; ++k) SamplePixel<3>(image, qx[x + k], qy[x + k], out + k * 3);
          continue;
        }
        const __m512i offsets = _mm512_permutexvar_epi32(gather_order, _mm512_maskz_mov_epi32(inside, o));
        const __m512i ax = _mm512_and_si512(vx, mask31), ay = _mm512_and_si512(vy, mask31);
        const __m512i wx16 = _mm512_add_epi32(c32, _mm512_sub_epi32(_mm512_slli_epi32(ax, 8), ax));
        const __m512i wx = _mm512_or_si512(wx16, _mm512_slli_epi32(wx16, 16));
        const __m512i wy = _mm512_add_epi32(c32, _mm512_sub_epi32(_mm512_slli_epi32(ay, 16), ay));
        const __m512i wxa = _mm512_permutexvar_epi32(wx_a, wx), wxb = _mm512_permutexvar_epi32(wx_b, wx);
        // The taps of gather A and B (8 bytes per pixel: its two columns' channels paired as pair_cols pairs them),
        // from the top and the bottom row.
        __m512i ta_top, ta_bot, tb_top, tb_bot;
        if (inside != 0xFFFF ||
            !BlockTaps(image, qx + x, qy + x, vx, vy, stride, gather_order, &ta_top, &ta_bot, &tb_top, &tb_bot)) {
          alignas(64) int32_t off[16];  // gather A's 8 offsets, then B's
          _mm512_store_si512(off, offsets);
          ta_top = _mm512_shuffle_epi8(Load8Qwords(image, off), pair_cols);
          ta_bot = _mm512_shuffle_epi8(Load8Qwords(image + stride, off), pair_cols);
          tb_top = _mm512_shuffle_epi8(Load8Qwords(image, off + 8), pair_cols);
          tb_bot = _mm512_shuffle_epi8(Load8Qwords(image + stride, off + 8), pair_cols);
        }
        const __m512i ha_top = _mm512_maddubs_epi16(ta_top, wxa), ha_bot = _mm512_maddubs_epi16(ta_bot, wxa);
        const __m512i hb_top = _mm512_maddubs_epi16(tb_top, wxb), hb_bot = _mm512_maddubs_epi16(tb_bot, wxb);
        const __m512i va0 = _mm512_srli_epi32(
            _mm512_add_epi32(
                _mm512_madd_epi16(_mm512_unpacklo_epi16(ha_top, ha_bot), _mm512_permutexvar_epi32(wy_a0, wy)), round),
            10);
        const __m512i va1 = _mm512_srli_epi32(
            _mm512_add_epi32(
                _mm512_madd_epi16(_mm512_unpackhi_epi16(ha_top, ha_bot), _mm512_permutexvar_epi32(wy_a1, wy)), round),
            10);
        const __m512i vb0 = _mm512_srli_epi32(
            _mm512_add_epi32(
                _mm512_madd_epi16(_mm512_unpacklo_epi16(hb_top, hb_bot), _mm512_permutexvar_epi32(wy_b0, wy)), round),
            10);
        const __m512i vb1 = _mm512_srli_epi32(
            _mm512_add_epi32(
                _mm512_madd_epi16(_mm512_unpackhi_epi16(hb_top, hb_bot), _mm512_permutexvar_epi32(wy_b1, wy)), round),
            10);
        __m512i px = _mm512_packus_epi16(_mm512_packs_epi32(va0, va1), _mm512_packs_epi32(vb0, vb1));
        px = _mm512_mask_mov_epi32(px, outside, border_px);
        _mm512_mask_storeu_epi8(out, store48, _mm512_permutexvar_epi8(pack48, px));
        for (; redo; redo &= redo - 1) {
          const int k = __builtin_ctz(redo);
          SamplePixel<3>(image, qx[x + k], qy[x + k], out + k * 3);
        }
      }
    }
    for (; x < out_.w; ++x) SamplePixel<3>(image, qx[x], qy[x], d + x * 3);
  }
#pragma GCC diagnostic pop
#endif

  template <int kC>
  void SampleRow(const T* image, const int32_t* qx, const int32_t* qy, T* d) const {
    const int64_t c = kC > 0 ? kC : in_.c;
    for (int64_t x = 0; x < out_.w; ++x, d += c) SamplePixel<kC>(image, qx[x], qy[x], d);
  }

  // uint8 bilinear, 3 channels. Groups of 4 output pixels whose 2x2 taps all lie inside the image (and whose 8-byte
  // loads stay inside it) are blended with SSSE3/SSE4.1 integer arithmetic, the exact sums of the scalar form:
  // pmaddubsw pairs the two columns with weights (32 - ax, ax), pmaddwd the two rows with (32 - ay, ay). Other
  // groups take the scalar path, which also handles the borders.
  void SampleRowU8C3(const uint8_t* image, const int32_t* qx, const int32_t* qy, uint8_t* d) const {
#ifdef OSPREY_WARP_AVX2
    if (simd_ >= kSimdAvx512) return SampleRowU8C3Avx512(image, qx, qy, d);
    if (simd_ >= kSimdAvx2) return SampleRowU8C3Avx2(image, qx, qy, d);
#endif
    int64_t x = 0;
#ifdef __SSE4_1__
    const WarpU8Tables& tab = WarpU8Tables::Get();
    const int64_t stride = in_.w * 3;
    // Last byte offset of a top-left tap whose two 8-byte row loads stay inside the image.
    const int64_t limit = (in_.h - 1) * stride - 8;
    if (in_.w >= 2 && in_.h >= 2 && limit >= 0 && (in_.h - 1) * stride <= INT32_MAX) {
      const __m128i max_x0 = _mm_set1_epi32(static_cast<int32_t>(in_.w - 2));
      const __m128i max_y0 = _mm_set1_epi32(static_cast<int32_t>(in_.h - 2));
      const __m128i limit_v = _mm_set1_epi32(static_cast<int32_t>(limit) + 1);
      const __m128i stride_v = _mm_set1_epi32(static_cast<int32_t>(stride));
      const __m128i pair_cols = _mm_setr_epi8(0, 3, 1, 4, 2, 5, 8, 11, 9, 12, 10, 13, -1, -1, -1, -1);
      const __m128i pair_rows = _mm_setr_epi8(0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11, -1, -1, -1, -1);
      const __m128i pack12 = _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
      const __m128i round = _mm_set1_epi32(512), mask31 = _mm_set1_epi32(31);
      alignas(16) int32_t ofs[4], ax[4], ay[4];
      for (; x + 4 <= out_.w; x += 4) {
        const __m128i vx = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qx + x));
        const __m128i vy = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qy + x));
        const __m128i x0 = _mm_srai_epi32(vx, 5), y0 = _mm_srai_epi32(vy, 5);
        const __m128i o = _mm_add_epi32(_mm_mullo_epi32(y0, stride_v), _mm_add_epi32(x0, _mm_add_epi32(x0, x0)));
        const __m128i inside = _mm_and_si128(_mm_and_si128(_mm_cmpeq_epi32(_mm_min_epu32(x0, max_x0), x0),
                                                           _mm_cmpeq_epi32(_mm_min_epu32(y0, max_y0), y0)),
                                             _mm_cmpgt_epi32(limit_v, o));
        if (_mm_movemask_ps(_mm_castsi128_ps(inside)) != 15) {
          for (int k = 0; k < 4; ++k) SamplePixel<3>(image, qx[x + k], qy[x + k], d + (x + k) * 3);
          continue;
        }
        _mm_store_si128(reinterpret_cast<__m128i*>(ofs), o);
        _mm_store_si128(reinterpret_cast<__m128i*>(ax), _mm_and_si128(vx, mask31));
        _mm_store_si128(reinterpret_cast<__m128i*>(ay), _mm_and_si128(vy, mask31));
        __m128i r[4];
        for (int k = 0; k < 4; ++k) {
          const uint8_t* p = image + ofs[k];
          const __m128i taps = _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)),
                                                  _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + stride)));
          const __m128i rows = _mm_maddubs_epi16(_mm_shuffle_epi8(taps, pair_cols), tab.wx[ax[k]]);
          r[k] = _mm_srli_epi32(_mm_add_epi32(_mm_madd_epi16(_mm_shuffle_epi8(rows, pair_rows), tab.wy[ay[k]]), round),
                                10);
        }
        const __m128i px =
            _mm_shuffle_epi8(_mm_packus_epi16(_mm_packs_epi32(r[0], r[1]), _mm_packs_epi32(r[2], r[3])), pack12);
        uint8_t* out = d + x * 3;
        _mm_storel_epi64(reinterpret_cast<__m128i*>(out), px);
        const int32_t last = _mm_extract_epi32(px, 2);
        std::memcpy(out + 8, &last, 4);
      }
    }
#endif
    for (; x < out_.w; ++x) SamplePixel<3>(image, qx[x], qy[x], d + x * 3);
  }

  template <int kC>
  inline void SamplePixel(const T* image, int32_t qxv, int32_t qyv, T* d) const {
    const int64_t c = kC > 0 ? kC : in_.c;
    const int64_t w = in_.w, h = in_.h, stride = w * c;
    if (nearest_) {
      const int64_t sx = BorderIndex(qxv, w, border_), sy = BorderIndex(qyv, h, border_);
      if (sx < 0 || sy < 0) {
        for (int64_t ch = 0; ch < c; ++ch) d[ch] = border_value_;
      } else {
        const T* s = image + sy * stride + sx * c;
        for (int64_t ch = 0; ch < c; ++ch) d[ch] = s[ch];
      }
      return;
    }
    const int64_t x0 = qxv >> 5, y0 = qyv >> 5;
    const int ax = qxv & 31, ay = qyv & 31;
    if (static_cast<uint64_t>(x0) < static_cast<uint64_t>(w - 1) &&
        static_cast<uint64_t>(y0) < static_cast<uint64_t>(h - 1)) {
      const T* s0 = image + y0 * stride + x0 * c;
      const T* s1 = s0 + stride;
      if constexpr (std::is_same_v<T, uint8_t>) {
        // Exact: the weights are integers summing to 1024.
        const int w00 = (32 - ax) * (32 - ay), w01 = ax * (32 - ay), w10 = (32 - ax) * ay, w11 = ax * ay;
        for (int64_t ch = 0; ch < c; ++ch)
          d[ch] = static_cast<uint8_t>((s0[ch] * w00 + s0[c + ch] * w01 + s1[ch] * w10 + s1[c + ch] * w11 + 512) >> 10);
      } else {
        const float fx = ax * (1.f / 32.f), fy = ay * (1.f / 32.f);
        for (int64_t ch = 0; ch < c; ++ch)
          d[ch] = (1 - fy) * ((1 - fx) * s0[ch] + fx * s0[c + ch]) + fy * ((1 - fx) * s1[ch] + fx * s1[c + ch]);
      }
      return;
    }
    if (border_ == Border::kConstant && (x0 >= w || x0 + 1 < 0 || y0 >= h || y0 + 1 < 0)) {
      for (int64_t ch = 0; ch < c; ++ch) d[ch] = border_value_;
      return;
    }
    const int64_t xs[2] = {BorderIndex(x0, w, border_), BorderIndex(x0 + 1, w, border_)};
    const int64_t ys[2] = {BorderIndex(y0, h, border_), BorderIndex(y0 + 1, h, border_)};
    auto tap = [&](int iy, int ix, int64_t ch) -> T {
      return xs[ix] < 0 || ys[iy] < 0 ? border_value_ : image[ys[iy] * stride + xs[ix] * c + ch];
    };
    if constexpr (std::is_same_v<T, uint8_t>) {
      const int w00 = (32 - ax) * (32 - ay), w01 = ax * (32 - ay), w10 = (32 - ax) * ay, w11 = ax * ay;
      for (int64_t ch = 0; ch < c; ++ch)
        d[ch] = static_cast<uint8_t>(
            (tap(0, 0, ch) * w00 + tap(0, 1, ch) * w01 + tap(1, 0, ch) * w10 + tap(1, 1, ch) * w11 + 512) >> 10);
    } else {
      const float fx = ax * (1.f / 32.f), fy = ay * (1.f / 32.f);
      for (int64_t ch = 0; ch < c; ++ch)
        d[ch] = (1 - fy) * ((1 - fx) * tap(0, 0, ch) + fx * tap(0, 1, ch)) +
                fy * ((1 - fx) * tap(1, 0, ch) + fx * tap(1, 1, ch));
    }
  }

  Shape in_shape_, out_shape_;
  ImageDims in_{}, out_{};
  double m_[9] = {};
  bool nearest_ = false, affine_ = false;
  int simd_ = 0;
  // Affine uint8 RGB: the SIMD loops prefetch the source bytes that output row y + kPrefetchRows will read (measured:
  // 2 to 8 rows do about as well on a 10-degree rotation).
  static constexpr int kPrefetchRows = 4;
  bool prefetch_rows_ = false;
  int64_t prefetch_delta_ = 0;
  Border border_ = Border::kConstant;
  T border_value_{};
  std::string name_;
};

}  // namespace

/// The general WarpPerspective kernel (uint8 or float32 image), or nullptr for other dtypes.
std::unique_ptr<Kernel> CreateWarpGeneralKernel(const KernelBuildContext& ctx) {
  if (ctx.input_dtypes[0] == DType::kU8) return std::make_unique<WarpPerspectiveKernel<uint8_t>>(ctx);
  if (ctx.input_dtypes[0] == DType::kF32) return std::make_unique<WarpPerspectiveKernel<float>>(ctx);
  return nullptr;
}

}  // namespace osprey

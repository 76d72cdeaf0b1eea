// Fast kernels of the augmentation image ops WarpPerspective, GaussianBlur and LookupTable (docs/augment.md); the uint8
// colour ops are in augment_color_kernels.cc, uint8 warps with axis-aligned matrices (resize, crop, flip, pad: a
// separable blend) in augment_warp_axis.cc. The reference kernels in src/kernels/reference/augment.cc are the oracle
// and state the arithmetic. WarpPerspective's source positions and uint8 weights are bit-identical to it (uint8 RGB
// blends 4 pixels at a time with SSE4.1 integer arithmetic). GaussianBlur uint8 with taps that are multiples of 1/256
// (OpenCV's fixed tables) is exact integer arithmetic (AVX2 when the CPU has it); other taps accumulate in float where
// the reference uses double. Augmentation runs one image per thread, so the kernels are single-threaded; per-call
// buffers come from the thread's scratch block.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
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
#endif

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/dnnl_common.h"
#include "ops/op_registry.h"

namespace osprey {
namespace {

struct ImageDims {
  int64_t n, h, w, c;
};

ImageDims DimsOf(const Shape& s) {
  if (s.size() == 4) return {s[0], s[1], s[2], s[3]};
  return {1, s[0], s[1], s[2]};
}

void CheckShapes(const KernelContext& ctx, const Shape& in, const Shape& out, const char* name) {
  if (ctx.In(0).shape() != in || ctx.Out(0).shape() != out)
    throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": " + name + " was built for " + ShapeToString(in) +
                                          " -> " + ShapeToString(out) + ", got " + ShapeToString(ctx.In(0).shape()) +
                                          " -> " + ShapeToString(ctx.Out(0).shape()));
}

inline uint8_t SaturateU8(float v) {
  if (!(v > 0.f)) return 0;
  if (v >= 255.f) return 255;
  return static_cast<uint8_t>(static_cast<int>(v + 0.5f));
}

template <class T>
inline T StoreAs(float v) {
  if constexpr (std::is_same_v<T, uint8_t>) {
    return SaturateU8(v);
  } else {
    return v;
  }
}

// Round to nearest, ties to even (cvRound / std::nearbyint in the default rounding mode), after clamping to int.
inline int RoundToInt(double v) {
  v = std::min(std::max(v, static_cast<double>(INT_MIN)), static_cast<double>(INT_MAX));
#ifdef __SSE2__
  return _mm_cvtsd_si32(_mm_set_sd(v));
#else
  return static_cast<int>(std::nearbyint(v));
#endif
}

enum class Border { kConstant, kReplicate, kReflect, kReflect101 };

Border BorderOf(const std::string& name) {
  if (name == "replicate") return Border::kReplicate;
  if (name == "reflect") return Border::kReflect;
  if (name == "reflect101") return Border::kReflect101;
  return Border::kConstant;
}

// cv::borderInterpolate (as the reference kernel): source index of position i on an axis of n, or -1 (constant).
inline int64_t BorderIndex(int64_t i, int64_t n, Border border) {
  if (i >= 0 && i < n) return i;
  switch (border) {
    case Border::kConstant:
      return -1;
    case Border::kReplicate:
      return i < 0 ? 0 : n - 1;
    case Border::kReflect: {
      const int64_t period = 2 * n;
      int64_t m = i % period;
      if (m < 0) m += period;
      return m < n ? m : period - 1 - m;
    }
    case Border::kReflect101: {
      if (n == 1) return 0;
      const int64_t period = 2 * (n - 1);
      int64_t m = i % period;
      if (m < 0) m += period;
      return m < n ? m : period - m;
    }
  }
  return -1;
}

// ---------------------------------------------------------------- WarpPerspective

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
  // Two positions per step in SSE2 doubles: the same IEEE operations in the same order as the scalar form (no FMA in
  // this build), clamped like RoundToInt and converted with the current (ties-to-even) rounding mode.
  void RowPositions(int64_t y, int32_t* qx, int32_t* qy) const {
    const double unit = nearest_ ? 1.0 : 32.0;
    const double bx = m_[1] * y + m_[2], by = m_[4] * y + m_[5];
    const int64_t w = out_.w;
    int64_t x = 0;
#ifdef __SSE2__
    const __m128d lo = _mm_set1_pd(static_cast<double>(INT_MIN)), hi = _mm_set1_pd(static_cast<double>(INT_MAX));
    auto round2 = [&](__m128d v) { return _mm_cvtpd_epi32(_mm_min_pd(_mm_max_pd(v, lo), hi)); };
    __m128d xd = _mm_set_pd(1.0, 0.0);
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
  Border border_ = Border::kConstant;
  T border_value_{};
  std::string name_;
};

// ---------------------------------------------------------------- GaussianBlur

// Separable, BORDER_REFLECT_101, float accumulation. Horizontally filtered rows live in a ring of ksize_y rows (slot =
// row % ksize_y): the rows one output row needs lie within ksize_y consecutive rows (or the image is shorter than
// the ring), so each source row is filtered once. Both passes pair the symmetric taps (k[i] == k[n-1-i] exactly).
template <class T>
class GaussianBlurKernel final : public Kernel {
 public:
  explicit GaussianBlurKernel(const KernelBuildContext& ctx)
      : in_shape_(ctx.input_shapes[0]), out_shape_(ctx.output_shapes[0]) {
    d_ = DimsOf(in_shape_);
    const GaussianBlurTaps taps = GaussianBlurKernels(ctx.node, std::is_same_v<T, uint8_t>);
    kx_.assign(taps.x.begin(), taps.x.end());
    ky_.assign(taps.y.begin(), taps.y.end());
    rx_ = static_cast<int64_t>(kx_.size()) / 2;
    ry_ = static_cast<int64_t>(ky_.size()) / 2;
    // Source column of every position of the border-extended row.
    for (int64_t xe = 0; xe < d_.w + 2 * rx_; ++xe)
      ext_cols_.push_back(BorderIndex(xe - rx_, d_.w, Border::kReflect101));
  }
  const char* Name() const override {
    return std::is_same_v<T, uint8_t> ? "GaussianBlurU8Separable" : "GaussianBlurF32Separable";
  }

  void Run(KernelContext& ctx) override {
    CheckShapes(ctx, in_shape_, out_shape_, Name());
    const int64_t c = d_.c, row = d_.w * c, ext_len = (d_.w + 2 * rx_) * c;
    const int64_t ring = static_cast<int64_t>(ky_.size());
    const size_t ext_bytes = cpu::ThreadScratch::Align(ext_len * sizeof(float));
    const size_t row_bytes = cpu::ThreadScratch::Align(row * sizeof(float));
    const size_t rows_bytes = (ring + 1) * row_bytes, index_bytes = cpu::ThreadScratch::Align(ring * sizeof(int64_t));
    char* scratch = cpu::ThreadScratch::Reserve(ext_bytes + rows_bytes + 2 * index_bytes);
    float* ext = reinterpret_cast<float*>(scratch);
    float* acc = reinterpret_cast<float*>(scratch + ext_bytes);
    auto slot = [&](int64_t r) { return reinterpret_cast<float*>(scratch + ext_bytes + (1 + r % ring) * row_bytes); };
    int64_t* slot_row = reinterpret_cast<int64_t*>(scratch + ext_bytes + rows_bytes);  // source row held by a slot
    const float** rows = reinterpret_cast<const float**>(scratch + ext_bytes + rows_bytes + index_bytes);
    for (int64_t b = 0; b < d_.n; ++b) {
      const T* src = ctx.In(0).data<T>() + b * d_.h * row;
      T* dst = ctx.Out(0).data<T>() + b * d_.h * row;
      std::fill(slot_row, slot_row + ring, int64_t{-1});
      for (int64_t y = 0; y < d_.h; ++y) {
        for (int64_t k = 0; k < ring; ++k) {
          const int64_t r = BorderIndex(y + k - ry_, d_.h, Border::kReflect101);
          if (slot_row[r % ring] != r) {
            HorizontalRow(src + r * row, ext, slot(r));
            slot_row[r % ring] = r;
          }
          rows[k] = slot(r);
        }
        VerticalRow(rows, acc, dst + y * row);
      }
    }
  }

 private:
  void HorizontalRow(const T* s, float* ext, float* out) const {
    const int64_t c = d_.c, row = d_.w * c;
    for (int64_t xe = 0; xe < static_cast<int64_t>(ext_cols_.size()); ++xe) {
      const T* p = s + ext_cols_[xe] * c;
      for (int64_t ch = 0; ch < c; ++ch) ext[xe * c + ch] = static_cast<float>(p[ch]);
    }
    const int64_t r = rx_;
    const float center = kx_[r];
    const float* mid = ext + r * c;
#pragma omp simd
    for (int64_t i = 0; i < row; ++i) out[i] = center * mid[i];
    for (int64_t k = 0; k < r; ++k) {
      const float wk = kx_[k];
      const float* a = ext + k * c;
      const float* z = ext + (2 * r - k) * c;
#pragma omp simd
      for (int64_t i = 0; i < row; ++i) out[i] += wk * (a[i] + z[i]);
    }
  }

  void VerticalRow(const float* const* rows, float* acc, T* d) const {
    const int64_t row = d_.w * d_.c, r = ry_;
    const float center = ky_[r];
    const float* mid = rows[r];
#pragma omp simd
    for (int64_t i = 0; i < row; ++i) acc[i] = center * mid[i];
    for (int64_t k = 0; k < r; ++k) {
      const float wk = ky_[k];
      const float* a = rows[k];
      const float* z = rows[2 * r - k];
#pragma omp simd
      for (int64_t i = 0; i < row; ++i) acc[i] += wk * (a[i] + z[i]);
    }
    if constexpr (std::is_same_v<T, uint8_t>) {
#pragma omp simd
      for (int64_t i = 0; i < row; ++i) {
        const float v = std::min(std::max(acc[i], 0.f), 255.f) + 0.5f;
        d[i] = static_cast<uint8_t>(static_cast<int>(v));
      }
    } else {
      std::memcpy(d, acc, row * sizeof(float));
    }
  }

  Shape in_shape_, out_shape_;
  ImageDims d_{};
  std::vector<float> kx_, ky_;
  int64_t rx_ = 0, ry_ = 0;
  std::vector<int64_t> ext_cols_;
};

// uint8 taps that are all multiples of 1/256 (OpenCV's fixed tables: ksize <= 9 with sigma 0, and ksize 1). Then the
// reference's double sums are exact: the horizontal pass is an integer in 1/256 (at most 255 * 256, so uint16), the
// vertical one an integer in 1/65536 (uint32), and the reference's round-half-up is (v + 32768) >> 16. This kernel
// computes those integers, so it is bit-identical to the reference (and to OpenCV's bit-exact fixed point).
bool FixedPointTaps(const std::vector<double>& taps, std::vector<uint32_t>& out) {
  uint32_t sum = 0;
  out.clear();
  for (double t : taps) {
    const double scaled = t * 256.0;
    if (!(scaled >= 0.0) || scaled > 256.0 || scaled != std::floor(scaled)) return false;
    out.push_back(static_cast<uint32_t>(scaled));
    sum += out.back();
  }
  return sum == 256 && out.size() <= 9;
}

#if defined(__x86_64__) || defined(__i386__)
#define OSPREY_BLUR_AVX2 1
bool HaveAvx2() {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
}

// 16 elements per step: bytes widened to uint16, multiplied by the tap, summed (no overflow: see above).
template <int kTaps>
__attribute__((target("avx2"))) int64_t BlurRowHorizontalAvx2(const uint8_t* ext, int64_t n, int64_t c,
                                                              const uint32_t* k, uint16_t* out) {
  __m256i w[kTaps];
  for (int t = 0; t < kTaps; ++t) w[t] = _mm256_set1_epi16(static_cast<int16_t>(k[t]));
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i acc = _mm256_setzero_si256();
    for (int t = 0; t < kTaps; ++t) {
      const __m256i x = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ext + i + t * c)));
      acc = _mm256_add_epi16(acc, _mm256_mullo_epi16(x, w[t]));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), acc);
  }
  return i;
}

// 16 elements per step: 32-bit products from the low and high halves of the 16 x 16-bit multiply.
template <int kTaps>
__attribute__((target("avx2"))) int64_t BlurRowVerticalAvx2(const uint16_t* const* rows, int64_t n, const uint32_t* k,
                                                            uint8_t* out) {
  __m256i w[kTaps];
  for (int t = 0; t < kTaps; ++t) w[t] = _mm256_set1_epi16(static_cast<int16_t>(k[t]));
  const __m256i half = _mm256_set1_epi32(1 << 15);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i acc_lo = half, acc_hi = half;
    for (int t = 0; t < kTaps; ++t) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[t] + i));
      const __m256i lo = _mm256_mullo_epi16(x, w[t]), hi = _mm256_mulhi_epu16(x, w[t]);
      acc_lo = _mm256_add_epi32(acc_lo, _mm256_unpacklo_epi16(lo, hi));
      acc_hi = _mm256_add_epi32(acc_hi, _mm256_unpackhi_epi16(lo, hi));
    }
    const __m256i words = _mm256_packus_epi32(_mm256_srli_epi32(acc_lo, 16), _mm256_srli_epi32(acc_hi, 16));
    const __m256i bytes = _mm256_permute4x64_epi64(_mm256_packus_epi16(words, words), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_castsi256_si128(bytes));
  }
  return i;
}
#endif

template <int kTaps>
void BlurRowHorizontalU16(const uint8_t* ext, int64_t n, int64_t c, const uint32_t* k, uint16_t* out) {
  int64_t i = 0;
#ifdef OSPREY_BLUR_AVX2
  if (HaveAvx2()) i = BlurRowHorizontalAvx2<kTaps>(ext, n, c, k, out);
#endif
  for (; i < n; ++i) {
    uint32_t v = 0;
    for (int t = 0; t < kTaps; ++t) v += k[t] * ext[i + t * c];
    out[i] = static_cast<uint16_t>(v);
  }
}

template <int kTaps>
void BlurRowVerticalU8(const uint16_t* const* rows, int64_t n, const uint32_t* k, uint8_t* out) {
  int64_t i = 0;
#ifdef OSPREY_BLUR_AVX2
  if (HaveAvx2()) i = BlurRowVerticalAvx2<kTaps>(rows, n, k, out);
#endif
  for (; i < n; ++i) {
    uint32_t v = 1u << 15;
    for (int t = 0; t < kTaps; ++t) v += k[t] * static_cast<uint32_t>(rows[t][i]);
    out[i] = static_cast<uint8_t>(v >> 16);
  }
}

using BlurHorizontalFn = void (*)(const uint8_t*, int64_t, int64_t, const uint32_t*, uint16_t*);
using BlurVerticalFn = void (*)(const uint16_t* const*, int64_t, const uint32_t*, uint8_t*);

template <int kTaps>
void PickBlurRows(size_t taps, BlurHorizontalFn* h, BlurVerticalFn* v) {
  if (taps == kTaps) {
    if (h) *h = BlurRowHorizontalU16<kTaps>;
    if (v) *v = BlurRowVerticalU8<kTaps>;
  }
  if constexpr (kTaps > 1) PickBlurRows<kTaps - 2>(taps, h, v);
}

// Same structure as GaussianBlurKernel (ring of horizontally filtered rows), in integers.
class GaussianBlurU8FixedKernel final : public Kernel {
 public:
  GaussianBlurU8FixedKernel(const KernelBuildContext& ctx, std::vector<uint32_t> kx, std::vector<uint32_t> ky)
      : shape_(ctx.input_shapes[0]), kx_(std::move(kx)), ky_(std::move(ky)) {
    d_ = DimsOf(shape_);
    rx_ = static_cast<int64_t>(kx_.size()) / 2;
    ry_ = static_cast<int64_t>(ky_.size()) / 2;
    PickBlurRows<9>(kx_.size(), &horizontal_, nullptr);
    PickBlurRows<9>(ky_.size(), nullptr, &vertical_);
    for (int64_t k = 0; k < rx_; ++k) {
      left_cols_.push_back(BorderIndex(k - rx_, d_.w, Border::kReflect101));
      right_cols_.push_back(BorderIndex(d_.w + k, d_.w, Border::kReflect101));
    }
  }
  const char* Name() const override { return "GaussianBlurU8FixedPoint"; }

  void Run(KernelContext& ctx) override {
    CheckShapes(ctx, shape_, shape_, Name());
    const int64_t c = d_.c, row = d_.w * c, ext_len = (d_.w + 2 * rx_) * c;
    const int64_t ring = static_cast<int64_t>(ky_.size());
    const size_t ext_bytes = cpu::ThreadScratch::Align(ext_len);
    const size_t row_bytes = cpu::ThreadScratch::Align(row * sizeof(uint16_t));
    const size_t index_bytes = cpu::ThreadScratch::Align(ring * sizeof(int64_t));
    char* scratch = cpu::ThreadScratch::Reserve(ext_bytes + ring * row_bytes + 2 * index_bytes);
    uint8_t* ext = reinterpret_cast<uint8_t*>(scratch);
    auto slot = [&](int64_t r) { return reinterpret_cast<uint16_t*>(scratch + ext_bytes + (r % ring) * row_bytes); };
    int64_t* slot_row = reinterpret_cast<int64_t*>(scratch + ext_bytes + ring * row_bytes);
    const uint16_t** rows = reinterpret_cast<const uint16_t**>(scratch + ext_bytes + ring * row_bytes + index_bytes);
    for (int64_t b = 0; b < d_.n; ++b) {
      const uint8_t* src = ctx.In(0).data<uint8_t>() + b * d_.h * row;
      uint8_t* dst = ctx.Out(0).data<uint8_t>() + b * d_.h * row;
      std::fill(slot_row, slot_row + ring, int64_t{-1});
      for (int64_t y = 0; y < d_.h; ++y) {
        for (int64_t k = 0; k < ring; ++k) {
          const int64_t r = BorderIndex(y + k - ry_, d_.h, Border::kReflect101);
          if (slot_row[r % ring] != r) {
            const uint8_t* s = src + r * row;
            for (int64_t k2 = 0; k2 < rx_; ++k2) {
              std::memcpy(ext + k2 * c, s + left_cols_[k2] * c, c);
              std::memcpy(ext + (rx_ + d_.w + k2) * c, s + right_cols_[k2] * c, c);
            }
            std::memcpy(ext + rx_ * c, s, row);
            horizontal_(ext, row, c, kx_.data(), slot(r));
            slot_row[r % ring] = r;
          }
          rows[k] = slot(r);
        }
        vertical_(rows, row, ky_.data(), dst + y * row);
      }
    }
  }

 private:
  Shape shape_;
  ImageDims d_{};
  std::vector<uint32_t> kx_, ky_;
  int64_t rx_ = 0, ry_ = 0;
  std::vector<int64_t> left_cols_, right_cols_;
  BlurHorizontalFn horizontal_ = nullptr;
  BlurVerticalFn vertical_ = nullptr;
};

// ---------------------------------------------------------------- LookupTable

// uint8 y = table[x] (one table, or one per channel when the table holds 256 * C values and C > 1, as the reference).
class LookupTableU8Kernel final : public Kernel {
 public:
  explicit LookupTableU8Kernel(const KernelBuildContext& ctx) : shape_(ctx.input_shapes[0]) {
    const std::vector<int64_t> table = ctx.node.GetInts("table");
    c_ = shape_.back();
    per_channel_ = static_cast<int64_t>(table.size()) == 256 * c_ && c_ > 1;
    lut_.assign(table.begin(), table.end());
  }
  const char* Name() const override { return per_channel_ ? "LookupTableU8PerChannel" : "LookupTableU8"; }

  void Run(KernelContext& ctx) override {
    CheckShapes(ctx, shape_, shape_, Name());
    const uint8_t* src = ctx.In(0).data<uint8_t>();
    uint8_t* dst = ctx.Out(0).data<uint8_t>();
    const int64_t n = ctx.In(0).numel();
    const uint8_t* lut = lut_.data();
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
  int64_t c_ = 1;
  bool per_channel_ = false;
  std::vector<uint8_t> lut_;
};

template <template <class> class K>
std::unique_ptr<Kernel> ByDType(const KernelBuildContext& ctx) {
  if (ctx.input_dtypes[0] == DType::kU8) return std::make_unique<K<uint8_t>>(ctx);
  if (ctx.input_dtypes[0] == DType::kF32) return std::make_unique<K<float>>(ctx);
  return nullptr;
}

}  // namespace

std::unique_ptr<Kernel> CreateAugmentColorKernel(const KernelBuildContext& ctx);  // augment_color_kernels.cc
std::unique_ptr<Kernel> CreateWarpAxisAlignedU8Kernel(const KernelBuildContext& ctx,
                                                      const double* m);  // augment_warp_axis.cc

/// Fast kernels for WarpPerspective, GaussianBlur, LookupTable and the uint8 colour ops, or nullptr (other ops run
/// their reference kernels).
std::unique_ptr<Kernel> CreateAugmentKernel(const KernelBuildContext& ctx) {
  const std::string& op = ctx.node.op_type;
  if (std::unique_ptr<Kernel> k = CreateAugmentColorKernel(ctx)) return k;
  if (op != "WarpPerspective" && op != "GaussianBlur" && op != "LookupTable") return nullptr;
  if (ctx.input_dtypes.empty() || ctx.input_shapes.empty() || ctx.output_shapes.empty()) return nullptr;
  for (Layout l : ctx.input_layouts)
    if (l != Layout::kPlain) return nullptr;
  for (Layout l : ctx.output_layouts)
    if (l != Layout::kPlain) return nullptr;
  const Shape& in = ctx.input_shapes[0];
  if (in.size() != 3 && in.size() != 4) return nullptr;
  if (op == "LookupTable") {
    if (ctx.input_dtypes[0] != DType::kU8) return nullptr;  // the reference kernel reports the error
    return std::make_unique<LookupTableU8Kernel>(ctx);
  }
  if (op == "WarpPerspective") {
    const std::vector<float> mf = ctx.node.GetFloats("matrix");
    double m[9];
    for (int i = 0; i < 9; ++i) m[i] = mf[i];
    if (std::unique_ptr<Kernel> k = CreateWarpAxisAlignedU8Kernel(ctx, m)) return k;
    return ByDType<WarpPerspectiveKernel>(ctx);
  }
  if (ctx.input_dtypes[0] == DType::kU8) {
    const GaussianBlurTaps taps = GaussianBlurKernels(ctx.node, true);
    std::vector<uint32_t> kx, ky;
    if (FixedPointTaps(taps.x, kx) && FixedPointTaps(taps.y, ky))
      return std::make_unique<GaussianBlurU8FixedKernel>(ctx, std::move(kx), std::move(ky));
  }
  return ByDType<GaussianBlurKernel>(ctx);
}

}  // namespace osprey

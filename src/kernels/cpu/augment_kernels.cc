// Fast kernels of the augmentation image ops WarpPerspective and GaussianBlur (docs/augment.md). The reference
// kernels in src/kernels/reference/augment.cc are the oracle and state the arithmetic; this file follows it exactly
// where that is cheap (WarpPerspective's source positions and uint8 weights are bit-identical to it) and accumulates
// in float where the reference uses double (GaussianBlur). Augmentation runs one image per thread, so the kernels are
// single-threaded; per-call buffers come from the thread's scratch block.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#ifdef __SSE2__
#include <emmintrin.h>
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
  void RowPositions(int64_t y, int32_t* qx, int32_t* qy) const {
    const double unit = nearest_ ? 1.0 : 32.0;
    const double bx = m_[1] * y + m_[2], by = m_[4] * y + m_[5];
    if (affine_) {
      const double sx = m_[0] * unit, sy = m_[3] * unit, bxs = bx * unit, bys = by * unit;
      for (int64_t x = 0; x < out_.w; ++x) {
        qx[x] = RoundToInt(sx * x + bxs);
        qy[x] = RoundToInt(sy * x + bys);
      }
      return;
    }
    const double bw = m_[7] * y + m_[8];
    for (int64_t x = 0; x < out_.w; ++x) {
      const double w = m_[6] * x + bw;
      const double scale = w != 0.0 ? unit / w : 0.0;
      qx[x] = RoundToInt((m_[0] * x + bx) * scale);
      qy[x] = RoundToInt((m_[3] * x + by) * scale);
    }
  }

  template <int kC>
  void SampleRow(const T* image, const int32_t* qx, const int32_t* qy, T* d) const {
    const int64_t c = kC > 0 ? kC : in_.c;
    const int64_t w = in_.w, h = in_.h, stride = w * c;
    for (int64_t x = 0; x < out_.w; ++x, d += c) {
      if (nearest_) {
        const int64_t sx = BorderIndex(qx[x], w, border_), sy = BorderIndex(qy[x], h, border_);
        if (sx < 0 || sy < 0) {
          for (int64_t ch = 0; ch < c; ++ch) d[ch] = border_value_;
        } else {
          const T* s = image + sy * stride + sx * c;
          for (int64_t ch = 0; ch < c; ++ch) d[ch] = s[ch];
        }
        continue;
      }
      const int64_t x0 = qx[x] >> 5, y0 = qy[x] >> 5;
      const int ax = qx[x] & 31, ay = qy[x] & 31;
      if (static_cast<uint64_t>(x0) < static_cast<uint64_t>(w - 1) &&
          static_cast<uint64_t>(y0) < static_cast<uint64_t>(h - 1)) {
        const T* s0 = image + y0 * stride + x0 * c;
        const T* s1 = s0 + stride;
        if constexpr (std::is_same_v<T, uint8_t>) {
          // Exact: the weights are integers summing to 1024.
          const int w00 = (32 - ax) * (32 - ay), w01 = ax * (32 - ay), w10 = (32 - ax) * ay, w11 = ax * ay;
          for (int64_t ch = 0; ch < c; ++ch)
            d[ch] =
                static_cast<uint8_t>((s0[ch] * w00 + s0[c + ch] * w01 + s1[ch] * w10 + s1[c + ch] * w11 + 512) >> 10);
        } else {
          const float fx = ax * (1.f / 32.f), fy = ay * (1.f / 32.f);
          for (int64_t ch = 0; ch < c; ++ch)
            d[ch] = (1 - fy) * ((1 - fx) * s0[ch] + fx * s0[c + ch]) + fy * ((1 - fx) * s1[ch] + fx * s1[c + ch]);
        }
        continue;
      }
      if (border_ == Border::kConstant && (x0 >= w || x0 + 1 < 0 || y0 >= h || y0 + 1 < 0)) {
        for (int64_t ch = 0; ch < c; ++ch) d[ch] = border_value_;
        continue;
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

template <template <class> class K>
std::unique_ptr<Kernel> ByDType(const KernelBuildContext& ctx) {
  if (ctx.input_dtypes[0] == DType::kU8) return std::make_unique<K<uint8_t>>(ctx);
  if (ctx.input_dtypes[0] == DType::kF32) return std::make_unique<K<float>>(ctx);
  return nullptr;
}

}  // namespace

/// Fast kernels for WarpPerspective and GaussianBlur, or nullptr (other ops run their reference kernels).
std::unique_ptr<Kernel> CreateAugmentKernel(const KernelBuildContext& ctx) {
  const std::string& op = ctx.node.op_type;
  if (op != "WarpPerspective" && op != "GaussianBlur") return nullptr;
  if (ctx.input_dtypes.empty() || ctx.input_shapes.empty() || ctx.output_shapes.empty()) return nullptr;
  for (Layout l : ctx.input_layouts)
    if (l != Layout::kPlain) return nullptr;
  for (Layout l : ctx.output_layouts)
    if (l != Layout::kPlain) return nullptr;
  const Shape& in = ctx.input_shapes[0];
  if (in.size() != 3 && in.size() != 4) return nullptr;
  if (op == "WarpPerspective") return ByDType<WarpPerspectiveKernel>(ctx);
  return ByDType<GaussianBlurKernel>(ctx);
}

}  // namespace osprey

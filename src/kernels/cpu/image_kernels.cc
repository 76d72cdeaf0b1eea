// Fast kernels of the osprey-domain image ops, built for concrete shapes at compile time. Rows run in parallel
// (OpenMP); every per-pixel decision that depends only on shapes and attributes (resampling taps, lookup tables)
// is made once at creation. The reference kernels in src/kernels/reference/image.cc are the oracle; both take their
// resampling taps from src/ops/resize_taps.h (the rules are stated there).
//
// Resize is separable, Pillow-style: a horizontal pass over the needed source rows into a float buffer, then a
// vertical pass, each with a precomputed table of K taps per output index (K = filter support in source pixels,
// so antialiased downscaling widens the table rather than the code path).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/image_common.h"
#include "kernels/cpu/thread_scratch.h"
#include "ops/op_registry.h"
#include "ops/resize_taps.h"

namespace osprey {
namespace {

using namespace image_kernels;

constexpr int64_t kMinParallelElements = int64_t{1} << 14;

// ---------------------------------------------------------------- resize

// One axis of a separable resize: output index o reads source [start[o], start[o] + taps) with weights
// weights[o * taps ...]. Repeated (clamped) indices are merged, and zero-weight ends trimmed, so `taps` is the
// true support; every window lies inside [0, in).
struct AxisTable {
  int taps = 1;
  std::vector<int32_t> start;
  std::vector<float> weights;
};

AxisTable BuildAxisTable(const std::string& mode, bool antialias, bool area_shrinks, int64_t in, int64_t out) {
  std::vector<ResizeTap> taps;
  std::vector<int64_t> lo(out), hi(out);
  std::vector<std::vector<double>> windows(out);
  int64_t k_max = 1;
  for (int64_t o = 0; o < out; ++o) {
    ResizeTaps(mode, antialias, area_shrinks, in, out, o, taps);
    int64_t a = in, b = 0;
    for (const ResizeTap& t : taps)
      if (t.weight != 0.0) a = std::min(a, t.index), b = std::max(b, t.index + 1);
    if (a >= b) a = std::min<int64_t>(taps.empty() ? 0 : taps[0].index, in - 1), b = a + 1;
    windows[o].assign(b - a, 0.0);
    for (const ResizeTap& t : taps)
      if (t.weight != 0.0) windows[o][t.index - a] += t.weight;
    lo[o] = a;
    k_max = std::max(k_max, b - a);
  }
  AxisTable table;
  table.taps = static_cast<int>(k_max);
  table.start.resize(out);
  table.weights.assign(out * k_max, 0.f);
  for (int64_t o = 0; o < out; ++o) {
    const int64_t start = std::min(lo[o], in - k_max);  // k_max <= in, so start >= 0
    table.start[o] = static_cast<int32_t>(start);
    for (size_t j = 0; j < windows[o].size(); ++j)
      table.weights[o * k_max + (lo[o] - start) + j] = static_cast<float>(windows[o][j]);
  }
  return table;
}

// Rows [begin, begin + count) of a table: the taps of a window of the output axis, identical to the full table's.
AxisTable SliceAxisTable(const AxisTable& full, int64_t begin, int64_t count) {
  AxisTable table;
  table.taps = full.taps;
  table.start.assign(full.start.begin() + begin, full.start.begin() + begin + count);
  table.weights.assign(full.weights.begin() + begin * full.taps, full.weights.begin() + (begin + count) * full.taps);
  return table;
}

// Horizontal pass of one source row: dst[x * C + ch] = sum_k w[x][k] * src[(start[x] + k) * C + ch].
template <class T, int kC>
void HorizontalRow(const T* src, float* dst, const AxisTable& t, int64_t out_w, int64_t channels) {
  const int K = t.taps;
  const int64_t c = kC > 0 ? kC : channels;
  for (int64_t x = 0; x < out_w; ++x) {
    const float* w = t.weights.data() + x * K;
    const T* s = src + static_cast<int64_t>(t.start[x]) * c;
    float* d = dst + x * c;
    if constexpr (kC > 0) {
      float acc[kC] = {};
      for (int k = 0; k < K; ++k)
        for (int ch = 0; ch < kC; ++ch) acc[ch] += w[k] * static_cast<float>(s[k * kC + ch]);
      for (int ch = 0; ch < kC; ++ch) d[ch] = acc[ch];
    } else {
      for (int64_t ch = 0; ch < c; ++ch) d[ch] = 0.f;
      for (int k = 0; k < K; ++k)
        for (int64_t ch = 0; ch < c; ++ch) d[ch] += w[k] * static_cast<float>(s[k * c + ch]);
    }
  }
}

template <class T>
class ResizeSeparableKernel final : public Kernel {
 public:
  ResizeSeparableKernel(const KernelBuildContext& ctx, const std::string& mode, bool antialias)
      : in_shape_(ctx.input_shapes[0]), out_shape_(ctx.output_shapes[0]) {
    in_ = DimsOf(in_shape_);
    out_ = DimsOf(out_shape_);
    // The output is the window [roi_top, +out_.h) x [roi_left, +out_.w) of the full height x width resize: the tables
    // are the full ones, sliced, so only the needed source rows and output columns are computed.
    const int64_t full_h = ctx.node.GetInt("height", out_.h), full_w = ctx.node.GetInt("width", out_.w);
    const int64_t top = ctx.node.GetInt("roi_top", 0), left = ctx.node.GetInt("roi_left", 0);
    if (top < 0 || left < 0 || top + out_.h > full_h || left + out_.w > full_w)
      throw Error(ErrorCode::kInvalidArgument, ctx.node.Describe() + ": roi outside the resized image");
    const bool area_shrinks = in_.h >= full_h && in_.w >= full_w;
    rows_ = SliceAxisTable(BuildAxisTable(mode, antialias, area_shrinks, in_.h, full_h), top, out_.h);
    cols_ = SliceAxisTable(BuildAxisTable(mode, antialias, area_shrinks, in_.w, full_w), left, out_.w);
    row_lo_ = rows_.start.empty() ? 0 : *std::min_element(rows_.start.begin(), rows_.start.end());
    row_hi_ = row_lo_;
    for (int64_t y = 0; y < out_.h; ++y) row_hi_ = std::max<int64_t>(row_hi_, rows_.start[y] + rows_.taps);
  }
  const char* Name() const override {
    return std::is_same_v<T, uint8_t> ? "ResizeImageU8Separable" : "ResizeImageF32Separable";
  }

  void Run(KernelContext& ctx) override {
    CheckShapes(ctx, in_shape_, out_shape_, Name());
    if (ctx.Out(0).numel() == 0) return;
    const int64_t c = in_.c, row_len = out_.w * c;
    float* tmp = reinterpret_cast<float*>(
        cpu::ThreadScratch::Reserve(static_cast<size_t>((row_hi_ - row_lo_) * row_len) * sizeof(float)));
    for (int64_t b = 0; b < in_.n; ++b) {
      const T* src = ctx.In(0).data<T>() + b * in_.h * in_.w * c;
      T* dst = ctx.Out(0).data<T>() + b * out_.h * row_len;
#pragma omp parallel for schedule(static) if ((row_hi_ - row_lo_) * row_len >= kMinParallelElements)
      for (int64_t y = row_lo_; y < row_hi_; ++y) {
        const T* s = src + y * in_.w * c;
        float* d = tmp + (y - row_lo_) * row_len;
        switch (c) {
          case 1:
            HorizontalRow<T, 1>(s, d, cols_, out_.w, c);
            break;
          case 3:
            HorizontalRow<T, 3>(s, d, cols_, out_.w, c);
            break;
          case 4:
            HorizontalRow<T, 4>(s, d, cols_, out_.w, c);
            break;
          default:
            HorizontalRow<T, 0>(s, d, cols_, out_.w, c);
            break;
        }
      }
      const int K = rows_.taps;
#pragma omp parallel for schedule(static) if (out_.h * row_len >= kMinParallelElements)
      for (int64_t y = 0; y < out_.h; ++y) {
        const float* w = rows_.weights.data() + y * K;
        const float* s = tmp + (rows_.start[y] - row_lo_) * row_len;
        T* d = dst + y * row_len;
        constexpr int64_t kChunk = 256;
        for (int64_t i0 = 0; i0 < row_len; i0 += kChunk) {
          const int64_t n = std::min(kChunk, row_len - i0);
          float acc[kChunk];
          for (int64_t i = 0; i < n; ++i) acc[i] = w[0] * s[i0 + i];
          for (int k = 1; k < K; ++k) {
            const float wk = w[k];
            const float* sk = s + k * row_len + i0;
            for (int64_t i = 0; i < n; ++i) acc[i] += wk * sk[i];
          }
          for (int64_t i = 0; i < n; ++i) d[i0 + i] = StoreAs<T>(acc[i]);
        }
      }
    }
  }

 private:
  Shape in_shape_, out_shape_;
  ImageDims in_{}, out_{};
  AxisTable rows_, cols_;
  int64_t row_lo_ = 0, row_hi_ = 0;
};

// Nearest neighbour: a pure gather with precomputed source rows and columns, any element size.
class ResizeNearestKernel final : public Kernel {
 public:
  explicit ResizeNearestKernel(const KernelBuildContext& ctx)
      : in_shape_(ctx.input_shapes[0]), out_shape_(ctx.output_shapes[0]) {
    in_ = DimsOf(in_shape_);
    out_ = DimsOf(out_shape_);
    pixel_bytes_ = in_.c * DTypeSize(ctx.input_dtypes[0]);
    // Window [roi_top, +out_.h) x [roi_left, +out_.w) of the full height x width resize.
    const int64_t full_h = ctx.node.GetInt("height", out_.h), full_w = ctx.node.GetInt("width", out_.w);
    const int64_t top = ctx.node.GetInt("roi_top", 0), left = ctx.node.GetInt("roi_left", 0);
    if (top < 0 || left < 0 || top + out_.h > full_h || left + out_.w > full_w)
      throw Error(ErrorCode::kInvalidArgument, ctx.node.Describe() + ": roi outside the resized image");
    std::vector<ResizeTap> taps;
    for (int64_t y = 0; y < out_.h; ++y) {
      ResizeTaps("nearest", false, false, in_.h, full_h, top + y, taps);
      src_rows_.push_back(taps[0].index);
    }
    for (int64_t x = 0; x < out_.w; ++x) {
      ResizeTaps("nearest", false, false, in_.w, full_w, left + x, taps);
      src_cols_.push_back(taps[0].index);
    }
  }
  const char* Name() const override { return "ResizeImageNearest"; }
  void Run(KernelContext& ctx) override {
    CheckShapes(ctx, in_shape_, out_shape_, Name());
    if (ctx.Out(0).numel() == 0) return;
    const char* src = static_cast<const char*>(ctx.In(0).raw());
    char* dst = static_cast<char*>(ctx.Out(0).raw());
    const int64_t rows = out_.n * out_.h;
    const size_t pb = pixel_bytes_;
#pragma omp parallel for schedule(static) if (rows * out_.w >= kMinParallelElements)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t b = r / out_.h, y = r % out_.h;
      const char* s = src + (b * in_.h + src_rows_[y]) * in_.w * pb;
      char* d = dst + r * out_.w * pb;
      for (int64_t x = 0; x < out_.w; ++x) std::memcpy(d + x * pb, s + src_cols_[x] * pb, pb);
    }
  }

 private:
  Shape in_shape_, out_shape_;
  ImageDims in_{}, out_{};
  size_t pixel_bytes_ = 0;
  std::vector<int64_t> src_rows_, src_cols_;
};

// ---------------------------------------------------------------- warp affine

template <class T, int kC>
void WarpRow(const T* image, const ImageDims& in, T* d, int64_t out_w, int64_t channels, const double m[6], int64_t y,
             bool nearest, float border) {
  const int64_t c = kC > 0 ? kC : channels;
  const double bx = m[1] * y + m[2], by = m[4] * y + m[5];
  const double max_x = static_cast<double>(in.w) + 1.0, max_y = static_cast<double>(in.h) + 1.0;
  const T border_t = StoreAs<T>(border);
  for (int64_t x = 0; x < out_w; ++x, d += c) {
    const double xi = std::clamp(m[0] * x + bx, -2.0, max_x), yi = std::clamp(m[3] * x + by, -2.0, max_y);
    if (nearest) {
      const int64_t sx = static_cast<int64_t>(std::floor(xi + 0.5)), sy = static_cast<int64_t>(std::floor(yi + 0.5));
      if (sx < 0 || sx >= in.w || sy < 0 || sy >= in.h) {
        for (int64_t ch = 0; ch < c; ++ch) d[ch] = border_t;
      } else {
        const T* s = image + (sy * in.w + sx) * c;
        for (int64_t ch = 0; ch < c; ++ch) d[ch] = s[ch];
      }
      continue;
    }
    const int64_t x0 = static_cast<int64_t>(std::floor(xi)), y0 = static_cast<int64_t>(std::floor(yi));
    const float fx = static_cast<float>(xi - x0), fy = static_cast<float>(yi - y0);
    const float w00 = (1 - fx) * (1 - fy), w01 = fx * (1 - fy), w10 = (1 - fx) * fy, w11 = fx * fy;
    if (x0 >= 0 && y0 >= 0 && x0 + 1 < in.w && y0 + 1 < in.h) {
      const T* s0 = image + (y0 * in.w + x0) * c;
      const T* s1 = s0 + in.w * c;
      for (int64_t ch = 0; ch < c; ++ch)
        d[ch] = StoreAs<T>(w00 * static_cast<float>(s0[ch]) + w01 * static_cast<float>(s0[c + ch]) +
                           w10 * static_cast<float>(s1[ch]) + w11 * static_cast<float>(s1[c + ch]));
      continue;
    }
    const bool in_x0 = x0 >= 0 && x0 < in.w, in_x1 = x0 + 1 >= 0 && x0 + 1 < in.w;
    const bool in_y0 = y0 >= 0 && y0 < in.h, in_y1 = y0 + 1 >= 0 && y0 + 1 < in.h;
    for (int64_t ch = 0; ch < c; ++ch) {
      auto at = [&](bool inside, int64_t yy, int64_t xx) {
        return inside ? static_cast<float>(image[(yy * in.w + xx) * c + ch]) : border;
      };
      d[ch] = StoreAs<T>(w00 * at(in_y0 && in_x0, y0, x0) + w01 * at(in_y0 && in_x1, y0, x0 + 1) +
                         w10 * at(in_y1 && in_x0, y0 + 1, x0) + w11 * at(in_y1 && in_x1, y0 + 1, x0 + 1));
    }
  }
}

template <class T>
class WarpAffineKernel final : public Kernel {
 public:
  explicit WarpAffineKernel(const KernelBuildContext& ctx)
      : in_shape_(ctx.input_shapes[0]), out_shape_(ctx.output_shapes[0]) {
    in_ = DimsOf(in_shape_);
    out_ = DimsOf(out_shape_);
    const std::vector<float> m = ctx.node.GetFloats("matrix");
    for (int i = 0; i < 6; ++i) m_[i] = m[i];
    nearest_ = ctx.node.GetString("mode", "bilinear") == "nearest";
    border_ = ctx.node.GetFloat("border_value", 0.f);
  }
  const char* Name() const override { return std::is_same_v<T, uint8_t> ? "WarpAffineU8" : "WarpAffineF32"; }
  void Run(KernelContext& ctx) override {
    CheckShapes(ctx, in_shape_, out_shape_, Name());
    if (ctx.Out(0).numel() == 0) return;
    const int64_t rows = out_.n * out_.h, c = in_.c;
#pragma omp parallel for schedule(static) if (rows * out_.w * c >= kMinParallelElements)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t b = r / out_.h, y = r % out_.h;
      const T* image = ctx.In(0).data<T>() + b * in_.h * in_.w * c;
      T* d = ctx.Out(0).data<T>() + r * out_.w * c;
      switch (c) {
        case 1:
          WarpRow<T, 1>(image, in_, d, out_.w, c, m_, y, nearest_, border_);
          break;
        case 3:
          WarpRow<T, 3>(image, in_, d, out_.w, c, m_, y, nearest_, border_);
          break;
        case 4:
          WarpRow<T, 4>(image, in_, d, out_.w, c, m_, y, nearest_, border_);
          break;
        default:
          WarpRow<T, 0>(image, in_, d, out_.w, c, m_, y, nearest_, border_);
          break;
      }
    }
  }

 private:
  Shape in_shape_, out_shape_;
  ImageDims in_{}, out_{};
  double m_[6] = {};
  bool nearest_ = false;
  float border_ = 0.f;
};

// ---------------------------------------------------------------- normalize (+ HWC -> CHW)

template <class T>
class NormalizeKernel final : public Kernel {
 public:
  explicit NormalizeKernel(const KernelBuildContext& ctx)
      : in_shape_(ctx.input_shapes[0]), out_shape_(ctx.output_shapes[0]) {
    in_ = DimsOf(in_shape_);
    scale_ = ctx.node.GetFloat("scale", 1.f);
    mean_ = ctx.node.GetFloats("mean");
    std_ = ctx.node.GetFloats("std");
    mean_.resize(in_.c, mean_.size() == 1 ? mean_[0] : 0.f);
    std_.resize(in_.c, std_.size() == 1 ? std_[0] : 1.f);
    chw_ = ctx.node.GetString("layout", "CHW") == "CHW";
    if constexpr (std::is_same_v<T, uint8_t>) {
      // Same expression as the reference kernel, so the table is bit-exact with it.
      lut_.resize(in_.c * 256);
      for (int64_t ch = 0; ch < in_.c; ++ch)
        for (int v = 0; v < 256; ++v) lut_[ch * 256 + v] = (static_cast<float>(v) * scale_ - mean_[ch]) / std_[ch];
    }
  }
  const char* Name() const override { return std::is_same_v<T, uint8_t> ? "NormalizeImageU8Lut" : "NormalizeImageF32"; }
  void Run(KernelContext& ctx) override {
    CheckShapes(ctx, in_shape_, out_shape_, Name());
    if (ctx.Out(0).numel() == 0) return;
    const int64_t rows = in_.n * in_.h, w = in_.w, c = in_.c, plane = in_.h * in_.w;
    const T* src = ctx.In(0).data<T>();
    float* dst = ctx.Out(0).data<float>();
#pragma omp parallel for schedule(static) if (rows * w * c >= kMinParallelElements)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t b = r / in_.h, y = r % in_.h;
      const T* s = src + r * w * c;
      if (chw_) {
        float* d = dst + b * c * plane + y * w;
        if (c == 3) {
          float* d0 = d;
          float* d1 = d + plane;
          float* d2 = d + 2 * plane;
          for (int64_t x = 0; x < w; ++x) {
            d0[x] = Value(s[3 * x], 0);
            d1[x] = Value(s[3 * x + 1], 1);
            d2[x] = Value(s[3 * x + 2], 2);
          }
        } else {
          for (int64_t ch = 0; ch < c; ++ch)
            for (int64_t x = 0; x < w; ++x) d[ch * plane + x] = Value(s[x * c + ch], ch);
        }
      } else {
        float* d = dst + r * w * c;
        for (int64_t x = 0; x < w; ++x)
          for (int64_t ch = 0; ch < c; ++ch) d[x * c + ch] = Value(s[x * c + ch], ch);
      }
    }
  }

 private:
  float Value(T v, int64_t ch) const {
    if constexpr (std::is_same_v<T, uint8_t>) {
      return lut_[ch * 256 + v];
    } else {
      return (v * scale_ - mean_[ch]) / std_[ch];
    }
  }
  Shape in_shape_, out_shape_;
  ImageDims in_{};
  float scale_ = 1.f;
  std::vector<float> mean_, std_, lut_;
  bool chw_ = true;
};

// ---------------------------------------------------------------- colour conversion

template <class T>
class ColorConvertKernel final : public Kernel {
 public:
  explicit ColorConvertKernel(const KernelBuildContext& ctx)
      : in_shape_(ctx.input_shapes[0]), out_shape_(ctx.output_shapes[0]) {
    const std::string from = ctx.node.GetString("from", ""), to = ctx.node.GetString("to", "");
    in_c_ = DimsOf(in_shape_).c;
    out_c_ = DimsOf(out_shape_).c;
    if (from == "GRAY") {
      r_ = g_ = b_ = 0;
    } else if (from == "BGR" || from == "BGRA") {
      r_ = 2, g_ = 1, b_ = 0;
    }
    to_gray_ = to == "GRAY" && from != "GRAY";
    to_bgr_ = to == "BGR";
  }
  const char* Name() const override { return std::is_same_v<T, uint8_t> ? "ColorConvertU8" : "ColorConvertF32"; }
  void Run(KernelContext& ctx) override {
    CheckShapes(ctx, in_shape_, out_shape_, Name());
    const int64_t pixels = ctx.In(0).numel() / std::max<int64_t>(in_c_, 1);
    const T* src = ctx.In(0).data<T>();
    T* dst = ctx.Out(0).data<T>();
    const int64_t ic = in_c_, oc = out_c_;
    const int r = r_, g = g_, b = b_;
#pragma omp parallel for schedule(static) if (pixels >= kMinParallelElements)
    for (int64_t p = 0; p < pixels; ++p) {
      const T* s = src + p * ic;
      T* d = dst + p * oc;
      if (to_gray_) {
        if constexpr (std::is_same_v<T, uint8_t>) {
          d[0] = static_cast<uint8_t>((s[r] * 9798 + s[g] * 19235 + s[b] * 3735 + (1 << 14)) >> 15);
        } else {
          d[0] = 0.299f * s[r] + 0.587f * s[g] + 0.114f * s[b];
        }
      } else if (oc == 1) {
        d[0] = s[0];
      } else if (to_bgr_) {
        d[0] = s[b], d[1] = s[g], d[2] = s[r];
      } else {
        d[0] = s[r], d[1] = s[g], d[2] = s[b];
      }
    }
  }

 private:
  Shape in_shape_, out_shape_;
  int64_t in_c_ = 3, out_c_ = 3;
  int r_ = 0, g_ = 1, b_ = 2;
  bool to_gray_ = false, to_bgr_ = false;
};

// ---------------------------------------------------------------- crop and layout changes

class CropKernel final : public Kernel {
 public:
  explicit CropKernel(const KernelBuildContext& ctx)
      : in_shape_(ctx.input_shapes[0]), out_shape_(ctx.output_shapes[0]) {
    in_ = DimsOf(in_shape_);
    out_ = DimsOf(out_shape_);
    top_ = ctx.node.GetInt("top", 0);
    left_ = ctx.node.GetInt("left", 0);
    pixel_bytes_ = in_.c * DTypeSize(ctx.input_dtypes[0]);
  }
  const char* Name() const override { return "CropImageCopy"; }
  void Run(KernelContext& ctx) override {
    CheckShapes(ctx, in_shape_, out_shape_, Name());
    if (ctx.Out(0).numel() == 0) return;
    const char* src = static_cast<const char*>(ctx.In(0).raw());
    char* dst = static_cast<char*>(ctx.Out(0).raw());
    const int64_t rows = out_.n * out_.h;
    const size_t row_bytes = out_.w * pixel_bytes_;
#pragma omp parallel for schedule(static) if (static_cast <int64_t>(rows * row_bytes) >= 4 * kMinParallelElements)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t b = r / out_.h, y = r % out_.h;
      std::memcpy(dst + r * row_bytes, src + ((b * in_.h + y + top_) * in_.w + left_) * pixel_bytes_, row_bytes);
    }
  }

 private:
  Shape in_shape_, out_shape_;
  ImageDims in_{}, out_{};
  int64_t top_ = 0, left_ = 0;
  size_t pixel_bytes_ = 0;
};

// [N,] H, W, C <-> [N,] C, H, W. Parallel over (image, row of the HWC side).
template <class T>
class TransposeImageKernel final : public Kernel {
 public:
  TransposeImageKernel(const KernelBuildContext& ctx, bool to_chw)
      : in_shape_(ctx.input_shapes[0]), out_shape_(ctx.output_shapes[0]), to_chw_(to_chw) {
    hwc_ = DimsOf(to_chw ? in_shape_ : out_shape_);
  }
  const char* Name() const override {
    if (to_chw_) return std::is_same_v<T, uint8_t> ? "HwcToChwU8" : "HwcToChwF32";
    return std::is_same_v<T, uint8_t> ? "ChwToHwcU8" : "ChwToHwcF32";
  }
  void Run(KernelContext& ctx) override {
    CheckShapes(ctx, in_shape_, out_shape_, Name());
    if (ctx.Out(0).numel() == 0) return;
    const ImageDims d = hwc_;
    const int64_t rows = d.n * d.h, plane = d.h * d.w;
    const T* src = ctx.In(0).data<T>();
    T* dst = ctx.Out(0).data<T>();
    const bool to_chw = to_chw_;
#pragma omp parallel for schedule(static) if (rows * d.w * d.c >= kMinParallelElements)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t b = r / d.h, y = r % d.h;
      const int64_t hwc_row = r * d.w * d.c, chw_row = b * d.c * plane + y * d.w;
      for (int64_t ch = 0; ch < d.c; ++ch) {
        if (to_chw) {
          const T* s = src + hwc_row + ch;
          T* o = dst + chw_row + ch * plane;
          for (int64_t x = 0; x < d.w; ++x) o[x] = s[x * d.c];
        } else {
          const T* s = src + chw_row + ch * plane;
          T* o = dst + hwc_row + ch;
          for (int64_t x = 0; x < d.w; ++x) o[x * d.c] = s[x];
        }
      }
    }
  }

 private:
  Shape in_shape_, out_shape_;
  bool to_chw_;
  ImageDims hwc_{};
};

template <template <class> class K, class... Args>
std::unique_ptr<Kernel> ByDType(DType t, Args&&... args) {
  if (t == DType::kU8) return std::make_unique<K<uint8_t>>(std::forward<Args>(args)...);
  if (t == DType::kF32) return std::make_unique<K<float>>(std::forward<Args>(args)...);
  return nullptr;
}

}  // namespace

std::unique_ptr<Kernel> CreateImageKernel(const KernelBuildContext& ctx) {
  if (ctx.input_dtypes.empty() || ctx.input_shapes.empty() || ctx.output_shapes.empty()) return nullptr;
  for (size_t i = 0; i < ctx.input_layouts.size(); ++i)
    if (ctx.input_layouts[i] != Layout::kPlain) return nullptr;
  for (size_t i = 0; i < ctx.output_layouts.size(); ++i)
    if (ctx.output_layouts[i] != Layout::kPlain) return nullptr;
  const DType dtype = ctx.input_dtypes[0];
  const Shape& in = ctx.input_shapes[0];
  if ((dtype != DType::kU8 && dtype != DType::kF32) || (in.size() != 3 && in.size() != 4)) return nullptr;
  const std::string& op = ctx.node.op_type;
  if (op == "ResizeImage") {
    const std::string mode = ctx.node.GetString("mode", "bilinear");
    if (mode == "nearest") return std::make_unique<ResizeNearestKernel>(ctx);
    return ByDType<ResizeSeparableKernel>(dtype, ctx, mode, ctx.node.GetInt("antialias", 1) != 0);
  }
  if (op == "WarpAffine") return ByDType<WarpAffineKernel>(dtype, ctx);
  if (op == "NormalizeImage") return ByDType<NormalizeKernel>(dtype, ctx);
  if (op == "ColorConvert") return ByDType<ColorConvertKernel>(dtype, ctx);
  if (op == "CropImage") return std::make_unique<CropKernel>(ctx);
  if (op == "HwcToChw") return ByDType<TransposeImageKernel>(dtype, ctx, true);
  if (op == "ChwToHwc") return ByDType<TransposeImageKernel>(dtype, ctx, false);
  return nullptr;
}

}  // namespace osprey

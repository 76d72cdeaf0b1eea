// Reference kernels of the osprey-domain image ops (docs/image-ops.md): plain per-pixel loops in double precision,
// the oracle for the fast kernels in src/kernels/cpu/image_kernels.cc. Shapes and attributes were validated by the
// schemas in src/ops/image.cc.
//
// Resampling: one-dimensional taps per axis (the rules in src/ops/resize_taps.h, shared with the fast kernels); a
// 2-D output pixel is the weighted sum over the product of the row taps and column taps.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/reference/reference.h"
#include "ops/op_registry.h"
#include "ops/resize_taps.h"

namespace osprey {
namespace {

// Geometry of an HWC / NHWC tensor.
struct ImageDims {
  int64_t n, h, w, c;
};

ImageDims DimsOf(const Shape& s) {
  if (s.size() == 4) return {s[0], s[1], s[2], s[3]};
  return {1, s[0], s[1], s[2]};
}

template <class T>
T StoreAs(double v) {
  if constexpr (std::is_same_v<T, uint8_t>) {
    if (!(v > 0.0)) return 0;  // also NaN
    if (v >= 255.0) return 255;
    return static_cast<uint8_t>(std::floor(v + 0.5));
  } else {
    return static_cast<T>(v);
  }
}

template <class T>
void ResizeRef(KernelContext& ctx) {
  const Node& node = ctx.node;
  const std::string mode = node.GetString("mode", "bilinear");
  const bool antialias = node.GetInt("antialias", 1) != 0;
  const ImageDims in = DimsOf(ctx.In(0).shape()), out = DimsOf(ctx.Out(0).shape());
  // The output is the window [roi_top, +out.h) x [roi_left, +out.w) of the full height x width resize.
  const int64_t full_h = node.GetInt("height", out.h), full_w = node.GetInt("width", out.w);
  const int64_t top = node.GetInt("roi_top", 0), left = node.GetInt("roi_left", 0);
  const bool area_shrinks = in.h >= full_h && in.w >= full_w;
  std::vector<std::vector<ResizeTap>> row_taps(out.h), col_taps(out.w);
  for (int64_t y = 0; y < out.h; ++y) ResizeTaps(mode, antialias, area_shrinks, in.h, full_h, top + y, row_taps[y]);
  for (int64_t x = 0; x < out.w; ++x) ResizeTaps(mode, antialias, area_shrinks, in.w, full_w, left + x, col_taps[x]);
  const T* src = ctx.In(0).data<T>();
  T* dst = ctx.Out(0).data<T>();
  const int64_t c = in.c;
  for (int64_t b = 0; b < in.n; ++b) {
    const T* image = src + b * in.h * in.w * c;
    for (int64_t y = 0; y < out.h; ++y)
      for (int64_t x = 0; x < out.w; ++x)
        for (int64_t ch = 0; ch < c; ++ch) {
          double sum = 0.0;
          for (const ResizeTap& ty : row_taps[y])
            for (const ResizeTap& tx : col_taps[x])
              sum += ty.weight * tx.weight * static_cast<double>(image[(ty.index * in.w + tx.index) * c + ch]);
          dst[((b * out.h + y) * out.w + x) * c + ch] = StoreAs<T>(sum);
        }
  }
}

// Generic gather: out(b, y, x, ch) = in(b, map(y, x), ch). Used by crop, flip, rotate and pad (with a constant).
template <class T, class Map>
void Gather(KernelContext& ctx, Map map, double fill = 0.0) {
  const ImageDims in = DimsOf(ctx.In(0).shape()), out = DimsOf(ctx.Out(0).shape());
  const T* src = ctx.In(0).data<T>();
  T* dst = ctx.Out(0).data<T>();
  const T fill_value = StoreAs<T>(fill);
  for (int64_t b = 0; b < out.n; ++b)
    for (int64_t y = 0; y < out.h; ++y)
      for (int64_t x = 0; x < out.w; ++x) {
        int64_t sy, sx;
        const bool inside = map(y, x, &sy, &sx);
        for (int64_t ch = 0; ch < out.c; ++ch)
          dst[((b * out.h + y) * out.w + x) * out.c + ch] =
              inside ? src[((b * in.h + sy) * in.w + sx) * in.c + ch] : fill_value;
      }
}

template <class T>
void CropRef(KernelContext& ctx) {
  const int64_t top = ctx.node.GetInt("top", 0), left = ctx.node.GetInt("left", 0);
  Gather<T>(ctx, [&](int64_t y, int64_t x, int64_t* sy, int64_t* sx) {
    *sy = y + top;
    *sx = x + left;
    return true;
  });
}

// numpy.pad index rules: "edge" clamps, "reflect" mirrors about the edge pixel without repeating it.
int64_t PadSource(int64_t i, int64_t n, bool reflect) {
  if (!reflect || n == 1) return std::clamp<int64_t>(i, 0, n - 1);
  const int64_t period = 2 * (n - 1);
  int64_t m = i % period;
  if (m < 0) m += period;
  return m < n ? m : period - m;
}

template <class T>
void PadRef(KernelContext& ctx) {
  const int64_t top = ctx.node.GetInt("top", 0), left = ctx.node.GetInt("left", 0);
  const std::string mode = ctx.node.GetString("mode", "constant");
  const ImageDims in = DimsOf(ctx.In(0).shape());
  Gather<T>(
      ctx,
      [&](int64_t y, int64_t x, int64_t* sy, int64_t* sx) {
        const int64_t iy = y - top, ix = x - left;
        if (mode == "constant") {
          *sy = iy;
          *sx = ix;
          return iy >= 0 && iy < in.h && ix >= 0 && ix < in.w;
        }
        *sy = PadSource(iy, in.h, mode == "reflect");
        *sx = PadSource(ix, in.w, mode == "reflect");
        return true;
      },
      ctx.node.GetFloat("value", 0.f));
}

template <class T>
void FlipRef(KernelContext& ctx) {
  const bool horizontal = ctx.node.GetInt("horizontal", 1) != 0, vertical = ctx.node.GetInt("vertical", 0) != 0;
  const ImageDims in = DimsOf(ctx.In(0).shape());
  Gather<T>(ctx, [&](int64_t y, int64_t x, int64_t* sy, int64_t* sx) {
    *sy = vertical ? in.h - 1 - y : y;
    *sx = horizontal ? in.w - 1 - x : x;
    return true;
  });
}

// numpy.rot90(image, k, axes=(0, 1)) for one quarter turn count k in 0..3.
template <class T>
void Rotate90Ref(KernelContext& ctx) {
  const int64_t k = ((ctx.node.GetInt("k", 0) % 4) + 4) % 4;
  const ImageDims in = DimsOf(ctx.In(0).shape());
  Gather<T>(ctx, [&](int64_t y, int64_t x, int64_t* sy, int64_t* sx) {
    switch (k) {
      case 0: *sy = y, *sx = x; break;
      case 1: *sy = x, *sx = in.w - 1 - y; break;
      case 2: *sy = in.h - 1 - y, *sx = in.w - 1 - x; break;
      default: *sy = in.h - 1 - x, *sx = y; break;
    }
    return true;
  });
}

template <class T>
void WarpAffineRef(KernelContext& ctx) {
  const std::vector<float> mf = ctx.node.GetFloats("matrix");
  const double m[6] = {mf[0], mf[1], mf[2], mf[3], mf[4], mf[5]};
  const bool nearest = ctx.node.GetString("mode", "bilinear") == "nearest";
  const double border = ctx.node.GetFloat("border_value", 0.f);
  const ImageDims in = DimsOf(ctx.In(0).shape()), out = DimsOf(ctx.Out(0).shape());
  const T* src = ctx.In(0).data<T>();
  T* dst = ctx.Out(0).data<T>();
  for (int64_t b = 0; b < out.n; ++b) {
    const T* image = src + b * in.h * in.w * in.c;
    auto at = [&](int64_t y, int64_t x, int64_t ch) -> double {
      if (y < 0 || y >= in.h || x < 0 || x >= in.w) return border;
      return static_cast<double>(image[(y * in.w + x) * in.c + ch]);
    };
    for (int64_t y = 0; y < out.h; ++y)
      for (int64_t x = 0; x < out.w; ++x) {
        const double xi = m[0] * x + m[1] * y + m[2], yi = m[3] * x + m[4] * y + m[5];
        T* d = dst + ((b * out.h + y) * out.w + x) * out.c;
        for (int64_t ch = 0; ch < out.c; ++ch) {
          // Far-away coordinates are clamped before conversion; any tap there is outside the image anyway.
          const double xc = std::clamp(xi, -2.0, static_cast<double>(in.w) + 1.0);
          const double yc = std::clamp(yi, -2.0, static_cast<double>(in.h) + 1.0);
          if (nearest) {
            d[ch] = StoreAs<T>(at(static_cast<int64_t>(std::floor(yc + 0.5)),
                                  static_cast<int64_t>(std::floor(xc + 0.5)), ch));
            continue;
          }
          const int64_t x0 = static_cast<int64_t>(std::floor(xc)), y0 = static_cast<int64_t>(std::floor(yc));
          const double fx = xc - x0, fy = yc - y0;
          const double v = (1 - fy) * ((1 - fx) * at(y0, x0, ch) + fx * at(y0, x0 + 1, ch)) +
                           fy * ((1 - fx) * at(y0 + 1, x0, ch) + fx * at(y0 + 1, x0 + 1, ch));
          d[ch] = StoreAs<T>(v);
        }
      }
  }
}

// Source channel of R, G and B in a colour space.
void RgbIndices(const std::string& space, int idx[3]) {
  if (space == "GRAY") idx[0] = idx[1] = idx[2] = 0;
  else if (space == "BGR" || space == "BGRA") idx[0] = 2, idx[1] = 1, idx[2] = 0;
  else idx[0] = 0, idx[1] = 1, idx[2] = 2;
}

template <class T>
void ColorConvertRef(KernelContext& ctx) {
  const std::string from = ctx.node.GetString("from", ""), to = ctx.node.GetString("to", "");
  const ImageDims in = DimsOf(ctx.In(0).shape()), out = DimsOf(ctx.Out(0).shape());
  int idx[3];
  RgbIndices(from, idx);
  const T* src = ctx.In(0).data<T>();
  T* dst = ctx.Out(0).data<T>();
  const int64_t pixels = in.n * in.h * in.w;
  for (int64_t p = 0; p < pixels; ++p) {
    const T* s = src + p * in.c;
    T* d = dst + p * out.c;
    const T r = s[idx[0]], g = s[idx[1]], b = s[idx[2]];
    if (to == "RGB") {
      d[0] = r, d[1] = g, d[2] = b;
    } else if (to == "BGR") {
      d[0] = b, d[1] = g, d[2] = r;
    } else if (from == "GRAY") {
      d[0] = s[0];
    } else if constexpr (std::is_same_v<T, uint8_t>) {
      // OpenCV's rounding of 0.299 R + 0.587 G + 0.114 B with 15-bit coefficients (bit-exact with cv2.cvtColor).
      d[0] = static_cast<uint8_t>((r * 9798 + g * 19235 + b * 3735 + (1 << 14)) >> 15);
    } else {
      d[0] = 0.299f * r + 0.587f * g + 0.114f * b;
    }
  }
}

template <class T>
void NormalizeRef(KernelContext& ctx) {
  const ImageDims in = DimsOf(ctx.In(0).shape());
  const float scale = ctx.node.GetFloat("scale", 1.f);
  std::vector<float> mean = ctx.node.GetFloats("mean"), std = ctx.node.GetFloats("std");
  mean.resize(in.c, mean.size() == 1 ? mean[0] : 0.f);
  std.resize(in.c, std.size() == 1 ? std[0] : 1.f);
  const bool chw = ctx.node.GetString("layout", "CHW") == "CHW";
  const T* src = ctx.In(0).data<T>();
  float* dst = ctx.Out(0).data<float>();
  for (int64_t b = 0; b < in.n; ++b)
    for (int64_t y = 0; y < in.h; ++y)
      for (int64_t x = 0; x < in.w; ++x)
        for (int64_t ch = 0; ch < in.c; ++ch) {
          const float v = (static_cast<float>(src[((b * in.h + y) * in.w + x) * in.c + ch]) * scale - mean[ch]) /
                          std[ch];
          const int64_t o = chw ? ((b * in.c + ch) * in.h + y) * in.w + x : ((b * in.h + y) * in.w + x) * in.c + ch;
          dst[o] = v;
        }
}

// [N,] A, B, C -> [N,] C, A, B when `to_chw`, else [N,] A, B, C -> [N,] B, C, A. Element size only matters.
void TransposeImageRef(KernelContext& ctx, bool to_chw) {
  const ImageDims d = DimsOf(ctx.In(0).shape());  // (n, a, b, c) of the input
  const size_t es = DTypeSize(ctx.In(0).dtype());
  const char* src = static_cast<const char*>(ctx.In(0).raw());
  char* dst = static_cast<char*>(ctx.Out(0).raw());
  for (int64_t n = 0; n < d.n; ++n)
    for (int64_t a = 0; a < d.h; ++a)
      for (int64_t b = 0; b < d.w; ++b)
        for (int64_t c = 0; c < d.c; ++c) {
          const int64_t i = ((n * d.h + a) * d.w + b) * d.c + c;
          const int64_t o = to_chw ? ((n * d.c + c) * d.h + a) * d.w + b : ((n * d.w + b) * d.c + c) * d.h + a;
          std::memcpy(dst + o * es, src + i * es, es);
        }
}

template <template <class> class Fn>
void ByDType(KernelContext& ctx) {
  if (ctx.In(0).dtype() == DType::kU8) return Fn<uint8_t>::Run(ctx);
  if (ctx.In(0).dtype() == DType::kF32) return Fn<float>::Run(ctx);
  throw Error(ErrorCode::kInvalidArgument,
              ctx.node.Describe() + ": image must be uint8 or float32, got " + DTypeName(ctx.In(0).dtype()));
}

#define OSPREY_IMAGE_KERNEL(Name, fn)           \
  template <class T>                            \
  struct Name {                                 \
    static void Run(KernelContext& ctx) { fn<T>(ctx); } \
  };
OSPREY_IMAGE_KERNEL(ResizeK, ResizeRef)
OSPREY_IMAGE_KERNEL(CropK, CropRef)
OSPREY_IMAGE_KERNEL(PadK, PadRef)
OSPREY_IMAGE_KERNEL(FlipK, FlipRef)
OSPREY_IMAGE_KERNEL(Rotate90K, Rotate90Ref)
OSPREY_IMAGE_KERNEL(WarpAffineK, WarpAffineRef)
OSPREY_IMAGE_KERNEL(ColorConvertK, ColorConvertRef)
OSPREY_IMAGE_KERNEL(NormalizeK, NormalizeRef)
#undef OSPREY_IMAGE_KERNEL

}  // namespace

void AddImageReferenceKernels(ReferenceKernelTable& t) {
  t.Add("ResizeImage", ByDType<ResizeK>);
  t.Add("CropImage", ByDType<CropK>);
  t.Add("PadImage", ByDType<PadK>);
  t.Add("FlipImage", ByDType<FlipK>);
  t.Add("Rotate90", ByDType<Rotate90K>);
  t.Add("WarpAffine", ByDType<WarpAffineK>);
  t.Add("ColorConvert", ByDType<ColorConvertK>);
  t.Add("NormalizeImage", ByDType<NormalizeK>);
  t.Add("HwcToChw", [](KernelContext& ctx) { TransposeImageRef(ctx, true); });
  t.Add("ChwToHwc", [](KernelContext& ctx) { TransposeImageRef(ctx, false); });
}

}  // namespace osprey

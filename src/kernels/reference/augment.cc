// Reference kernels of the augmentation image ops (docs/augment.md): plain loops, the oracle for the fast kernels of
// WarpPerspective and GaussianBlur (src/kernels/cpu/augment_kernels.cc) and of ShiftHSV, AdjustSaturation and
// AdjustContrast (src/kernels/cpu/augment_color_kernels.cc, bit-identical). The other ops have no fast kernel.
// Shapes and attributes were validated by the schemas in src/ops/augment_ops.cc.
//
// Arithmetic follows what the augmentation must match:
// - WarpPerspective: OpenCV's warpPerspective with WARP_INVERSE_MAP. The source position is rounded to 1/32 pixel
//   (cvRound(x * 32 / w), ties to even) and bilinear weights are products of those 1/32 fractions, so the uint8
//   result is exact (a multiple of 1/1024) and rounds half up: bit-exact with OpenCV. Nearest rounds the position
//   (ties to even). Border indices as cv::borderInterpolate.
// - GaussianBlur: cv::getGaussianKernel taps, separable, BORDER_REFLECT_101. OpenCV's uint8 path quantises its taps
//   to 8 fractional bits, so a uint8 result may differ from it by 1.
// - AdjustContrast / LookupTable-style arithmetic: albucore's float32 lookup tables (truncating), as Albumentations.
// - ShiftHSV: OpenCV's uint8 RGB <-> HSV (H in [0, 180)) with Albumentations' shifts.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/reference/reference.h"
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

// Round half away from zero and saturate (the doc's uint8 rule).
uint8_t SaturateU8(double v) {
  if (!(v > 0.0)) return 0;
  if (v >= 255.0) return 255;
  return static_cast<uint8_t>(std::floor(v + 0.5));
}

template <class T>
T StoreAs(double v) {
  if constexpr (std::is_same_v<T, uint8_t>) {
    return SaturateU8(v);
  } else {
    return static_cast<T>(v);
  }
}

// ---------------------------------------------------------------- borders

enum class Border { kConstant, kReplicate, kReflect, kReflect101 };

Border BorderOf(const std::string& name) {
  if (name == "replicate") return Border::kReplicate;
  if (name == "reflect") return Border::kReflect;
  if (name == "reflect101") return Border::kReflect101;
  return Border::kConstant;
}

// cv::borderInterpolate: the source index of position i on an axis of n pixels, or -1 (constant border, outside).
int64_t BorderIndex(int64_t i, int64_t n, Border border) {
  if (i >= 0 && i < n) return i;
  switch (border) {
    case Border::kConstant:
      return -1;
    case Border::kReplicate:
      return i < 0 ? 0 : n - 1;
    case Border::kReflect: {  // fedcba|abcdef|fedcba
      const int64_t period = 2 * n;
      int64_t m = i % period;
      if (m < 0) m += period;
      return m < n ? m : period - 1 - m;
    }
    case Border::kReflect101: {  // gfedcb|abcdefg|fedcba
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

template <class T>
void WarpPerspectiveRef(KernelContext& ctx) {
  const std::vector<float> mf = ctx.node.GetFloats("matrix");
  double m[9];
  for (int i = 0; i < 9; ++i) m[i] = mf[i];
  const bool nearest = ctx.node.GetString("mode", "bilinear") == "nearest";
  const Border border = BorderOf(ctx.node.GetString("border_mode", "constant"));
  const double border_value = static_cast<double>(StoreAs<T>(ctx.node.GetFloat("border_value", 0.f)));
  const ImageDims in = DimsOf(ctx.In(0).shape()), out = DimsOf(ctx.Out(0).shape());
  const T* src = ctx.In(0).data<T>();
  T* dst = ctx.Out(0).data<T>();
  constexpr double kIntMin = std::numeric_limits<int>::min(), kIntMax = std::numeric_limits<int>::max();
  for (int64_t b = 0; b < out.n; ++b) {
    const T* image = src + b * in.h * in.w * in.c;
    auto at = [&](int64_t y, int64_t x, int64_t ch) -> double {
      const int64_t sy = BorderIndex(y, in.h, border), sx = BorderIndex(x, in.w, border);
      if (sy < 0 || sx < 0) return border_value;
      return static_cast<double>(image[(sy * in.w + sx) * in.c + ch]);
    };
    for (int64_t y = 0; y < out.h; ++y)
      for (int64_t x = 0; x < out.w; ++x) {
        // OpenCV's order of operations (the row part first), so the fast kernel's per-row increments are exact.
        const double xw = m[0] * x + (m[1] * y + m[2]);
        const double yw = m[3] * x + (m[4] * y + m[5]);
        const double w = m[6] * x + (m[7] * y + m[8]);
        T* d = dst + ((b * out.h + y) * out.w + x) * out.c;
        const double scale = w != 0.0 ? (nearest ? 1.0 : 32.0) / w : 0.0;
        const int64_t qx = static_cast<int64_t>(std::nearbyint(std::clamp(xw * scale, kIntMin, kIntMax)));
        const int64_t qy = static_cast<int64_t>(std::nearbyint(std::clamp(yw * scale, kIntMin, kIntMax)));
        if (nearest) {
          for (int64_t ch = 0; ch < out.c; ++ch) d[ch] = static_cast<T>(at(qy, qx, ch));
          continue;
        }
        // Position in 1/32 pixels: integer part floor(q / 32), fraction (q mod 32) / 32.
        const int64_t x0 = qx >> 5, y0 = qy >> 5;
        const double fx = (qx & 31) / 32.0, fy = (qy & 31) / 32.0;
        for (int64_t ch = 0; ch < out.c; ++ch) {
          const double v = (1 - fy) * ((1 - fx) * at(y0, x0, ch) + fx * at(y0, x0 + 1, ch)) +
                           fy * ((1 - fx) * at(y0 + 1, x0, ch) + fx * at(y0 + 1, x0 + 1, ch));
          d[ch] = StoreAs<T>(v);
        }
      }
  }
}

// ---------------------------------------------------------------- GaussianBlur

template <class T>
void GaussianBlurRef(KernelContext& ctx) {
  const GaussianBlurTaps taps = GaussianBlurKernels(ctx.node, std::is_same_v<T, uint8_t>);
  const ImageDims d = DimsOf(ctx.In(0).shape());
  const int64_t rx = static_cast<int64_t>(taps.x.size()) / 2, ry = static_cast<int64_t>(taps.y.size()) / 2;
  const int64_t row = d.w * d.c;
  std::vector<double> tmp(d.h * row);
  for (int64_t b = 0; b < d.n; ++b) {
    const T* src = ctx.In(0).data<T>() + b * d.h * row;
    T* dst = ctx.Out(0).data<T>() + b * d.h * row;
    for (int64_t y = 0; y < d.h; ++y)
      for (int64_t x = 0; x < d.w; ++x)
        for (int64_t ch = 0; ch < d.c; ++ch) {
          double sum = 0;
          for (int64_t k = 0; k < static_cast<int64_t>(taps.x.size()); ++k)
            sum += taps.x[k] * src[y * row + BorderIndex(x + k - rx, d.w, Border::kReflect101) * d.c + ch];
          tmp[y * row + x * d.c + ch] = sum;
        }
    for (int64_t y = 0; y < d.h; ++y)
      for (int64_t i = 0; i < row; ++i) {
        double sum = 0;
        for (int64_t k = 0; k < static_cast<int64_t>(taps.y.size()); ++k)
          sum += taps.y[k] * tmp[BorderIndex(y + k - ry, d.h, Border::kReflect101) * row + i];
        dst[y * row + i] = StoreAs<T>(sum);
      }
  }
}

// ---------------------------------------------------------------- MedianBlur

// cv2.medianBlur: the median of the ksize x ksize window of each channel, BORDER_REPLICATE (uint8).
void MedianBlurRef(KernelContext& ctx) {
  const int64_t k = ctx.node.GetInt("ksize", 3), r = k / 2;
  const ImageDims d = DimsOf(ctx.In(0).shape());
  const int64_t row = d.w * d.c;
  std::vector<uint8_t> window(static_cast<size_t>(k * k));
  for (int64_t b = 0; b < d.n; ++b) {
    const uint8_t* src = ctx.In(0).data<uint8_t>() + b * d.h * row;
    uint8_t* dst = ctx.Out(0).data<uint8_t>() + b * d.h * row;
    for (int64_t y = 0; y < d.h; ++y)
      for (int64_t x = 0; x < d.w; ++x)
        for (int64_t ch = 0; ch < d.c; ++ch) {
          size_t n = 0;
          for (int64_t dy = -r; dy <= r; ++dy)
            for (int64_t dx = -r; dx <= r; ++dx)
              window[n++] = src[BorderIndex(y + dy, d.h, Border::kReplicate) * row +
                                BorderIndex(x + dx, d.w, Border::kReplicate) * d.c + ch];
          std::nth_element(window.begin(), window.begin() + n / 2, window.end());
          dst[y * row + x * d.c + ch] = window[n / 2];
        }
  }
}

// ---------------------------------------------------------------- point operations (uint8)

// cv::cvtColor RGB -> GRAY for uint8: 0.299 R + 0.587 G + 0.114 B with OpenCV's 15-bit coefficients.
inline int GrayU8(int r, int g, int b) { return (r * 9798 + g * 19235 + b * 3735 + (1 << 14)) >> 15; }

void LookupTableRef(KernelContext& ctx) {
  const std::vector<int64_t> table = ctx.node.GetInts("table");
  const ImageDims d = DimsOf(ctx.In(0).shape());
  const bool per_channel = static_cast<int64_t>(table.size()) == 256 * d.c && d.c > 1;
  std::vector<uint8_t> lut(table.begin(), table.end());
  const uint8_t* src = ctx.In(0).data<uint8_t>();
  uint8_t* dst = ctx.Out(0).data<uint8_t>();
  const int64_t n = ctx.In(0).numel();
  if (!per_channel) {
    for (int64_t i = 0; i < n; ++i) dst[i] = lut[src[i]];
    return;
  }
  for (int64_t p = 0; p < n; p += d.c)
    for (int64_t ch = 0; ch < d.c; ++ch) dst[p + ch] = lut[ch * 256 + src[p + ch]];
}

// Albumentations' ColorJitter contrast (adjust_contrast_torchvision): m = mean of the uint8 gray image; factor 0 gives
// round(m) everywhere; otherwise albucore's float32 table clip(v * factor + m * (1 - factor)), truncated to uint8.
void AdjustContrastRef(KernelContext& ctx) {
  const double factor = ctx.node.GetFloat("factor", 1.f);
  const ImageDims d = DimsOf(ctx.In(0).shape());
  const int64_t pixels = d.h * d.w;
  for (int64_t b = 0; b < d.n; ++b) {
    const uint8_t* src = ctx.In(0).data<uint8_t>() + b * pixels * d.c;
    uint8_t* dst = ctx.Out(0).data<uint8_t>() + b * pixels * d.c;
    int64_t sum = 0;
    for (int64_t p = 0; p < pixels; ++p) {
      const uint8_t* s = src + p * d.c;
      sum += d.c == 3 ? GrayU8(s[0], s[1], s[2]) : s[0];
    }
    const double mean = static_cast<double>(sum) / static_cast<double>(pixels);
    uint8_t lut[256];
    for (int v = 0; v < 256; ++v) {
      if (factor == 0.0) {
        lut[v] = static_cast<uint8_t>(static_cast<int>(mean + 0.5));
        continue;
      }
      const float f = static_cast<float>(v) * static_cast<float>(factor) + static_cast<float>(mean * (1.0 - factor));
      lut[v] = static_cast<uint8_t>(std::clamp(f, 0.f, 255.f));
    }
    for (int64_t i = 0; i < pixels * d.c; ++i) dst[i] = lut[src[i]];
  }
}

// Albumentations' ColorJitter saturation: cv2.addWeighted(x, factor, gray, 1 - factor, 0) per channel with the uint8
// gray of the pixel, in float32, rounded half to even as OpenCV. C = 1: the input.
void AdjustSaturationRef(KernelContext& ctx) {
  const double factor = ctx.node.GetFloat("factor", 1.f);
  const ImageDims d = DimsOf(ctx.In(0).shape());
  const uint8_t* src = ctx.In(0).data<uint8_t>();
  uint8_t* dst = ctx.Out(0).data<uint8_t>();
  const int64_t pixels = d.n * d.h * d.w;
  if (d.c == 1) {
    std::memcpy(dst, src, pixels);
    return;
  }
  const float alpha = static_cast<float>(factor), beta = static_cast<float>(1.0 - factor);
  float scaled[256], gray_part[256];
  for (int v = 0; v < 256; ++v) scaled[v] = static_cast<float>(v) * alpha, gray_part[v] = static_cast<float>(v) * beta;
  for (int64_t p = 0; p < pixels; ++p) {
    const uint8_t* s = src + p * 3;
    uint8_t* o = dst + p * 3;
    const float g = gray_part[GrayU8(s[0], s[1], s[2])];
    // saturate_cast<uchar>(float): round half to even (factors like 1.5 hit exact halves often).
    for (int ch = 0; ch < 3; ++ch)
      o[ch] = static_cast<uint8_t>(std::clamp<long>(std::lrint(scaled[s[ch]] + g), 0, 255));
  }
}

// OpenCV's uint8 RGB -> HSV tables (color_hsv.simd.hpp, hsv_shift = 12, hue range 180).
struct HsvTables {
  int sdiv[256], hdiv[256];
  HsvTables() {
    sdiv[0] = hdiv[0] = 0;
    for (int i = 1; i < 256; ++i) {
      sdiv[i] = static_cast<int>(std::nearbyint((255 << 12) / (1.0 * i)));
      hdiv[i] = static_cast<int>(std::nearbyint((180 << 12) / (6.0 * i)));
    }
  }
};

// Albumentations' HueSaturationValue / ColorJitter hue on uint8: RGB -> HSV (OpenCV), H = floor((H + hue) mod 180),
// S = clip(S + trunc(saturation)), V = clip(V + trunc(value)) (albucore add_constant), HSV -> RGB (OpenCV, float).
void ShiftHsvRef(KernelContext& ctx) {
  static const HsvTables tables;
  const double hue = ctx.node.GetFloat("hue", 0.f);
  if (hue == 0.0 && ctx.node.GetFloat("saturation", 0.f) == 0.f && ctx.node.GetFloat("value", 0.f) == 0.f) {
    // Albumentations returns the image untouched (no HSV round trip) when every shift is 0.
    std::memcpy(ctx.Out(0).raw(), ctx.In(0).raw(), ctx.In(0).numel());
    return;
  }
  const int sat = static_cast<int>(std::trunc(ctx.node.GetFloat("saturation", 0.f)));
  const int val = static_cast<int>(std::trunc(ctx.node.GetFloat("value", 0.f)));
  uint8_t lut_h[256], lut_s[256], lut_v[256];
  for (int v = 0; v < 256; ++v) {
    double h = std::fmod(v + hue, 180.0);
    if (h < 0) h += 180.0;
    lut_h[v] = static_cast<uint8_t>(std::min(std::floor(h), 179.0));
    lut_s[v] = static_cast<uint8_t>(std::clamp(v + sat, 0, 255));
    lut_v[v] = static_cast<uint8_t>(std::clamp(v + val, 0, 255));
  }
  const int64_t pixels = ctx.In(0).numel() / 3;
  const uint8_t* src = ctx.In(0).data<uint8_t>();
  uint8_t* dst = ctx.Out(0).data<uint8_t>();
  static const int kSector[6][3] = {{1, 3, 0}, {1, 0, 2}, {3, 0, 1}, {0, 2, 1}, {0, 1, 3}, {2, 1, 0}};
  for (int64_t p = 0; p < pixels; ++p) {
    const int r = src[p * 3], g = src[p * 3 + 1], b = src[p * 3 + 2];
    // RGB -> HSV, OpenCV RGB2HSV_b.
    const int v = std::max({r, g, b}), vmin = std::min({r, g, b}), diff = v - vmin;
    const int s = (diff * tables.sdiv[v] + (1 << 11)) >> 12;
    int h = v == r ? g - b : v == g ? b - r + 2 * diff : r - g + 4 * diff;
    h = (h * tables.hdiv[diff] + (1 << 11)) >> 12;
    if (h < 0) h += 180;
    // Shifts.
    const float hf = static_cast<float>(lut_h[h]);
    const float sf = static_cast<float>(lut_s[s]) * (1.f / 255.f), vf = static_cast<float>(lut_v[v]) * (1.f / 255.f);
    // HSV -> RGB, OpenCV HSV2RGB_b (float, hue scale 6 / 180).
    float rgb_b, rgb_g, rgb_r;
    if (sf == 0.f) {
      rgb_b = rgb_g = rgb_r = vf;
    } else {
      float hh = hf * (6.f / 180.f);
      int sector = static_cast<int>(std::floor(hh));
      hh -= static_cast<float>(sector);
      if (sector < 0 || sector >= 6) sector = 0, hh = 0.f;
      // OpenCV's code (AVX2 dispatch) fuses 1 - s * h into one FMA; the product of two floats is exact in double,
      // so computing it there and rounding once matches that bit for bit.
      const float t2 = static_cast<float>(1.0 - static_cast<double>(sf) * hh);
      const float t3 = static_cast<float>(1.0 - static_cast<double>(sf) * (1.f - hh));
      const float tab[4] = {vf, vf * (1.f - sf), vf * t2, vf * t3};
      rgb_b = tab[kSector[sector][0]];
      rgb_g = tab[kSector[sector][1]];
      rgb_r = tab[kSector[sector][2]];
    }
    // OpenCV 4.10's SIMD HSV2RGB_b ends in what equals truncation of x * 255 (checked on every HSV value); only its
    // scalar tail (the last W mod 32 pixels of a row on AVX2) rounds. Truncating everywhere matches it exactly
    // except on that tail, where the result may be 1 higher.
    auto to_u8 = [](float x) { return static_cast<uint8_t>(std::clamp(static_cast<int>(x * 255.f), 0, 255)); };
    dst[p * 3] = to_u8(rgb_r);
    dst[p * 3 + 1] = to_u8(rgb_g);
    dst[p * 3 + 2] = to_u8(rgb_b);
  }
}

// ---------------------------------------------------------------- AddGaussianNoise

// A standard normal variate per (key, counter) pair: splitmix64 of key + counter * golden gamma gives 64 random bits;
// the top 12 pick one of 4096 equal-probability bins of N(0, 1) and the next 24 place the value linearly inside the
// bin (knots at the exact quantiles k / 4096). The two end bins span [a, quantile(1/4096)] with `a` chosen so the
// bin's mean is the tail's conditional mean: the tails are cut at ~3.9 sigma, the variance is 1 to ~1e-4.
constexpr int kNormalBins = 4096;

double NormalCdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

const std::vector<float>& NormalKnots() {
  static const std::vector<float> knots = [] {
    std::vector<double> q(kNormalBins + 1);
    for (int k = 1; k < kNormalBins; ++k) {
      const double p = static_cast<double>(k) / kNormalBins;
      double lo = -10, hi = 10;
      for (int it = 0; it < 80; ++it) {
        const double mid = 0.5 * (lo + hi);
        (NormalCdf(mid) < p ? lo : hi) = mid;
      }
      q[k] = 0.5 * (lo + hi);
    }
    const double pi = 3.14159265358979323846;
    const double tail_mean = -std::exp(-0.5 * q[1] * q[1]) / std::sqrt(2 * pi) / NormalCdf(q[1]);
    q[0] = 2 * tail_mean - q[1];
    q[kNormalBins] = -q[0];
    return std::vector<float>(q.begin(), q.end());
  }();
  return knots;
}

inline uint64_t Mix64(uint64_t z) {
  z ^= z >> 30;
  z *= 0xbf58476d1ce4e5b9ULL;
  z ^= z >> 27;
  z *= 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

inline float NormalAt(const float* knots, uint64_t key, uint64_t counter) {
  const uint64_t bits = Mix64(key + counter * 0x9E3779B97F4A7C15ULL);
  const int bin = static_cast<int>(bits >> 52);
  const float frac = static_cast<float>((bits >> 28) & 0xFFFFFF) * (1.f / 16777216.f);
  return knots[bin] + (knots[bin + 1] - knots[bin]) * frac;
}

template <class T>
void AddGaussianNoiseRef(KernelContext& ctx) {
  const float mean = ctx.node.GetFloat("mean", 0.f), std_dev = ctx.node.GetFloat("std", 0.f);
  const bool per_channel = ctx.node.GetInt("per_channel", 1) != 0;
  const uint64_t key = Mix64(static_cast<uint64_t>(ctx.node.GetInt("seed", 0)));
  const float* knots = NormalKnots().data();
  const ImageDims d = DimsOf(ctx.In(0).shape());
  const T* src = ctx.In(0).data<T>();
  T* dst = ctx.Out(0).data<T>();
  const int64_t pixels = d.n * d.h * d.w;
  for (int64_t p = 0; p < pixels; ++p)
    for (int64_t ch = 0; ch < d.c; ++ch) {
      // Element index (per channel) or pixel index (one draw shared by the pixel's channels).
      const uint64_t counter = static_cast<uint64_t>(per_channel ? p * d.c + ch : p);
      const float noise = mean + std_dev * NormalAt(knots, key, counter);
      const float v = static_cast<float>(src[p * d.c + ch]) + noise;
      dst[p * d.c + ch] = StoreAs<T>(v);
    }
}

// ---------------------------------------------------------------- FillRects

template <class T>
void FillRectsRef(KernelContext& ctx) {
  const std::vector<int64_t> rects = ctx.node.GetInts("rects");
  const std::vector<float> fill_attr = FillRectsValues(ctx.node);
  const ImageDims d = DimsOf(ctx.In(0).shape());
  std::vector<T> fill(d.c);
  for (int64_t ch = 0; ch < d.c; ++ch) fill[ch] = StoreAs<T>(fill_attr.size() == 1 ? fill_attr[0] : fill_attr[ch]);
  std::memcpy(ctx.Out(0).raw(), ctx.In(0).raw(), ctx.In(0).numel() * sizeof(T));
  for (int64_t b = 0; b < d.n; ++b) {
    T* image = ctx.Out(0).data<T>() + b * d.h * d.w * d.c;
    for (size_t r = 0; r + 3 < rects.size(); r += 4) {
      const int64_t top = std::clamp<int64_t>(rects[r], 0, d.h), bottom = std::clamp<int64_t>(rects[r + 2], 0, d.h);
      const int64_t left = std::clamp<int64_t>(rects[r + 1], 0, d.w), right = std::clamp<int64_t>(rects[r + 3], 0, d.w);
      for (int64_t y = top; y < bottom; ++y)
        for (int64_t x = left; x < right; ++x) std::memcpy(image + (y * d.w + x) * d.c, fill.data(), d.c * sizeof(T));
    }
  }
}

template <template <class> class Fn>
void ByDType(KernelContext& ctx) {
  if (ctx.In(0).dtype() == DType::kU8) return Fn<uint8_t>::Run(ctx);
  if (ctx.In(0).dtype() == DType::kF32) return Fn<float>::Run(ctx);
  throw Error(ErrorCode::kInvalidArgument,
              ctx.node.Describe() + ": image must be uint8 or float32, got " + DTypeName(ctx.In(0).dtype()));
}

void RequireU8(const KernelContext& ctx) {
  if (ctx.In(0).dtype() != DType::kU8)
    throw Error(ErrorCode::kInvalidArgument,
                ctx.node.Describe() + ": image must be uint8, got " + DTypeName(ctx.In(0).dtype()));
}

#define OSPREY_AUGMENT_KERNEL(Name, fn)                 \
  template <class T>                                    \
  struct Name {                                         \
    static void Run(KernelContext& ctx) { fn<T>(ctx); } \
  };
OSPREY_AUGMENT_KERNEL(WarpPerspectiveK, WarpPerspectiveRef)
OSPREY_AUGMENT_KERNEL(GaussianBlurK, GaussianBlurRef)
OSPREY_AUGMENT_KERNEL(AddGaussianNoiseK, AddGaussianNoiseRef)
OSPREY_AUGMENT_KERNEL(FillRectsK, FillRectsRef)
#undef OSPREY_AUGMENT_KERNEL

}  // namespace

void AddAugmentReferenceKernels(ReferenceKernelTable& t) {
  t.Add("WarpPerspective", ByDType<WarpPerspectiveK>);
  t.Add("GaussianBlur", ByDType<GaussianBlurK>);
  t.Add("BoxBlur", ByDType<GaussianBlurK>);  // the same separable kernel, with equal taps (GaussianBlurKernels)
  t.Add("MedianBlur", [](KernelContext& ctx) { RequireU8(ctx), MedianBlurRef(ctx); });
  t.Add("AddGaussianNoise", ByDType<AddGaussianNoiseK>);
  t.Add("FillRects", ByDType<FillRectsK>);
  t.Add("LookupTable", [](KernelContext& ctx) { RequireU8(ctx), LookupTableRef(ctx); });
  t.Add("AdjustContrast", [](KernelContext& ctx) { RequireU8(ctx), AdjustContrastRef(ctx); });
  t.Add("AdjustSaturation", [](KernelContext& ctx) { RequireU8(ctx), AdjustSaturationRef(ctx); });
  t.Add("ShiftHSV", [](KernelContext& ctx) { RequireU8(ctx), ShiftHsvRef(ctx); });
}

}  // namespace osprey

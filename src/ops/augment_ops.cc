// Schemas of the osprey-domain image ops used by augmentation (docs/augment.md, "Image ops used by augmentation"):
// attribute validation and shape/dtype inference. Every op keeps its input's shape and dtype except WarpPerspective
// (output height x width). Images are HWC (rank 3) or NHWC (rank 4). Kernels (src/kernels/reference/augment.cc and
// src/kernels/cpu/augment_kernels.cc) rely on the checks made here.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ops/op_registry.h"
#include "ops/schema_util.h"

namespace osprey {
namespace {

using namespace schema;

// Largest Gaussian kernel side; far beyond any augmentation's blur and keeps a row of taps small.
constexpr int64_t kMaxBlurKernel = 1023;

float RequiredFloat(const InferContext& ctx, const std::string& name) {
  if (!ctx.node.Has(name)) ctx.Fail("attribute '" + name + "' is required");
  return FiniteFloat(ctx, name, ctx.node.GetFloat(name, 0.f));
}

// The image input: rank 3 (HWC) or rank 4 (NHWC), non-empty H and W, of one of the allowed dtypes.
const Shape& ImageInput(const InferContext& ctx, bool allow_f32) {
  if (!ctx.Has(0)) ctx.Fail("input 0 (image) is required");
  const DType t = ctx.input_dtypes[0];
  if (t != DType::kU8 && !(allow_f32 && t == DType::kF32))
    ctx.Fail(std::string("image must be ") + (allow_f32 ? "uint8 or float32" : "uint8") + ", got " + DTypeName(t));
  const Shape& s = ctx.input_shapes[0];
  if (s.size() != 3 && s.size() != 4)
    ctx.Fail("image must be rank 3 (HWC) or rank 4 (NHWC), got shape " + ShapeToString(s));
  const size_t h = s.size() - 3;
  if (s[h] < 1 || s[h + 1] < 1 || s[h + 2] < 1)
    ctx.Fail("image must have at least one row, column and channel, got shape " + ShapeToString(s));
  return s;
}

void RequireChannels(const InferContext& ctx, const Shape& s, std::initializer_list<int64_t> allowed,
                     const char* what) {
  for (int64_t c : allowed)
    if (s.back() == c) return;
  ctx.Fail(std::string("expects ") + what + ", got shape " + ShapeToString(s));
}

// Floats of an attribute written either as floats or as ints (ONNX exporters and Python helpers write [114] as ints).
std::vector<float> FloatsOrInts(const Node& node, const std::string& name) {
  auto it = node.attrs.find(name);
  if (it == node.attrs.end()) return {};
  if (it->second.kind == Attribute::Kind::kInts || it->second.kind == Attribute::Kind::kInt) {
    std::vector<float> out;
    for (int64_t v : node.GetInts(name)) out.push_back(static_cast<float>(v));
    return out;
  }
  if (it->second.kind == Attribute::Kind::kFloat) return {it->second.f};
  return node.GetFloats(name);
}

void InferWarpPerspective(InferContext& ctx) {
  const Shape& s = ImageInput(ctx, true);
  if (!ctx.node.Has("matrix")) ctx.Fail("attribute 'matrix' is required (9 floats, row-major 3x3, output -> input)");
  const std::vector<float> m = ctx.node.GetFloats("matrix");
  if (m.size() != 9) ctx.Fail("attribute 'matrix' must hold 9 floats (3x3, row-major), got " + Str(m.size()));
  for (float v : m) FiniteFloat(ctx, "matrix", v);
  const int64_t h = IntInRange(ctx, "height", RequiredInt(ctx, "height"), 1, kMaxImageDim);
  const int64_t w = IntInRange(ctx, "width", RequiredInt(ctx, "width"), 1, kMaxImageDim);
  OneOf(ctx, "mode", ctx.node.GetString("mode", "bilinear"), {"nearest", "bilinear"});
  OneOf(ctx, "border_mode", ctx.node.GetString("border_mode", "constant"),
        {"constant", "replicate", "reflect", "reflect101"});
  FiniteFloat(ctx, "border_value", ctx.node.GetFloat("border_value", 0.f));
  Shape out = s;
  out[s.size() - 3] = h;
  out[s.size() - 2] = w;
  ctx.SetOutput(0, ctx.input_dtypes[0], out);
}

void InferLookupTable(InferContext& ctx) {
  const Shape& s = ImageInput(ctx, false);
  if (!ctx.node.Has("table")) ctx.Fail("attribute 'table' is required (256 ints, or 256 per channel)");
  const std::vector<int64_t> table = ctx.node.GetInts("table");
  if (table.size() != 256 && static_cast<int64_t>(table.size()) != 256 * s.back())
    ctx.Fail("attribute 'table' must hold 256 values, or 256 per channel (" + Str(256 * s.back()) + "), got " +
             Str(table.size()));
  for (size_t i = 0; i < table.size(); ++i)
    if (table[i] < 0 || table[i] > 255)
      ctx.Fail("attribute 'table' values must be in [0, 255], got " + Str(table[i]) + " at index " + Str(i));
  ctx.SetOutput(0, DType::kU8, s);
}

void InferAdjustContrast(InferContext& ctx) {
  const Shape& s = ImageInput(ctx, false);
  RequireChannels(ctx, s, {1, 3}, "a gray (C = 1) or RGB (C = 3) image");
  if (RequiredFloat(ctx, "factor") < 0.f) ctx.Fail("attribute 'factor' must be >= 0");
  ctx.SetOutput(0, DType::kU8, s);
}

void InferAdjustSaturation(InferContext& ctx) {
  const Shape& s = ImageInput(ctx, false);
  RequireChannels(ctx, s, {1, 3}, "a gray (C = 1) or RGB (C = 3) image");
  if (RequiredFloat(ctx, "factor") < 0.f) ctx.Fail("attribute 'factor' must be >= 0");
  ctx.SetOutput(0, DType::kU8, s);
}

void InferShiftHsv(InferContext& ctx) {
  const Shape& s = ImageInput(ctx, false);
  RequireChannels(ctx, s, {3}, "an RGB image (C = 3); convert gray images to RGB first");
  for (const char* name : {"hue", "saturation", "value"}) {
    const float v = FiniteFloat(ctx, name, ctx.node.GetFloat(name, 0.f));
    if (std::fabs(v) > 1e6f) ctx.Fail(std::string("attribute '") + name + "' must be within +-1e6");
  }
  ctx.SetOutput(0, DType::kU8, s);
}

}  // namespace

int64_t GaussianBlurKernelSize(int64_t ksize, double sigma, bool is_u8) {
  if (ksize > 0 || sigma <= 0) return ksize;
  return static_cast<int64_t>(std::nearbyint(std::min(sigma, 1e6) * (is_u8 ? 3 : 4) * 2 + 1)) | 1;
}

std::vector<double> GaussianKernel1D(int64_t size, double sigma) {
  // cv::getGaussianKernel (OpenCV 4.x): sizes 1 to 9 with sigma <= 0 use fixed tables (in 1/256).
  static const double kSmall[5][9] = {
      {256}, {64, 128, 64}, {16, 64, 96, 64, 16}, {8, 28, 56, 72, 56, 28, 8}, {4, 13, 30, 51, 60, 51, 30, 13, 4}};
  const bool fixed = size % 2 == 1 && size <= 9 && sigma <= 0;
  const double s = sigma > 0 ? sigma : ((size - 1) * 0.5 - 1) * 0.3 + 0.8;
  const double scale2 = -0.5 / (s * s);
  std::vector<double> k(size);
  double sum = 0;
  for (int64_t i = 0; i < size; ++i) {
    const double x = i - (size - 1) * 0.5;
    k[i] = fixed ? kSmall[size >> 1][i] : std::exp(scale2 * x * x);
    sum += k[i];
  }
  for (double& v : k) v /= sum;
  return k;
}

std::vector<double> FixedPointTaps256(const std::vector<double>& taps) {
  // OpenCV's GaussianBlur on CV_8U (getGaussianKernelFixedPoint_ED): from each end toward the centre, every tap is
  // rounded (half to even) after adding the rounding error carried from its outer neighbour; the centre takes what
  // makes the sum exactly 256.
  const size_t n = taps.size(), half = n / 2;
  std::vector<double> out(n);
  double err = 0, sum = 0;
  for (size_t i = 0; i < half; ++i) {
    const double adjusted = taps[i] * 256.0 + err, v = std::nearbyint(adjusted);
    err = adjusted - v;
    out[i] = out[n - 1 - i] = v / 256.0;
    sum += 2 * v;
  }
  out[half] = (256.0 - sum) / 256.0;
  return out;
}

GaussianBlurTaps GaussianBlurKernels(const Node& node, bool is_u8) {
  if (node.op_type == "BoxBlur") {  // cv2.blur: equal taps
    const int64_t kx = std::clamp<int64_t>(node.GetInt("ksize_x", 1), 1, kMaxBlurKernel);
    const int64_t ky = std::clamp<int64_t>(node.GetInt("ksize_y", kx), 1, kMaxBlurKernel);
    return {std::vector<double>(kx, 1.0 / kx), std::vector<double>(ky, 1.0 / ky)};
  }
  const double sx = node.GetFloat("sigma_x", 0.f), sy_attr = node.GetFloat("sigma_y", 0.f);
  const double sy = sy_attr > 0 ? sy_attr : sx;
  const int64_t kx = GaussianBlurKernelSize(node.GetInt("ksize_x", 0), sx, is_u8);
  const int64_t ky = GaussianBlurKernelSize(node.GetInt("ksize_y", 0), sy, is_u8);
  GaussianBlurTaps taps{GaussianKernel1D(kx, std::max(sx, 0.0)), GaussianKernel1D(ky, std::max(sy, 0.0))};
  if (is_u8) taps = {FixedPointTaps256(taps.x), FixedPointTaps256(taps.y)};
  return taps;
}

namespace {

void InferGaussianBlur(InferContext& ctx) {
  const Shape& s = ImageInput(ctx, true);
  const bool u8 = ctx.input_dtypes[0] == DType::kU8;
  const int64_t kx = ctx.node.GetInt("ksize_x", 0), ky = ctx.node.GetInt("ksize_y", 0);
  const float sx = FiniteFloat(ctx, "sigma_x", ctx.node.GetFloat("sigma_x", 0.f));
  const float sy = FiniteFloat(ctx, "sigma_y", ctx.node.GetFloat("sigma_y", 0.f));
  if (sx < 0.f || sy < 0.f) ctx.Fail("attributes 'sigma_x' and 'sigma_y' must be >= 0 (0 = derive from the size)");
  for (const auto& [name, k] : {std::pair<const char*, int64_t>{"ksize_x", kx}, {"ksize_y", ky}})
    if (k < 0 || (k > 0 && k % 2 == 0))
      ctx.Fail(std::string("attribute '") + name + "' must be odd and >= 1, or 0 to derive it from sigma; got " +
               Str(k));
  const double sigma_y = sy > 0.f ? sy : sx;
  const int64_t kx_eff = GaussianBlurKernelSize(kx, sx, u8), ky_eff = GaussianBlurKernelSize(ky, sigma_y, u8);
  if (kx_eff <= 0 || ky_eff <= 0)
    ctx.Fail("needs a kernel size or a positive sigma for each axis (ksize_x = " + Str(kx) + ", ksize_y = " + Str(ky) +
             ", sigma_x = " + std::to_string(sx) + ", sigma_y = " + std::to_string(sy) + ")");
  if (kx_eff > kMaxBlurKernel || ky_eff > kMaxBlurKernel)
    ctx.Fail("kernel size " + Str(ky_eff) + "x" + Str(kx_eff) + " exceeds the limit of " + Str(kMaxBlurKernel) +
             " per side; use a smaller sigma or ksize");
  ctx.SetOutput(0, ctx.input_dtypes[0], s);
}

// BoxBlur and MedianBlur: a kernel side per axis (MedianBlur: one odd ksize, as cv2.medianBlur).
void InferBoxBlur(InferContext& ctx) {
  const Shape& s = ImageInput(ctx, true);
  const int64_t kx = ctx.node.GetInt("ksize_x", 0), ky = ctx.node.GetInt("ksize_y", kx);
  if (kx < 1 || ky < 1 || kx > kMaxBlurKernel || ky > kMaxBlurKernel)
    ctx.Fail("attributes 'ksize_x' and 'ksize_y' must be in 1.." + Str(kMaxBlurKernel) + ", got " + Str(kx) + " and " +
             Str(ky));
  ctx.SetOutput(0, ctx.input_dtypes[0], s);
}

void InferMedianBlur(InferContext& ctx) {
  const Shape& s = ImageInput(ctx, false);
  const int64_t k = ctx.node.GetInt("ksize", 0);
  if (k < 1 || k % 2 == 0 || k > 255) ctx.Fail("attribute 'ksize' must be odd, in 1..255, got " + Str(k));
  ctx.SetOutput(0, ctx.input_dtypes[0], s);
}

void InferAddGaussianNoise(InferContext& ctx) {
  const Shape& s = ImageInput(ctx, true);
  FiniteFloat(ctx, "mean", ctx.node.GetFloat("mean", 0.f));
  if (RequiredFloat(ctx, "std") < 0.f) ctx.Fail("attribute 'std' must be >= 0");
  IntInRange(ctx, "per_channel", ctx.node.GetInt("per_channel", 1), 0, 1);
  ctx.node.GetInt("seed", 0);  // kind check
  ctx.SetOutput(0, ctx.input_dtypes[0], s);
}

void InferFillRects(InferContext& ctx) {
  const Shape& s = ImageInput(ctx, true);
  const std::vector<int64_t> rects = ctx.node.GetInts("rects");
  if (rects.size() % 4 != 0)
    ctx.Fail("attribute 'rects' must hold 4 ints per rectangle (top, left, bottom, right), got " + Str(rects.size()));
  for (size_t i = 0; i < rects.size(); i += 4)
    if (rects[i + 2] < rects[i] || rects[i + 3] < rects[i + 1])
      ctx.Fail("rectangle " + Str(i / 4) + " (top " + Str(rects[i]) + ", left " + Str(rects[i + 1]) + ", bottom " +
               Str(rects[i + 2]) + ", right " + Str(rects[i + 3]) + ") has bottom < top or right < left");
  const std::vector<float> fill = FloatsOrInts(ctx.node, "fill");
  if (fill.size() != 1 && static_cast<int64_t>(fill.size()) != s.back())
    ctx.Fail("attribute 'fill' must hold 1 value or one per channel (" + Str(s.back()) + "), got " + Str(fill.size()));
  for (float v : fill) FiniteFloat(ctx, "fill", v);
  ctx.SetOutput(0, ctx.input_dtypes[0], s);
}

}  // namespace

std::vector<float> FillRectsValues(const Node& node) { return FloatsOrInts(node, "fill"); }

void RegisterAugmentOps(OpRegistry& r) {
  r.Add({"WarpPerspective", 1, 1, 1, 1, InferWarpPerspective});
  r.Add({"LookupTable", 1, 1, 1, 1, InferLookupTable});
  r.Add({"AdjustContrast", 1, 1, 1, 1, InferAdjustContrast});
  r.Add({"AdjustSaturation", 1, 1, 1, 1, InferAdjustSaturation});
  r.Add({"ShiftHSV", 1, 1, 1, 1, InferShiftHsv});
  r.Add({"GaussianBlur", 1, 1, 1, 1, InferGaussianBlur});
  r.Add({"BoxBlur", 1, 1, 1, 1, InferBoxBlur});
  r.Add({"MedianBlur", 1, 1, 1, 1, InferMedianBlur});
  r.Add({"AddGaussianNoise", 1, 1, 1, 1, InferAddGaussianNoise});
  r.Add({"FillRects", 1, 1, 1, 1, InferFillRects});
}

}  // namespace osprey

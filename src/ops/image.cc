// Schemas of the osprey-domain image ops (docs/image-ops.md): attribute validation and shape/dtype inference.
// Images are HWC (rank 3) or NHWC (rank 4), uint8 or float32. Kernels (src/kernels/reference/image.cc and
// src/kernels/cpu/image_kernels.cc) rely on the checks made here and re-read only the attributes they need.
#include <cmath>
#include <string>
#include <vector>

#include "ops/op_registry.h"
#include "ops/schema_util.h"

namespace osprey {
namespace {

using namespace schema;

// The image input: rank 3 (HWC) or 4 (NHWC), uint8 or float32. Returns its shape.
const Shape& ImageInput(const InferContext& ctx, const char* layout = "HWC") {
  if (!ctx.Has(0)) ctx.Fail("input 0 (image) is required");
  const DType t = ctx.input_dtypes[0];
  if (t != DType::kU8 && t != DType::kF32) ctx.Fail(std::string("image must be uint8 or float32, got ") + DTypeName(t));
  const Shape& s = ctx.input_shapes[0];
  if (s.size() != 3 && s.size() != 4)
    ctx.Fail(std::string("image must be rank 3 (") + layout + ") or rank 4 (N" + layout + "), got shape " +
             ShapeToString(s));
  return s;
}

// Index of the H axis in an HWC/NHWC shape.
size_t HAxis(const Shape& s) { return s.size() == 4 ? 1 : 0; }

Shape WithHw(const Shape& s, int64_t h, int64_t w) {
  Shape out = s;
  out[HAxis(s)] = h;
  out[HAxis(s) + 1] = w;
  return out;
}

int ColorChannels(const std::string& space) {
  if (space == "GRAY") return 1;
  if (space == "RGBA" || space == "BGRA") return 4;
  return 3;
}

void InferResize(InferContext& ctx) {
  const Shape& s = ImageInput(ctx);
  const int64_t h = IntInRange(ctx, "height", RequiredInt(ctx, "height"), 1, kMaxImageDim);
  const int64_t w = IntInRange(ctx, "width", RequiredInt(ctx, "width"), 1, kMaxImageDim);
  OneOf(ctx, "mode", ctx.node.GetString("mode", "bilinear"), {"nearest", "bilinear", "bicubic", "area"});
  IntInRange(ctx, "antialias", ctx.node.GetInt("antialias", 1), 0, 1);
  if (s[HAxis(s)] < 1 || s[HAxis(s) + 1] < 1)
    ctx.Fail("cannot resize an empty image of shape " + ShapeToString(s) + " to " + Str(h) + "x" + Str(w));
  // Optional window of the resized image to compute (a fused CropImage): rows [roi_top, roi_top + roi_height) x
  // columns [roi_left, roi_left + roi_width) of the height x width result.
  const int64_t top = ctx.node.GetInt("roi_top", 0), left = ctx.node.GetInt("roi_left", 0);
  const int64_t roi_h = ctx.node.GetInt("roi_height", h - top), roi_w = ctx.node.GetInt("roi_width", w - left);
  if (top < 0 || left < 0 || roi_h < 1 || roi_w < 1 || top > h - roi_h || left > w - roi_w)
    ctx.Fail("roi rows [" + Str(top) + ", " + Str(top + roi_h) + ") x columns [" + Str(left) + ", " +
             Str(left + roi_w) + ") must be non-empty and lie inside the " + Str(h) + "x" + Str(w) + " resized image");
  ctx.SetOutput(0, ctx.input_dtypes[0], WithHw(s, roi_h, roi_w));
}

void InferCrop(InferContext& ctx) {
  const Shape& s = ImageInput(ctx);
  const int64_t top = RequiredInt(ctx, "top"), left = RequiredInt(ctx, "left");
  const int64_t h = RequiredInt(ctx, "height"), w = RequiredInt(ctx, "width");
  const int64_t in_h = s[HAxis(s)], in_w = s[HAxis(s) + 1];
  if (top < 0 || left < 0 || h < 1 || w < 1 || top > in_h - h || left > in_w - w)
    ctx.Fail("crop rows [" + Str(top) + ", " + Str(top + h) + ") x columns [" + Str(left) + ", " + Str(left + w) +
             ") must be non-empty and lie inside the " + Str(in_h) + "x" + Str(in_w) + " image");
  ctx.SetOutput(0, ctx.input_dtypes[0], WithHw(s, h, w));
}

void InferPad(InferContext& ctx) {
  const Shape& s = ImageInput(ctx);
  int64_t pads[4];
  const char* names[4] = {"top", "bottom", "left", "right"};
  for (int i = 0; i < 4; ++i) pads[i] = IntInRange(ctx, names[i], RequiredInt(ctx, names[i]), 0, kMaxImageDim);
  FiniteFloat(ctx, "value", ctx.node.GetFloat("value", 0.f));
  const std::string mode = OneOf(ctx, "mode", ctx.node.GetString("mode", "constant"), {"constant", "edge", "reflect"});
  const int64_t in_h = s[HAxis(s)], in_w = s[HAxis(s) + 1];
  if (mode != "constant" && ((in_h == 0 && pads[0] + pads[1] > 0) || (in_w == 0 && pads[2] + pads[3] > 0)))
    ctx.Fail("mode \"" + mode + "\" cannot pad an empty image of shape " + ShapeToString(s));
  const int64_t h = in_h + pads[0] + pads[1], w = in_w + pads[2] + pads[3];
  if (h > kMaxImageDim || w > kMaxImageDim)
    ctx.Fail("padded size " + Str(h) + "x" + Str(w) + " exceeds the limit of " + Str(kMaxImageDim) + " per side");
  ctx.SetOutput(0, ctx.input_dtypes[0], WithHw(s, h, w));
}

void InferFlip(InferContext& ctx) {
  const Shape& s = ImageInput(ctx);
  IntInRange(ctx, "horizontal", ctx.node.GetInt("horizontal", 1), 0, 1);
  IntInRange(ctx, "vertical", ctx.node.GetInt("vertical", 0), 0, 1);
  ctx.SetOutput(0, ctx.input_dtypes[0], s);
}

void InferRotate90(InferContext& ctx) {
  const Shape& s = ImageInput(ctx);
  const int64_t k = ((RequiredInt(ctx, "k") % 4) + 4) % 4;
  const size_t a = HAxis(s);
  ctx.SetOutput(0, ctx.input_dtypes[0], k % 2 ? WithHw(s, s[a + 1], s[a]) : s);
}

void InferWarpAffine(InferContext& ctx) {
  const Shape& s = ImageInput(ctx);
  if (!ctx.node.Has("matrix")) ctx.Fail("attribute 'matrix' is required");
  const std::vector<float> m = ctx.node.GetFloats("matrix");
  if (m.size() != 6) ctx.Fail("attribute 'matrix' must hold 6 floats (2x3, row-major), got " + Str(m.size()));
  for (float v : m) FiniteFloat(ctx, "matrix", v);
  const int64_t h = IntInRange(ctx, "height", RequiredInt(ctx, "height"), 1, kMaxImageDim);
  const int64_t w = IntInRange(ctx, "width", RequiredInt(ctx, "width"), 1, kMaxImageDim);
  OneOf(ctx, "mode", ctx.node.GetString("mode", "bilinear"), {"nearest", "bilinear"});
  FiniteFloat(ctx, "border_value", ctx.node.GetFloat("border_value", 0.f));
  ctx.SetOutput(0, ctx.input_dtypes[0], WithHw(s, h, w));
}

void InferColorConvert(InferContext& ctx) {
  const Shape& s = ImageInput(ctx);
  if (!ctx.node.Has("from")) ctx.Fail("attribute 'from' is required");
  if (!ctx.node.Has("to")) ctx.Fail("attribute 'to' is required");
  const std::string from = OneOf(ctx, "from", ctx.node.GetString("from", ""), {"RGB", "BGR", "GRAY", "RGBA", "BGRA"});
  const std::string to = OneOf(ctx, "to", ctx.node.GetString("to", ""), {"RGB", "BGR", "GRAY"});
  if (s.back() != ColorChannels(from))
    ctx.Fail("a " + from + " image has " + Str(ColorChannels(from)) + " channel(s), got shape " + ShapeToString(s));
  Shape out = s;
  out.back() = ColorChannels(to);
  ctx.SetOutput(0, ctx.input_dtypes[0], out);
}

void InferNormalize(InferContext& ctx) {
  const Shape& s = ImageInput(ctx);
  const int64_t c = s.back();
  FiniteFloat(ctx, "scale", ctx.node.GetFloat("scale", 1.f));
  const std::vector<float> mean = ctx.node.GetFloats("mean"), std = ctx.node.GetFloats("std");
  if (!mean.empty() && static_cast<int64_t>(mean.size()) != c && mean.size() != 1)
    ctx.Fail("attribute 'mean' must hold one value per channel (" + Str(c) + ") or one value, got " + Str(mean.size()));
  if (!std.empty() && static_cast<int64_t>(std.size()) != c && std.size() != 1)
    ctx.Fail("attribute 'std' must hold one value per channel (" + Str(c) + ") or one value, got " + Str(std.size()));
  for (float v : mean) FiniteFloat(ctx, "mean", v);
  for (float v : std)
    if (!std::isfinite(v) || v == 0.f)
      ctx.Fail("attribute 'std' must hold finite non-zero values, got " + std::to_string(v));
  const std::string layout = OneOf(ctx, "layout", ctx.node.GetString("layout", "CHW"), {"CHW", "HWC"});
  Shape out = s;
  if (layout == "CHW") {
    const size_t a = HAxis(s);
    out[a] = c;
    out[a + 1] = s[a];
    out[a + 2] = s[a + 1];
  }
  ctx.SetOutput(0, DType::kF32, out);
}

void InferHwcToChw(InferContext& ctx) {
  const Shape& s = ImageInput(ctx);
  const size_t a = HAxis(s);
  Shape out = s;
  out[a] = s[a + 2];
  out[a + 1] = s[a];
  out[a + 2] = s[a + 1];
  ctx.SetOutput(0, ctx.input_dtypes[0], out);
}

void InferChwToHwc(InferContext& ctx) {
  const Shape& s = ImageInput(ctx, "CHW");
  const size_t a = HAxis(s);
  Shape out = s;
  out[a] = s[a + 1];
  out[a + 1] = s[a + 2];
  out[a + 2] = s[a];
  ctx.SetOutput(0, ctx.input_dtypes[0], out);
}

}  // namespace

void RegisterImageOps(OpRegistry& r) {
  r.Add({"ResizeImage", 1, 1, 1, 1, InferResize});
  r.Add({"CropImage", 1, 1, 1, 1, InferCrop});
  r.Add({"PadImage", 1, 1, 1, 1, InferPad});
  r.Add({"FlipImage", 1, 1, 1, 1, InferFlip});
  r.Add({"Rotate90", 1, 1, 1, 1, InferRotate90});
  r.Add({"WarpAffine", 1, 1, 1, 1, InferWarpAffine});
  r.Add({"ColorConvert", 1, 1, 1, 1, InferColorConvert});
  r.Add({"NormalizeImage", 1, 1, 1, 1, InferNormalize});
  r.Add({"HwcToChw", 1, 1, 1, 1, InferHwcToChw});
  r.Add({"ChwToHwc", 1, 1, 1, 1, InferChwToHwc});
}

}  // namespace osprey

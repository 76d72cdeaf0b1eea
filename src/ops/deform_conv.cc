// Schema of DeformConv (deform_conv.h).
#include "ops/deform_conv.h"

#include <string>
#include <vector>

#include "ops/op_registry.h"
#include "ops/schema_util.h"

namespace osprey {
namespace {

using schema::FailNode;
using schema::Str;

}  // namespace

DeformConvParams ResolveDeformConv(const Node& node, const Shape& x, const Shape& w, const Shape& offset,
                                   const Shape* bias, const Shape* mask) {
  if (x.size() != 4 || w.size() != 4 || offset.size() != 4)
    FailNode(node, "X, W and offset must be 4-D (osprey deforms 2-D convolutions), got " + ShapeToString(x) + ", " +
                       ShapeToString(w) + ", " + ShapeToString(offset));
  DeformConvParams p;
  p.n = x[0];
  p.in_c = x[1];
  p.in_h = x[2];
  p.in_w = x[3];
  p.out_c = w[0];
  const std::vector<int64_t> kernel =
      node.Has("kernel_shape") ? schema::IntsAttr(node, "kernel_shape", 2, 1, 1) : std::vector<int64_t>{w[2], w[3]};
  if (kernel[0] != w[2] || kernel[1] != w[3])
    FailNode(node, "kernel_shape " + ShapeToString(kernel) + " differs from W's " + ShapeToString(w));
  p.kh = kernel[0];
  p.kw = kernel[1];
  const std::vector<int64_t> strides = schema::IntsAttr(node, "strides", 2, 1, 1),
                             dilations = schema::IntsAttr(node, "dilations", 2, 1, 1);
  const std::vector<int64_t> pads = schema::IntsAttr(node, "pads", 4, 0, 0);
  p.stride_h = strides[0];
  p.stride_w = strides[1];
  p.dil_h = dilations[0];
  p.dil_w = dilations[1];
  p.pad_top = pads[0];
  p.pad_left = pads[1];
  p.group = node.GetInt("group", 1);
  p.offset_group = node.GetInt("offset_group", 1);
  if (p.group < 1 || p.in_c % p.group != 0 || p.out_c % p.group != 0 || w[1] * p.group != p.in_c)
    FailNode(node, "group " + Str(p.group) + " must divide X's " + Str(p.in_c) + " and W's " + Str(p.out_c) +
                       " channels, with W [" + Str(p.out_c) + ", " + Str(p.in_c) + " / group, kH, kW], got W " +
                       ShapeToString(w));
  if (p.offset_group < 1 || p.in_c % p.offset_group != 0)
    FailNode(node, "offset_group " + Str(p.offset_group) + " must divide X's " + Str(p.in_c) + " channels");
  p.out_h = (p.in_h + pads[0] + pads[2] - p.dil_h * (p.kh - 1) - 1) / p.stride_h + 1;
  p.out_w = (p.in_w + pads[1] + pads[3] - p.dil_w * (p.kw - 1) - 1) / p.stride_w + 1;
  if (p.out_h < 1 || p.out_w < 1) FailNode(node, "the kernel does not fit the padded input " + ShapeToString(x));
  const Shape want_offset{p.n, p.offset_group * p.kh * p.kw * 2, p.out_h, p.out_w};
  if (offset != want_offset)
    FailNode(node, "offset must be " + ShapeToString(want_offset) +
                       " (N, offset_group x kH x kW x 2, out H, out W), got " + ShapeToString(offset));
  if (bias) {
    p.bias = true;
    if (*bias != Shape{p.out_c}) FailNode(node, "B must be [" + Str(p.out_c) + "], got " + ShapeToString(*bias));
  }
  if (mask) {
    p.mask = true;
    const Shape want_mask{p.n, p.offset_group * p.kh * p.kw, p.out_h, p.out_w};
    if (*mask != want_mask)
      FailNode(node, "mask must be " + ShapeToString(want_mask) + ", got " + ShapeToString(*mask));
  }
  return p;
}

namespace {

void InferDeformConv(InferContext& ctx) {
  for (int i = 0; i < 3; ++i)
    if (!ctx.Has(i)) ctx.Fail("inputs X, W and offset are required");
  for (int i = 0; i < ctx.num_inputs(); ++i)
    if (ctx.Has(i) && ctx.input_dtypes[i] != DType::kF32)
      throw Error(ErrorCode::kUnsupported, ctx.node.Describe() + ": DeformConv computes in float32, input " + Str(i) +
                                               " is " + DTypeName(ctx.input_dtypes[i]));
  auto optional = [&](int i) {
    return ctx.Has(i) && NumElements(ctx.input_shapes[i]) > 0 ? &ctx.input_shapes[i] : nullptr;
  };
  const DeformConvParams p = ResolveDeformConv(ctx.node, ctx.input_shapes[0], ctx.input_shapes[1], ctx.input_shapes[2],
                                               optional(3), optional(4));
  ctx.SetOutput(0, DType::kF32, {p.n, p.out_c, p.out_h, p.out_w});
}

}  // namespace

void RegisterDeformConvOps(OpRegistry& r) { r.Add(OpSchema{"DeformConv", 3, 5, 1, 1, InferDeformConv, {}}); }

}  // namespace osprey

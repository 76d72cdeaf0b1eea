// Schemas of Col2Im and MaxUnpool (fold.h). Sizes must be known when the model is compiled.
#include "ops/fold.h"

#include <string>

#include "ops/op_registry.h"
#include "ops/schema_util.h"

namespace osprey {
namespace {

using schema::FailNode;
using schema::Str;

std::vector<int64_t> Ints(const Node& node, const Tensor& t, const char* what) {
  if ((t.dtype() != DType::kI64 && t.dtype() != DType::kI32) || t.rank() != 1)
    FailNode(node, std::string(what) + " must be a 1-D integer tensor, got " + DTypeName(t.dtype()) + " " +
                       ShapeToString(t.shape()));
  return t.ToInt64Vector();
}

}  // namespace

Col2ImParams ResolveCol2Im(const Node& node, const Shape& x, const Tensor& image_shape, const Tensor& block_shape) {
  Col2ImParams p;
  p.image = Ints(node, image_shape, "image_shape (input 1)");
  p.block = Ints(node, block_shape, "block_shape (input 2)");
  const size_t dims = p.image.size();
  if (dims == 0 || p.block.size() != dims)
    FailNode(node, "image_shape and block_shape must have one value per spatial dim each, got " +
                       ShapeToString(p.image) + " and " + ShapeToString(p.block));
  if (x.size() != 3) FailNode(node, "input must be [N, C x prod(block_shape), L], got " + ShapeToString(x));
  p.dilations = schema::IntsAttr(node, "dilations", dims, 1, 1);
  p.strides = schema::IntsAttr(node, "strides", dims, 1, 1);
  const std::vector<int64_t> pads = schema::IntsAttr(node, "pads", 2 * dims, 0, 0);
  int64_t kernel = 1, blocks = 1;
  for (size_t d = 0; d < dims; ++d) {
    if (p.image[d] < 1 || p.block[d] < 1)
      FailNode(node, "image_shape and block_shape must be >= 1, got " + ShapeToString(p.image) + " and " +
                         ShapeToString(p.block));
    p.pads_begin.push_back(pads[d]);
    p.pads_end.push_back(pads[dims + d]);
    const int64_t span = p.image[d] + pads[d] + pads[dims + d] - p.dilations[d] * (p.block[d] - 1) - 1;
    if (span < 0)
      FailNode(node, "the block does not fit the padded image along spatial dim " + Str(static_cast<int64_t>(d)));
    p.blocks.push_back(span / p.strides[d] + 1);
    kernel *= p.block[d];
    blocks *= p.blocks.back();
  }
  if (x[1] % kernel != 0)
    FailNode(node, "input dim 1 (" + Str(x[1]) + ") must be a multiple of the block's size (" + Str(kernel) + ")");
  if (x[2] != blocks)
    FailNode(node, "input dim 2 must be the number of blocks, " + Str(blocks) + " (" + ShapeToString(p.blocks) +
                       "), got " + Str(x[2]));
  p.channels = x[1] / kernel;
  return p;
}

Shape ResolveMaxUnpool(const Node& node, const Shape& x, const Tensor* output_shape) {
  if (x.size() < 3) FailNode(node, "X must be [N, C, spatial...], got " + ShapeToString(x));
  const size_t dims = x.size() - 2;
  if (!node.Has("kernel_shape")) FailNode(node, "attribute 'kernel_shape' is required");
  const std::vector<int64_t> kernel = schema::IntsAttr(node, "kernel_shape", dims, 1, 1);
  const std::vector<int64_t> strides = schema::IntsAttr(node, "strides", dims, 1, 1);
  const std::vector<int64_t> pads = schema::IntsAttr(node, "pads", 2 * dims, 0, 0);
  Shape out = x;
  for (size_t d = 0; d < dims; ++d) {
    out[2 + d] = (x[2 + d] - 1) * strides[d] - pads[d] - pads[dims + d] + kernel[d];
    if (out[2 + d] < 0) FailNode(node, "the pads leave no output along spatial dim " + Str(static_cast<int64_t>(d)));
  }
  if (output_shape != nullptr && output_shape->numel() > 0) {
    const std::vector<int64_t> given = Ints(node, *output_shape, "output_shape (input 2)");
    if (given.size() != x.size() || given[0] != x[0] || given[1] != x[1])
      FailNode(node, "output_shape must be [N, C, spatial...] with X's N and C, got " + ShapeToString(given));
    for (size_t d = 0; d < dims; ++d)
      if (given[2 + d] < out[2 + d])
        FailNode(node, "output_shape " + ShapeToString(given) + " is smaller than what the pooling inverts to, " +
                           ShapeToString(out));
    out = given;
  }
  return out;
}

namespace {

void SetChecked(InferContext& ctx, DType dtype, const Shape& out) {
  try {
    (void)NumElements(out);
  } catch (const Error& e) {
    ctx.Fail(std::string("computed output ") + e.what());
  }
  ctx.SetOutput(0, dtype, out);
}

void InferCol2Im(InferContext& ctx) {
  if (!ctx.Has(0)) ctx.Fail("input 0 is required");
  if (ctx.input_dtypes[0] != DType::kF32)
    throw Error(ErrorCode::kUnsupported,
                ctx.node.Describe() + ": Col2Im of " + DTypeName(ctx.input_dtypes[0]) + " is not supported (float32)");
  const Col2ImParams p = ResolveCol2Im(ctx.node, ctx.input_shapes[0], ctx.Value(1), ctx.Value(2));
  Shape out{ctx.input_shapes[0][0], p.channels};
  out.insert(out.end(), p.image.begin(), p.image.end());
  SetChecked(ctx, DType::kF32, out);
}

void InferMaxUnpool(InferContext& ctx) {
  if (!ctx.Has(0) || !ctx.Has(1)) ctx.Fail("inputs X and I are required");
  if (ctx.input_dtypes[0] != DType::kF32)
    throw Error(ErrorCode::kUnsupported, ctx.node.Describe() + ": MaxUnpool of " + DTypeName(ctx.input_dtypes[0]) +
                                             " is not supported (float32)");
  if (ctx.input_dtypes[1] != DType::kI64 || ctx.input_shapes[1] != ctx.input_shapes[0])
    ctx.Fail("I must be int64 of X's shape " + ShapeToString(ctx.input_shapes[0]) + ", got " +
             DTypeName(ctx.input_dtypes[1]) + " " + ShapeToString(ctx.input_shapes[1]));
  const Tensor* output_shape = ctx.Has(2) && NumElements(ctx.input_shapes[2]) > 0 ? &ctx.Value(2) : nullptr;
  SetChecked(ctx, DType::kF32, ResolveMaxUnpool(ctx.node, ctx.input_shapes[0], output_shape));
}

}  // namespace

void RegisterFoldOps(OpRegistry& r) {
  r.Add(OpSchema{"Col2Im", 3, 3, 1, 1, InferCol2Im, {}});
  r.Add(OpSchema{"MaxUnpool", 2, 3, 1, 1, InferMaxUnpool, {}});
}

}  // namespace osprey

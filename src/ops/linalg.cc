// Schema of Det: the determinants of square matrices, X [..., M, M] -> [...] (float32). Kernel:
// kernels/reference/linalg.cc (LU with partial pivoting, in double precision).
#include <string>

#include "ops/op_registry.h"

namespace osprey {
namespace {

void InferDet(InferContext& ctx) {
  if (!ctx.Has(0)) ctx.Fail("input 0 is required");
  const Shape& x = ctx.input_shapes[0];
  if (ctx.input_dtypes[0] != DType::kF32)
    throw Error(ErrorCode::kUnsupported,
                ctx.node.Describe() + ": Det of " + DTypeName(ctx.input_dtypes[0]) + " is not supported (float32)");
  if (x.size() < 2 || x[x.size() - 1] != x[x.size() - 2])
    ctx.Fail("input must be square matrices [..., M, M], got " + ShapeToString(x));
  ctx.SetOutput(0, DType::kF32, Shape(x.begin(), x.end() - 2));
}

}  // namespace

void RegisterLinalgOps(OpRegistry& r) { r.Add(OpSchema{"Det", 1, 1, 1, 1, InferDet, {}}); }

}  // namespace osprey

// Schemas of the reduction family: Reduce*, ArgMax/ArgMin and TopK.
#include <string>
#include <vector>

#include "ops/op_registry.h"
#include "ops/reduce_axes.h"

namespace osprey {
namespace {

constexpr uint32_t Bit(DType d) { return 1u << static_cast<int>(d); }
constexpr uint32_t kFloat = Bit(DType::kF32);
constexpr uint32_t kWideInts = Bit(DType::kI32) | Bit(DType::kI64);
constexpr uint32_t kNumeric = kFloat | kWideInts | Bit(DType::kI8) | Bit(DType::kU8);

void CheckDType(const InferContext& ctx, int i, uint32_t allowed) {
  if (!ctx.Has(i)) ctx.Fail("input " + std::to_string(i) + " is required");
  DType d = ctx.input_dtypes[i];
  if (allowed & Bit(d)) return;
  std::string names;
  for (int k = 0; k < kNumDTypes; ++k)
    if (allowed & (1u << k)) names += (names.empty() ? "" : ", ") + std::string(DTypeName(static_cast<DType>(k)));
  std::string msg = "input " + std::to_string(i) + " has dtype " + DTypeName(d) + "; this op supports " + names;
  if (d == DType::kF16 || d == DType::kBF16)
    throw Error(ErrorCode::kUnsupported, ctx.node.Describe() + ": " + msg + " (cast to float32 first)");
  ctx.Fail(msg);
}

// Reduced-axis mask for a Reduce* node; an empty result means "nothing reduced" (noop_with_empty_axes).
// The kernels take the mask from ReduceAxesMask (ops/reduce_axes.h) once this has validated the node.
std::vector<bool> ReducedAxes(const InferContext& ctx) {
  const Node& node = ctx.node;
  const int64_t rank = static_cast<int64_t>(ctx.input_shapes[0].size());
  std::vector<int64_t> axes;
  if (ctx.opset < ReduceAxesInputOpset(node.op_type)) {
    if (ctx.Has(1))
      ctx.Fail("axes is an attribute before opset " + std::to_string(ReduceAxesInputOpset(node.op_type)) + ", not an input");
    axes = node.GetInts("axes");
  } else {
    if (node.Has("axes"))
      ctx.Fail("axes is input 1 from opset " + std::to_string(ReduceAxesInputOpset(node.op_type)) + " on, not an attribute");
    if (ctx.Has(1)) {
      const Tensor& t = ctx.Value(1);
      if (t.dtype() != DType::kI64) ctx.Fail(std::string("axes must be int64, got ") + DTypeName(t.dtype()));
      if (t.rank() > 1) ctx.Fail("axes must be 1-D, got shape " + ShapeToString(t.shape()));
      axes = t.ToInt64Vector();
    }
  }
  const int64_t keepdims = node.GetInt("keepdims", 1);
  const int64_t noop = node.GetInt("noop_with_empty_axes", 0);
  if ((keepdims != 0 && keepdims != 1) || (noop != 0 && noop != 1))
    ctx.Fail("attributes 'keepdims' and 'noop_with_empty_axes' must be 0 or 1");
  std::vector<bool> mask(rank, false);
  if (axes.empty()) {
    if (noop == 0) mask.assign(rank, true);
    return mask;
  }
  for (int64_t a : axes) {
    int64_t norm = a < 0 ? a + rank : a;
    if (norm < 0 || norm >= rank)
      ctx.Fail("axis " + std::to_string(a) + " is out of range for input of rank " + std::to_string(rank));
    if (mask[norm]) ctx.Fail("axis " + std::to_string(a) + " is repeated");
    mask[norm] = true;
  }
  return mask;
}

InferFn ReduceInfer(uint32_t allowed) {
  return [allowed](InferContext& ctx) {
    CheckDType(ctx, 0, allowed);
    std::vector<bool> mask = ReducedAxes(ctx);
    const bool keepdims = ctx.node.GetInt("keepdims", 1) != 0;
    const Shape& in = ctx.input_shapes[0];
    Shape out;
    for (size_t i = 0; i < in.size(); ++i) {
      if (!mask[i])
        out.push_back(in[i]);
      else if (keepdims)
        out.push_back(1);
    }
    ctx.SetOutput(0, ctx.input_dtypes[0], out);
  };
}

void InferArgReduce(InferContext& ctx) {
  CheckDType(ctx, 0, kNumeric);
  const Shape& in = ctx.input_shapes[0];
  if (in.empty()) ctx.Fail("input must have rank >= 1");
  const int64_t axis = NormalizeAxis(ctx.node.GetInt("axis", 0), static_cast<int64_t>(in.size()), ctx.node);
  if (in[axis] == 0) ctx.Fail("cannot take the arg of an empty axis (shape " + ShapeToString(in) + ")");
  const bool keepdims = ctx.node.GetInt("keepdims", 1) != 0;
  ctx.node.GetInt("select_last_index", 0);
  Shape out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (static_cast<int64_t>(i) != axis)
      out.push_back(in[i]);
    else if (keepdims)
      out.push_back(1);
  }
  ctx.SetOutput(0, DType::kI64, out);
}

void InferTopK(InferContext& ctx) {
  CheckDType(ctx, 0, kNumeric);
  const Shape& in = ctx.input_shapes[0];
  if (in.empty()) ctx.Fail("input must have rank >= 1");
  const int64_t axis = NormalizeAxis(ctx.node.GetInt("axis", -1), static_cast<int64_t>(in.size()), ctx.node);
  int64_t k;
  if (ctx.opset < 10) {
    if (ctx.Has(1)) ctx.Fail("K is attribute 'k' before opset 10, not an input");
    if (!ctx.node.Has("k")) ctx.Fail("attribute 'k' is required");
    k = ctx.node.GetInt("k", 0);
  } else {
    if (!ctx.Has(1)) ctx.Fail("input 1 (K) is required");
    const Tensor& kt = ctx.Value(1);
    if (kt.dtype() != DType::kI64 || kt.numel() != 1)
      ctx.Fail(std::string("K must be a 1-element int64 tensor, got ") + DTypeName(kt.dtype()) + " of shape " +
               ShapeToString(kt.shape()));
    k = kt.GetAsInt(0);
  }
  if (k < 0 || k > in[axis])
    ctx.Fail("K = " + std::to_string(k) + " is out of range for axis " + std::to_string(axis) + " of size " +
             std::to_string(in[axis]));
  ctx.node.GetInt("largest", 1);
  ctx.node.GetInt("sorted", 1);
  Shape out = in;
  out[axis] = k;
  ctx.SetOutput(0, ctx.input_dtypes[0], out);
  ctx.SetOutput(1, DType::kI64, out);
}

// CumSum, CumProd: the running sum or product along the axis given as input 1 (a scalar, read by the kernel), same
// shape and dtype.
void InferCumulative(InferContext& ctx) {
  if (!ctx.Has(0) || !ctx.Has(1)) ctx.Fail("inputs 'x' and 'axis' are required");
  const DType t = ctx.input_dtypes[0];
  if (t != DType::kF32 && t != DType::kI32 && t != DType::kI64)
    ctx.Fail(std::string("float32, int32 or int64 input only, got ") + DTypeName(t));
  if (ctx.input_dtypes[1] != DType::kI32 && ctx.input_dtypes[1] != DType::kI64)
    ctx.Fail(std::string("axis must be int32 or int64, got ") + DTypeName(ctx.input_dtypes[1]));
  if (NumElements(ctx.input_shapes[1]) != 1 || ctx.input_shapes[1].size() > 1)
    ctx.Fail("axis must hold one value, got shape " + ShapeToString(ctx.input_shapes[1]));
  if (ctx.input_shapes[0].empty()) ctx.Fail("x must have rank >= 1, got a scalar");
  ctx.SetOutput(0, t, ctx.input_shapes[0]);
}

void AddSchema(OpRegistry& r, const char* op_type, int min_inputs, int max_inputs, InferFn infer, int num_outputs = 1) {
  r.Add(op_type, min_inputs, max_inputs, num_outputs, num_outputs, std::move(infer));
}

}  // namespace

void RegisterReductionOps(OpRegistry& r) {
  for (const char* op : {"ReduceMax", "ReduceMin"}) AddSchema(r, op, 1, 2, ReduceInfer(kNumeric | Bit(DType::kBool)));
  for (const char* op : {"ReduceSum", "ReduceMean", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare"})
    AddSchema(r, op, 1, 2, ReduceInfer(kFloat | kWideInts));
  for (const char* op : {"ReduceLogSum", "ReduceLogSumExp"}) AddSchema(r, op, 1, 2, ReduceInfer(kFloat));
  AddSchema(r, "ArgMax", 1, 1, InferArgReduce);
  AddSchema(r, "ArgMin", 1, 1, InferArgReduce);
  AddSchema(r, "TopK", 1, 2, InferTopK, 2);
  AddSchema(r, "CumSum", 2, 2, InferCumulative);
  AddSchema(r, "CumProd", 2, 2, InferCumulative);
}

}  // namespace osprey

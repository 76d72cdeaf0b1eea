// Schemas of the data-movement and shape ops: Concat, Split, Slice, Gather*, ScatterND, Reshape, Flatten, Squeeze,
// Unsqueeze, Transpose, Expand, Tile, Pad, Resize, Upsample, Shape, Size, Constant*, Range, Identity, Dropout,
// DepthToSpace, SpaceToDepth. Only the inputs that decide an output shape are read as values (ctx.Value); data inputs
// may be known by shape only.
#include <algorithm>
#include <cmath>
#include <set>

#include "ops/op_registry.h"
#include "ops/schema_util.h"
#include "ops/slice.h"

namespace osprey {
namespace {

constexpr int kManyValues = 1 << 20;

bool IsIntegerDType(DType t) { return t == DType::kI64 || t == DType::kI32 || t == DType::kI8 || t == DType::kU8; }

std::string Str(int64_t v) { return std::to_string(v); }

std::string IntsToString(const std::vector<int64_t>& v) { return ShapeToString(v); }

const Shape& InShape(const InferContext& ctx, int i) {
  if (!ctx.Has(i)) ctx.Fail("input " + Str(i) + " is required");
  return ctx.input_shapes[i];
}

std::string ToStr(long double c) { return std::to_string(static_cast<double>(c)); }

// True when input i is given and holds at least one element (an empty tensor counts as "not given" for the
// optional scales/sizes/split inputs, as ONNX exporters use both forms).
bool HasNonEmpty(const InferContext& ctx, int i) { return ctx.Has(i) && NumElements(ctx.input_shapes[i]) > 0; }

// A compile-time integer input (shape, axes, pads, ...): integer dtype, rank 0 or 1.
std::vector<int64_t> IntInput(const InferContext& ctx, int i, const char* what) {
  const Tensor& t = ctx.Value(i);
  if (!IsIntegerDType(t.dtype()))
    ctx.Fail(std::string(what) + " (input " + Str(i) + ") must be an integer tensor, got " + DTypeName(t.dtype()));
  if (t.rank() > 1)
    ctx.Fail(std::string(what) + " (input " + Str(i) + ") must be 1-D, got shape " + ShapeToString(t.shape()));
  return t.ToInt64Vector();
}

std::vector<double> FloatInput(const InferContext& ctx, int i, const char* what) {
  const Tensor& t = ctx.Value(i);
  if (t.dtype() != DType::kF32 && t.dtype() != DType::kF16 && t.dtype() != DType::kBF16)
    ctx.Fail(std::string(what) + " (input " + Str(i) + ") must be a float tensor, got " + DTypeName(t.dtype()));
  if (t.rank() > 1)
    ctx.Fail(std::string(what) + " (input " + Str(i) + ") must be 1-D, got shape " + ShapeToString(t.shape()));
  std::vector<double> v(t.numel());
  for (int64_t k = 0; k < t.numel(); ++k) v[k] = t.GetAsDouble(k);
  return v;
}

// Dims >= 0 and an element count that fits; the message names the node.
void CheckShape(const InferContext& ctx, const Shape& shape) {
  try {
    (void)NumElements(shape);
  } catch (const Error& e) {
    ctx.Fail(std::string("computed output ") + e.what());
  }
}

// Normalises a list of axes against `rank`; duplicates are an error.
std::vector<int64_t> NormalizeAxes(const InferContext& ctx, const std::vector<int64_t>& axes, int64_t rank) {
  std::vector<int64_t> out;
  std::set<int64_t> seen;
  for (int64_t a : axes) {
    int64_t n = NormalizeAxis(a, rank, ctx.node);
    if (n >= rank) ctx.Fail("axes " + IntsToString(axes) + " name axis " + Str(a) + " of a scalar");
    if (!seen.insert(n).second) ctx.Fail("axes " + IntsToString(axes) + " name axis " + Str(a) + " twice");
    out.push_back(n);
  }
  return out;
}

void RequireAttr(const InferContext& ctx, const char* attr) {
  if (!ctx.node.Has(attr)) ctx.Fail(std::string("attribute '") + attr + "' is required");
}

// ---------------------------------------------------------------------------------------------------------------
void InferConcat(InferContext& ctx) {
  if (ctx.num_inputs() == 0) ctx.Fail("expected at least one input");
  RequireAttr(ctx, "axis");
  for (int i = 0; i < ctx.num_inputs(); ++i) InShape(ctx, i);
  const Shape& first = ctx.input_shapes[0];
  int64_t rank = static_cast<int64_t>(first.size());
  if (rank == 0) ctx.Fail("inputs must have rank >= 1, input 0 is a scalar");
  int64_t axis = NormalizeAxis(ctx.node.GetInt("axis", 0), rank, ctx.node);
  Shape out = first;
  out[axis] = 0;
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    const Shape& s = ctx.input_shapes[i];
    if (ctx.input_dtypes[i] != ctx.input_dtypes[0])
      ctx.Fail("input " + Str(i) + " has dtype " + DTypeName(ctx.input_dtypes[i]) + ", expected " +
               DTypeName(ctx.input_dtypes[0]) + " (the dtype of input 0)");
    if (static_cast<int64_t>(s.size()) != rank)
      ctx.Fail("input " + Str(i) + " has rank " + Str(s.size()) + " (shape " + ShapeToString(s) + "), expected rank " +
               Str(rank) + " like input 0 " + ShapeToString(first));
    for (int64_t d = 0; d < rank; ++d)
      if (d != axis && s[d] != first[d])
        ctx.Fail("input " + Str(i) + " has shape " + ShapeToString(s) + ", which differs from input 0 " +
                 ShapeToString(first) + " outside axis " + Str(axis));
    out[axis] += s[axis];
  }
  CheckShape(ctx, out);
  ctx.SetOutput(0, ctx.input_dtypes[0], out);
}

// ---------------------------------------------------------------------------------------------------------------
void InferSplit(InferContext& ctx) {
  const Shape& in = InShape(ctx, 0);
  if (in.empty()) ctx.Fail("input must have rank >= 1, got a scalar");
  int64_t axis = NormalizeAxis(ctx.node.GetInt("axis", 0), static_cast<int64_t>(in.size()), ctx.node);
  int64_t dim = in[axis];
  int64_t num_outputs = static_cast<int64_t>(ctx.node.outputs.size());
  std::vector<int64_t> split;
  bool has_split = false;
  if (ctx.opset < 13) {
    if (ctx.Has(1)) ctx.Fail("before opset 13 'split' is an attribute, not an input");
    if (ctx.node.Has("split")) {
      split = ctx.node.GetInts("split");
      has_split = true;
    }
  } else if (HasNonEmpty(ctx, 1)) {
    split = IntInput(ctx, 1, "split");
    has_split = true;
  }
  std::vector<int64_t> sizes;
  if (ctx.opset >= 18 && ctx.node.Has("num_outputs")) {
    if (has_split) ctx.Fail("give either the 'split' input or the 'num_outputs' attribute, not both");
    int64_t n = ctx.node.GetInt("num_outputs", 0);
    if (n < 1 || n != num_outputs)
      ctx.Fail("num_outputs = " + Str(n) + " must equal the number of outputs (" + Str(num_outputs) + ")");
    int64_t chunk = (dim + n - 1) / n;
    int64_t last = dim - chunk * (n - 1);
    if (last < 0)
      ctx.Fail("axis of size " + Str(dim) + " cannot be split into " + Str(n) + " chunks of size " + Str(chunk));
    sizes.assign(n, chunk);
    sizes.back() = last;
  } else if (has_split) {
    if (static_cast<int64_t>(split.size()) != num_outputs)
      ctx.Fail("split " + IntsToString(split) + " has " + Str(split.size()) + " entries for " + Str(num_outputs) +
               " outputs");
    int64_t sum = 0;
    for (int64_t s : split) {
      if (s < 0) ctx.Fail("split " + IntsToString(split) + " has a negative entry");
      sum += s;
    }
    if (sum != dim)
      ctx.Fail("split " + IntsToString(split) + " sums to " + Str(sum) + ", but axis " + Str(axis) + " has size " +
               Str(dim));
    sizes = split;
  } else {
    if (num_outputs < 1 || dim % num_outputs != 0)
      ctx.Fail("axis " + Str(axis) + " of size " + Str(dim) + " cannot be split evenly into " + Str(num_outputs) +
               " outputs");
    sizes.assign(num_outputs, dim / num_outputs);
  }
  for (int64_t i = 0; i < num_outputs; ++i) {
    Shape s = in;
    s[axis] = sizes[i];
    ctx.SetOutput(static_cast<int>(i), ctx.input_dtypes[0], s);
  }
}

// ---------------------------------------------------------------------------------------------------------------
void InferSlice(InferContext& ctx) {
  const Shape& in = InShape(ctx, 0);
  SliceArgs args;
  if (ctx.opset < 10) {
    if (ctx.num_inputs() > 1) ctx.Fail("before opset 10 Slice takes starts/ends/axes as attributes, not inputs");
    RequireAttr(ctx, "starts");
    RequireAttr(ctx, "ends");
    args.starts = ctx.node.GetInts("starts");
    args.ends = ctx.node.GetInts("ends");
    if (ctx.node.Has("axes")) args.axes = ctx.node.GetInts("axes");
  } else {
    if (!ctx.Has(1) || !ctx.Has(2)) ctx.Fail("inputs 'starts' and 'ends' are required");
    args.starts = IntInput(ctx, 1, "starts");
    args.ends = IntInput(ctx, 2, "ends");
    if (ctx.Has(3)) args.axes = IntInput(ctx, 3, "axes");
    if (ctx.Has(4)) args.steps = IntInput(ctx, 4, "steps");
    if (ctx.Has(3) && args.axes.empty() && !args.starts.empty()) ctx.Fail("axes is empty but starts is not");
  }
  ctx.SetOutput(0, ctx.input_dtypes[0], ResolveSlice(in, args, ctx.node).out);
}

// ---------------------------------------------------------------------------------------------------------------
void InferGather(InferContext& ctx) {
  const Shape& data = InShape(ctx, 0);
  const Shape& indices = InShape(ctx, 1);
  int64_t rank = static_cast<int64_t>(data.size());
  if (rank == 0) ctx.Fail("data must have rank >= 1, got a scalar");
  if (ctx.input_dtypes[1] != DType::kI64 && ctx.input_dtypes[1] != DType::kI32)
    ctx.Fail(std::string("indices must be int32 or int64, got ") + DTypeName(ctx.input_dtypes[1]));
  int64_t axis = NormalizeAxis(ctx.node.GetInt("axis", 0), rank, ctx.node);
  Shape out(data.begin(), data.begin() + axis);
  out.insert(out.end(), indices.begin(), indices.end());
  out.insert(out.end(), data.begin() + axis + 1, data.end());
  CheckShape(ctx, out);
  ctx.SetOutput(0, ctx.input_dtypes[0], out);
}

void InferGatherElements(InferContext& ctx) {
  const Shape& data = InShape(ctx, 0);
  const Shape& indices = InShape(ctx, 1);
  int64_t rank = static_cast<int64_t>(data.size());
  if (rank == 0) ctx.Fail("data must have rank >= 1, got a scalar");
  if (ctx.input_dtypes[1] != DType::kI64 && ctx.input_dtypes[1] != DType::kI32)
    ctx.Fail(std::string("indices must be int32 or int64, got ") + DTypeName(ctx.input_dtypes[1]));
  if (static_cast<int64_t>(indices.size()) != rank)
    ctx.Fail("indices " + ShapeToString(indices) + " must have the rank of data " + ShapeToString(data));
  int64_t axis = NormalizeAxis(ctx.node.GetInt("axis", 0), rank, ctx.node);
  for (int64_t d = 0; d < rank; ++d)
    if (d != axis && indices[d] > data[d])
      ctx.Fail("indices " + ShapeToString(indices) + " exceed data " + ShapeToString(data) + " on axis " + Str(d));
  ctx.SetOutput(0, ctx.input_dtypes[0], indices);
}

// GatherND / ScatterND: the last axis of `indices` (k values) addresses data's axes batch_dims .. batch_dims + k - 1;
// the first batch_dims axes of data and indices pair up. Returns k.
int64_t NdIndexDepth(const InferContext& ctx, const Shape& data, const Shape& indices, int64_t batch_dims) {
  if (ctx.input_dtypes[1] != DType::kI64 && ctx.input_dtypes[1] != DType::kI32)
    ctx.Fail(std::string("indices must be int64 (or int32), got ") + DTypeName(ctx.input_dtypes[1]));
  const int64_t r = static_cast<int64_t>(data.size()), q = static_cast<int64_t>(indices.size());
  if (r < 1 || q < 1)
    ctx.Fail("data and indices must have rank >= 1, got " + ShapeToString(data) + " and " + ShapeToString(indices));
  if (batch_dims < 0 || batch_dims >= std::min(r, q))
    ctx.Fail("batch_dims " + Str(batch_dims) + " must be in [0, " + Str(std::min(r, q) - 1) + "]");
  for (int64_t d = 0; d < batch_dims; ++d)
    if (data[d] != indices[d])
      ctx.Fail("batch dim " + Str(d) + " differs: data " + ShapeToString(data) + ", indices " + ShapeToString(indices));
  const int64_t k = indices.back();
  if (k < 1 || k > r - batch_dims)
    ctx.Fail("the last dim of indices " + ShapeToString(indices) + " must be in [1, " + Str(r - batch_dims) +
             "] for data " + ShapeToString(data));
  return k;
}

// The updates' dtype and the reduction of ScatterND / ScatterElements.
void CheckScatterUpdates(const InferContext& ctx) {
  if (ctx.input_dtypes[2] != ctx.input_dtypes[0])
    ctx.Fail(std::string("updates are ") + DTypeName(ctx.input_dtypes[2]) + ", data " + DTypeName(ctx.input_dtypes[0]));
  const std::string reduction = ctx.node.GetString("reduction", "none");
  if (reduction != "none" && reduction != "add" && reduction != "mul" && reduction != "max" && reduction != "min")
    ctx.Fail("reduction must be none, add, mul, max or min, got \"" + reduction + "\"");
  if (reduction != "none" && ctx.input_dtypes[0] == DType::kBool)
    ctx.Fail("reduction \"" + reduction + "\" needs numbers, data is bool");
}

void InferGatherND(InferContext& ctx) {
  const Shape& data = InShape(ctx, 0);
  const Shape& indices = InShape(ctx, 1);
  const int64_t b = ctx.node.GetInt("batch_dims", 0);
  const int64_t k = NdIndexDepth(ctx, data, indices, b);
  Shape out(indices.begin(), indices.end() - 1);
  out.insert(out.end(), data.begin() + b + k, data.end());
  CheckShape(ctx, out);
  ctx.SetOutput(0, ctx.input_dtypes[0], out);
}

void InferScatterND(InferContext& ctx) {
  const Shape& data = InShape(ctx, 0);
  const Shape& indices = InShape(ctx, 1);
  const Shape& updates = InShape(ctx, 2);
  const int64_t k = NdIndexDepth(ctx, data, indices, 0);
  Shape want(indices.begin(), indices.end() - 1);
  want.insert(want.end(), data.begin() + k, data.end());
  if (updates != want)
    ctx.Fail("updates " + ShapeToString(updates) + " must have shape " + ShapeToString(want) + " (indices " +
             ShapeToString(indices) + ", data " + ShapeToString(data) + ")");
  CheckScatterUpdates(ctx);
  ctx.SetOutput(0, ctx.input_dtypes[0], data);
}

// ScatterElements (and Scatter, its name before opset 11): indices and updates of one shape, data's rank, no larger
// than data off the axis.
void InferScatterElements(InferContext& ctx) {
  const Shape& data = InShape(ctx, 0);
  const Shape& indices = InShape(ctx, 1);
  const Shape& updates = InShape(ctx, 2);
  const int64_t rank = static_cast<int64_t>(data.size());
  if (rank == 0) ctx.Fail("data must have rank >= 1, got a scalar");
  if (ctx.input_dtypes[1] != DType::kI64 && ctx.input_dtypes[1] != DType::kI32)
    ctx.Fail(std::string("indices must be int32 or int64, got ") + DTypeName(ctx.input_dtypes[1]));
  if (indices != updates || static_cast<int64_t>(indices.size()) != rank)
    ctx.Fail("indices " + ShapeToString(indices) + " and updates " + ShapeToString(updates) +
             " must have one shape, of data's rank " + Str(rank));
  const int64_t axis = NormalizeAxis(ctx.node.GetInt("axis", 0), rank, ctx.node);
  for (int64_t d = 0; d < rank; ++d)
    if (d != axis && indices[d] > data[d])
      ctx.Fail("indices " + ShapeToString(indices) + " exceed data " + ShapeToString(data) + " on axis " + Str(d));
  CheckScatterUpdates(ctx);
  ctx.SetOutput(0, ctx.input_dtypes[0], data);
}

// TensorScatter (opset 24, a KV cache update): past_cache [B, .., max_seq (axis), ..], update of its shape but for
// the axis (at most max_seq), write_indices [B] (int64, default zeros); mode "linear" or "circular".
void InferTensorScatter(InferContext& ctx) {
  const Shape& cache = InShape(ctx, 0);
  const Shape& update = InShape(ctx, 1);
  const int64_t rank = static_cast<int64_t>(cache.size());
  if (rank < 2) ctx.Fail("past_cache must have rank >= 2, got " + ShapeToString(cache));
  const int64_t axis = NormalizeAxis(ctx.node.GetInt("axis", -2), rank, ctx.node);
  if (axis == 0) ctx.Fail("axis must not be 0 (the batch axis)");
  const std::string mode = ctx.node.GetString("mode", "linear");
  if (mode != "linear" && mode != "circular") ctx.Fail("mode '" + mode + "' is not one of linear, circular");
  if (ctx.input_dtypes[1] != ctx.input_dtypes[0]) ctx.Fail("update's dtype differs from past_cache's");
  bool fits = static_cast<int64_t>(update.size()) == rank;
  for (int64_t d = 0; fits && d < rank; ++d) fits = d == axis ? update[d] <= cache[d] : update[d] == cache[d];
  if (!fits)
    ctx.Fail("update " + ShapeToString(update) + " must have past_cache's shape " + ShapeToString(cache) +
             " with at most as many entries on axis " + Str(axis));
  if (ctx.Has(2) && (ctx.input_dtypes[2] != DType::kI64 || InShape(ctx, 2) != Shape{cache[0]}))
    ctx.Fail("write_indices must be int64 [" + Str(cache[0]) + "], got " + ShapeToString(InShape(ctx, 2)));
  ctx.SetOutput(0, ctx.input_dtypes[0], cache);
}

// ---------------------------------------------------------------------------------------------------------------
void InferReshape(InferContext& ctx) {
  const Shape& in = InShape(ctx, 0);
  std::vector<int64_t> req;
  if (ctx.opset < 5) {
    RequireAttr(ctx, "shape");
    req = ctx.node.GetInts("shape");
  } else {
    if (!ctx.Has(1)) ctx.Fail("input 'shape' is required");
    req = IntInput(ctx, 1, "shape");
  }
  bool allow_zero = ctx.node.GetInt("allowzero", 0) != 0;
  int64_t total = NumElements(in);
  Shape out(req.size());
  int64_t unknown = -1;
  int64_t known = 1;
  for (size_t i = 0; i < req.size(); ++i) {
    int64_t d = req[i];
    if (d == -1) {
      if (unknown >= 0) ctx.Fail("shape " + IntsToString(req) + " has more than one -1");
      unknown = static_cast<int64_t>(i);
      continue;
    }
    if (d < -1) ctx.Fail("shape " + IntsToString(req) + " has a negative entry other than -1");
    if (d == 0 && !allow_zero) {
      if (i >= in.size())
        ctx.Fail("shape " + IntsToString(req) + " copies dim " + Str(i) + " (a 0) of input " + ShapeToString(in) +
                 ", which has no such dim");
      d = in[i];
    }
    out[i] = d;
    if (d != 0 && known > kMaxBytes / d) ctx.Fail("shape " + IntsToString(req) + " is too large");
    known *= d;
  }
  if (unknown >= 0) {
    if (allow_zero && std::count(req.begin(), req.end(), 0) > 0)
      ctx.Fail("shape " + IntsToString(req) + " mixes 0 and -1 while allowzero=1");
    if (known == 0 || total % known != 0)
      ctx.Fail("cannot reshape " + ShapeToString(in) + " (" + Str(total) + " elements) to " + IntsToString(req));
    out[unknown] = total / known;
  }
  CheckShape(ctx, out);
  if (NumElements(out) != total)
    ctx.Fail("cannot reshape " + ShapeToString(in) + " (" + Str(total) + " elements) to " + IntsToString(req) + " (" +
             Str(NumElements(out)) + " elements)");
  ctx.SetOutput(0, ctx.input_dtypes[0], out);
}

void InferFlatten(InferContext& ctx) {
  const Shape& in = InShape(ctx, 0);
  int64_t rank = static_cast<int64_t>(in.size());
  int64_t axis = ctx.node.GetInt("axis", 1);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis > rank)
    ctx.Fail("axis " + Str(ctx.node.GetInt("axis", 1)) + " is out of range for rank " + Str(rank));
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < rank; ++d) (d < axis ? outer : inner) = CheckedMul(d < axis ? outer : inner, in[d]);
  ctx.SetOutput(0, ctx.input_dtypes[0], {outer, inner});
}

void InferSqueeze(InferContext& ctx) {
  const Shape& in = InShape(ctx, 0);
  int64_t rank = static_cast<int64_t>(in.size());
  std::vector<int64_t> axes;
  bool has_axes = false;
  if (ctx.opset < 13) {
    if (ctx.Has(1)) ctx.Fail("before opset 13 'axes' is an attribute, not an input");
    if (ctx.node.Has("axes")) {
      axes = ctx.node.GetInts("axes");
      has_axes = true;
    }
  } else if (ctx.Has(1)) {
    axes = IntInput(ctx, 1, "axes");
    has_axes = true;
  }
  std::vector<bool> drop(rank, false);
  if (has_axes && !axes.empty()) {
    for (int64_t a : axes) {
      int64_t n = NormalizeAxis(a, rank, ctx.node);
      if (n >= rank) ctx.Fail("cannot squeeze axis " + Str(a) + " of a scalar");
      if (in[n] != 1)
        ctx.Fail("cannot squeeze axis " + Str(a) + " of shape " + ShapeToString(in) + ": its size is " + Str(in[n]));
      drop[n] = true;
    }
  } else {
    for (int64_t d = 0; d < rank; ++d) drop[d] = in[d] == 1;
  }
  Shape out;
  for (int64_t d = 0; d < rank; ++d)
    if (!drop[d]) out.push_back(in[d]);
  ctx.SetOutput(0, ctx.input_dtypes[0], out);
}

void InferUnsqueeze(InferContext& ctx) {
  const Shape& in = InShape(ctx, 0);
  std::vector<int64_t> axes;
  if (ctx.opset < 13) {
    if (ctx.Has(1)) ctx.Fail("before opset 13 'axes' is an attribute, not an input");
    RequireAttr(ctx, "axes");
    axes = ctx.node.GetInts("axes");
  } else {
    if (!ctx.Has(1)) ctx.Fail("input 'axes' is required from opset 13");
    axes = IntInput(ctx, 1, "axes");
  }
  int64_t out_rank = static_cast<int64_t>(in.size() + axes.size());
  std::vector<int64_t> norm = NormalizeAxes(ctx, axes, out_rank);
  std::vector<bool> inserted(out_rank, false);
  for (int64_t a : norm) inserted[a] = true;
  Shape out;
  size_t next = 0;
  for (int64_t d = 0; d < out_rank; ++d) out.push_back(inserted[d] ? 1 : in[next++]);
  ctx.SetOutput(0, ctx.input_dtypes[0], out);
}

void InferTranspose(InferContext& ctx) {
  const Shape& in = InShape(ctx, 0);
  int64_t rank = static_cast<int64_t>(in.size());
  const std::vector<int64_t> perm = TransposePerm(ctx.node, in.size());
  if (static_cast<int64_t>(perm.size()) != rank)
    ctx.Fail("perm " + IntsToString(perm) + " has " + Str(perm.size()) + " entries for an input of rank " + Str(rank));
  std::vector<bool> used(rank, false);
  Shape out(rank);
  for (int64_t i = 0; i < rank; ++i) {
    int64_t p = perm[i];
    if (p < 0 || p >= rank || used[p])
      ctx.Fail("perm " + IntsToString(perm) + " is not a permutation of 0.." + Str(rank - 1));
    used[p] = true;
    out[i] = in[p];
  }
  ctx.SetOutput(0, ctx.input_dtypes[0], out);
}

void InferExpand(InferContext& ctx) {
  const Shape& in = InShape(ctx, 0);
  std::vector<int64_t> shape = IntInput(ctx, 1, "shape");
  for (int64_t d : shape)
    if (d < 0) ctx.Fail("shape " + IntsToString(shape) + " has a negative entry");
  Shape out = BroadcastShapes(in, shape, ctx.node);
  CheckShape(ctx, out);
  ctx.SetOutput(0, ctx.input_dtypes[0], out);
}

void InferTile(InferContext& ctx) {
  const Shape& in = InShape(ctx, 0);
  std::vector<int64_t> repeats = IntInput(ctx, 1, "repeats");
  if (repeats.size() != in.size())
    ctx.Fail("repeats " + IntsToString(repeats) + " must have one entry per dim of input " + ShapeToString(in));
  Shape out(in.size());
  for (size_t d = 0; d < in.size(); ++d) {
    if (repeats[d] < 0) ctx.Fail("repeats " + IntsToString(repeats) + " has a negative entry");
    if (in[d] != 0 && repeats[d] > kMaxBytes / in[d])
      ctx.Fail("repeats " + IntsToString(repeats) + " are too large");
    out[d] = in[d] * repeats[d];
  }
  CheckShape(ctx, out);
  ctx.SetOutput(0, ctx.input_dtypes[0], out);
}

// ---------------------------------------------------------------------------------------------------------------
void InferPad(InferContext& ctx) {
  const Shape& in = InShape(ctx, 0);
  int64_t rank = static_cast<int64_t>(in.size());
  std::string mode = ctx.node.GetString("mode", "constant");
  if (mode != "constant" && mode != "reflect" && mode != "edge" && mode != "wrap")
    ctx.Fail("mode '" + mode + "' is not one of constant, reflect, edge, wrap");
  std::vector<int64_t> pads, axes;
  if (ctx.opset < 11) {
    if (ctx.num_inputs() > 1) ctx.Fail("before opset 11 Pad takes pads/value as attributes, not inputs");
    RequireAttr(ctx, "pads");
    pads = ctx.node.GetInts("pads");
    for (int64_t d = 0; d < rank; ++d) axes.push_back(d);
  } else {
    if (!ctx.Has(1)) ctx.Fail("input 'pads' is required");
    pads = IntInput(ctx, 1, "pads");
    if (ctx.Has(2)) {
      if (ctx.input_dtypes[2] != ctx.input_dtypes[0])
        ctx.Fail(std::string("constant_value has dtype ") + DTypeName(ctx.input_dtypes[2]) + ", expected " +
                 DTypeName(ctx.input_dtypes[0]) + " (the dtype of data)");
      if (NumElements(ctx.input_shapes[2]) > 1)
        ctx.Fail("constant_value must be a scalar, got shape " + ShapeToString(ctx.input_shapes[2]));
    }
    if (ctx.Has(3)) {
      axes = NormalizeAxes(ctx, IntInput(ctx, 3, "axes"), rank);
    } else {
      for (int64_t d = 0; d < rank; ++d) axes.push_back(d);
    }
  }
  int64_t n = static_cast<int64_t>(axes.size());
  if (static_cast<int64_t>(pads.size()) != 2 * n)
    ctx.Fail("pads " + IntsToString(pads) + " must have 2 * " + Str(n) + " entries for input " + ShapeToString(in));
  Shape out = in;
  for (int64_t i = 0; i < n; ++i) {
    int64_t d = axes[i], begin = pads[i], end = pads[i + n];
    // Pads near the int64 limits would overflow the sums below: osprey's tensor size limit refuses far less.
    constexpr int64_t kMaxPad = int64_t{1} << 48;
    if (begin > kMaxPad || end > kMaxPad || begin < -kMaxPad || end < -kMaxPad)
      ctx.Fail("pads " + IntsToString(pads) + " exceed +/-2^48 on axis " + Str(d) + " (no tensor that size fits)");
    int64_t kept = in[d] - std::max<int64_t>(0, -begin) - std::max<int64_t>(0, -end);
    if (kept < 0)
      ctx.Fail("pads " + IntsToString(pads) + " crop more than the " + Str(in[d]) + " elements of axis " + Str(d));
    if (kept == 0 && mode != "constant" && (begin > 0 || end > 0))
      ctx.Fail("cannot pad an empty axis " + Str(d) + " in mode '" + mode + "'");
    out[d] = in[d] + begin + end;
  }
  CheckShape(ctx, out);
  ctx.SetOutput(0, ctx.input_dtypes[0], out);
}

// ---------------------------------------------------------------------------------------------------------------
const char* const kCoordinateModes[] = {"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                                        "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize"};
const char* const kNearestModes[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};

template <size_t N>
bool OneOf(const std::string& s, const char* const (&options)[N]) {
  for (const char* o : options)
    if (s == o) return true;
  return false;
}

void CheckInterpolationDType(const InferContext& ctx, const std::string& mode) {
  if (mode != "nearest" && ctx.input_dtypes[0] != DType::kF32)
    throw Error(ErrorCode::kUnsupported, ctx.node.Describe() + ": mode '" + mode +
                                             "' supports float32 input only, got " + DTypeName(ctx.input_dtypes[0]));
}

// Output dims floor(d * scale) for the legacy Upsample / Resize-10 form.
Shape ScaledShape(const InferContext& ctx, const Shape& in, const std::vector<double>& scales) {
  if (scales.size() != in.size())
    ctx.Fail("scales has " + Str(scales.size()) + " entries for an input of rank " + Str(in.size()));
  Shape out(in.size());
  for (size_t d = 0; d < in.size(); ++d) {
    if (!(scales[d] > 0) || !std::isfinite(scales[d])) ctx.Fail("scales must be positive and finite");
    double v = std::floor(static_cast<double>(in[d]) * scales[d]);
    if (v > static_cast<double>(kMaxBytes)) ctx.Fail("scaled output is too large");
    out[d] = static_cast<int64_t>(v);
  }
  CheckShape(ctx, out);
  return out;
}

void InferUpsample(InferContext& ctx) {
  const Shape& in = InShape(ctx, 0);
  std::string mode = ctx.node.GetString("mode", "nearest");
  if (mode != "nearest" && mode != "linear") ctx.Fail("mode '" + mode + "' is not one of nearest, linear");
  CheckInterpolationDType(ctx, mode);
  std::vector<double> scales;
  if (ctx.opset < 9) {
    if (ctx.Has(1)) ctx.Fail("before opset 9 'scales' is an attribute, not an input");
    RequireAttr(ctx, "scales");
    for (float s : ctx.node.GetFloats("scales")) scales.push_back(s);
  } else {
    if (!ctx.Has(1)) ctx.Fail("input 'scales' is required from opset 9");
    scales = FloatInput(ctx, 1, "scales");
  }
  ctx.SetOutput(0, ctx.input_dtypes[0], ScaledShape(ctx, in, scales));
}

void InferResize(InferContext& ctx) {
  const Shape& in = InShape(ctx, 0);
  int64_t rank = static_cast<int64_t>(in.size());
  std::string mode = ctx.node.GetString("mode", "nearest");
  if (ctx.opset < 11) {
    if (mode != "nearest" && mode != "linear") ctx.Fail("mode '" + mode + "' is not one of nearest, linear");
    CheckInterpolationDType(ctx, mode);
    if (!ctx.Has(1)) ctx.Fail("input 'scales' is required in opset 10");
    if (ctx.num_inputs() > 2) ctx.Fail("opset 10 Resize takes 2 inputs (X, scales)");
    ctx.SetOutput(0, ctx.input_dtypes[0], ScaledShape(ctx, in, FloatInput(ctx, 1, "scales")));
    return;
  }
  if (mode != "nearest" && mode != "linear" && mode != "cubic")
    ctx.Fail("mode '" + mode + "' is not one of nearest, linear, cubic");
  CheckInterpolationDType(ctx, mode);
  std::string coord = ctx.node.GetString("coordinate_transformation_mode", "half_pixel");
  if (!OneOf(coord, kCoordinateModes)) ctx.Fail("coordinate_transformation_mode '" + coord + "' is not supported");
  std::string nearest_mode = ctx.node.GetString("nearest_mode", "round_prefer_floor");
  if (!OneOf(nearest_mode, kNearestModes)) ctx.Fail("nearest_mode '" + nearest_mode + "' is not supported");
  if (ctx.node.GetInt("antialias", 0) != 0)
    throw Error(ErrorCode::kUnsupported, ctx.node.Describe() + ": antialias=1 is not supported");
  std::string policy = ctx.node.GetString("keep_aspect_ratio_policy", "stretch");
  if (policy != "stretch" && policy != "not_larger" && policy != "not_smaller")
    ctx.Fail("keep_aspect_ratio_policy '" + policy + "' is not one of stretch, not_larger, not_smaller");
  std::vector<int64_t> axes;
  if (ctx.node.Has("axes")) {
    axes = NormalizeAxes(ctx, ctx.node.GetInts("axes"), rank);
  } else {
    for (int64_t d = 0; d < rank; ++d) axes.push_back(d);
  }
  int64_t n = static_cast<int64_t>(axes.size());
  bool has_scales = HasNonEmpty(ctx, 2), has_sizes = HasNonEmpty(ctx, 3);
  if (has_scales == has_sizes) ctx.Fail("exactly one of the 'scales' and 'sizes' inputs must be given (non-empty)");
  if (coord == "tf_crop_and_resize" && (!ctx.Has(1) || NumElements(ctx.input_shapes[1]) != 2 * n))
    ctx.Fail("coordinate_transformation_mode 'tf_crop_and_resize' needs an roi input of " + Str(2 * n) + " values");
  Shape out = in;
  if (has_scales) {
    std::vector<double> scales = FloatInput(ctx, 2, "scales");
    if (static_cast<int64_t>(scales.size()) != n)
      ctx.Fail("scales has " + Str(scales.size()) + " entries, expected " + Str(n));
    for (int64_t i = 0; i < n; ++i) {
      if (!(scales[i] > 0) || !std::isfinite(scales[i])) ctx.Fail("scales must be positive and finite");
      double v = std::floor(static_cast<double>(in[axes[i]]) * scales[i]);
      if (v > static_cast<double>(kMaxBytes)) ctx.Fail("scaled output is too large");
      out[axes[i]] = static_cast<int64_t>(v);
    }
  } else {
    std::vector<int64_t> sizes = IntInput(ctx, 3, "sizes");
    if (static_cast<int64_t>(sizes.size()) != n)
      ctx.Fail("sizes has " + Str(sizes.size()) + " entries, expected " + Str(n));
    for (int64_t s : sizes)
      if (s < 0) ctx.Fail("sizes " + IntsToString(sizes) + " has a negative entry");
    if (policy == "stretch") {
      for (int64_t i = 0; i < n; ++i) out[axes[i]] = sizes[i];
    } else {
      double scale = policy == "not_larger" ? INFINITY : 0.0;
      for (int64_t i = 0; i < n; ++i) {
        double s = static_cast<double>(sizes[i]) / static_cast<double>(in[axes[i]]);
        scale = policy == "not_larger" ? std::min(scale, s) : std::max(scale, s);
      }
      if (!std::isfinite(scale)) ctx.Fail("keep_aspect_ratio_policy needs non-empty input axes");
      for (int64_t i = 0; i < n; ++i)
        out[axes[i]] = static_cast<int64_t>(scale * static_cast<double>(in[axes[i]]) + 0.5);
    }
  }
  for (int64_t d = 0; d < rank; ++d)
    if (in[d] == 0 && out[d] > 0) ctx.Fail("cannot resize empty axis " + Str(d) + " to size " + Str(out[d]));
  CheckShape(ctx, out);
  ctx.SetOutput(0, ctx.input_dtypes[0], out);
}

// ---------------------------------------------------------------------------------------------------------------
void InferShape(InferContext& ctx) {
  int64_t rank = static_cast<int64_t>(InShape(ctx, 0).size());
  int64_t start = ctx.node.GetInt("start", 0), end = ctx.node.GetInt("end", rank);
  if (start < 0) start += rank;
  if (end < 0) end += rank;
  start = std::clamp<int64_t>(start, 0, rank);
  end = std::clamp<int64_t>(end, 0, rank);
  ctx.SetOutput(0, DType::kI64, {std::max<int64_t>(0, end - start)});
}

void InferSize(InferContext& ctx) {
  InShape(ctx, 0);
  ctx.SetOutput(0, DType::kI64, {});
}

void InferConstant(InferContext& ctx) {
  const Node& node = ctx.node;
  const char* const kValueAttrs[] = {"value",      "value_float",  "value_floats",  "value_int",
                                     "value_ints", "value_string", "value_strings", "sparse_value"};
  int count = 0;
  for (const char* a : kValueAttrs) count += node.Has(a) ? 1 : 0;
  if (count != 1) ctx.Fail("exactly one value attribute is required, got " + Str(count));
  if (node.Has("sparse_value"))
    throw Error(ErrorCode::kUnsupported, node.Describe() + ": sparse_value constants are not supported");
  if (node.Has("value_string") || node.Has("value_strings"))
    throw Error(ErrorCode::kUnsupported, node.Describe() + ": string constants are not supported");
  if (node.Has("value")) {
    const Attribute& a = node.attrs.at("value");
    if (a.kind != Attribute::Kind::kTensor)
      ctx.Fail(std::string("attribute 'value' should be a tensor, got ") + AttributeKindName(a.kind));
    if (!a.t.defined()) ctx.Fail("attribute 'value' holds no tensor");
    ctx.SetOutput(0, a.t.dtype(), a.t.shape());
  } else if (node.Has("value_float")) {
    node.GetFloat("value_float", 0);
    ctx.SetOutput(0, DType::kF32, {});
  } else if (node.Has("value_floats")) {
    ctx.SetOutput(0, DType::kF32, {static_cast<int64_t>(node.GetFloats("value_floats").size())});
  } else if (node.Has("value_int")) {
    node.GetInt("value_int", 0);
    ctx.SetOutput(0, DType::kI64, {});
  } else {
    ctx.SetOutput(0, DType::kI64, {static_cast<int64_t>(node.GetInts("value_ints").size())});
  }
}

void InferConstantOfShape(InferContext& ctx) {
  std::vector<int64_t> shape = IntInput(ctx, 0, "shape");
  DType dtype = DType::kF32;
  if (ctx.node.Has("value")) {
    const Attribute& a = ctx.node.attrs.at("value");
    if (a.kind != Attribute::Kind::kTensor)
      ctx.Fail(std::string("attribute 'value' should be a tensor, got ") + AttributeKindName(a.kind));
    if (a.t.numel() != 1) ctx.Fail("attribute 'value' must hold exactly one element, got " + Str(a.t.numel()));
    dtype = a.t.dtype();
  }
  CheckShape(ctx, shape);
  ctx.SetOutput(0, dtype, shape);
}

// OneHot(indices, depth, values [off, on]; axis): indices' shape with `depth` inserted at `axis` (default -1, the
// innermost), of values' dtype. depth must be known when the model is compiled (it sizes the output).
void InferOneHot(InferContext& ctx) {
  const Shape& indices = InShape(ctx, 0);
  const Tensor& depth_t = ctx.Value(1);
  if (depth_t.numel() != 1 || depth_t.rank() > 1)
    ctx.Fail("depth must be a scalar or a one-element tensor, got shape " + ShapeToString(depth_t.shape()));
  const double depth_value = depth_t.GetAsDouble(0);
  if (!(depth_value >= 1) || depth_value > static_cast<double>(kMaxBytes))
    ctx.Fail("depth must be a positive number of classes, got " + ToStr(depth_value));
  const Shape& values = InShape(ctx, 2);
  if (values.size() != 1 || values[0] != 2)
    ctx.Fail("values must be [off_value, on_value] (2 elements), got shape " + ShapeToString(values));
  const int64_t rank = static_cast<int64_t>(indices.size());
  int64_t axis = ctx.node.GetInt("axis", -1);
  if (axis < -rank - 1 || axis > rank)
    ctx.Fail("axis " + Str(axis) + " is out of range for indices of rank " + Str(rank) + " (the output has rank " +
             Str(rank + 1) + ")");
  if (axis < 0) axis += rank + 1;
  Shape out(indices.begin(), indices.begin() + axis);
  out.push_back(static_cast<int64_t>(depth_value));
  out.insert(out.end(), indices.begin() + axis, indices.end());
  CheckShape(ctx, out);
  ctx.SetOutput(0, ctx.input_dtypes[2], out);
}

void InferRange(InferContext& ctx) {
  for (int i = 0; i < 3; ++i) {
    const Tensor& t = ctx.Value(i);
    if (t.numel() != 1 || t.rank() > 1)
      ctx.Fail("input " + Str(i) + " must be a scalar, got shape " + ShapeToString(t.shape()));
    if (t.dtype() != ctx.Value(0).dtype())
      ctx.Fail("start, limit and delta must share a dtype, got " + std::string(DTypeName(ctx.Value(0).dtype())) +
               " and " + DTypeName(t.dtype()));
  }
  DType dtype = ctx.Value(0).dtype();
  int64_t count = 0;
  if (dtype == DType::kI64 || dtype == DType::kI32) {
    int64_t start = ctx.Value(0).GetAsInt(0), limit = ctx.Value(1).GetAsInt(0), delta = ctx.Value(2).GetAsInt(0);
    if (delta == 0) ctx.Fail("delta must not be 0");
    // Work in long double so that limit - start cannot overflow.
    long double span = static_cast<long double>(limit) - static_cast<long double>(start);
    long double c = std::ceil(span / static_cast<long double>(delta));
    if (c > static_cast<long double>(kMaxBytes)) ctx.Fail("range has too many elements (" + ToStr(c) + ")");
    count = c > 0 ? static_cast<int64_t>(c) : 0;
  } else if (dtype == DType::kF32) {
    double start = ctx.Value(0).GetAsDouble(0), limit = ctx.Value(1).GetAsDouble(0),
           delta = ctx.Value(2).GetAsDouble(0);
    if (delta == 0) ctx.Fail("delta must not be 0");
    double c = std::ceil((limit - start) / delta);
    if (!std::isfinite(c)) ctx.Fail("start, limit and delta must be finite");
    if (c > static_cast<double>(kMaxBytes)) ctx.Fail("range has too many elements (" + ToStr(c) + ")");
    count = c > 0 ? static_cast<int64_t>(c) : 0;
  } else {
    throw Error(ErrorCode::kUnsupported,
                ctx.node.Describe() + ": Range supports float32, int32 and int64, got " + DTypeName(dtype));
  }
  ctx.SetOutput(0, dtype, {count});
}

void InferIdentity(InferContext& ctx) { ctx.SetOutput(0, ctx.input_dtypes[0], InShape(ctx, 0)); }

// Trilu: the upper (or lower) triangle of the last two axes, the k-th diagonal on (input 1, a scalar read by the
// kernel); the rest zero.
void InferTrilu(InferContext& ctx) {
  const Shape& in = InShape(ctx, 0);
  if (in.size() < 2) ctx.Fail("input must have rank >= 2, got " + ShapeToString(in));
  if (ctx.Has(1) && (NumElements(ctx.input_shapes[1]) != 1 || ctx.input_dtypes[1] != DType::kI64))
    ctx.Fail("k must be one int64, got " + std::string(DTypeName(ctx.input_dtypes[1])) + " " +
             ShapeToString(ctx.input_shapes[1]));
  ctx.SetOutput(0, ctx.input_dtypes[0], in);
}

void InferDropout(InferContext& ctx) {
  const Shape& in = InShape(ctx, 0);
  if (ctx.opset < 12 && ctx.num_inputs() > 1) ctx.Fail("before opset 12 Dropout takes one input");
  // Training mode draws a random mask; only its no-op form (ratio 0) is deterministic.
  if (ctx.Has(2) && ctx.input_values[2] && ctx.input_values[2]->numel() > 0 && ctx.input_values[2]->GetAsInt(0) != 0) {
    double ratio = 0.5;
    if (ctx.Has(1) && ctx.input_values[1] && ctx.input_values[1]->numel() > 0)
      ratio = ctx.input_values[1]->GetAsDouble(0);
    if (ratio != 0)
      throw Error(ErrorCode::kUnsupported,
                  ctx.node.Describe() + ": training_mode=true (random dropout) is not supported");
  }
  ctx.SetOutput(0, ctx.input_dtypes[0], in);
  if (ctx.node.outputs.size() > 1) ctx.SetOutput(1, ctx.opset < 10 ? ctx.input_dtypes[0] : DType::kBool, in);
}

// CenterCropPad (opset 18): each axis in `axes` (all by default) cut to, or zero-padded to, its size in input 1 about
// its centre (a crop drops the extra element at the end, a pad adds it at the end).
void InferCenterCropPad(InferContext& ctx) {
  const Shape& in = InShape(ctx, 0);
  if (!ctx.Has(1)) ctx.Fail("input 'shape' is required");
  const std::vector<int64_t> sizes = IntInput(ctx, 1, "shape");
  const int64_t rank = static_cast<int64_t>(in.size());
  std::vector<int64_t> axes;
  if (ctx.node.Has("axes")) {
    axes = NormalizeAxes(ctx, ctx.node.GetInts("axes"), rank);
  } else {
    for (int64_t d = 0; d < rank; ++d) axes.push_back(d);
  }
  if (sizes.size() != axes.size())
    ctx.Fail("shape " + IntsToString(sizes) + " must give one size per axis (" +
             Str(static_cast<int64_t>(axes.size())) + ")");
  Shape out = in;
  for (size_t i = 0; i < axes.size(); ++i) {
    if (sizes[i] < 0) ctx.Fail("shape " + IntsToString(sizes) + " has a negative size");
    out[axes[i]] = sizes[i];
  }
  CheckShape(ctx, out);
  ctx.SetOutput(0, ctx.input_dtypes[0], out);
}

void InferDepthToSpace(InferContext& ctx) {
  const Shape& in = InShape(ctx, 0);
  if (in.size() != 4) ctx.Fail("input must be 4-D (N, C, H, W), got " + ShapeToString(in));
  RequireAttr(ctx, "blocksize");
  int64_t b = ctx.node.GetInt("blocksize", 0);
  if (b < 1) ctx.Fail("blocksize must be >= 1, got " + Str(b));
  std::string mode = ctx.node.GetString("mode", "DCR");
  if (mode != "DCR" && mode != "CRD") ctx.Fail("mode '" + mode + "' is not one of DCR, CRD");
  if (b > (int64_t{1} << 30) || in[1] % (b * b) != 0)
    ctx.Fail("channels " + Str(in[1]) + " are not divisible by blocksize^2 = " + Str(b) + "^2");
  Shape out = {in[0], in[1] / (b * b), in[2] * b, in[3] * b};
  CheckShape(ctx, out);
  ctx.SetOutput(0, ctx.input_dtypes[0], out);
}

void InferSpaceToDepth(InferContext& ctx) {
  const Shape& in = InShape(ctx, 0);
  if (in.size() != 4) ctx.Fail("input must be 4-D (N, C, H, W), got " + ShapeToString(in));
  RequireAttr(ctx, "blocksize");
  int64_t b = ctx.node.GetInt("blocksize", 0);
  if (b < 1) ctx.Fail("blocksize must be >= 1, got " + Str(b));
  const std::string mode = ctx.node.GetString("mode", "DCR");  // opset 28
  if (mode != "DCR" && mode != "CRD") ctx.Fail("mode '" + mode + "' is not one of DCR, CRD");
  if (in[2] % b != 0 || in[3] % b != 0)
    ctx.Fail("height and width of " + ShapeToString(in) + " are not divisible by blocksize " + Str(b));
  Shape out = {in[0], in[1] * b * b, in[2] / b, in[3] / b};
  CheckShape(ctx, out);
  ctx.SetOutput(0, ctx.input_dtypes[0], out);
}

// EyeLike: input's 2-D shape, ones on the k-th diagonal; dtype from the attribute or the input.
void InferEyeLike(InferContext& ctx) {
  const Shape& in = InShape(ctx, 0);
  if (in.size() != 2) ctx.Fail("input must be 2-D, got " + ShapeToString(in));
  const DType dtype = ctx.node.Has("dtype") ? schema::DTypeFromOnnxCode(ctx, ctx.node.GetInt("dtype", 1), "dtype")
                                            : ctx.input_dtypes[0];
  if (dtype == DType::kF16 || dtype == DType::kBF16)
    throw Error(ErrorCode::kUnsupported,
                ctx.node.Describe() + ": EyeLike of " + DTypeName(dtype) + " is not supported");
  ctx.node.GetInt("k", 0);
  ctx.SetOutput(0, dtype, in);
}

// HannWindow, HammingWindow, BlackmanWindow (opset 17): a window of `size` (known at compile time: it is the length)
// points, periodic (default) or symmetric.
void InferWindow(InferContext& ctx) {
  const std::vector<int64_t> size = IntInput(ctx, 0, "size");
  if (size.size() != 1 || size[0] < 0) ctx.Fail("size must be one integer >= 0, got " + IntsToString(size));
  const DType dtype = schema::DTypeFromOnnxCode(ctx, ctx.node.GetInt("output_datatype", 1), "output_datatype");
  if (dtype != DType::kF32 && dtype != DType::kI32 && dtype != DType::kI64 && dtype != DType::kI8 &&
      dtype != DType::kU8)
    throw Error(ErrorCode::kUnsupported,
                ctx.node.Describe() + ": a window of " + DTypeName(dtype) + " is not supported");
  ctx.node.GetInt("periodic", 1);
  CheckShape(ctx, {size[0]});
  ctx.SetOutput(0, dtype, {size[0]});
}

// ReverseSequence: the first sequence_lens[b] steps along time_axis of each batch entry reversed, the rest kept.
void InferReverseSequence(InferContext& ctx) {
  const Shape& in = InShape(ctx, 0);
  if (in.size() < 2) ctx.Fail("input must have rank >= 2, got " + ShapeToString(in));
  const int64_t batch_axis = ctx.node.GetInt("batch_axis", 1), time_axis = ctx.node.GetInt("time_axis", 0);
  if ((batch_axis != 0 && batch_axis != 1) || (time_axis != 0 && time_axis != 1) || batch_axis == time_axis)
    ctx.Fail("batch_axis and time_axis must be 0 and 1 or 1 and 0, got " + Str(batch_axis) + " and " + Str(time_axis));
  if (!ctx.Has(1) || (ctx.input_dtypes[1] != DType::kI64 && ctx.input_dtypes[1] != DType::kI32) ||
      ctx.input_shapes[1] != Shape{in[batch_axis]})
    ctx.Fail("sequence_lens must be int64 of shape [" + Str(in[batch_axis]) + "] (the batch), got " +
             (ctx.Has(1) ? std::string(DTypeName(ctx.input_dtypes[1])) + " " + ShapeToString(ctx.input_shapes[1])
                         : std::string("none")));
  ctx.SetOutput(0, ctx.input_dtypes[0], in);
}

// Ops whose output shapes depend on values (OpTraits::data_dependent): a model is cut at them before it is compiled
// (runtime/segments.cc), so their infer runs only where no cut was made: inside an If, Loop or Scan body.
void InferDataDependent(InferContext& ctx) {
  throw Error(ErrorCode::kUnsupported,
              ctx.node.Describe() +
                  ": its output shape depends on its input values; osprey runs such ops between "
                  "plans, at a model's top level or in an If branch or a Loop body there, not inside a Scan body");
}

void Add(OpRegistry& r, const char* op_type, int min_in, int max_in, int min_out, int max_out, InferFn fn,
         OpTraits traits = {}) {
  r.Add(OpSchema{op_type, min_in, max_in, min_out, max_out, std::move(fn), traits});
}

}  // namespace

void RegisterShapeOps(OpRegistry& r) {
  Add(r, "Concat", 1, kManyValues, 1, 1, InferConcat);
  Add(r, "Split", 1, 2, 1, kManyValues, InferSplit);
  Add(r, "Slice", 1, 5, 1, 1, InferSlice);
  Add(r, "Gather", 2, 2, 1, 1, InferGather);
  Add(r, "GatherElements", 2, 2, 1, 1, InferGatherElements);
  Add(r, "GatherND", 2, 2, 1, 1, InferGatherND);
  Add(r, "ScatterND", 3, 3, 1, 1, InferScatterND);
  Add(r, "TensorScatter", 2, 3, 1, 1, InferTensorScatter);
  Add(r, "ScatterElements", 3, 3, 1, 1, InferScatterElements);
  Add(r, "Scatter", 3, 3, 1, 1, InferScatterElements);
  Add(r, "Reshape", 1, 2, 1, 1, InferReshape, {.same_bytes = true});
  Add(r, "Flatten", 1, 1, 1, 1, InferFlatten, {.same_bytes = true});
  Add(r, "Squeeze", 1, 2, 1, 1, InferSqueeze, {.same_bytes = true});
  Add(r, "Unsqueeze", 1, 2, 1, 1, InferUnsqueeze, {.same_bytes = true});
  Add(r, "Transpose", 1, 1, 1, 1, InferTranspose);
  Add(r, "Expand", 2, 2, 1, 1, InferExpand);
  Add(r, "Tile", 2, 2, 1, 1, InferTile);
  Add(r, "Pad", 1, 4, 1, 1, InferPad);
  Add(r, "Resize", 1, 4, 1, 1, InferResize);
  Add(r, "Upsample", 1, 2, 1, 1, InferUpsample);
  Add(r, "Shape", 1, 1, 1, 1, InferShape, {.shape_only = true});
  Add(r, "Size", 1, 1, 1, 1, InferSize, {.shape_only = true});
  Add(r, "Constant", 0, 0, 1, 1, InferConstant);
  Add(r, "ConstantOfShape", 1, 1, 1, 1, InferConstantOfShape);
  Add(r, "Range", 3, 3, 1, 1, InferRange);
  Add(r, "OneHot", 3, 3, 1, 1, InferOneHot);
  Add(r, "Identity", 1, 1, 1, 1, InferIdentity, {.layout_transparent = true, .same_bytes = true});
  Add(r, "Trilu", 1, 2, 1, 1, InferTrilu);
  Add(r, "EyeLike", 1, 1, 1, 1, InferEyeLike);
  for (const char* op : {"HannWindow", "HammingWindow", "BlackmanWindow"}) Add(r, op, 1, 1, 1, 1, InferWindow);
  Add(r, "ReverseSequence", 2, 2, 1, 1, InferReverseSequence);
  Add(r, "NonZero", 1, 1, 1, 1, InferDataDependent, {.data_dependent = true});
  Add(r, "NonMaxSuppression", 2, 5, 1, 1, InferDataDependent, {.data_dependent = true});
  Add(r, "Compress", 2, 2, 1, 1, InferDataDependent, {.data_dependent = true});
  Add(r, "ImageDecoder", 1, 1, 1, 1, InferDataDependent, {.data_dependent = true});  // its size is in the bytes
  Add(r, "Unique", 1, 1, 1, 4, InferDataDependent, {.data_dependent = true});
  Add(r, "Dropout", 1, 3, 1, 2, InferDropout);
  Add(r, "DepthToSpace", 1, 1, 1, 1, InferDepthToSpace);
  Add(r, "CenterCropPad", 2, 2, 1, 1, InferCenterCropPad);
  Add(r, "SpaceToDepth", 1, 1, 1, 1, InferSpaceToDepth);
}

}  // namespace osprey

// Schemas of osprey's internal ops: nodes the compile pipeline creates by fusion (ONNX domain, names starting with
// '_'). They are registered like any op so a graph may carry them directly (unit tests build them that way), and so
// their reference kernel stays the oracle of the fast kernels.
//
// _ChannelShuffle(x_0, ..., x_{k-1}) -> y_0, ..., y_{m-1}, attributes `groups` (int >= 1) and `split` (ints, optional)
//   The inputs are concatenated along axis 1 into X of C channels (all inputs: same dtype, same rank >= 2, equal dims
//   outside axis 1); C must be a multiple of `groups`. Shuffled channel k takes X's channel
//   (k % groups) * (C / groups) + k / groups, i.e. Reshape [N, g, C/g, ...] -> Transpose(0, 2, 1, ...) -> Reshape
//   [N, C, ...] as ShuffleNet exports it. The shuffled tensor is then cut along axis 1 into the outputs, `split[j]`
//   channels each (default: one output holding all C channels).
//
// _MatMulViews(a, b): a batched MatMul of strided views of its inputs; _AttentionViews(q, k, v): softmax(q k) v of
// strided views (ops/matmul_views.h).
//
// _GroupNorm(x, scale, bias), attributes `num_groups`, `epsilon`: GroupNormalization with scale and bias per channel
//   whatever the model's opset (registered beside GroupNormalization in nn.cc, which it shares schema and kernels
//   with).
#include <limits>
#include <string>

#include "ops/matmul_views.h"
#include "ops/op_registry.h"
#include "ops/schema_util.h"

namespace osprey {
namespace {

constexpr int kManyValues = 1 << 20;

std::string Str(int64_t v) { return std::to_string(v); }

void InferChannelShuffle(InferContext& ctx) {
  if (ctx.num_inputs() == 0) ctx.Fail("expected at least one input");
  for (int i = 0; i < ctx.num_inputs(); ++i)
    if (!ctx.Has(i)) ctx.Fail("input " + Str(i) + " is required");
  const Shape& first = ctx.input_shapes[0];
  const int64_t rank = static_cast<int64_t>(first.size());
  if (rank < 2) ctx.Fail("inputs must have rank >= 2 (channels on axis 1), input 0 has shape " + ShapeToString(first));
  int64_t channels = 0;
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    const Shape& s = ctx.input_shapes[i];
    if (ctx.input_dtypes[i] != ctx.input_dtypes[0])
      ctx.Fail("input " + Str(i) + " has dtype " + DTypeName(ctx.input_dtypes[i]) + ", expected " +
               DTypeName(ctx.input_dtypes[0]) + " (the dtype of input 0)");
    if (static_cast<int64_t>(s.size()) != rank)
      ctx.Fail("input " + Str(i) + " has shape " + ShapeToString(s) + ", expected rank " + Str(rank) +
               " like input 0 " + ShapeToString(first));
    for (int64_t d = 0; d < rank; ++d)
      if (d != 1 && s[d] != first[d])
        ctx.Fail("input " + Str(i) + " has shape " + ShapeToString(s) + ", which differs from input 0 " +
                 ShapeToString(first) + " outside axis 1");
    channels += s[1];
  }
  const int64_t groups = ctx.node.GetInt("groups", 0);
  if (groups < 1 || channels % groups != 0)
    ctx.Fail("attribute 'groups' must be >= 1 and divide the " + Str(channels) + " channels, got " + Str(groups));
  const int num_outputs = static_cast<int>(ctx.node.outputs.size());
  std::vector<int64_t> split = ctx.node.GetInts("split", {channels});
  int64_t total = 0;
  for (int64_t s : split) {
    if (s < 0) ctx.Fail("attribute 'split' has a negative size: " + ShapeToString(split));
    total += s;
  }
  if (static_cast<int>(split.size()) != num_outputs || total != channels)
    ctx.Fail("attribute 'split' " + ShapeToString(split) + " must give one size per output (" + Str(num_outputs) +
             ") adding up to the " + Str(channels) + " channels");
  for (int j = 0; j < num_outputs; ++j) {
    Shape out = first;
    out[1] = split[j];
    ctx.SetOutput(j, ctx.input_dtypes[0], out);
  }
}

// Operand `which` of a _MatMulViews node (matmul_views.h) over input `input`: rank 2-6 (`rank`: the other operand's,
// or 0), extents >= 1, strides >= 0, every element inside the input.
StridedView CheckedView(InferContext& ctx, const std::string& which, int input, size_t rank) {
  const StridedView v = ReadView(ctx.node, which);
  const std::string name = "operand " + which + " (" + which + "_offset, " + which + "_dims, " + which + "_strides)";
  if (v.dims.size() < 2 || v.dims.size() > 6 || v.strides.size() != v.dims.size() ||
      (rank != 0 && v.dims.size() != rank))
    ctx.Fail(name + ": dims and strides need one entry per axis, 2-6 axes, as many as the other operand's; got dims " +
             ShapeToString(v.dims) + ", strides " + ShapeToString(v.strides));
  const int64_t elements = NumElements(ctx.input_shapes[input]);
  // The last element it reads, each term bounded by the input's size before it is added (no overflow).
  int64_t last = v.offset;
  bool inside = v.offset >= 0 && v.offset < elements;
  for (size_t k = 0; k < v.dims.size() && inside; ++k) {
    if (v.dims[k] < 1 || v.strides[k] < 0) inside = false;
    if (inside && v.strides[k] > 0 && v.dims[k] - 1 > (elements - 1 - last) / v.strides[k]) inside = false;
    if (inside) last += (v.dims[k] - 1) * v.strides[k];
  }
  if (!inside)
    ctx.Fail(name + ": offset " + Str(v.offset) + ", dims " + ShapeToString(v.dims) + " and strides " +
             ShapeToString(v.strides) + " should have extents >= 1, strides >= 0 and stay inside input " + Str(input) +
             " of shape " + ShapeToString(ctx.input_shapes[input]));
  // No more elements than the input holds, and a stride of 0 only on an axis of extent 1: a view selects elements (as
  // the fusion's Slices, Reshapes and Transposes do), it does not repeat them, so a small input cannot stand for a
  // large product (K = 2^40 read from one element: 2^40 steps for each output element).
  int64_t count = 1;
  for (size_t k = 0; k < v.dims.size(); ++k) {
    if (v.strides[k] == 0 && v.dims[k] > 1) count = elements + 1;
    count = count > elements / v.dims[k] ? elements + 1 : count * v.dims[k];
  }
  if (count > elements)
    ctx.Fail(name + ": dims " + ShapeToString(v.dims) + " with strides " + ShapeToString(v.strides) +
             " repeat elements: a view may take at most the " + Str(elements) + " elements of input " + Str(input) +
             ", with a stride of 0 only on axes of extent 1");
  return v;
}

// a x b as a product of views: inner dimensions that match, batch axes that broadcast.
void CheckViewProduct(InferContext& ctx, const StridedView& a, const StridedView& b, const std::string& a_label,
                      const std::string& b_label) {
  const size_t rank = a.dims.size();
  if (a.dims[rank - 1] != b.dims[rank - 2])
    ctx.Fail("inner dimensions do not match: " + a_label + " " + ShapeToString(a.dims) + ", " + b_label + " " +
             ShapeToString(b.dims));
  for (size_t k = 0; k + 2 < rank; ++k)
    if (a.dims[k] != b.dims[k] && a.dims[k] != 1 && b.dims[k] != 1)
      ctx.Fail("batch axes do not broadcast: " + a_label + " " + ShapeToString(a.dims) + ", " + b_label + " " +
               ShapeToString(b.dims));
}

// `scale` finite; `out_perm`, if given, a permutation of the product's `rank` axes.
void CheckScaleAndPerm(InferContext& ctx, size_t rank) {
  schema::FiniteFloat(ctx, "scale", ctx.node.GetFloat("scale", 1.f));
  if (ctx.node.Has("out_perm")) {
    const std::vector<int64_t> perm = ctx.node.GetInts("out_perm", {});
    std::vector<bool> seen(rank, false);
    bool ok = perm.size() == rank;
    for (size_t k = 0; k < perm.size() && ok; ++k) {
      ok = perm[k] >= 0 && perm[k] < static_cast<int64_t>(rank) && !seen[perm[k]];
      if (ok) seen[perm[k]] = true;
    }
    if (!ok)
      ctx.Fail("out_perm should be a permutation of the product's " + Str(rank) + " axes, got " + ShapeToString(perm));
  }
}

void InferMatMulViews(InferContext& ctx) {
  for (int i = 0; i < 2; ++i)
    if (!ctx.Has(i) || ctx.input_dtypes[i] != DType::kF32) ctx.Fail("input " + Str(i) + " should be float32");
  const StridedView a = CheckedView(ctx, "a", 0, 0), b = CheckedView(ctx, "b", 1, a.dims.size());
  CheckViewProduct(ctx, a, b, "a_dims", "b_dims");
  CheckScaleAndPerm(ctx, a.dims.size());
  ctx.SetOutput(0, DType::kF32, ProductOf(ctx.node, a, b).output);
}

void InferAttentionViews(InferContext& ctx) {
  for (int i = 0; i < 3; ++i)
    if (!ctx.Has(i) || ctx.input_dtypes[i] != DType::kF32) ctx.Fail("input " + Str(i) + " should be float32");
  const StridedView q = CheckedView(ctx, "q", 0, 0), k = CheckedView(ctx, "k", 1, q.dims.size()),
                    v = CheckedView(ctx, "v", 2, q.dims.size());
  CheckViewProduct(ctx, q, k, "q_dims", "k_dims");
  CheckScaleAndPerm(ctx, q.dims.size());  // before AttentionOf reads out_perm
  const AttentionProducts p = AttentionOf(ctx.node, q, k, v);
  CheckViewProduct(ctx, DenseView(p.scores), v, "scores (q k)", "v_dims");
  if (ctx.Has(3)) {
    const Shape& bias = ctx.input_shapes[3];
    if (ctx.input_dtypes[3] != DType::kF32 || !BroadcastsTo(bias, p.scores))
      ctx.Fail("input 3 (bias) should be float32 and broadcast to the scores " + ShapeToString(p.scores) + ", got " +
               ShapeToString(bias));
  }
  // Multiply-adds: every score (batch x M x T) takes D of them and gives Dv; each factor checked before it is applied.
  int64_t work = q.dims.back() + v.dims.back();
  for (int64_t d : p.scores) work = d > kMaxAttentionWork / work ? kMaxAttentionWork + 1 : work * d;
  if (work > kMaxAttentionWork)
    ctx.Fail("scores " + ShapeToString(p.scores) + " of depth " + Str(q.dims.back()) + " with context rows of " +
             Str(v.dims.back()) + " take more than " + Str(kMaxAttentionWork) +
             " multiply-adds, the limit of one node");
  ctx.SetOutput(0, DType::kF32, p.context.output);
}

}  // namespace

void RegisterInternalOps(OpRegistry& r) {
  r.Add(kChannelShuffleOp, 1, kManyValues, 1, kManyValues, InferChannelShuffle);
  r.Add(kMatMulViewsOp, 2, 2, 1, 1, InferMatMulViews);
  r.Add(kAttentionViewsOp, 3, 4, 1, 1, InferAttentionViews);
}

}  // namespace osprey

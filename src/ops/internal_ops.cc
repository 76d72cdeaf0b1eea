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
// _GroupNorm(x, scale, bias), attributes `num_groups`, `epsilon`: GroupNormalization with scale and bias per channel
//   whatever the model's opset (registered beside GroupNormalization in nn.cc, which it shares schema and kernels
//   with).
#include <string>

#include "ops/op_registry.h"

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

}  // namespace

void RegisterInternalOps(OpRegistry& r) {
  r.Add(kChannelShuffleOp, 1, kManyValues, 1, kManyValues, InferChannelShuffle);
}

}  // namespace osprey

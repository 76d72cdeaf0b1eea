// Schemas of the signal family: DFT (opsets 17 and 20), STFT and MelWeightMatrix (opset 17). A complex value is a
// trailing dim of 2 (real, imaginary); a real input may have a trailing dim of 1. PyTorch exports torch.fft.rfft2 /
// fft2 (LaMa's Fourier convolutions) and torch.stft (audio front ends) so; STFT also takes a real signal as
// [batch, length]. Sizes, axes and lengths must be known when the model is compiled. The kernels are in
// kernels/reference/signal.cc.
#include "ops/signal.h"

#include <string>
#include <vector>

#include "ops/op_registry.h"
#include "ops/schema_util.h"

namespace osprey {
namespace {

using schema::FailNode;
using schema::Str;

// An integer input holding one value (a scalar or a one-element vector).
int64_t OneInt(const Node& node, const Tensor& t, const char* what) {
  if ((t.dtype() != DType::kI64 && t.dtype() != DType::kI32) || t.numel() != 1)
    FailNode(node,
             std::string(what) + " must be one integer, got " + DTypeName(t.dtype()) + " " + ShapeToString(t.shape()));
  return t.GetAsInt(0);
}

double OneValue(const Node& node, const Tensor& t, const char* what) {
  if (t.numel() != 1) FailNode(node, std::string(what) + " must be one value, got " + ShapeToString(t.shape()));
  return t.GetAsDouble(0);
}

// Input 0 of DFT and STFT: float32 with a last dim of 1 (real) or 2 (complex), at least `min_rank` dims.
void CheckSignal(const Node& node, const Shape& x, DType dtype, size_t min_rank) {
  if (dtype != DType::kF32)
    throw Error(ErrorCode::kUnsupported,
                node.Describe() + ": osprey computes " + node.op_type + " in float32, got " + DTypeName(dtype));
  if (x.size() < min_rank || (x.back() != 1 && x.back() != 2))
    FailNode(node, "input must have rank >= " + Str(static_cast<int64_t>(min_rank)) +
                       " and a last dim of 1 (real) or 2 (complex), got " + ShapeToString(x));
}

bool Given(const Tensor* t) { return t != nullptr && t->numel() > 0; }

}  // namespace

DftParams ResolveDft(const Node& node, int opset, const Shape& x, DType dtype, const Tensor* dft_length,
                     const Tensor* axis_input) {
  CheckSignal(node, x, dtype, 2);
  const int64_t rank = static_cast<int64_t>(x.size());
  DftParams p;
  int64_t axis = opset >= 20 ? -2 : node.GetInt("axis", 1);
  if (opset >= 20 && Given(axis_input)) axis = OneInt(node, *axis_input, "axis (input 2)");
  if (axis < -rank || axis == -1 || axis >= rank - 1)
    FailNode(node, "axis must be a dim of the signal, not the last (real, imaginary) one: in [" + Str(-rank) +
                       ", -2] or [0, " + Str(rank - 2) + "], got " + Str(axis));
  p.axis = axis < 0 ? axis + rank : axis;
  p.inverse = node.GetInt("inverse", 0) != 0;
  p.onesided = node.GetInt("onesided", 0) != 0;
  p.complex_to_real = p.inverse && p.onesided;
  p.length = p.complex_to_real ? 2 * (x[p.axis] - 1) : x[p.axis];
  if (Given(dft_length)) {
    p.length = OneInt(node, *dft_length, "dft_length (input 1)");
    if (p.length < 1) FailNode(node, "dft_length must be >= 1, got " + Str(p.length));
  }
  if (p.length < 1) FailNode(node, "the signal along axis " + Str(p.axis) + " is too short: nothing to transform");
  if (p.onesided && !p.inverse && x.back() != 1)
    FailNode(node, "a one-sided transform needs a real input (a last dim of 1), got " + ShapeToString(x));
  if (p.complex_to_real && (x.back() != 2 || x[p.axis] != p.length / 2 + 1))
    FailNode(node, "an inverse one-sided transform (complex to real) of " + Str(p.length) +
                       " points needs a complex "
                       "input holding " +
                       Str(p.length / 2 + 1) + " bins along axis " + Str(p.axis) + ", got " + ShapeToString(x));
  p.bins = p.onesided && !p.inverse ? p.length / 2 + 1 : p.length;
  return p;
}

StftParams ResolveStft(const Node& node, const Shape& x, DType dtype, const Tensor& frame_step, const Shape* window,
                       const Tensor* frame_length) {
  // [batch, length] is a real signal as ONNX Runtime reads it (the spec writes [batch, length, 1]; onnx-asr's audio
  // front ends feed the waveform as it comes): the same bytes.
  CheckSignal(node, x.size() == 2 ? Shape{x[0], x[1], 1} : x, dtype, 3);
  if (x.size() != 3 && x.size() != 2)
    FailNode(node, "signal must be [batch, length, 1 or 2] or [batch, length] (real), got " + ShapeToString(x));
  StftParams p;
  p.step = OneInt(node, frame_step, "frame_step (input 1)");
  if (p.step < 1) FailNode(node, "frame_step must be >= 1, got " + Str(p.step));
  if (window && window->size() != 1) FailNode(node, "window must be 1-D, got " + ShapeToString(*window));
  if (Given(frame_length))
    p.frame_length = OneInt(node, *frame_length, "frame_length (input 3)");
  else
    p.frame_length = window ? (*window)[0] : x[1];
  if (p.frame_length < 1 || p.frame_length > x[1])
    FailNode(node, "frame_length must be in [1, " + Str(x[1]) + "] (the signal's length), got " + Str(p.frame_length));
  if (window && (*window)[0] != p.frame_length)
    FailNode(node, "window has " + Str((*window)[0]) + " values, frame_length is " + Str(p.frame_length) +
                       " (they must be equal)");
  p.frames = 1 + (x[1] - p.frame_length) / p.step;
  p.onesided = node.GetInt("onesided", 1) != 0;
  p.bins = p.onesided ? p.frame_length / 2 + 1 : p.frame_length;
  return p;
}

MelParams ResolveMel(const Node& node, const Tensor& mel_bins, const Tensor& dft_length, const Tensor& sample_rate,
                     const Tensor& lower_hz, const Tensor& upper_hz) {
  MelParams p;
  p.mel_bins = OneInt(node, mel_bins, "num_mel_bins (input 0)");
  p.dft_length = OneInt(node, dft_length, "dft_length (input 1)");
  p.sample_rate = OneInt(node, sample_rate, "sample_rate (input 2)");
  p.lower_hz = OneValue(node, lower_hz, "lower_edge_hertz (input 3)");
  p.upper_hz = OneValue(node, upper_hz, "upper_edge_hertz (input 4)");
  if (p.mel_bins < 1 || p.dft_length < 1 || p.sample_rate < 1)
    FailNode(node, "num_mel_bins, dft_length and sample_rate must be >= 1, got " + Str(p.mel_bins) + ", " +
                       Str(p.dft_length) + ", " + Str(p.sample_rate));
  if (!(p.lower_hz >= 0) || !(p.upper_hz > p.lower_hz) || !(p.upper_hz <= p.sample_rate / 2.0))
    FailNode(node, "the edges must satisfy 0 <= lower_edge_hertz < upper_edge_hertz <= sample_rate / 2, got " +
                       std::to_string(p.lower_hz) + " and " + std::to_string(p.upper_hz) + " at " + Str(p.sample_rate) +
                       " Hz");
  return p;
}

namespace {

const Tensor* KnownOrNull(const InferContext& ctx, int i) {
  return ctx.Has(i) && NumElements(ctx.input_shapes[i]) > 0 ? &ctx.Value(i) : nullptr;
}

void SetChecked(InferContext& ctx, const Shape& out) {
  try {
    (void)NumElements(out);
  } catch (const Error& e) {
    ctx.Fail(std::string("computed output ") + e.what());
  }
  ctx.SetOutput(0, DType::kF32, out);
}

void InferDft(InferContext& ctx) {
  if (!ctx.Has(0)) ctx.Fail("input 0 is required");
  const DftParams p = ResolveDft(ctx.node, ctx.opset, ctx.input_shapes[0], ctx.input_dtypes[0], KnownOrNull(ctx, 1),
                                 ctx.opset >= 20 ? KnownOrNull(ctx, 2) : nullptr);
  Shape out = ctx.input_shapes[0];
  out[p.axis] = p.bins;
  out.back() = p.complex_to_real ? 1 : 2;
  SetChecked(ctx, out);
}

void InferStft(InferContext& ctx) {
  if (!ctx.Has(0)) ctx.Fail("input 0 is required");
  const bool window = ctx.Has(2) && NumElements(ctx.input_shapes[2]) > 0;
  if (window && ctx.input_dtypes[2] != DType::kF32)
    ctx.Fail("window must be float32, got " + std::string(DTypeName(ctx.input_dtypes[2])));
  const StftParams p = ResolveStft(ctx.node, ctx.input_shapes[0], ctx.input_dtypes[0], ctx.Value(1),
                                   window ? &ctx.input_shapes[2] : nullptr, KnownOrNull(ctx, 3));
  SetChecked(ctx, {ctx.input_shapes[0][0], p.frames, p.bins, 2});
}

void InferMel(InferContext& ctx) {
  const MelParams p = ResolveMel(ctx.node, ctx.Value(0), ctx.Value(1), ctx.Value(2), ctx.Value(3), ctx.Value(4));
  const DType dtype = schema::DTypeFromOnnxCode(ctx, ctx.node.GetInt("output_datatype", 1), "output_datatype");
  if (dtype != DType::kF32)
    throw Error(ErrorCode::kUnsupported, ctx.node.Describe() + ": a " + DTypeName(dtype) +
                                             " matrix is not supported (osprey makes it in float32)");
  SetChecked(ctx, {p.dft_length / 2 + 1, p.mel_bins});
}

}  // namespace

void RegisterSignalOps(OpRegistry& r) {
  r.Add(OpSchema{"DFT", 1, 3, 1, 1, InferDft, {}});
  r.Add(OpSchema{"STFT", 2, 4, 1, 1, InferStft, {}});
  r.Add(OpSchema{"MelWeightMatrix", 5, 5, 1, 1, InferMel, {}});
}

}  // namespace osprey

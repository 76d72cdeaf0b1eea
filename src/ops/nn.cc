// Schemas (arity, attribute checks, shape/dtype inference) for the neural-network op family: convolutions, pools,
// normalisations, MatMul/Gemm and the softmax family. ONNX semantics for opsets 7..28, float32 only.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ops/activation.h"
#include "ops/conv_input_scale.h"
#include "ops/conv_window.h"
#include "ops/fused_depthwise.h"
#include "ops/fused_pool.h"
#include "ops/op_registry.h"

namespace osprey {
namespace {

constexpr int kMaxSpatialRank = 3;

std::string IntsToString(const std::vector<int64_t>& v) { return ShapeToString(v); }

void RequireInput(const InferContext& c, int i, const char* what) {
  if (!c.Has(i)) c.Fail(std::string("input ") + std::to_string(i) + " (" + what + ") is required");
}

void RequireF32(const InferContext& c, int i, const char* what) {
  RequireInput(c, i, what);
  if (c.input_dtypes[i] != DType::kF32)
    throw Error(ErrorCode::kUnsupported, c.node.Describe() + ": input " + std::to_string(i) + " (" + what +
                                             ") has dtype " + DTypeName(c.input_dtypes[i]) +
                                             "; only float32 is supported");
}

// Sets every declared output so that omitted (-1) trailing outputs still get a (placeholder) type.
void SetOmittedOutputs(InferContext& c, int from) {
  for (int i = from; i < static_cast<int>(c.node.outputs.size()); ++i) c.SetOutput(i, DType::kF32, {0});
}

bool HasOutput(const InferContext& c, int i) {
  return i < static_cast<int>(c.node.outputs.size()) && c.node.outputs[i] >= 0;
}

// Internal: `_residual` = 1 adds input 3, of the output's shape `y`, before the fused activation (Conv, MatMul).
void CheckFusedResidual(const InferContext& c, const Shape& y) {
  if (c.node.GetInt("_residual", 0) != 0) {
    if (!c.Has(3)) c.Fail("_residual is set but input 3 (the residual) is missing");
    RequireF32(c, 3, "residual");
    if (c.input_shapes[3] != y)
      c.Fail("residual input 3 should have the output's shape " + ShapeToString(y) + ", got " +
             ShapeToString(c.input_shapes[3]));
  } else if (c.Has(3)) {
    c.Fail("input 3 is only allowed on a fused node with _residual = 1");
  }
}

void CheckFusedActivation(const InferContext& c) {
  Activation act;  // reads _alpha and _beta too, so a wrong kind fails here
  if (!Activation::FromFusedNode(c.node, &act))
    c.Fail("unknown fused activation '" + c.node.GetString("_activation", "") + "'");
}

// Spatial rank of an [N, C, D1..Dn] input, checked against what the reference kernels implement.
int SpatialRank(const InferContext& c, const Shape& x) {
  if (x.size() < 3) c.Fail("input X must have rank >= 3 ([N, C, D1, ...]), got shape " + ShapeToString(x));
  int n = static_cast<int>(x.size()) - 2;
  if (n > kMaxSpatialRank)
    throw Error(ErrorCode::kUnsupported, c.node.Describe() + ": " + std::to_string(n) +
                                             "-D windows are not supported (1-D, 2-D and 3-D are), input shape " +
                                             ShapeToString(x));
  return n;
}

// ---------------------------------------------------------------- Conv / ConvTranspose

// The output shape of a Conv with a fused depthwise convolution (ops/fused_depthwise.h) whose pointwise part gives
// `pointwise_y`.
Shape InferFusedDepthwise(InferContext& c, const Shape& pointwise_y) {
  if (c.node.GetInt("_residual", 0) != 0 || c.node.GetInt("_int8", 0) != 0)
    c.Fail("a fused depthwise convolution (_dw_strides) takes no residual and is not int8");
  const std::vector<int64_t> strides = c.node.GetInts("_dw_strides");
  if (pointwise_y.size() != 4 || strides.size() != 2)
    c.Fail("a fused depthwise convolution needs a 2-D convolution and two _dw_strides, got output " +
           ShapeToString(pointwise_y) + " and " + IntsToString(strides));
  const int64_t channels = pointwise_y[1];
  RequireF32(c, kDwWeightInput, "depthwise W");
  if (c.input_shapes[kDwWeightInput] != Shape{channels, 1, 3, 3})
    c.Fail("depthwise W (input 4) should have shape [" + std::to_string(channels) + ", 1, 3, 3], got " +
           ShapeToString(c.input_shapes[kDwWeightInput]));
  if (c.Has(kDwBiasInput)) {
    RequireF32(c, kDwBiasInput, "depthwise B");
    if (c.input_shapes[kDwBiasInput] != Shape{channels})
      c.Fail("depthwise bias (input 5) should have shape [" + std::to_string(channels) + "], got " +
             ShapeToString(c.input_shapes[kDwBiasInput]));
  }
  const Node part = FusedDepthwisePart(c.node, channels);
  Activation act;
  if (!Activation::FromFusedNode(part, &act))
    c.Fail("unknown fused depthwise activation '" + c.node.GetString("_dw_activation", "") + "'");
  const std::vector<int64_t> spatial = ResolveConvWindow(part, pointwise_y, {3, 3}, /*ceil_mode=*/false).out;
  return {pointwise_y[0], channels, spatial[0], spatial[1]};
}

// X of a Conv: input 0, or with `_input_parts` (ops/conv_input_scale.h) the channel concatenation of its parts.
Shape ConvInputShape(InferContext& c) {
  if (!HasInputParts(c.node)) {
    if (c.input_shapes.size() > kInputPartsInput) c.Fail("inputs 10 and on are only allowed with _input_parts");
    return c.input_shapes[0];
  }
  const std::vector<int64_t> parts = c.node.GetInts("_input_parts");
  const int k = static_cast<int>(parts.size());
  if (k < 2 || k > kMaxInputParts)
    c.Fail("_input_parts should list 2 to " + std::to_string(kMaxInputParts) + " channel counts, got " +
           std::to_string(k));
  if (static_cast<int>(c.input_shapes.size()) != InputPartIndex(k - 1) + 1)
    c.Fail("_input_parts lists " + std::to_string(k) + " parts: inputs 0 and 10 to " +
           std::to_string(InputPartIndex(k - 1)) + " should hold them, got " + std::to_string(c.input_shapes.size()) +
           " inputs");
  Shape x = c.input_shapes[0];
  if (x.size() != 4) c.Fail("a Conv with _input_parts needs rank-4 parts, got " + ShapeToString(x));
  x[1] = 0;
  for (int i = 0; i < k; ++i) {
    const int in = InputPartIndex(i);
    if (!c.Has(in)) c.Fail("part " + std::to_string(i) + " (input " + std::to_string(in) + ") is missing");
    RequireF32(c, in, "X part");
    const Shape& p = c.input_shapes[in];
    if (p.size() != 4 || p[0] != x[0] || p[2] != x[2] || p[3] != x[3] || p[1] != parts[i] || parts[i] < 1)
      c.Fail("part " + std::to_string(i) + " (input " + std::to_string(in) + ") should have shape [" +
             std::to_string(x[0]) + ", " + std::to_string(parts[i]) + ", " + std::to_string(x[2]) + ", " +
             std::to_string(x[3]) + "], got " + ShapeToString(p));
    x[1] += parts[i];
  }
  return x;
}

// The output shape of a Conv with a fused MaxPool (ops/fused_pool.h) whose convolution gives `conv_y`.
Shape InferFusedPool(InferContext& c, const Shape& conv_y) {
  if (conv_y.size() != 4 || CarriesAnotherFusedPart(c.node))
    c.Fail("a fused MaxPool (_pool_kernel) needs a 2-D convolution without another fused part, got output " +
           ShapeToString(conv_y));
  const Node pool = FusedPoolPart(c.node);
  const std::vector<int64_t> kernel = ReadWindowInts(pool, "kernel_shape", 2, 1, 1);
  const int64_t ceil_mode = pool.GetInt("ceil_mode", 0);
  if (ceil_mode != 0 && ceil_mode != 1) c.Fail("_pool_ceil should be 0 or 1, got " + std::to_string(ceil_mode));
  const std::vector<int64_t> spatial = ResolveConvWindow(pool, conv_y, kernel, ceil_mode != 0).out;
  return {conv_y[0], conv_y[1], spatial[0], spatial[1]};
}

void InferConv(InferContext& c) {
  RequireF32(c, 0, "X");
  RequireF32(c, 1, "W");
  const Shape x = ConvInputShape(c);
  const Shape& w = c.input_shapes[1];
  SpatialRank(c, x);
  if (w.size() != x.size())
    c.Fail("W should have rank " + std::to_string(x.size()) + " like X " + ShapeToString(x) + ", got shape " +
           ShapeToString(w));
  int64_t group = c.node.GetInt("group", 1);
  if (group < 1) c.Fail("attribute 'group' should be >= 1, got " + std::to_string(group));
  int64_t channels = x[1], out_channels = w[0];
  if (channels % group != 0)
    c.Fail("group " + std::to_string(group) + " does not divide the " + std::to_string(channels) +
           " input channels of X " + ShapeToString(x));
  if (w[1] * group != channels)
    c.Fail("W " + ShapeToString(w) + " expects " + std::to_string(w[1] * group) + " input channels (W[1] * group " +
           std::to_string(group) + "), X " + ShapeToString(x) + " has " + std::to_string(channels));
  if (out_channels % group != 0)
    c.Fail("group " + std::to_string(group) + " does not divide the " + std::to_string(out_channels) +
           " output channels of W " + ShapeToString(w));
  std::vector<int64_t> kernel(w.begin() + 2, w.end());
  for (int64_t k : kernel)
    if (k < 1 || k > kMaxWindowAttr) c.Fail("W " + ShapeToString(w) + " has an empty or oversized kernel");
  if (c.node.Has("kernel_shape")) {
    std::vector<int64_t> ks = c.node.GetInts("kernel_shape");
    if (ks != kernel)
      c.Fail("attribute kernel_shape " + IntsToString(ks) + " does not match W's spatial dims " + ShapeToString(w));
  }
  if (c.Has(2)) {
    RequireF32(c, 2, "B");
    if (c.input_shapes[2] != Shape{out_channels})
      c.Fail("bias B should have shape [" + std::to_string(out_channels) + "], got " +
             ShapeToString(c.input_shapes[2]));
  }
  const std::vector<int64_t> spatial = ResolveConvWindow(c.node, x, kernel, /*ceil_mode=*/false).out;
  Shape y = {x[0], out_channels};
  y.insert(y.end(), spatial.begin(), spatial.end());
  CheckFusedResidual(c, y);
  CheckFusedActivation(c);
  if (HasFusedDepthwise(c.node)) {
    y = InferFusedDepthwise(c, y);
  } else if (c.Has(kDwWeightInput) || c.Has(kDwBiasInput)) {
    c.Fail("inputs 4 and 5 are only allowed on a fused node with _dw_strides");
  }
  if (HasFusedPRelu(c.node)) {
    if (HasFusedDepthwise(c.node) || c.node.GetInt("_int8", 0) != 0 || !c.node.GetString("_activation", "").empty())
      c.Fail("a fused PRelu (_prelu) is the node's only activation: no _activation, _dw_strides or _int8");
    if (!c.Has(kPReluSlopeInput)) c.Fail("_prelu is set but input 6 (the slopes) is missing");
    RequireF32(c, kPReluSlopeInput, "PRelu slope");
    const Shape& slope = c.input_shapes[kPReluSlopeInput];
    if (slope != Shape{1} && slope != Shape{out_channels})
      c.Fail("PRelu slope (input 6) should have shape [1] or [" + std::to_string(out_channels) + "], got " +
             ShapeToString(slope));
  } else if (c.Has(kPReluSlopeInput)) {
    c.Fail("input 6 is only allowed on a fused node with _prelu = 1");
  }
  if (HasInputScale(c.node)) {
    if (x.size() != 4 || HasFusedDepthwise(c.node) || c.node.GetInt("_int8", 0) != 0)
      c.Fail("a fused input scale (_input_scale) needs a 2-D convolution without _dw_strides or _int8");
    if (!c.Has(kInputScaleInput)) c.Fail("_input_scale is set but input 7 (the scale) is missing");
    RequireF32(c, kInputScaleInput, "input scale");
    const Shape& s = c.input_shapes[kInputScaleInput];
    if (s.size() != 4 || (s[0] != 1 && s[0] != x[0]) || s[1] != channels || s[2] != 1 || s[3] != 1)
      c.Fail("input scale (input 7) should have shape [" + std::to_string(x[0]) + " or 1, " + std::to_string(channels) +
             ", 1, 1], got " + ShapeToString(s));
  } else if (c.Has(kInputScaleInput)) {
    c.Fail("input 7 is only allowed on a fused node with _input_scale = 1");
  }
  if ((HasInputAffine(c.node) || HasInputParts(c.node)) &&
      (x.size() != 4 || HasFusedDepthwise(c.node) || c.node.GetInt("_int8", 0) != 0 || HasInputScale(c.node)))
    c.Fail(
        "a fused input affine or parts (_input_affine, _input_parts) needs a 2-D convolution without _dw_strides, "
        "_int8 or _input_scale");
  if (HasInputAffine(c.node)) {
    for (int in : {kInputAffineScale, kInputAffineShift}) {
      if (!c.Has(in)) c.Fail("_input_affine is set but input " + std::to_string(in) + " is missing");
      RequireF32(c, in, "input affine");
      if (c.input_shapes[in] != Shape{channels})
        c.Fail("input affine (input " + std::to_string(in) + ") should have shape [" + std::to_string(channels) +
               "], got " + ShapeToString(c.input_shapes[in]));
    }
  } else if (c.Has(kInputAffineScale) || c.Has(kInputAffineShift) || c.node.Has("_input_relu")) {
    c.Fail("inputs 8 and 9 and _input_relu are only allowed on a fused node with _input_affine = 1");
  }
  if (HasFusedPool(c.node)) y = InferFusedPool(c, y);
  c.SetOutput(0, DType::kF32, y);
}

void InferConvTranspose(InferContext& c) {
  RequireF32(c, 0, "X");
  RequireF32(c, 1, "W");
  const Shape& x = c.input_shapes[0];
  const Shape& w = c.input_shapes[1];
  SpatialRank(c, x);
  if (w.size() != x.size())
    c.Fail("W should have rank " + std::to_string(x.size()) + " like X " + ShapeToString(x) + ", got shape " +
           ShapeToString(w));
  int64_t group = c.node.GetInt("group", 1);
  if (group < 1) c.Fail("attribute 'group' should be >= 1, got " + std::to_string(group));
  int64_t channels = x[1];
  if (channels % group != 0)
    c.Fail("group " + std::to_string(group) + " does not divide the " + std::to_string(channels) +
           " input channels of X " + ShapeToString(x));
  if (w[0] != channels)
    c.Fail("W " + ShapeToString(w) + " expects " + std::to_string(w[0]) + " input channels (W[0]), X " +
           ShapeToString(x) + " has " + std::to_string(channels));
  int64_t out_channels = w[1] * group;
  std::vector<int64_t> kernel(w.begin() + 2, w.end());
  for (int64_t k : kernel)
    if (k < 1 || k > kMaxWindowAttr) c.Fail("W " + ShapeToString(w) + " has an empty or oversized kernel");
  if (c.node.Has("kernel_shape")) {
    std::vector<int64_t> ks = c.node.GetInts("kernel_shape");
    if (ks != kernel)
      c.Fail("attribute kernel_shape " + IntsToString(ks) + " does not match W's spatial dims " + ShapeToString(w));
  }
  if (c.Has(2)) {
    RequireF32(c, 2, "B");
    if (c.input_shapes[2] != Shape{out_channels})
      c.Fail("bias B should have shape [" + std::to_string(out_channels) + "], got " +
             ShapeToString(c.input_shapes[2]));
  }
  const std::vector<int64_t> spatial = ResolveConvTransposeWindow(c.node, x, kernel).out;
  Shape y = {x[0], out_channels};
  y.insert(y.end(), spatial.begin(), spatial.end());
  c.SetOutput(0, DType::kF32, y);
}

// ---------------------------------------------------------------- pools

void InferPool(InferContext& c, bool has_ceil_mode, bool allow_8bit = false) {
  // MaxPool takes int8 and uint8 too (opset 12; ONNX Runtime's QOperator models pool quantised tensors).
  const bool eight_bit = allow_8bit && c.Has(0) && (c.input_dtypes[0] == DType::kI8 || c.input_dtypes[0] == DType::kU8);
  if (!eight_bit) RequireF32(c, 0, "X");
  const Shape& x = c.input_shapes[0];
  int n = SpatialRank(c, x);
  if (!c.node.Has("kernel_shape")) c.Fail("attribute 'kernel_shape' is required");
  std::vector<int64_t> kernel = ReadWindowInts(c.node, "kernel_shape", n, 1, 1);
  int64_t ceil_mode = has_ceil_mode ? c.node.GetInt("ceil_mode", 0) : 0;
  if (ceil_mode != 0 && ceil_mode != 1)
    c.Fail("attribute 'ceil_mode' should be 0 or 1, got " + std::to_string(ceil_mode));
  const std::vector<int64_t> spatial = ResolveConvWindow(c.node, x, kernel, ceil_mode != 0).out;
  Shape y = {x[0], x[1]};
  y.insert(y.end(), spatial.begin(), spatial.end());
  c.SetOutput(0, c.input_dtypes[0], y);
}

void InferMaxPool(InferContext& c) {
  InferPool(c, true, /*allow_8bit=*/true);
  int64_t storage_order = c.node.GetInt("storage_order", 0);
  if (storage_order != 0 && storage_order != 1)
    c.Fail("attribute 'storage_order' should be 0 or 1, got " + std::to_string(storage_order));
  if (c.node.outputs.size() > 1) c.SetOutput(1, DType::kI64, c.output_shapes[0]);
}

void InferAveragePool(InferContext& c) {
  InferPool(c, true);
  int64_t cip = c.node.GetInt("count_include_pad", 0);
  if (cip != 0 && cip != 1) c.Fail("attribute 'count_include_pad' should be 0 or 1, got " + std::to_string(cip));
}

void InferLpPool(InferContext& c) {
  InferPool(c, true);
  int64_t p = c.node.GetInt("p", 2);
  if (p < 1 || p > 64) c.Fail("attribute 'p' should be in [1, 64], got " + std::to_string(p));
}

void InferGlobalPool(InferContext& c) {
  RequireF32(c, 0, "X");
  const Shape& x = c.input_shapes[0];
  SpatialRank(c, x);
  Shape y = x;
  std::fill(y.begin() + 2, y.end(), 1);
  c.SetOutput(0, DType::kF32, y);
}

// ---------------------------------------------------------------- normalisations

void RequireChannelVector(const InferContext& c, int i, const char* what, int64_t channels) {
  RequireF32(c, i, what);
  if (c.input_shapes[i] != Shape{channels})
    c.Fail(std::string("input ") + std::to_string(i) + " (" + what + ") should have shape [" +
           std::to_string(channels) + "], got " + ShapeToString(c.input_shapes[i]));
}

void InferBatchNormalization(InferContext& c) {
  RequireF32(c, 0, "X");
  const Shape& x = c.input_shapes[0];
  if (x.size() < 2) c.Fail("input X should have rank >= 2 ([N, C, ...]), got shape " + ShapeToString(x));
  // training_mode = 1 (opset 14+): Y normalised by X's own per-channel statistics, and the running mean and variance
  // as outputs 1 and 2. Exporters write it for weight standardisation (timm's ScaledStdConv2d through the TorchScript
  // exporter: a BatchNormalization over the constant weights, folded when compiled).
  const bool training = c.opset >= 14 && c.node.GetInt("training_mode", 0) != 0;
  if (c.opset < 9 && c.node.GetInt("spatial", 1) == 0)
    throw Error(ErrorCode::kUnsupported,
                c.node.Describe() + ": spatial = 0 (per-activation statistics) is not supported");
  for (int i = training ? 3 : 1; i < static_cast<int>(c.node.outputs.size()); ++i)
    if (HasOutput(c, i))
      throw Error(ErrorCode::kUnsupported, c.node.Describe() +
                                               ": outputs beyond Y (saved mean and variance of opset < 14's training "
                                               "mode) are not supported");
  const char* names[] = {"X", "scale", "B", "input_mean", "input_var"};
  for (int i = 1; i < 5; ++i) RequireChannelVector(c, i, names[i], x[1]);
  c.SetOutput(0, DType::kF32, x);
  SetOmittedOutputs(c, 1);
  if (training)
    for (int i = 1; i < 3; ++i)
      if (HasOutput(c, i)) c.SetOutput(i, DType::kF32, {x[1]});
}

// GroupNormalization: num_groups groups of channels, each normalised over its channels and spatial dims; scale and
// bias per group (opset 18) or per channel (opset 21, which corrected the op).
void InferGroupNormalization(InferContext& c) {
  RequireF32(c, 0, "X");
  const Shape& x = c.input_shapes[0];
  if (x.size() < 2) c.Fail("input X should have rank >= 2 ([N, C, ...]), got shape " + ShapeToString(x));
  if (!c.node.Has("num_groups")) c.Fail("attribute 'num_groups' is required");
  const int64_t groups = c.node.GetInt("num_groups", 0);
  if (groups < 1 || x[1] % groups != 0)
    c.Fail("num_groups " + std::to_string(groups) + " must be >= 1 and divide the channels (" + std::to_string(x[1]) +
           ")");
  const int64_t params = c.opset >= 21 || c.node.op_type == kGroupNormOp ? x[1] : groups;
  RequireChannelVector(c, 1, "scale", params);
  RequireChannelVector(c, 2, "bias", params);
  c.node.GetFloat("epsilon", 1e-5f);
  c.node.GetInt("stash_type", 1);  // statistics are always accumulated in double
  CheckFusedActivation(c);
  c.SetOutput(0, DType::kF32, x);
}

// MeanVarianceNormalization: (x - mean) / (std + 1e-9) over `axes` (default N, H, W), as the spec's function body.
void InferMeanVarianceNormalization(InferContext& c) {
  RequireF32(c, 0, "X");
  const int64_t rank = static_cast<int64_t>(c.input_shapes[0].size());
  for (int64_t a : c.node.GetInts("axes", {0, 2, 3}))
    if (a < -rank || a >= rank)
      c.Fail("axis " + std::to_string(a) + " is out of range for rank " + std::to_string(rank));
  c.SetOutput(0, DType::kF32, c.input_shapes[0]);
}

// RoiAlign: [num_rois, C, output_height, output_width] from X [N, C, H, W], rois [num_rois, 4] and batch_indices
// [num_rois] (Faster/Mask R-CNN's box heads).
void InferRoiAlign(InferContext& c) {
  RequireF32(c, 0, "X");
  RequireF32(c, 1, "rois");
  const Shape& x = c.input_shapes[0];
  if (x.size() != 4) c.Fail("input X must be 4-D [N, C, H, W], got " + ShapeToString(x));
  const Shape& rois = c.input_shapes[1];
  if (rois.size() != 2 || rois[1] != 4) c.Fail("rois must be [num_rois, 4], got " + ShapeToString(rois));
  if (!c.Has(2) || (c.input_dtypes[2] != DType::kI64 && c.input_dtypes[2] != DType::kI32) ||
      c.input_shapes[2] != Shape{rois[0]})
    c.Fail("batch_indices must be int64 [" + std::to_string(rois[0]) + "] (one per roi)");
  const int64_t oh = c.node.GetInt("output_height", 1), ow = c.node.GetInt("output_width", 1);
  if (oh < 1 || ow < 1 || oh > (1 << 16) || ow > (1 << 16))
    c.Fail("output_height and output_width must be in [1, 65536], got " + std::to_string(oh) + " and " +
           std::to_string(ow));
  const std::string mode = c.node.GetString("mode", "avg");
  if (mode != "avg" && mode != "max") c.Fail("mode must be avg or max, got \"" + mode + "\"");
  const std::string coord = c.node.GetString("coordinate_transformation_mode", "half_pixel");
  if (coord != "half_pixel" && coord != "output_half_pixel")
    c.Fail("coordinate_transformation_mode must be half_pixel or output_half_pixel, got \"" + coord + "\"");
  if (c.node.GetInt("sampling_ratio", 0) < 0) c.Fail("sampling_ratio must be >= 0");
  const float scale = c.node.GetFloat("spatial_scale", 1.f);
  if (!std::isfinite(scale)) c.Fail("spatial_scale must be finite");
  c.SetOutput(0, DType::kF32, {rois[0], x[1], oh, ow});
}

void InferInstanceNormalization(InferContext& c) {
  RequireF32(c, 0, "X");
  const Shape& x = c.input_shapes[0];
  if (x.size() < 3) c.Fail("input X should have rank >= 3 ([N, C, D1, ...]), got shape " + ShapeToString(x));
  RequireChannelVector(c, 1, "scale", x[1]);
  RequireChannelVector(c, 2, "B", x[1]);
  CheckFusedActivation(c);
  c.SetOutput(0, DType::kF32, x);
}

// Unidirectional broadcast of `param` to `target` (numpy rules, param may not grow).
void RequireBroadcastableTo(const InferContext& c, const Shape& param, const Shape& target, const char* what) {
  bool ok = param.size() <= target.size();
  for (size_t i = 0; ok && i < param.size(); ++i) {
    int64_t p = param[param.size() - 1 - i], t = target[target.size() - 1 - i];
    ok = p == t || p == 1;
  }
  if (!ok)
    c.Fail(std::string(what) + " of shape " + ShapeToString(param) + " cannot be broadcast to " +
           ShapeToString(target));
}

void InferLayerNormalization(InferContext& c) {
  RequireF32(c, 0, "X");
  RequireF32(c, 1, "Scale");
  const Shape& x = c.input_shapes[0];
  if (x.empty()) c.Fail("input X should have rank >= 1, got a scalar");
  int64_t axis = NormalizeAxis(c.node.GetInt("axis", -1), static_cast<int64_t>(x.size()), c.node);
  Shape normalized(x.begin() + axis, x.end());
  RequireBroadcastableTo(c, c.input_shapes[1], normalized, "Scale");
  if (c.Has(2)) {
    RequireF32(c, 2, "B");
    RequireBroadcastableTo(c, c.input_shapes[2], normalized, "B");
  }
  c.node.GetFloat("epsilon", 1e-5f);
  // stash_type only asks for at least that precision in the statistics; the kernel always accumulates in double.
  c.node.GetInt("stash_type", 1);
  c.SetOutput(0, DType::kF32, x);
  Shape stats = x;
  std::fill(stats.begin() + axis, stats.end(), 1);
  for (int i = 1; i < static_cast<int>(c.node.outputs.size()); ++i) c.SetOutput(i, DType::kF32, stats);
}

void InferLRN(InferContext& c) {
  RequireF32(c, 0, "X");
  const Shape& x = c.input_shapes[0];
  if (x.size() < 2) c.Fail("input X should have rank >= 2 ([N, C, ...]), got shape " + ShapeToString(x));
  if (!c.node.Has("size")) c.Fail("attribute 'size' is required");
  int64_t size = c.node.GetInt("size", 1);
  if (size < 1) c.Fail("attribute 'size' should be >= 1, got " + std::to_string(size));
  c.SetOutput(0, DType::kF32, x);
}

// ---------------------------------------------------------------- MatMul / Gemm

void InferMatMul(InferContext& c) {
  RequireF32(c, 0, "A");
  RequireF32(c, 1, "B");
  Shape a = c.input_shapes[0], b = c.input_shapes[1];
  if (a.empty() || b.empty())
    c.Fail("inputs should have rank >= 1, got " + ShapeToString(a) + " and " + ShapeToString(b));
  bool a_vector = a.size() == 1, b_vector = b.size() == 1;
  if (a_vector) a.insert(a.begin(), 1);
  if (b_vector) b.push_back(1);
  if (a.back() != b[b.size() - 2])
    c.Fail("inner dimensions do not match: A " + ShapeToString(c.input_shapes[0]) + " x B " +
           ShapeToString(c.input_shapes[1]));
  Shape batch = BroadcastShapes(Shape(a.begin(), a.end() - 2), Shape(b.begin(), b.end() - 2), c.node);
  Shape y = batch;
  if (!a_vector) y.push_back(a[a.size() - 2]);
  if (!b_vector) y.push_back(b.back());
  // Internal: `_bias` = 1 adds input 2, a [N] row vector, to every row of the product before the fused activation.
  const bool has_bias = c.node.GetInt("_bias", 0) != 0;
  if (c.Has(2) && !has_bias) c.Fail("input 2 (bias) is internal and needs attribute _bias = 1");
  if (has_bias) {
    RequireF32(c, 2, "bias");
    if (b_vector) c.Fail("a fused bias needs B of rank >= 2, got B " + ShapeToString(c.input_shapes[1]));
    if (c.input_shapes[2] != Shape{b.back()})
      c.Fail("fused bias should have shape [" + std::to_string(b.back()) + "] (the columns of B), got " +
             ShapeToString(c.input_shapes[2]));
  }
  CheckFusedResidual(c, y);
  CheckFusedActivation(c);
  c.SetOutput(0, DType::kF32, y);
}

void InferGemm(InferContext& c) {
  RequireF32(c, 0, "A");
  RequireF32(c, 1, "B");
  const Shape& a = c.input_shapes[0];
  const Shape& b = c.input_shapes[1];
  if (a.size() != 2 || b.size() != 2)
    c.Fail("A and B should be 2-D, got " + ShapeToString(a) + " and " + ShapeToString(b));
  bool trans_a = c.node.GetInt("transA", 0) != 0, trans_b = c.node.GetInt("transB", 0) != 0;
  int64_t m = trans_a ? a[1] : a[0], k = trans_a ? a[0] : a[1];
  int64_t kb = trans_b ? b[1] : b[0], n = trans_b ? b[0] : b[1];
  if (k != kb)
    c.Fail("inner dimensions do not match: A " + ShapeToString(a) + (trans_a ? " (transposed)" : "") + " x B " +
           ShapeToString(b) + (trans_b ? " (transposed)" : ""));
  c.node.GetFloat("alpha", 1.f);
  c.node.GetFloat("beta", 1.f);
  if (c.Has(2)) {
    RequireF32(c, 2, "C");
    if (c.input_shapes[2].size() > 2) c.Fail("C should have rank <= 2, got " + ShapeToString(c.input_shapes[2]));
    RequireBroadcastableTo(c, c.input_shapes[2], Shape{m, n}, "C");
  }
  CheckFusedActivation(c);
  c.SetOutput(0, DType::kF32, Shape{m, n});
}

// ---------------------------------------------------------------- softmax family

void InferSoftmaxLike(InferContext& c) {
  RequireF32(c, 0, "input");
  const Shape& x = c.input_shapes[0];
  if (x.empty()) c.Fail("input should have rank >= 1, got a scalar");
  int64_t axis = c.node.GetInt("axis", c.opset >= 13 ? -1 : 1);
  NormalizeAxis(axis, static_cast<int64_t>(x.size()), c.node);
  c.SetOutput(0, DType::kF32, x);
}

OpSchema Schema(const char* op_type, int min_in, int max_in, int min_out, int max_out, InferFn infer) {
  return OpSchema{op_type, min_in, max_in, min_out, max_out, std::move(infer)};
}

}  // namespace

void RegisterNnOps(OpRegistry& r) {
  // Internal inputs: 3, fused residual; 4, 5: fused depthwise; 6: PRelu; 7: input scale.
  r.Add(Schema("Conv", 2, kInputPartsInput + kMaxInputParts - 1, 1, 1, InferConv));
  r.Add(Schema("ConvTranspose", 2, 3, 1, 1, InferConvTranspose));
  r.Add(Schema("BatchNormalization", 5, 5, 1, 5, InferBatchNormalization));
  r.Add(Schema("InstanceNormalization", 3, 3, 1, 1, InferInstanceNormalization));
  r.Add(Schema("GroupNormalization", 3, 3, 1, 1, InferGroupNormalization));
  r.Add(Schema(kGroupNormOp, 3, 3, 1, 1, InferGroupNormalization));
  r.Add(Schema("RoiAlign", 3, 3, 1, 1, InferRoiAlign));
  r.Add(Schema("MeanVarianceNormalization", 1, 1, 1, 1, InferMeanVarianceNormalization));
  r.Add(Schema("LayerNormalization", 2, 3, 1, 3, InferLayerNormalization));
  // Internal inputs: 2, a fused bias (with _bias = 1); 3, a fused residual (with _residual = 1).
  r.Add(Schema("MatMul", 2, 4, 1, 1, InferMatMul));
  r.Add(Schema("Gemm", 2, 3, 1, 1, InferGemm));
  r.Add(Schema("MaxPool", 1, 1, 1, 2, InferMaxPool));
  r.Add(Schema("AveragePool", 1, 1, 1, 1, InferAveragePool));
  r.Add(Schema("LpPool", 1, 1, 1, 1, InferLpPool));
  r.Add(Schema("GlobalAveragePool", 1, 1, 1, 1, InferGlobalPool));
  r.Add(Schema("GlobalMaxPool", 1, 1, 1, 1, InferGlobalPool));
  r.Add(Schema("Softmax", 1, 1, 1, 1, InferSoftmaxLike));
  r.Add(Schema("LogSoftmax", 1, 1, 1, 1, InferSoftmaxLike));
  r.Add(Schema("Hardmax", 1, 1, 1, 1, InferSoftmaxLike));
  r.Add(Schema("LRN", 1, 1, 1, 1, InferLRN));
}

}  // namespace osprey
